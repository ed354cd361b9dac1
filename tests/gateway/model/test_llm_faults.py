"""Fault injection against the fake model: every failure gives its documented behaviour (README,
"When the model fails"), one plain sentence to the user, and an intact session.

Intact means: the failed user message stays in the conversation, the error notice is stored
but never sent back to the model, nothing partial (a stalled stream's first words) is kept, and
the next message is answered with exactly the history it would have had anyway.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.app import Gateway
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import (
    FakeOpenAI,
    StepLike,
    context_overflow,
    error,
    fn,
    hang,
    malformed,
    rate_limited,
    reply,
    stall_stream,
)

KEY = "agent:main:webchat:direct:tester"
PARTIAL = "half-finished words that must vanish"
FAST = {"retry-after-ms": "10"}  # the SDK honours it; keeps the retry quick

FAULTS: dict[str, tuple[bool, list[StepLike], str]] = {
    # name: (streaming, steps that exhaust the retries, what the user reads)
    "429 twice (retry-after-ms honoured, then given up)": (
        False, [rate_limited(10), rate_limited(10)],
        "The model is rate-limited right now. Please try again in a minute.",
    ),
    "500 twice": (
        False, [error(500, headers=FAST), error(500, headers=FAST)],
        "The model endpoint failed (500). Please try again shortly.",
    ),
    "502 with an HTML body": (
        False, [error(502, "<html>bad gateway</html>", FAST)] * 2,
        "The model endpoint failed (502). Please try again shortly.",
    ),
    "no answer within the timeout": (
        False, [hang(), hang()],
        "The model did not answer within 0.3 s (2 attempts). Please try again in a moment.",
    ),
    "stream stalls mid-answer": (
        True, [stall_stream(3, PARTIAL)] * 2,
        "The model stopped answering for 0.3 s (2 attempts). Please try again in a moment.",
    ),
    "truncated JSON": (
        False, [malformed(), malformed()],
        "The model endpoint sent a malformed response. Please try again.",
    ),
    "JSON that is no completion": (
        False, [malformed('{"object": "list", "data": []}')] * 2,
        "The model endpoint sent a malformed response. Please try again.",
    ),
    "malformed stream event": (
        True, [malformed('{"choices": [{"delta": ')] * 2,
        "The model endpoint sent a malformed response. Please try again.",
    ),
}

RECOVERED: dict[str, tuple[bool, StepLike]] = {
    # one fault, then the retry succeeds (429/500/timeout/stall are covered in test_runner.py)
    "truncated JSON": (False, malformed()),
    "JSON that is no completion": (False, malformed('{"object": "list", "data": []}')),
    "malformed stream event": (True, malformed('{"choices": [{"delta": ')),
    "stall after the first words": (True, stall_stream(3, PARTIAL)),
}


@pytest.fixture
async def gateway_factory(
    fake_llm: FakeOpenAI, make_config: MakeConfig
) -> AsyncIterator[Any]:
    started: list[Gateway] = []

    async def start(stream: bool) -> RunningGateway:
        config = make_config(fake_llm, llm={"timeout": 0.3, "max_retries": 1, "stream": stream})
        gateway = Gateway(config)
        rg = RunningGateway(gateway)
        await gateway.start()
        started.append(gateway)
        return rg

    yield start
    for gateway in started:
        await gateway.stop()


def sent(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in body["messages"][1:]]


async def stored(rg: RunningGateway) -> list[tuple[str, str, str | None]]:
    session = await rg.gateway.store.get_session(KEY)
    assert session is not None and session.id is not None
    return [
        (m.role, m.text, m.meta.get("status")) for m in await rg.gateway.store.history(session.id)
    ]


@pytest.mark.parametrize("name", list(FAULTS))
async def test_fault_gives_a_clear_message_and_leaves_the_session_intact(
    name: str, fake_llm: FakeOpenAI, gateway_factory: Any
) -> None:
    stream, steps, message = FAULTS[name]
    rg: RunningGateway = await gateway_factory(stream)
    fake_llm.script(reply("one"))
    assert await rg.ask("first") == ["one"]
    before = len(fake_llm.requests)

    fake_llm.script(*steps)
    assert await rg.ask("does this fail?") == [message]
    assert len(fake_llm.requests) - before == len(steps)

    fake_llm.script(reply("back again"))
    assert await rg.ask("next?") == ["back again"]
    assert sent(fake_llm.requests[-1]) == [
        ("user", "first"),
        ("assistant", "one"),
        ("user", "does this fail?"),
        ("user", "next?"),
    ]
    assert await stored(rg) == [
        ("user", "first", None),
        ("assistant", "one", None),
        ("user", "does this fail?", None),
        ("assistant", message, "error"),
        ("user", "next?", None),
        ("assistant", "back again", None),
    ]
    session = await rg.gateway.store.get_session(KEY)
    assert session is not None and session.last_error is None  # cleared by the good turn


@pytest.mark.parametrize("name", list(RECOVERED))
async def test_one_fault_is_retried_and_leaves_no_trace(
    name: str, fake_llm: FakeOpenAI, gateway_factory: Any
) -> None:
    stream, fault = RECOVERED[name]
    rg: RunningGateway = await gateway_factory(stream)
    fake_llm.script(fault, reply("whole answer"))
    assert await rg.ask("hello") == ["whole answer"]
    assert len(fake_llm.requests) == 2
    assert await stored(rg) == [("user", "hello", None), ("assistant", "whole answer", None)]
    assert PARTIAL not in str(fake_llm.requests[-1]["messages"])


async def test_retry_after_is_waited_out_before_the_retry(
    fake_llm: FakeOpenAI, gateway_factory: Any
) -> None:
    rg: RunningGateway = await gateway_factory(False)
    arrivals: list[float] = []

    def at(step: StepLike) -> StepLike:
        def record(_body: dict[str, Any]) -> StepLike:
            arrivals.append(time.monotonic())
            return step

        return fn(record)

    fake_llm.script(at(rate_limited(400)), at(reply("after the wait")))
    assert await rg.ask("busy?") == ["after the wait"]
    assert arrivals[1] - arrivals[0] >= 0.4


async def test_context_overflow_with_nothing_to_compact_keeps_the_session(
    fake_llm: FakeOpenAI, gateway_factory: Any
) -> None:
    rg: RunningGateway = await gateway_factory(False)
    fake_llm.script(reply("one"), context_overflow(8192, 9000))
    assert await rg.ask("first") == ["one"]
    [answer] = await rg.ask("a very long paste")
    assert answer.startswith("This conversation no longer fits model 'fake-model': about ")
    assert "tokens against a 200,000-token window" in answer
    fake_llm.script(reply("fits again"))
    assert await rg.ask("short one") == ["fits again"]
    assert sent(fake_llm.requests[-1]) == [
        ("user", "first"), ("assistant", "one"), ("user", "a very long paste"), ("user", "short one"),
    ]
