"""The runner against the real openai SDK and a fake OpenAI server on 127.0.0.1."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from channels.base import InboundMessage, OutboundMessage
from context.engine import DefaultContextEngine
from gateway.app import Gateway
from gateway.model.llm import NOT_CONFIGURED, LLMProvider
from gateway.model.sizing import ContextResolver
from gateway.model.summarizer import make_summary_call
from gateway.store import SessionInfo, Store
from gateway.tools.registry import ToolRegistry
from gateway.turn.outbox import SENT, Delivery
from gateway.turn.runner import Runner, TurnHooks
from gateway.turn.stats import TurnStats
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import (
    FakeOpenAI,
    Reply,
    context_overflow,
    error,
    fn,
    hang,
    malformed,
    rate_limited,
    reply,
    stall_stream,
    tool_call,
)


async def transcript(rg: RunningGateway, key: str) -> list[tuple[str, str | None]]:
    store = rg.gateway.store
    session = await store.get_session(key)
    assert session is not None and session.id is not None
    return [(m.role, m.text or None) for m in await store.history(session.id)]


async def test_reply_and_persisted_turn(running: RunningGateway, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(reply("hello there"))
    out = await running.webchat.submit("alice", "hi")
    assert out.replies == ["hello there"]
    assert out.session_key == "agent:main:webchat:direct:alice"
    assert await transcript(running, out.session_key) == [
        ("user", "hi"),
        ("assistant", "hello there"),
    ]
    body = fake_llm.requests[-1]
    assert body["messages"][0]["role"] == "system"
    assert body["messages"][-1] == {"role": "user", "content": "hi"}


async def test_history_is_sent_on_the_next_turn(
    running: RunningGateway, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script(reply("one"), reply("two"))
    await running.ask("first")
    await running.ask("second")
    sent = [(m["role"], m["content"]) for m in fake_llm.requests[-1]["messages"][1:]]
    assert sent == [("user", "first"), ("assistant", "one"), ("user", "second")]


async def test_a_turn_reads_its_history_with_its_claim(
    running: RunningGateway, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim's transaction reads the history too: no separate read per turn."""
    fake_llm.script(reply("one"), reply("two"))
    await running.ask("first")
    store = running.gateway.store
    separate_reads: list[object] = []
    read = store.summary_and_history

    async def counted(*args: object, **kwargs: object) -> object:
        separate_reads.append(args)
        return await read(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "summary_and_history", counted)
    await running.ask("second")
    assert separate_reads == []
    sent = [(m["role"], m["content"]) for m in fake_llm.requests[-1]["messages"][1:]]
    assert sent == [("user", "first"), ("assistant", "one"), ("user", "second")]


async def test_tool_loop_with_unknown_tool_and_bad_arguments(
    running: RunningGateway, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script(
        tool_call("no_such_tool", {}),
        tool_call("current_time", '{"timezone": 5'),
        tool_call("current_time", {"timezone": 5}),
        tool_call("current_time", {"timezone": "UTC"}),
        reply("it is noon"),
    )
    assert await running.ask("what time is it?") == ["it is noon"]
    tool_msgs = [m for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool"]
    assert "unknown tool 'no_such_tool'" in tool_msgs[0]["content"]
    assert "not valid JSON" in tool_msgs[1]["content"]
    assert "invalid arguments" in tool_msgs[2]["content"]
    assert tool_msgs[3]["content"][:2] == "20"  # an ISO timestamp
    # every tool call in the prompt is followed by its result
    assert fake_llm.requests[-1]["tools"][0]["function"]["name"] == "current_time"


async def test_a_reply_or_tool_result_with_a_nul_or_broken_surrogate_is_stored_and_sent(
    running: RunningGateway, fake_llm: FakeOpenAI
) -> None:
    """Model output is text from outside: a NUL (PostgreSQL text cannot hold it) or an
    unpaired surrogate (UTF-8 cannot) used to fail the turn's end, and the person got nothing."""
    fake_llm.script(
        tool_call("no\x00such\ud800tool", {}),
        reply("a\x00b\ud800c"),
    )
    assert await running.ask("hi") == ["ab\ufffdc"]
    session = await running.gateway.store.get_session("agent:main:webchat:direct:tester")
    assert session is not None and session.id is not None
    stored = await running.gateway.store.history(session.id)
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[1].tool_calls[0].name == "nosuch\ufffdtool"
    assert "unknown tool 'nosuch\ufffdtool'" in str(stored[2].content)
    assert stored[3].content == "ab\ufffdc"


async def test_server_errors_are_retried_then_explained(
    running: RunningGateway, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script(error(500), reply("recovered"))
    assert await running.ask("hello") == ["recovered"]
    fake_llm.script(error(503), error(503), error(503))
    [answer] = await running.ask("again")
    assert "failed (503)" in answer
    # the session stays consistent: the failed exchange is kept, the error notice is not sent
    fake_llm.script(reply("fine now"))
    assert await running.ask("and now?") == ["fine now"]
    sent = [(m["role"], m["content"]) for m in fake_llm.requests[-1]["messages"][1:]]
    assert sent == [
        ("user", "hello"),
        ("assistant", "recovered"),
        ("user", "again"),
        ("user", "and now?"),
    ]


async def test_rate_limit_with_retry_after_is_retried_by_the_sdk(
    running: RunningGateway, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script(rate_limited(5), reply("ok"))
    assert await running.ask("hi") == ["ok"]


async def test_timeout_and_malformed_responses(
    fake_llm: FakeOpenAI, make_config: MakeConfig
) -> None:
    config = make_config(fake_llm, llm={"timeout": 0.3, "max_retries": 1})
    gateway = Gateway(config)
    rg = RunningGateway(gateway)
    await gateway.start()
    try:
        fake_llm.script(hang(), reply("second try"))
        assert await rg.ask("slow?") == ["second try"]
        fake_llm.script(hang(), hang())
        [answer] = await rg.ask("slower?")
        assert "did not answer within 0.3 s" in answer
        fake_llm.script(malformed(), malformed(), malformed())
        [answer] = await rg.ask("broken?")
        assert "malformed" in answer
    finally:
        await gateway.stop()


async def test_stalled_stream_is_retried(fake_llm: FakeOpenAI, make_config: MakeConfig) -> None:
    config = make_config(fake_llm, llm={"timeout": 0.3, "max_retries": 1, "stream": True})
    gateway = Gateway(config)
    rg = RunningGateway(gateway)
    await gateway.start()
    try:
        fake_llm.script(stall_stream(after_chunks=1), reply("streamed fine"))
        assert await rg.ask("stream please") == ["streamed fine"]
        assert fake_llm.requests[-1]["stream"] is True
    finally:
        await gateway.stop()


async def test_context_overflow_is_reported(running: RunningGateway, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(context_overflow(8192, 9000))
    [answer] = await running.ask("huge")
    # nothing to compact in a first message: the user is told tokens, window and model
    assert "no longer fits model 'fake-model'" in answer
    assert "200,000-token window" in answer


async def test_messages_arriving_mid_turn_are_collected(
    running: RunningGateway, fake_llm: FakeOpenAI
) -> None:
    fake_llm.latency = 0.2
    first = asyncio.create_task(running.webchat.submit("bob", "one"))
    await fake_llm.wait_for_requests(1)
    rest = [asyncio.create_task(running.webchat.submit("bob", t)) for t in ("two", "three")]
    replies = await asyncio.gather(first, *rest)
    assert len(fake_llm.requests) == 2, "the two mid-turn messages make exactly one more turn"
    assert replies[1].replies == replies[2].replies
    last = [(m["role"], m["content"]) for m in fake_llm.requests[1]["messages"][1:]]
    assert last[-2:] == [("user", "two"), ("user", "three")]


async def test_no_endpoint_configured(make_config: MakeConfig) -> None:
    gateway = Gateway(make_config())
    rg = RunningGateway(gateway)
    await gateway.start()
    try:
        assert await rg.ask("hello?") == [NOT_CONFIGURED]
    finally:
        await gateway.stop()


async def test_bad_input_gets_a_polite_reply_and_is_not_stored(
    running: RunningGateway, fake_llm: FakeOpenAI
) -> None:
    _key, [answer] = await running.console.ask("   \n ")
    assert "empty" in answer
    _key, [answer] = await running.console.ask("x" * 1_000_001)
    assert "1,000,001 characters" in answer
    assert fake_llm.requests == []
    assert await running.gateway.store.message_count() == 0


async def test_lone_surrogates_are_replaced(running: RunningGateway, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(reply("ok"))
    assert await running.ask("bad \ud800 text") == ["ok"]
    assert fake_llm.requests[-1]["messages"][-1]["content"] == "bad \ufffd text"


async def test_interrupted_turn_resumes_after_restart(
    fake_llm: FakeOpenAI, make_config: MakeConfig
) -> None:
    config = make_config(fake_llm)
    gateway = Gateway(config)
    rg = RunningGateway(gateway)
    await gateway.start()
    fake_llm.script(hang())
    task = asyncio.create_task(rg.webchat.submit("carol", "don't lose me"))
    await fake_llm.wait_for_requests(1)
    await gateway.stop(grace=0.05)
    with pytest.raises(ConnectionAbortedError):
        await task  # the caller is told; the message stays stored
    # Restart: the message is answered exactly once.
    fake_llm.clear()
    fake_llm.script(reply("here you go"))
    gateway2 = Gateway(config)
    rg2 = RunningGateway(gateway2)
    delivered: list[str] = []
    original = rg2.webchat.send

    async def spy(message):  # type: ignore[no-untyped-def]
        delivered.append(message.text)
        await original(message)

    rg2.webchat.send = spy  # type: ignore[method-assign]
    await gateway2.start()
    await fake_llm.wait_for_requests(1)
    await gateway2.lanes.join()
    assert delivered == ["here you go"]
    assert fake_llm.requests[0]["messages"][-1]["content"] == "don't lose me"
    await gateway2.stop()


async def test_a_runner_gets_its_collaborators_when_it_is_built(
    fake_llm: FakeOpenAI, make_config: MakeConfig
) -> None:
    """No Gateway: the runner alone, with what it reports to and sends through handed in."""
    config = make_config(fake_llm, gateway={"typing_delay_ms": 0})
    store = Store(config.database_url)
    await store.init()
    llm = LLMProvider(config.llm)
    resolver = ContextResolver(config, llm)
    sent: list[OutboundMessage] = []
    typing: list[str] = []
    turns: list[TurnStats] = []

    async def deliver(message: OutboundMessage) -> Delivery:
        sent.append(message)
        return SENT

    async def show_typing(platform: str, chat_id: str, thread_id: str | None) -> None:
        typing.append(chat_id)

    async def slow(body: dict[str, Any]) -> Reply:
        await asyncio.sleep(0.05)  # long enough for the typing indicator
        return reply("built, not patched")

    runner = Runner(
        config, store, DefaultContextEngine(), llm, ToolRegistry(), deliver, resolver,
        make_summary_call(config, llm),
        hooks=TurnHooks(typing=show_typing, on_turn=turns.append),
    )
    info = SessionInfo(key="k", platform="webchat", chat_type="direct", chat_id="dana")
    message = InboundMessage(
        platform="webchat", chat_type="direct", chat_id="dana", sender_id="dana", text="hi"
    )
    try:
        await store.accept_inbound(info, message)
        fake_llm.script(fn(slow))
        await runner.run_turn("k")
    finally:
        await llm.close()
        await store.close()
    assert [m.text for m in sent] == ["built, not patched"]
    assert typing == ["dana"]
    assert [(t.session_key, t.error) for t in turns] == [("k", None)]
    assert turns[0].window is not None and turns[0].local_prompt_tokens
