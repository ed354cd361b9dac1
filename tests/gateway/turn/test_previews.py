"""PreviewStream's throttling and failure rules, the Previews factory, and the provider's
streamed-text callback (through the real openai SDK and the fake OpenAI server).

The platform round trips (real PTB / slack-bolt / discord.py against their fakes) are in
tests/channels/test_*_preview.py.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from channels.base import ChannelCapabilities, InboundHandler, OutboundMessage
from channels.console import ConsoleChannel
from context.types import Message
from gateway.config import LLMSection, parse_config
from gateway.model.llm import LLMProvider
from gateway.turn.previews import Previews, PreviewStream
from tests.fakes import FakeOpenAI, reply

INTERVAL = 0.05


@dataclass
class Shown:
    kind: str  # "send" | "edit"
    text: str
    started: float
    ended: float = 0.0


@dataclass
class Board:
    """A channel that keeps its messages in memory: records every preview call with its start
    and end time; `gate` holds calls until it is set; `fail_edits` / `fail_send` make them raise."""

    name: str = "board"
    capabilities: ChannelCapabilities = field(
        default_factory=lambda: ChannelCapabilities(max_message_chars=500, edits=True)
    )
    calls: list[Shown] = field(default_factory=list)
    gate: asyncio.Event | None = None
    fail_edits: bool = False
    fail_send: bool = False
    in_flight: int = 0
    most_in_flight: int = 0
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def until(self, predicate: Callable[[], bool], timeout: float = 2.0) -> None:  # noqa: ASYNC109
        """Wait until `predicate` holds (checked whenever a call starts or ends)."""
        async with asyncio.timeout(timeout), self.changed:
            await self.changed.wait_for(predicate)

    async def start(self, on_message: InboundHandler) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def send(self, message: OutboundMessage) -> None:
        return None

    async def send_preview(self, message: OutboundMessage) -> str:
        await self._call("send", message.text, self.fail_send)
        return "m1"

    async def edit(
        self, chat_id: str, message_id: str, text: str, thread_id: str | None = None
    ) -> None:
        assert (chat_id, message_id, thread_id) == ("c1", "m1", "t1")
        await self._call("edit", text, self.fail_edits)

    async def _call(self, kind: str, text: str, fail: bool) -> None:
        shown = Shown(kind, text, time.perf_counter())
        async with self.changed:
            self.calls.append(shown)
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.changed.notify_all()
        try:
            if self.gate is not None:
                await self.gate.wait()
            if fail:
                raise ConnectionError(f"{kind} refused")
        finally:
            shown.ended = time.perf_counter()
            self.in_flight -= 1
            async with self.changed:
                self.changed.notify_all()


TARGET = OutboundMessage(
    platform="board", chat_id="c1", thread_id="t1", text="", session_key="k", reply_to="u1"
)


def stream(board: Board, min_chars: int = 5, max_chars: int = 500) -> PreviewStream:
    return PreviewStream(board, TARGET, interval=INTERVAL, min_chars=min_chars, max_chars=max_chars)


async def test_nothing_is_shown_before_min_chars() -> None:
    board = Board()
    preview = stream(board, min_chars=10)
    preview.update("Hi")
    preview.update("Hi there")
    assert await preview.finish() is None
    assert board.calls == []


async def test_first_send_then_edits_at_most_once_per_interval() -> None:
    board = Board()
    preview = stream(board)
    text = ""
    for i in range(60):  # a token stream faster than the interval
        text += f" word{i}"
        preview.update(text)
        await asyncio.sleep(0.005)
    assert await preview.finish() == "m1"

    send, *edits = board.calls
    assert send.kind == "send" and send.text == "word0"
    assert len(edits) >= 2 and {e.kind for e in edits} == {"edit"}
    for before, after in itertools.pairwise(board.calls):
        assert after.started - before.ended >= INTERVAL
    assert board.most_in_flight == 1
    shown = [c.text for c in board.calls]
    assert all(text.strip().startswith(s) for s in shown)
    assert [len(s) for s in shown] == sorted({len(s) for s in shown})  # always newer text
    assert preview.edits == len(edits)


async def test_one_call_in_flight_and_the_latest_text_wins() -> None:
    board = Board()
    preview = stream(board)
    preview.update("first text")
    await board.until(lambda: len(board.calls) == 1 and board.in_flight == 0)
    board.gate = asyncio.Event()
    preview.update("second text")
    await board.until(lambda: len(board.calls) == 2)  # this edit hangs on the gate
    preview.update("third text")  # never blocks, even with an edit in flight
    preview.update("fourth text")
    await asyncio.sleep(3 * INTERVAL)
    assert [c.text for c in board.calls] == ["first text", "second text"]
    board.gate.set()
    await board.until(lambda: len(board.calls) == 3)
    assert board.calls[2].text == "fourth text"  # "third text" was never shown
    await preview.finish()
    assert board.most_in_flight == 1


async def test_finish_waits_for_the_preview_send_and_returns_its_id() -> None:
    board = Board(gate=asyncio.Event())
    preview = stream(board)
    preview.update("a preview in flight")
    await board.until(lambda: len(board.calls) == 1)
    finishing = asyncio.create_task(preview.finish())
    await asyncio.sleep(3 * INTERVAL)
    assert not finishing.done()
    preview.update("text after finish is ignored")
    board.gate.set()
    assert await finishing == "m1"
    assert [c.kind for c in board.calls] == ["send"]


async def test_finish_does_not_wait_out_the_interval() -> None:
    board = Board()
    preview = PreviewStream(board, TARGET, interval=60.0, min_chars=1, max_chars=500)
    preview.update("shown")
    await board.until(lambda: len(board.calls) == 1 and board.in_flight == 0)
    preview.update("never shown: the next edit would be a minute away")
    async with asyncio.timeout(1):
        assert await preview.finish() == "m1"
    assert len(board.calls) == 1


async def test_failed_edits_are_logged_and_stop_after_max_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    board = Board()
    preview = stream(board)
    preview.update("first text")
    await board.until(lambda: len(board.calls) == 1 and board.in_flight == 0)
    board.fail_edits = True
    text = "first text"
    for i in range(40):
        text += f" more{i}"
        preview.update(text)
        await asyncio.sleep(0.01)
    assert await preview.finish() == "m1"  # the reply can still try to edit it
    edits = [c for c in board.calls if c.kind == "edit"]
    assert len(edits) == PreviewStream.max_failures
    assert "preview edit on board for k failed: edit refused" in caplog.text
    assert "no more updates" in caplog.text


async def test_a_failed_send_means_no_preview(caplog: pytest.LogCaptureFixture) -> None:
    board = Board(fail_send=True)
    preview = stream(board)
    preview.update("a preview that never arrives")
    await board.until(lambda: len(board.calls) == 1 and board.in_flight == 0)
    preview.update("a preview that never arrives, longer")
    assert await preview.finish() is None
    assert len(board.calls) == 1
    assert "preview send on board for k failed" in caplog.text


async def test_a_new_model_call_shows_once_it_reaches_min_chars() -> None:
    board = Board()
    preview = stream(board, min_chars=10)
    preview.update("Let me look that up.")
    await board.until(lambda: len(board.calls) == 1 and board.in_flight == 0)
    preview.update("It is")  # a tool round later: the next call starts from nothing
    await asyncio.sleep(3 * INTERVAL)
    assert len(board.calls) == 1
    preview.update("It is noon in Paris.")
    await board.until(lambda: len(board.calls) == 2)
    assert board.calls[1].text == "It is noon in Paris."
    await preview.finish()


async def test_a_long_preview_shows_its_newest_text() -> None:
    board = Board()
    preview = stream(board, max_chars=40)
    text = " ".join(f"word{i}" for i in range(50))
    preview.update(text)
    await board.until(lambda: bool(board.calls))
    await preview.finish()
    [send] = board.calls
    assert len(send.text) <= 40
    assert send.text.startswith("…") and text.endswith(send.text[1:])


async def test_abort_stops_at_once() -> None:
    board = Board(gate=asyncio.Event())
    preview = stream(board)
    preview.update("a preview in flight")
    await board.until(lambda: len(board.calls) == 1)
    preview.abort()
    await board.until(lambda: board.in_flight == 0)  # the send was cancelled, its gate still shut
    assert not board.gate.is_set()
    assert preview.message_id is None


# -- which replies get a preview ------------------------------------------------------------


def test_previews_only_where_configured_and_able_to_edit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = parse_config(
        {
            "llm": {"stream": False},
            "channels": {
                "telegram": {"stream_preview": True, "stream_edit_interval_ms": 300,
                             "stream_min_chars": 7},
                "console": {"stream_preview": True},
            },
        }
    )
    board = Board(name="telegram")
    console = ConsoleChannel(user_id="me")
    with caplog.at_level(logging.INFO, logger="gateway.turn.previews"):
        previews = Previews(config.channels, {"telegram": board, "console": console}, False)
    assert "stream_preview is on for console, telegram while [llm] stream = false" in caplog.text

    opened = previews(OutboundMessage("telegram", "c1", "", "k"))
    assert isinstance(opened, PreviewStream)
    assert (opened.interval, opened.min_chars, opened.max_chars) == (0.3, 7, 500)
    assert opened.channel is board

    caplog.clear()
    assert previews(OutboundMessage("console", "me", "", "k")) is None  # cannot edit
    assert previews(OutboundMessage("console", "me", "", "k")) is None
    assert caplog.text.count("channels.console.stream_preview is on") == 1
    assert previews(OutboundMessage("slack", "C1", "", "k")) is None  # off there, and no channel
    assert previews(OutboundMessage("bench", "x", "", "k")) is None  # not a configured platform


# -- the provider's streamed-text callback --------------------------------------------------


async def test_on_text_gets_the_text_so_far_and_streams_the_call() -> None:
    async with FakeOpenAI() as fake:
        fake.script(reply("The answer is forty-two, as always."))
        settings = LLMSection(base_url=fake.base_url, api_key="x", model="m", stream=False)
        provider = LLMProvider(settings)
        seen: list[str] = []
        try:
            completion = await provider.complete(
                [Message(role="user", content="hi")], on_text=seen.append
            )
            plain = await provider.complete([Message(role="user", content="again")])
        finally:
            await provider.close()
    assert completion.message.text == "The answer is forty-two, as always."
    assert len(seen) > 3
    assert seen[-1] == completion.message.text
    assert all(b.startswith(a) and len(b) > len(a) for a, b in itertools.pairwise(seen))
    assert fake.requests[0]["stream"] is True  # asked for by on_text
    assert "stream" not in fake.requests[1]  # [llm] stream = false elsewhere
    assert plain.message.text == "echo: again"


async def test_a_failing_listener_never_fails_the_call(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []

    def broken(text: str) -> None:
        calls.append(text)
        raise ValueError("listener bug")

    async with FakeOpenAI() as fake:
        fake.script(reply("one two three four"))
        provider = LLMProvider(LLMSection(base_url=fake.base_url, api_key="x", model="m"))
        try:
            completion = await provider.complete([Message(role="user", content="hi")], on_text=broken)
        finally:
            await provider.close()
    assert completion.message.text == "one two three four"
    assert len(calls) == 1  # dropped after it raised
    assert len(fake.requests) == 1  # not mistaken for a malformed response and retried
    assert "streamed-text listener failed" in caplog.text
