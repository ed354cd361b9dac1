"""Benchmark: the Discord adapter end to end vs a bare discord.py echo bot, on the same fake.

Both paths run the genuine discord.py client against ``tests.fakes.discord_server.FakeDiscord``
(REST + gateway on loopback). Latency is the time from queueing a MESSAGE_CREATE dispatch at the
fake gateway to the reply's ``POST /channels/{id}/messages`` arriving at the fake. ``concurrency``
users each DM the bot (one DM channel, so one session each) and send their next message when
the previous one was answered.

- "bare discord.py echo bot": a minimal ``discord.Client`` whose ``on_message`` sends the text
  back — the SDK's own floor.
- "gatehouse": a `Gateway` (tmp data dir, SQLite, ``dm_policy="open"``) with `DiscordChannel`,
  answering through a zero-latency ``tests.fakes.FakeOpenAI`` (which echoes).

    .venv/bin/python bench/channel_discord.py [--messages 200] [--concurrency 20]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncio
import itertools
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import discord
import discord.gateway
import discord.http
import yarl

from bench.common import (
    ROUNDS,
    WITH_MODEL,
    bench_gateway,
    channel_row,
    floors_and_gatehouse,
    model_call,
)
from channels.discord import DiscordChannel, discord_intents
from tests.fakes.discord_server import FakeDiscord, RecordedCall

__all__ = ["measure"]

PLATFORM = "discord"
BARE = "bare discord.py echo bot"
GATEHOUSE = "gatehouse"
_TOKEN = re.compile(r"\bbench-(\d+)-end\b")
REPLY_TIMEOUT = 30.0


async def _drive(fake: FakeDiscord, messages: int, concurrency: int, label: str) -> dict[str, Any]:
    """Send ``messages`` DMs from ``concurrency`` users; time each until its reply arrives."""
    waiting: dict[int, asyncio.Future[float]] = {}

    def on_call(call: RecordedCall) -> None:
        if call.method != "POST" or call.status != 200 or not call.path.endswith("/messages"):
            return
        match = _TOKEN.search(str((call.json or {}).get("content", "")))
        future = waiting.pop(int(match.group(1)), None) if match else None
        if future is not None and not future.done():
            future.set_result(call.at)

    fake.listeners.append(on_call)
    numbers = itertools.count()
    users = [fake.user(str(10**18 + i), f"user{i}") for i in range(concurrency)]

    async def one(user: dict[str, Any]) -> float:
        n = next(numbers)
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        waiting[n] = future
        started = time.perf_counter()
        fake.dm_message(f"bench-{n}-end", author=user)
        arrived = await asyncio.wait_for(future, REPLY_TIMEOUT)
        return (arrived - started) * 1000

    try:
        # Warm-up (untimed): one message per user opens the DM channels and HTTP connections.
        await asyncio.gather(*(one(user) for user in users))
        latencies: list[float] = []
        remaining = itertools.count()

        async def worker(user: dict[str, Any]) -> None:
            while next(remaining) < messages:
                latencies.append(await one(user))

        started = time.perf_counter()
        await asyncio.gather(*(worker(user) for user in users))
        wall = time.perf_counter() - started
    finally:
        fake.listeners.remove(on_call)
    return channel_row(PLATFORM, label, len(latencies), wall, [ms / 1000 for ms in latencies])


async def _with_endpoints(fake: FakeDiscord, run: Callable[[], Awaitable[Any]]) -> Any:
    """Point discord.py's process-wide REST and gateway URLs at the fake while ``run`` runs."""
    ws_cls = discord.gateway.DiscordWebSocket
    saved = discord.http.Route.BASE, ws_cls.DEFAULT_GATEWAY
    discord.http.Route.BASE = fake.api_base_url
    ws_cls.DEFAULT_GATEWAY = yarl.URL(fake.gateway_url)
    try:
        return await run()
    finally:
        discord.http.Route.BASE, ws_cls.DEFAULT_GATEWAY = saved


async def measure_bare(
    messages: int, concurrency: int, llm_url: str | None = None
) -> dict[str, Any]:
    async with model_call(llm_url) as answer, FakeDiscord() as fake:

        async def run() -> dict[str, Any]:
            client = discord.Client(intents=discord_intents(), guild_ready_timeout=0.01)
            ready = asyncio.Event()

            @client.event
            async def on_ready() -> None:
                ready.set()

            @client.event
            async def on_message(message: discord.Message) -> None:
                if not message.author.bot:
                    await message.channel.send(await answer(message.content))

            task = asyncio.create_task(client.start(fake.token))
            try:
                await asyncio.wait_for(ready.wait(), 10)
                label = BARE + (WITH_MODEL if llm_url else "")
                return await _drive(fake, messages, concurrency, label)
            finally:
                await client.close()
                await asyncio.gather(task, return_exceptions=True)

        result: dict[str, Any] = await _with_endpoints(fake, run)
        return result


async def measure_gatehouse(messages: int, concurrency: int) -> dict[str, Any]:
    async with FakeDiscord() as fake:
        settings = {
            "token": fake.token,
            "api_base_url": fake.api_base_url,
            "gateway_url": fake.gateway_url,
            "require_mention": False,
        }

        def channel(section: Any) -> DiscordChannel:
            return DiscordChannel(section, guild_ready_timeout=0.01)

        async with bench_gateway("discord", settings, channel, concurrency, grace=5):
            return await _drive(fake, messages, concurrency, GATEHOUSE)


async def measure(
    messages: int = 200, concurrency: int = 20, rounds: int = ROUNDS
) -> list[dict[str, Any]]:
    """The bare discord.py echo bot (the floor), the same bot asking the model first, then
    Gatehouse."""
    return await floors_and_gatehouse(
        measure_bare, measure_gatehouse, messages, concurrency, rounds
    )


if __name__ == "__main__":
    from bench.channels import run_alone

    run_alone(PLATFORM)
