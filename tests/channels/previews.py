"""Shared pieces of the streamed-preview tests (one per platform, each through its real SDK)."""

from __future__ import annotations

import itertools
from typing import Any

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
