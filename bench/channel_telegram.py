"""Benchmark: Telegram messages through the fake Bot API — bare PTB echo bot vs. Gatehouse.

Latency is measured from queueing an update in the fake (``FakeTelegram.private_message``) to
the reply's ``sendMessage`` arriving at the fake; both paths long-poll ``getUpdates`` with PTB.

- ``bare PTB echo bot``: the floor — a minimal PTB `Application` (``concurrent_updates``) with a
  `MessageHandler` that sends the text straight back.
- ``gatehouse``: a real `Gateway` (tmp data dir, SQLite, ``dm_policy = "open"``) with the
  `TelegramChannel`, answering through a zero-latency `FakeOpenAI` echo: persist, session lane,
  prompt assembly, one chat-completion call, Markdown -> HTML, ``sendMessage``.

``concurrency`` private chats send in parallel; each chat waits for its reply before sending
its next message (so no two messages of one session are in flight, which Gatehouse would
answer with one collected reply). Everything shares one event loop on loopback.

    .venv/bin/python bench/channel_telegram.py [--messages 200] [--concurrency 20]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncio
import itertools
import re
import time
from typing import Any

from telegram import Update
from telegram.ext import ApplicationBuilder, ContextTypes, MessageHandler, filters

from bench.common import (
    ROUNDS,
    WITH_MODEL,
    bench_gateway,
    channel_row,
    floors_and_gatehouse,
    model_call,
)
from channels.telegram import TelegramChannel
from tests.fakes.telegram_server import Call, FakeTelegram

_MARK = re.compile(r"bench (\d+)")
_FIRST_USER = 10_000


async def _drive(fake: FakeTelegram, messages: int, concurrency: int) -> tuple[float, list[float]]:
    """Send `messages` over `concurrency` chats; (wall seconds, per-message latencies)."""
    loop = asyncio.get_running_loop()
    waiting: dict[int, asyncio.Future[float]] = {}

    def on_call(call: Call) -> None:
        if call.method != "sendMessage":
            return
        match = _MARK.search(str(call.params.get("text", "")))
        future = waiting.get(int(match.group(1))) if match else None
        if future is not None and not future.done():
            future.set_result(time.perf_counter())

    counter = itertools.count()
    latencies: list[float] = []

    async def chat(user_id: int) -> None:
        while (i := next(counter)) < messages:
            future: asyncio.Future[float] = loop.create_future()
            waiting[i] = future
            began = time.perf_counter()
            fake.private_message(user_id, f"bench {i}")
            latencies.append(await asyncio.wait_for(future, 30) - began)

    fake.on_call = on_call
    try:
        began = time.perf_counter()
        await asyncio.gather(*(chat(_FIRST_USER + n) for n in range(concurrency)))
        wall = time.perf_counter() - began
    finally:
        fake.on_call = None
    return wall, latencies


async def _measured(
    fake: FakeTelegram, messages: int, concurrency: int
) -> tuple[float, list[float]]:
    await _drive(fake, concurrency, concurrency)  # warm-up: connections, sessions, caches
    return await _drive(fake, messages, concurrency)


async def _bare(messages: int, concurrency: int, llm_url: str | None = None) -> dict[str, Any]:
    async with model_call(llm_url) as answer, FakeTelegram() as fake:

        async def echo(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
            message = update.effective_message
            if message is not None and message.text:
                await context.bot.send_message(message.chat_id, await answer(message.text))

        app = (
            ApplicationBuilder()
            .token(fake.token)
            .base_url(f"{fake.base_url}/bot")
            .concurrent_updates(True)
            .job_queue(None)
            .build()
        )
        app.add_handler(MessageHandler(filters.TEXT, echo))
        async with app:
            assert app.updater is not None
            await app.updater.start_polling(timeout=30)
            await app.start()
            try:
                wall, latencies = await _measured(fake, messages, concurrency)
            finally:
                await app.updater.stop()
                await app.stop()
    path = "bare PTB echo bot" + (WITH_MODEL if llm_url else "")
    return channel_row("telegram", path, messages, wall, latencies)


async def _gatehouse(messages: int, concurrency: int) -> dict[str, Any]:
    async with FakeTelegram() as fake:
        settings = {"token": fake.token, "base_url": fake.base_url}
        async with bench_gateway("telegram", settings, TelegramChannel, concurrency):
            wall, latencies = await _measured(fake, messages, concurrency)
    return channel_row("telegram", "gatehouse", messages, wall, latencies)


async def measure(
    messages: int = 200, concurrency: int = 20, rounds: int = ROUNDS
) -> list[dict[str, Any]]:
    """The bare PTB echo floor, the same bot asking the model first, and Gatehouse."""
    return await floors_and_gatehouse(_bare, _gatehouse, messages, concurrency, rounds)


if __name__ == "__main__":
    from bench.channels import run_alone

    run_alone("telegram")
