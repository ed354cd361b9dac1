"""Benchmark: Slack messages through the fake Slack — bare bolt echo app vs. Gatehouse.

Latency is measured from pushing an ``events_api`` envelope at the fake (``FakeSlack.push_event``,
delivered over the Socket Mode WebSocket) to the reply's ``chat.postMessage`` arriving at the
fake. Both paths use slack-bolt's ``AsyncApp`` with the ``AsyncSocketModeHandler``.

- ``bare bolt echo app``: the floor — a minimal ``AsyncApp`` with a ``message`` listener that
  sends the text straight back with ``say()`` (one ``chat.postMessage``).
- ``gatehouse``: a real `Gateway` (tmp data dir, SQLite, ``dm_policy = "open"``) with the
  `SlackChannel`, answering through a zero-latency `FakeOpenAI` echo: dedupe, persist, session
  lane, prompt assembly, one chat-completion call, Markdown -> mrkdwn, ``chat.postMessage``.

``concurrency`` DM channels send in parallel; each waits for its reply before sending its next
message (so no two messages of one session are in flight). Everything shares one event loop on
loopback.

    .venv/bin/python bench/channel_slack.py [--messages 200] [--concurrency 20]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncio
import itertools
import logging
import re
import time
from typing import Any

from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp, AsyncSay
from slack_sdk.web.async_client import AsyncWebClient

from bench.common import (
    ROUNDS,
    WITH_MODEL,
    bench_gateway,
    channel_row,
    floors_and_gatehouse,
    model_call,
)
from channels.slack import SlackChannel
from tests.fakes.slack_server import ApiCall, FakeSlack, im_message

_MARK = re.compile(r"bench (\d+)")
_QUIET = logging.getLogger("bench.channel_slack.bolt")
_QUIET.setLevel(logging.WARNING)


async def _drive(fake: FakeSlack, messages: int, concurrency: int) -> tuple[float, list[float]]:
    """Send `messages` over `concurrency` DM channels; (wall seconds, per-message latencies)."""
    loop = asyncio.get_running_loop()
    waiting: dict[int, asyncio.Future[float]] = {}

    def on_call(call: ApiCall) -> None:
        if call.method != "chat.postMessage" or call.status != 200:
            return
        match = _MARK.search(str(call.params.get("text", "")))
        future = waiting.get(int(match.group(1))) if match else None
        if future is not None and not future.done():
            future.set_result(time.perf_counter())

    counter = itertools.count()
    latencies: list[float] = []

    async def chat(n: int) -> None:
        while (i := next(counter)) < messages:
            future: asyncio.Future[float] = loop.create_future()
            waiting[i] = future
            began = time.perf_counter()
            fake.push_event(im_message(f"bench {i}", user=f"U{n:05d}", channel=f"D{n:05d}"))
            latencies.append(await asyncio.wait_for(future, 30) - began)

    fake.on_call = on_call
    try:
        began = time.perf_counter()
        await asyncio.gather(*(chat(n) for n in range(concurrency)))
        wall = time.perf_counter() - began
    finally:
        fake.on_call = None
    return wall, latencies


async def _measured(fake: FakeSlack, messages: int, concurrency: int) -> tuple[float, list[float]]:
    # Warm-up: bolt's first auth.test, HTTP connections, sessions. Fresh message numbers only.
    await _drive(fake, concurrency, concurrency)
    return await _drive(fake, messages, concurrency)


async def _bare(messages: int, concurrency: int, llm_url: str | None = None) -> dict[str, Any]:
    async with model_call(llm_url) as answer, FakeSlack() as fake:
        app = AsyncApp(
            client=AsyncWebClient(token="xoxb-bench", base_url=fake.api_url),
            logger=_QUIET,
            request_verification_enabled=False,
        )

        @app.event("message")
        async def echo(event: dict[str, Any], say: AsyncSay) -> None:
            await say(text=await answer(event.get("text") or ""))

        handler = AsyncSocketModeHandler(app, "xapp-bench", logger=_QUIET)
        await handler.connect_async()  # type: ignore[no-untyped-call]
        try:
            await fake.wait_for_connection()
            wall, latencies = await _measured(fake, messages, concurrency)
        finally:
            await handler.close_async()  # type: ignore[no-untyped-call]
    path = "bare bolt echo app" + (WITH_MODEL if llm_url else "")
    return channel_row("slack", path, messages, wall, latencies)


async def _gatehouse(messages: int, concurrency: int) -> dict[str, Any]:
    async with FakeSlack() as fake:
        settings = {"bot_token": "xoxb-bench", "app_token": "xapp-bench", "base_url": fake.api_url}
        async with bench_gateway("slack", settings, SlackChannel, concurrency):
            wall, latencies = await _measured(fake, messages, concurrency)
    return channel_row("slack", "gatehouse", messages, wall, latencies)


async def measure(
    messages: int = 200, concurrency: int = 20, rounds: int = ROUNDS
) -> list[dict[str, Any]]:
    """The bare bolt echo floor, the same app asking the model first, and Gatehouse."""
    return await floors_and_gatehouse(_bare, _gatehouse, messages, concurrency, rounds)


if __name__ == "__main__":
    from bench.channels import run_alone

    run_alone("slack")
