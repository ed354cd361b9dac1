"""The typing indicator: only for turns slower than the delay, never failing a turn."""

from __future__ import annotations

import asyncio

from gateway.turn.typing_indicator import typing_later


async def test_a_quick_turn_shows_nothing() -> None:
    shown: list[tuple[str, str, str | None]] = []

    async def typing(platform: str, chat_id: str, thread_id: str | None) -> None:
        shown.append((platform, chat_id, thread_id))

    stop = typing_later(typing, 0.05, "telegram", "42", None)
    stop()
    await asyncio.sleep(0.1)
    assert shown == []


async def test_a_slow_turn_shows_typing_until_stopped() -> None:
    shown: list[tuple[str, str, str | None]] = []

    async def typing(platform: str, chat_id: str, thread_id: str | None) -> None:
        shown.append((platform, chat_id, thread_id))

    stop = typing_later(typing, 0.01, "slack", "C1", "t1")
    await asyncio.sleep(0.1)
    stop()
    assert shown == [("slack", "C1", "t1")]


async def test_a_failing_indicator_is_ignored() -> None:
    calls = 0

    async def typing(platform: str, chat_id: str, thread_id: str | None) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("platform down")

    stop = typing_later(typing, 0.0, "discord", "9", None)
    await asyncio.sleep(0.05)
    stop()
    assert calls == 1, "tried once, then given up without an error"


def test_without_a_typing_channel_there_is_nothing_to_stop() -> None:
    """No timer, no task (no event loop is even running here): the one shared no-op."""
    stop = typing_later(None, 0.0, "webchat", "x", None)
    assert stop is typing_later(None, 5.0, "slack", "y", "t")
    assert stop() is None
