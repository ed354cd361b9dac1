"""The "typing…" indicator a turn shows while it runs longer than `typing_delay_ms`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

Typing = Callable[[str, str, str | None], Awaitable[None]]
"""Shows "typing…" once in (platform, chat id, thread id)."""
TYPING_REFRESH_SECONDS = 5.0


def typing_later(
    typing: Typing | None, delay: float, platform: str, chat_id: str, thread_id: str | None
) -> Callable[[], None]:
    """Show "typing…" once the turn has run `delay` seconds; returns what stops it.

    Not for a reply that is ready sooner: the indicator would only flash, and it costs one
    platform API call per message. A timer, not a task, until then: most turns never need one.
    """
    if typing is None:
        return _nothing
    loop = asyncio.get_running_loop()
    shown: list[asyncio.Task[None]] = []

    def start() -> None:
        shown.append(loop.create_task(_keep_typing(typing, platform, chat_id, thread_id)))

    timer = loop.call_later(delay, start)

    def stop() -> None:
        timer.cancel()
        for task in shown:
            task.cancel()

    return stop


async def _keep_typing(typing: Typing, platform: str, chat_id: str, thread_id: str | None) -> None:
    """Show "typing…" until cancelled (platforms expire it after a few seconds: renewed)."""
    while True:
        try:
            await typing(platform, chat_id, thread_id)
        except Exception as exc:  # typing is cosmetic: never fail a turn over it
            log.debug("typing indicator failed on %s: %s", platform, exc)
            return
        await asyncio.sleep(TYPING_REFRESH_SECONDS)


def _nothing() -> None:
    """Nothing to stop."""
