"""One turn's handling of messages that arrive while it runs (gateway/turn/midturn.py): the
interruptible model call on its own, then the runner's boundaries through a real gateway."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from channels.base import InboundMessage
from gateway.app import Gateway
from gateway.config import ConfigError, parse_config
from gateway.model.llm import LLMError
from gateway.store import SessionInfo, Store
from gateway.tools.registry import Tool, ToolContext, default_registry
from gateway.turn.midturn import NOT_STARTED_NOTE, TOOL_NOT_RUN, MidTurn, queue_mode
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import FakeOpenAI, reply, tool_calls
from tests.helpers.midturn import Gate, arrived, conversation

INFO = SessionInfo(key="k", platform="webchat", chat_type="direct", chat_id="u")


def test_a_channel_overrides_the_gateway_default() -> None:
    config = parse_config(
        {"gateway": {"queue_mode": "followup"}, "channels": {"slack": {"queue_mode": "steer"}}},
        "test",
    )
    assert queue_mode(config, "slack") == "steer"
    assert queue_mode(config, "telegram") == "followup"
    assert queue_mode(config, "no-such-channel") == "followup"
    assert queue_mode(parse_config({}, "test"), "webchat") == "collect"
    with pytest.raises(ConfigError, match="queue_mode"):
        parse_config({"channels": {"discord": {"queue_mode": "queue"}}}, "test")


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    store = Store(database_url)
    await store.init()
    try:
        yield store
    finally:
        await store.close()


async def _arrive(store: Store, text: str, mid: str) -> None:
    message = InboundMessage(
        platform="webchat", chat_type="direct", chat_id="u", sender_id="u", text=text,
        platform_message_id=mid,
    )
    await store.accept_inbound(INFO, message)


async def _interruptible(store: Store) -> MidTurn:
    session = await store.ensure_session(INFO)
    assert session.id is not None
    turn = MidTurn("interrupt", store, session.id)
    assert not await turn.stop_due()  # the first look: nothing waits
    return turn


async def test_an_arrival_cancels_the_model_call(store: Store) -> None:
    turn = await _interruptible(store)
    cancelled = asyncio.Event()

    async def model() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    call = asyncio.create_task(turn.call(model()))
    await asyncio.sleep(0.05)
    await _arrive(store, "/status", "c1")  # a command never interrupts
    turn.wake()
    await asyncio.sleep(0.05)
    assert not call.done()
    await _arrive(store, "stop, do this instead", "m1")
    turn.wake()
    assert await asyncio.wait_for(call, 2) is None
    assert cancelled.is_set()
    assert turn.interrupt() == NOT_STARTED_NOTE and turn.interrupted


async def test_a_call_that_finishes_first_keeps_its_answer(store: Store) -> None:
    turn = await _interruptible(store)
    seen = turn.on_text(None)
    assert seen is not None  # interrupt keeps the text so far, preview or not
    seen("half")

    async def model() -> str:
        return "done"

    assert await turn.call(model()) == "done"
    assert turn.partial == "" and not turn.interrupted


async def test_a_store_that_cannot_be_read_never_stops_the_call(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    turn = await _interruptible(store)

    async def broken(_session_id: int) -> list[Any]:
        raise RuntimeError("database is locked")

    monkeypatch.setattr(store, "arrivals", broken)

    async def model() -> str:
        await asyncio.sleep(0.1)
        return "done"

    call = asyncio.create_task(turn.call(model()))
    await asyncio.sleep(0.02)
    turn.wake()
    assert await asyncio.wait_for(call, 2) == "done"


async def test_a_failing_call_fails_the_turn(store: Store) -> None:
    turn = await _interruptible(store)

    async def model() -> str:
        raise LLMError("the model is down", kind="unavailable")

    with pytest.raises(LLMError, match="down"):
        await turn.call(model())


async def test_cancelling_the_turn_cancels_the_call(store: Store) -> None:
    turn = await _interruptible(store)
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def model() -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    call = asyncio.create_task(turn.call(model()))
    await started.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.wait_for(cancelled.wait(), 1)


# -- through the runner -------------------------------------------------------------------------


class SlowTool:
    """A tool the test holds until it lets it finish."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.calls = 0

    async def handler(self, _args: dict[str, Any], _ctx: ToolContext) -> str:
        self.calls += 1
        self.started.set()
        await self.release.wait()
        return "slow result"


@pytest.fixture
async def slow_tool() -> SlowTool:
    return SlowTool()


async def _gateway(
    make_config: MakeConfig, fake_llm: FakeOpenAI, mode: str, tool: SlowTool
) -> RunningGateway:
    tools = default_registry()
    tools.register(
        Tool(
            name="slow", description="takes its time",
            parameters={"type": "object", "properties": {}}, handler=tool.handler,
        )
    )
    gateway = Gateway(make_config(fake_llm, gateway={"queue_mode": mode}), tools=tools)
    rg = RunningGateway(gateway)
    await gateway.start()
    return rg


async def test_interrupt_in_a_tool_round_finishes_the_running_tool_and_skips_the_rest(
    make_config: MakeConfig, fake_llm: FakeOpenAI, slow_tool: SlowTool
) -> None:
    rg = await _gateway(make_config, fake_llm, "interrupt", slow_tool)
    try:
        fake_llm.script(tool_calls(("slow", {}), ("slow", {})))
        first = asyncio.create_task(rg.ask("one"))
        await slow_tool.started.wait()
        second = asyncio.create_task(rg.ask("two"))
        await arrived(rg.gateway, 1)
        slow_tool.release.set()
        assert await asyncio.wait_for(first, 5) == [NOT_STARTED_NOTE]
        assert await asyncio.wait_for(second, 5) == ["echo: two"]
        assert slow_tool.calls == 1
        assert conversation(fake_llm.requests[1])[-6:] == [
            ("user", "one"), ("assistant", "->slow,slow"), ("tool", "slow"), ("tool", "slow"),
            ("assistant", NOT_STARTED_NOTE), ("user", "two"),
        ]
        results = [m["content"] for m in fake_llm.requests[1]["messages"] if m["role"] == "tool"]
        assert results == ["slow result", TOOL_NOT_RUN]
    finally:
        await rg.gateway.stop(grace=2)


async def test_steer_leaves_a_command_for_a_turn_of_its_own(
    make_config: MakeConfig, fake_llm: FakeOpenAI, slow_tool: SlowTool
) -> None:
    rg = await _gateway(make_config, fake_llm, "steer", slow_tool)
    try:
        gate = Gate()
        fake_llm.script(gate.hold(tool_calls(("current_time", {}))), reply("answered"))
        first = asyncio.create_task(rg.ask("one"))
        await fake_llm.wait_for_requests(1)
        second = asyncio.create_task(rg.ask("/status"))
        await arrived(rg.gateway, 1)
        gate.open()
        assert await asyncio.wait_for(first, 5) == ["answered"]
        [status] = await asyncio.wait_for(second, 5)
        assert "Model: `fake-model`" in status  # the gateway's own answer, not the model's
        assert len(fake_llm.requests) == 2
        assert ("user", "/status") not in conversation(fake_llm.requests[1])
    finally:
        await rg.gateway.stop(grace=2)
