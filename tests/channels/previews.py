"""Shared pieces of the streamed-preview tests (one per platform, each through its real SDK)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from channels.base import Channel
from gateway.app import Gateway
from gateway.config import Config
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI

INTERVAL_MS = 250
"""The smallest edit interval the config accepts: keeps the tests short."""
CHUNK_DELAY = 0.015
"""Seconds between the fake model's streamed words: a 50-word reply streams for ~0.8 s."""


def preview_settings(**extra: Any) -> dict[str, Any]:
    """Channel keys for a streamed preview that starts early and edits as often as allowed."""
    return {
        "stream_preview": True,
        "stream_edit_interval_ms": INTERVAL_MS,
        "stream_min_chars": 12,
        "dm_policy": "open",
        **extra,
    }


def streamed_reply(words: int = 50) -> str:
    """A reply long enough to stream for a while, with Markdown the final edit must render."""
    body = " ".join(f"word{i}" for i in range(words))
    return f"Here is **the answer** you asked for: {body}. Done."


def long_reply(chars: int) -> str:
    """A reply of about `chars` characters in few (long) words, so it streams quickly."""
    words = [f"w{i:03d}-" + "x" * 95 for i in range(chars // 100 + 1)]
    return "**Long** answer: " + " ".join(words)


def assert_spaced(times: list[float], interval_ms: int = INTERVAL_MS) -> None:
    """Consecutive preview calls (send, then edits) reached the server at least an interval apart."""
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap >= interval_ms / 1000 for gap in gaps), gaps


StartGateway = Callable[..., Awaitable[Gateway]]
"""``await start(llm={...}, **channel_keys)``: a started gateway with one platform channel."""


@asynccontextmanager
async def gateways(
    fake_llm: FakeOpenAI,
    make_config: MakeConfig,
    platform: str,
    connection: dict[str, Any],
    build: Callable[[Config], Channel],
) -> AsyncIterator[StartGateway]:
    """Starts gateways with a `platform` channel (its `connection` keys plus the test's own) on
    the streaming fake model; stops them all at the end."""
    started: list[Gateway] = []
    fake_llm.chunk_delay = CHUNK_DELAY

    async def start(llm: dict[str, Any] | None = None, **keys: Any) -> Gateway:
        section = {"enabled": True, **connection, **keys}
        config = make_config(fake_llm, channels={platform: section}, llm=llm or {})
        gateway = Gateway(config)
        gateway.add_channel(build(config))
        await gateway.start()
        started.append(gateway)
        return gateway

    try:
        yield start
    finally:
        for gateway in started:
            await gateway.stop(grace=2)
