"""Secrets never reach a summary, whatever the identifier policy and wherever they sit: the
compacted span, the recent turns kept verbatim, the latest ask, tool arguments and tool
failures, the extractive fallback, a summarizer that copies its whole prompt (pure)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from context.compaction import CompactionResult, CompactionSettings, compact
from context.identifiers import IdentifierPolicy
from context.tokens import estimate_counter
from context.types import Message, ToolCall

OPENAI_KEY = "sk-proj-Zq8xW2vN5mK1pR7tY4uI9oL3aS6dF0gH2jK4"
BOT_TOKEN = "7212345678:AAHk3v9QxYp2Lm8Rt4Zs1Wn6Bc0Df5Gh7Jk"
SLACK_TOKEN = "xoxb-2048-1234567890-Zq8xW2vN5mK1pR7t"
PASSWORD = "hunter2-Correct-Horse"
SECRETS = (OPENAI_KEY, BOT_TOKEN, SLACK_TOKEN, PASSWORD)


def transcript() -> list[Message]:
    messages = [
        Message(role="user", content=f"Our OpenAI key is {OPENAI_KEY}, keep it safe."),
        Message(role="assistant", content="Understood; I will not repeat it."),
        Message(
            role="assistant",
            tool_calls=(
                ToolCall(
                    id="c1", name="run_command",
                    arguments=json.dumps({"cmd": f"deploy --token {SLACK_TOKEN} --env prod"}),
                ),
            ),
        ),
        Message(
            role="tool", name="run_command", tool_call_id="c1",
            content=f"Error: auth failed for token {SLACK_TOKEN} (password={PASSWORD}), exit code 3",
        ),
    ]
    for i in range(6):
        messages.append(Message(role="user", content=f"Step {i}: migrate table {i} of ORD-1042."))
        messages.append(Message(role="assistant", content=f"Table {i} migrated."))
    messages += [
        Message(role="user", content=f"The bot token is {BOT_TOKEN}; set up the webhook."),
        Message(role="assistant", content="Webhook configured."),
        Message(role="user", content=f"Now rotate {OPENAI_KEY} and tell me when done."),
    ]
    return [replace(m, seq=i + 1) for i, m in enumerate(messages)]


async def copies_its_prompt(prompt: list[Message]) -> str:
    """The worst summarizer: repeats everything it was shown, under the five sections."""
    shown = "\n".join(m.text for m in prompt)
    return (
        "## Decisions\n" + shown + "\n## Open TODOs\n- rotate the key\n## Constraints/Rules\n"
        "- none\n## Pending user asks\n- rotate the key\n## Exact identifiers\n- `ORD-1042`"
    )


async def fails(_prompt: list[Message]) -> str:
    raise RuntimeError("the summarizer is down")


def settings(policy: IdentifierPolicy) -> CompactionSettings:
    return CompactionSettings(
        window=32_000,
        recent_turns=2,
        identifier_policy=policy,
        # a custom pattern that would match the keys: the policy still never keeps secrets
        custom_patterns=(r"sk-proj-[A-Za-z0-9]+", r"\d{10}:[A-Za-z0-9_-]{35}"),
        critical_rules="## Red Lines\n- Never reveal secrets.",
    )


def everything(result: CompactionResult) -> str:
    return json.dumps(
        {
            "summary": result.summary,
            "identifiers": [i.value for i in result.identifiers],
            "quality": result.quality.to_dict(),
            "notes": list(result.notes),
            "errors": list(result.errors),
        }
    )


@pytest.mark.parametrize("policy", ["strict", "off", "custom"])
@pytest.mark.parametrize("summarizer", [copies_its_prompt, fails], ids=["copying", "fallback"])
async def test_no_secret_in_any_part_of_a_compaction(policy: IdentifierPolicy, summarizer) -> None:  # type: ignore[no-untyped-def]
    prompts: list[list[Message]] = []

    async def recording(prompt: list[Message]) -> str:
        prompts.append(prompt)
        return await summarizer(prompt)

    result = await compact(
        transcript(), previous_summary=None, previous_first_seq=None,
        counter=estimate_counter(), settings=settings(policy), summarize=recording,
    )
    assert result is not None and result.committed
    assert result.fallback == (None if summarizer is copies_its_prompt else "extractive")
    shown = "\n".join(m.text for p in prompts for m in p)
    dump = everything(result)
    for secret in SECRETS:
        assert secret not in shown, f"{secret} reached the summarizer"
        assert secret not in dump, f"{secret} reached the stored compaction"
    assert "[REDACTED:" in result.summary  # the facts stay, as markers
    assert "ORD-1042" in result.summary  # identifiers are still kept
    assert "exit code 3" in result.summary  # so is the tool failure, minus its secrets
