"""`gatehouse context compact` prints the prompt the next live call would carry after the
compaction, and `tokens_after` counts exactly that prompt with the live token authority."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from context.budget import BudgetSettings, make_budget
from gateway.model.tokenizer import load_counter
from tests.fakes import FakeOpenAI, reply
from tests.helpers.cli import in_process, run_cli, write_config

RED_LINE = "Never restart the primary during business hours."


def transcript(path: Path) -> None:
    """~40k tokens: identifier-rich chat and bulk tool output, then the latest ask."""
    rng = random.Random(11)
    lines: list[dict[str, Any]] = []
    for t in range(30):
        lines.append({"role": "user", "content": (
            f"Look at ORD-{88100 + t} and github.com/acme/infra-config on release/2026.{t % 12 + 1}."
            f" We decided to use plan {t} because canary {t} was stable."
        )})
        if t % 5 == 0:
            call = {"id": f"c{t}", "type": "function",
                    "function": {"name": "run", "arguments": json.dumps({"cmd": f"dump {t}"})}}
            lines.append({"role": "assistant", "content": None, "tool_calls": [call]})
            rows = "\n".join(
                f"{rng.randint(10**5, 10**6)}\t{rng.getrandbits(40):010x}\thost-{t}.internal"
                for _ in range(700)
            )
            lines.append({"role": "tool", "tool_call_id": f"c{t}", "content": rows})
        lines.append({"role": "assistant", "content": f"Checked ORD-{88100 + t}."})
    lines.append({"role": "user", "content": "Summarise where we are and deploy the last release."})
    path.write_text("\n".join(json.dumps(x) for x in lines), encoding="utf-8")


def summarizer(body: dict[str, Any]) -> Any:
    return reply(
        "## Decisions\n- plans 0-29 chosen because the canaries were stable\n"
        "## Open TODOs\n- none\n## Constraints/Rules\n- none\n"
        "## Pending user asks\n- Summarise where we are and deploy the last release.\n"
        "## Exact identifiers\n- `github.com/acme/infra-config`"
    )


async def test_context_compact_prints_the_live_prompt(tmp_path: Path) -> None:
    async with FakeOpenAI(default=summarizer) as fake:
        config = write_config(tmp_path, fake)
        workspace = tmp_path / "data" / "workspace"
        workspace.mkdir(parents=True)
        (workspace / "AGENTS.md").write_text(
            f"# Agent\n\n## Session Startup\n- Read MEMORY.md.\n\n## Red Lines\n- {RED_LINE}\n",
            encoding="utf-8",
        )
        path = tmp_path / "t.jsonl"
        transcript(path)
        code, out, err = await in_process(
            config, "context", "compact", str(path), "--window", "32000", "--json"
        )
    assert code == 0, err
    data = json.loads(out)
    assert data["committed"], data["quality"]["notes"]
    messages = data["messages"]
    # The same system prompt as a live turn (with the red lines), the summary, the refresh block
    # that names the lookup tool, and the kept turns ending with the latest ask.
    assert messages[0]["role"] == "system" and RED_LINE in messages[0]["content"]
    assert messages[1]["content"].startswith("[Summary of earlier conversation")
    refresh = messages[2]["content"]
    assert refresh.startswith("[Post-compaction context refresh]") and "history_search" in refresh
    assert messages[-1] == {
        "role": "user", "content": "Summarise where we are and deploy the last release."
    }
    # tokens_after is the printed prompt plus the tool schemas, with the live token authority.
    counter = load_counter("fake-model")
    from context.types import Message

    printed = counter.count_messages([Message.from_openai(m) for m in messages])
    assert 0 < data["tokens_after"] - printed < 2_000  # the tools' schemas
    assert data["tokens_after"] <= make_budget(32_000, BudgetSettings()).usable
    assert data["tokens_after"] < data["tokens_before"]
    assert data["identifiers_archived"] > 0
    assert "more identifiers from these messages are archived" in data["summary"]


async def test_context_compact_of_one_ask_and_135_rounds_keeps_the_ask(tmp_path: Path) -> None:
    """The reported case: a real-shaped agent run (one ask, 135 tool rounds, ~80k tokens) at
    32k printed the system message alone and "tokens 29,959 → 1,103; identifiers 0"."""
    from context.types import Message
    from tests.fakes.tool_loops import agent_run, loop_model

    run = agent_run(135)
    path = tmp_path / "agent-run.jsonl"
    path.write_text(run.jsonl("You are a coding agent."), encoding="utf-8")
    counter = load_counter("fake-model")
    true_tokens = sum(counter.count_message(m) for m in run.messages)
    async with FakeOpenAI(default=loop_model(run, "good")) as fake:
        write_config(tmp_path, fake)
        code, out, err = await run_cli(
            "context", "compact", str(path), "--window", "32000", "--json", cwd=tmp_path
        )
        assert code == 0, err
        code, text, err = await run_cli(
            "context", "compact", str(path), "--window", "32000", cwd=tmp_path
        )
    assert code == 0, err
    data = json.loads(out)
    assert data["committed"], data["quality"]["notes"]
    messages = data["messages"]
    asks = [m for m in messages if m["role"] == "user"]
    assert asks == [{"role": "user", "content": run.ask}], "the ask, verbatim, once"
    assert messages[1]["content"].startswith("[Summary of earlier conversation")
    newest = run.round_messages(run.rounds - 1)
    assert messages[-1]["content"] == newest[-1].text, "the newest round ends the prompt"
    assert true_tokens < data["tokens_before"] < true_tokens + 3_000, "the whole transcript"
    assert data["tokens_after"] <= make_budget(32_000, BudgetSettings()).usable
    prompt = "\n".join(str(m.get("content") or "") + json.dumps(m.get("tool_calls") or [])
                       for m in messages)
    archived = set(data["identifiers"])
    missing = [i for i in run.identifiers if i not in prompt and i not in archived]
    assert missing == []
    assert f"tokens {data['tokens_before']:,} → {data['tokens_after']:,}" in text
    assert "its ask pinned" in text
    assert counter.count_messages([Message.from_openai(m) for m in messages]) > 0
