"""Messages that arrive mid-turn, driven the same way on every platform: one scenario per queue
mode (`gateway/turn/midturn.py`), run by `tests/channels/test_midturn_modes.py` through a real
adapter against its fake (Telegram, Slack, Discord) and through the web chat.

A scenario holds the model's first request open (a `Gate`, or a stream that stalls after a few
words), sends more messages while it is open, so they genuinely arrive mid-turn, then checks
what the model received and which replies the platform was asked to send."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from gateway.app import Gateway
from gateway.store import MessageRow
from gateway.turn.midturn import INTERRUPTED_NOTE
from tests.fakes import FakeOpenAI, fn, reply, stall_stream, tool_call
from tests.fakes.openai_server import StepLike

INTERRUPT_CUT = f"Let me think about …\n\n{INTERRUPTED_NOTE}"
"""The interrupted reply of the `interrupt` scenario: the four words streamed, and the note."""


class Chat(Protocol):
    """One person's direct chat with the bot on some platform."""

    async def send(self, text: str) -> None:
        """Send a message as the person; returns once the platform delivered it."""

    async def replies(self, n: int) -> list[str]:
        """Wait until the bot sent `n` replies in the chat; their texts, in order."""


class Gate:
    """A model step held open until `open()` (or `within` seconds)."""

    def __init__(self, within: float = 10.0) -> None:
        self._opened = asyncio.Event()
        self.within = within

    def hold(self, step: StepLike) -> StepLike:
        async def held(_body: dict[str, Any]) -> StepLike:
            async with asyncio.timeout(self.within):
                await self._opened.wait()
            return step

        return fn(held)

    def open(self) -> None:
        self._opened.set()


async def until(check: Callable[[], Awaitable[bool]], within: float = 5.0) -> None:
    """Poll `check` (a store read: nothing to wait on) until it holds."""
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


async def waiting(gateway: Gateway) -> list[MessageRow]:
    """Messages stored since the running turn claimed its own (the mid-turn arrivals)."""
    rows: list[MessageRow] = []
    for session in await gateway.store.sessions_with_pending():
        assert session.id is not None
        rows.extend(await gateway.store.arrivals(session.id))
    return rows


async def arrived(gateway: Gateway, n: int) -> None:
    """Wait until `n` messages arrived mid-turn (stored, their turn not started)."""

    async def enough() -> bool:
        return len(await waiting(gateway)) >= n

    await until(enough)


async def settle(gateway: Gateway) -> None:
    """Every turn finished, and time for a wrong extra one to show up."""
    await gateway.lanes.join()
    await asyncio.sleep(0.2)
    await gateway.lanes.join()


def conversation(body: dict[str, Any]) -> list[tuple[str, str]]:
    """A model request's messages after the system prompt: (role, text or the tool's name)."""
    out = []
    for m in body["messages"]:
        if m["role"] == "system":
            continue
        if m.get("tool_calls"):
            out.append((m["role"], "->" + ",".join(c["function"]["name"] for c in m["tool_calls"])))
        elif m["role"] == "tool":
            out.append(("tool", m.get("name") or ""))
        else:
            out.append((m["role"], m["content"] or ""))
    return out


def ends_with(body: dict[str, Any], *tail: tuple[str, str]) -> bool:
    got = conversation(body)
    return got[-len(tail) :] == list(tail)


# -- one scenario per queue mode ----------------------------------------------------------------


async def collect(gateway: Gateway, chat: Chat, llm: FakeOpenAI) -> None:
    """Both messages that arrived mid-turn are answered together, in one follow-up turn."""
    gate = Gate()
    llm.script(gate.hold(reply("first answer")))
    await chat.send("one")
    await llm.wait_for_requests(1)
    await chat.send("two")
    await chat.send("three")
    await arrived(gateway, 2)
    gate.open()
    assert await chat.replies(2) == ["first answer", "echo: three"]
    await settle(gateway)
    assert len(llm.requests) == 2
    assert ends_with(
        llm.requests[1],
        ("user", "one"), ("assistant", "first answer"), ("user", "two"), ("user", "three"),
    ), conversation(llm.requests[1])
    assert await chat.replies(2) == ["first answer", "echo: three"]  # and nothing more


async def followup(gateway: Gateway, chat: Chat, llm: FakeOpenAI) -> None:
    """Each message that arrived mid-turn gets a turn (and a reply) of its own, in order."""
    gate = Gate()
    llm.script(gate.hold(reply("first answer")))
    await chat.send("one")
    await llm.wait_for_requests(1)
    await chat.send("two")
    await chat.send("three")
    await arrived(gateway, 2)
    gate.open()
    assert await chat.replies(3) == ["first answer", "echo: two", "echo: three"]
    await settle(gateway)
    assert len(llm.requests) == 3
    second, third = conversation(llm.requests[1]), conversation(llm.requests[2])
    assert second[-3:] == [("user", "one"), ("assistant", "first answer"), ("user", "two")]
    assert ("user", "three") not in second
    assert third[-2:] == [("assistant", "echo: two"), ("user", "three")]


async def steer(gateway: Gateway, chat: Chat, llm: FakeOpenAI) -> None:
    """A message arriving during a tool round joins the running turn: the model sees it after
    the tool's result, before its next call; one reply answers both."""
    gate = Gate()
    llm.script(gate.hold(tool_call("current_time", {})), reply("both answered"))
    await chat.send("one")
    await llm.wait_for_requests(1)
    await chat.send("two")
    await arrived(gateway, 1)
    gate.open()
    assert await chat.replies(1) == ["both answered"]
    await settle(gateway)
    assert len(llm.requests) == 2  # no follow-up turn
    assert ends_with(
        llm.requests[1],
        ("user", "one"), ("assistant", "->current_time"), ("tool", "current_time"),
        ("user", "two"),
    ), conversation(llm.requests[1])
    assert await waiting(gateway) == []
    assert await chat.replies(1) == ["both answered"]


async def interrupt(gateway: Gateway, chat: Chat, llm: FakeOpenAI) -> None:
    """A message arriving while the model writes stops the turn: the words so far are stored
    (marked interrupted) and sent with a note, then the new message is answered."""
    llm.script(stall_stream(after_chunks=4, text="Let me think about this very carefully first"))
    await chat.send("one")
    await llm.wait_for_requests(1)

    async def writing() -> bool:
        sessions = await gateway.store.sessions_with_pending()
        turns = [gateway.runner.arrivals.turn(s.key) for s in sessions]
        return any(t is not None and t.partial for t in turns)

    await until(writing)
    await chat.send("two")
    cut = INTERRUPT_CUT
    assert await chat.replies(2) == [cut, "echo: two"]
    await settle(gateway)
    assert len(llm.requests) == 2
    assert ends_with(
        llm.requests[1], ("user", "one"), ("assistant", cut), ("user", "two")
    ), conversation(llm.requests[1])
    [session] = await gateway.store.list_sessions()
    assert session.id is not None
    history = await gateway.store.history(session.id)
    assert [(m.role, m.meta.get("status")) for m in history] == [
        ("user", None), ("assistant", "interrupted"), ("user", None), ("assistant", None),
    ]
    assert await gateway.store.sessions_with_pending() == []


SCENARIOS = {
    "collect": collect,
    "followup": followup,
    "steer": steer,
    "interrupt": interrupt,
}
