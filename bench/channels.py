"""Benchmark: each platform adapter end to end, side by side with a bare echo bot on the same
SDK and the same fake server (the SDK's own floor), with a zero-latency LLM.

Time is measured from an update injected at the fake platform server to the reply arriving
back at it. Goal: gateway overhead at most 2x the bare SDK round trip.

    .venv/bin/python bench/channels.py [--messages 200] [--concurrency 20] [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PLATFORMS = ("telegram", "slack", "discord")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--only", choices=PLATFORMS, action="append")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quick", action="store_true", help="60 messages, 10 at a time")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.concurrency = 60, 10
    rows: list[dict[str, Any]] = []
    for platform in args.only or PLATFORMS:
        module = importlib.import_module(f"bench.channel_{platform}")
        rows.extend(await module.measure(args.messages, args.concurrency))
    table = Table(
        title=f"channels: {args.messages} messages, {args.concurrency} at a time, zero-latency LLM"
    )
    for col in ("platform", "path", "msgs/s", "p50 ms", "p99 ms", "p50 vs bare", "goal ≤ 2×"):
        table.add_column(col, justify="left" if col in ("platform", "path") else "right")
    bare: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["path"] != "gatehouse":
            bare[row["platform"]] = row
    for row in rows:
        floor = bare.get(row["platform"])
        ratio = row["p50_ms"] / floor["p50_ms"] if floor and row is not floor else None
        table.add_row(
            row["platform"], row["path"], f"{row['msgs_per_s']:.0f}", f"{row['p50_ms']:.2f}",
            f"{row['p99_ms']:.2f}",
            "" if ratio is None else f"×{ratio:.2f}",
            "" if ratio is None else ("ok" if ratio <= 2 else "MISSED"),
        )
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
