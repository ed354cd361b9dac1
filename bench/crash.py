"""Benchmark: kill -9 `gatehouse run` during a Telegram burst, restart it, account for every message.

`gatehouse run` is a real subprocess with Telegram in polling mode (python-telegram-bot against
the fake Bot API) and a zero-latency fake model. The burst is queued at once, interleaved across
sessions; SIGKILL is sent once a share of it was answered; the gateway is started again on the
same SQLite file and runs until every message is answered. The table shows how often each
message was stored (SQLite) and answered (``sendMessage`` calls at the fake). "In doubt" counts
replies Telegram had received when the process died but whose delivery was not yet recorded:
the only replies that may be sent twice (see README, "Crash safety").

    .venv/bin/python bench/crash.py [--sessions 100] [--messages 10] [--trials 1] [--json out.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import json
import tempfile
from typing import Any

from rich.console import Console
from rich.table import Table

from tests.helpers.kill_restart import run_trial

COLUMNS = (
    ("trial", "trial"),
    ("messages", "messages"),
    ("answered at kill", "answered_at_kill"),
    ("unanswered in db at kill", "unanswered_at_kill"),
    ("updates redelivered", "redelivered_updates"),
    ("stored exactly once", "stored_exactly_once"),
    ("answered exactly once", "answered_exactly_once"),
    ("lost", "lost"),
    ("duplicated", "duplicated"),
    ("in doubt at kill", "replies_in_doubt"),
    ("order violations", "order_violations"),
    ("recovery s", "recovery_s"),
)

GOALS = {
    "stored_exactly_once": "all",
    "answered_exactly_once": "all",
    "lost": "0",
    "duplicated": "≤ in doubt",
    "order_violations": "0",
}


async def measure(sessions: int, per_session: int, trials: int, kill_fraction: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for n in range(1, trials + 1):
        with tempfile.TemporaryDirectory(prefix="gatehouse-crash-") as tmp:
            trial = await run_trial(
                Path(tmp), sessions, per_session, kill_fraction, timeout=max(120.0, sessions * per_session * 0.5)
            )
        rows.append({"trial": n, **trial.row()})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--messages", type=int, default=10, help="messages per session")
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--kill-at", type=float, default=0.35, help="share answered before SIGKILL")
    parser.add_argument("--quick", action="store_true", help="20 sessions x 10 messages")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.messages = 20, 10
    rows = asyncio.run(measure(args.sessions, args.messages, args.trials, args.kill_at))
    table = Table(
        title=f"kill -9 mid-burst: {args.sessions} Telegram sessions × {args.messages} messages, "
        "restart, every message accounted for"
    )
    table.add_column("measure")
    for row in rows:
        table.add_column(f"trial {row['trial']}", justify="right")
    table.add_column("goal", justify="right")
    for title, key in COLUMNS[1:]:
        goal = GOALS.get(key, "")
        table.add_row(title, *(str(row[key]) for row in rows), goal)
    Console().print(table)
    ok = all(r["lost"] == 0 and r["duplicated"] <= r["replies_in_doubt"] for r in rows)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "ok": ok}, indent=2))
    if not ok:
        raise SystemExit("a message was lost or answered twice outside the in-doubt window")


if __name__ == "__main__":
    main()
