"""Load, scaled down: 50 Telegram sessions × 4 messages at once through `gatehouse run` and the
real python-telegram-bot; none lost, each answered once, in order. `bench/load.py` runs
1,000 × 10 and reports p99 latency and peak RSS."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.telegram_load import run_load


async def test_fifty_sessions_at_once_lose_nothing_and_keep_order(tmp_path: Path) -> None:
    run = await run_load(tmp_path, sessions=50, per_session=4, reply_timeout=120)
    assert run.lost == []
    assert run.reply_order_violations == []  # each answered once, in the order sent
    assert run.stored_order_violations == []  # and stored in that order
    assert len(run.latencies) == run.messages
    assert run.peak_rss_mb is None or run.peak_rss_mb > 0
