"""Secrets stay out of every log line and every stored summary on the live path: a turn that
carries an API key, a provider error that quotes it back, a tool call with a token in its
arguments, and a `/compact` whose summarizer copies everything it is shown."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gateway.app import Gateway
from gateway.logging_setup import NOISY, SecretFilter, config_secrets
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import FakeOpenAI, error, reply, tool_call

KEY = "agent:main:webchat:direct:tester"
LLM_KEY = "sk-gateway-Qw3rTy7uI9oP1aS2dF4gH6jKzX"
PASTED_KEY = "sk-proj-Zq8xW2vN5mK1pR7tY4uI9oL3aS6dF0gH2jK4"
GITHUB_TOKEN = "ghp_8fK2mQ9xLp4Rt7Vw1Zs3Yb6Nc0Dh5Gj2Kl4M"
PASSWORD = "hunter2-Correct-Horse"
SECRETS = (LLM_KEY, PASTED_KEY, GITHUB_TOKEN, PASSWORD)


def is_summary_request(body: dict[str, Any]) -> bool:
    system = body["messages"][0]["content"] or ""
    return system.startswith(("You compress part of", "You merge partial summaries"))


def copying_summarizer(body: dict[str, Any]) -> Any:
    """Answers summary requests by repeating what it is shown of the conversation, secrets
    included (the worst case; the first 3,000 characters, where the secrets are, so that the
    summary is still smaller than the session); echoes chat turns."""
    text = str(body["messages"][-1].get("content") or "")[:3_000]
    if is_summary_request(body):
        return reply(
            "## Decisions\n" + text + "\n## Open TODOs\n- none\n## Constraints/Rules\n- none\n"
            "## Pending user asks\n- none\n## Exact identifiers\n- none"
        )
    return reply("noted: " + str(body["messages"][-1].get("content") or "")[:60])


@pytest.mark.parametrize("policy", ["strict", "off"])
async def test_no_secret_in_logs_or_summaries_over_a_turn_and_a_compaction(
    policy: str, make_config: MakeConfig, caplog: pytest.LogCaptureFixture
) -> None:
    async with FakeOpenAI(default=copying_summarizer) as fake:
        config = make_config(
            fake, llm={"api_key": LLM_KEY},
            context={"recent_turns": 1, "identifier_policy": policy},
        )
        # What `gatehouse` sets up: its log handler redacts (gateway.logging_setup).
        redact = SecretFilter()
        redact.protect(config_secrets(config))
        caplog.handler.addFilter(redact)  # pytest reuses this handler: removed below
        for noisy in NOISY:
            caplog.set_level(logging.WARNING, logger=noisy)
        caplog.set_level(logging.DEBUG)  # last: it also sets the capturing handler's level
        gateway = Gateway(config)
        rg = RunningGateway(gateway)
        await gateway.start()
        try:
            await rg.ask(f"Here is our key {PASTED_KEY}; the db password={PASSWORD}")
            fake.script(
                tool_call("current_time", {"timezone": "UTC", "token": GITHUB_TOKEN}),
                reply("It is noon."),
            )
            await rg.ask("what time is it? use my token " + GITHUB_TOKEN)
            fake.script(error(400, {"error": {"message": f"the key {PASTED_KEY} was refused"}}))
            await rg.ask("try the key again")
            for i in range(3):
                filler = " ".join(f"detail{j}" for j in range(400))
                await rg.ask(f"step {i}: remember {PASTED_KEY} for later. {filler}")
            [notice] = await rg.ask(f"/compact keep every detail, even {GITHUB_TOKEN}")
        finally:
            await gateway.stop()
            caplog.handler.removeFilter(redact)
        session = await gateway.store.get_session(KEY)
    assert session is not None and session.id is not None
    assert notice.startswith("Compacted the conversation")
    logged = caplog.text
    assert "turn failed" in logged and "compaction" in logged  # the lines exist...
    for secret in SECRETS:
        assert secret not in logged  # ...without the secrets
        assert secret not in notice
    summary_requests = [b for b in fake.requests if is_summary_request(b)]
    assert summary_requests, "the summarizer was called"
    for body in summary_requests:
        for secret in SECRETS:
            assert secret not in str(body)
    store = Gateway(config).store
    try:
        [compaction] = await store.compactions(session.id)
    finally:
        await store.close()
    stored = compaction.summary + str(compaction.quality)
    for secret in SECRETS:
        assert secret not in stored
    assert "[REDACTED:" in compaction.summary


BENIGN_LOG_LINES = [
    "token counter for model 'gpt-4o': tiktoken:o200k_base",
    "counting with tiktoken:cl100k_base (o200k_base unavailable) instead",
    "context agent:main:telegram:direct:5000: window=128000 (table) counter=tiktoken:cl100k_base",
    "compaction agent:main:webchat:direct:tester (command): seq 1-12, 577 -> 1596 tokens",
    "telegram: started as @gatehouse_bot (polling mode)",
    "max_tokens: 4096, reserve_tokens=20000",
]


@pytest.mark.parametrize("line", BENIGN_LOG_LINES)
def test_redaction_leaves_ordinary_log_lines_alone(line: str) -> None:
    assert SecretFilter().redact(line) == line


def test_redaction_masks_configured_values_and_secret_shapes() -> None:
    redact = SecretFilter()
    redact.protect(["7212345678:AAHk3v9QxYp2Lm8Rt4Zs1Wn6Bc0Df5Gh7Jk", "x", None])
    line = (
        "Set Bot API URL: http://127.0.0.1:1/bot7212345678:AAHk3v9QxYp2Lm8Rt4Zs1Wn6Bc0Df5Gh7Jk "
        f"text={PASTED_KEY!r} accessToken: abcd1234efgh"
    )
    assert redact.redact(line) == (
        "Set Bot API URL: http://127.0.0.1:1/bot[REDACTED:config] "
        "text='[REDACTED:openai_key]' accessToken: [REDACTED:credential]"
    )
    assert redact.literals == ["7212345678:AAHk3v9QxYp2Lm8Rt4Zs1Wn6Bc0Df5Gh7Jk"]  # not "x"
