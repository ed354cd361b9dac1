"""Benchmark: 1,000 concurrent Telegram sessions × 10 messages through `gatehouse run`.

The gateway is a real subprocess: python-telegram-bot long-polls the fake Bot API, SQLite
stores everything, a zero-latency fake model acknowledges each message. Every session sends
two messages in a row (the second while the first is being answered), waits for both answers
and goes on; all sessions at once. Reported: lost messages (none allowed), per-session order
(answers and stored conversation), throughput, latency from the update being queued to the
``sendMessage`` that answers it (p50/p99/max), and the gateway process's peak RSS.

    .venv/bin/python bench/load.py [--sessions 1000] [--messages 10] [--quick] [--json out.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import json
import tempfile

from rich.console import Console
from rich.table import Table

from tests.helpers.telegram_load import run_load

ROWS = (
    ("sessions", "sessions", ""),
    ("messages", "messages", ""),
    ("answered", "answered", "all"),
    ("lost", "lost", "0"),
    ("order violations", "order_violations", "0"),
    ("messages/s", "msgs_per_s", ""),
    ("latency p50 ms", "p50_ms", ""),
    ("latency p99 ms", "p99_ms", ""),
    ("latency max ms", "max_ms", ""),
    ("gateway peak RSS MiB", "peak_rss_mb", ""),
    ("wall s", "wall_s", ""),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=10, help="messages per session")
    parser.add_argument("--concurrency", type=int, default=8, help="[gateway] max_concurrent_turns")
    parser.add_argument("--quick", action="store_true", help="100 sessions × 4 messages")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.messages = 100, 4
    with tempfile.TemporaryDirectory(prefix="gatehouse-load-") as tmp:
        run = asyncio.run(
            run_load(Path(tmp), args.sessions, args.messages, concurrency=args.concurrency,
                     reply_timeout=max(300.0, args.sessions * args.messages * 0.2))
        )
    row = run.row()
    table = Table(
        title=f"load: {args.sessions} Telegram sessions × {args.messages} messages at once, "
        "real PTB, fake Bot API, zero-latency model"
    )
    for col in ("measure", "value", "goal"):
        table.add_column(col, justify="left" if col == "measure" else "right")
    for title, key, goal in ROWS:
        table.add_row(title, "—" if row[key] is None else str(row[key]), goal)
    Console().print(table)
    ok = row["lost"] == 0 and row["order_violations"] == 0
    if args.json:
        args.json.write_text(json.dumps({"row": row, "ok": ok}, indent=2))
    if not ok:
        raise SystemExit("messages were lost or answered out of order")


if __name__ == "__main__":
    main()
