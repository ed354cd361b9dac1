"""Benchmark: each platform adapter end to end, side by side with a bare echo bot on the same
SDK and the same fake server (the SDK's own floor), with a zero-latency LLM.

Time is measured from an update injected at the fake platform server to the reply arriving
back at it. Goal: gateway overhead at most 2x the bare SDK round trip. A bare echo bot makes no
model call, and one openai SDK call alone costs more than a whole Discord round trip, so a third
row per platform is the bare bot asking the model first (one call to the same zero-latency fake,
in its own process): the least any bot that answers with a model can do. The goal column is the
gateway against that row, i.e. what the gateway itself (persistence, lanes, context assembly,
formatting) costs; the ratio to the echo bot is shown too.

At 1 message at a time the p50 is the round trip itself; at 20 every path is saturated and
the p50 also says how each path orders its queue (a bare bot serves some users first and starves
others: see its p99), so the mean, which is concurrency ÷ throughput, is printed too.

    .venv/bin/python bench/channels.py [--messages 200] [--concurrency 1 --concurrency 20]
                                       [--rounds 5] [--quick] [--json out.json] [--only discord]

`bench/channel_<platform>.py` alone is ``--only <platform> --concurrency 20`` (its options
are these).
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

from bench.common import ROUNDS, WITH_MODEL, paired_ratio

PLATFORMS = ("telegram", "slack", "discord")


async def main(argv: list[str] | None = None) -> None:
    """The table; also what each `bench/channel_<platform>.py` prints when run alone (with
    ``--only`` its platform), so a single platform's ratio is taken the same way."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument(
        "--concurrency", type=int, action="append",
        help="messages in flight at once (repeatable; default: 1, the round trip, and 20)",
    )
    parser.add_argument("--only", choices=PLATFORMS, action="append")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="runs of each path, interleaved; each number is their median")
    parser.add_argument("--quick", action="store_true", help="60 messages, 1 and 10 at a time")
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.concurrency = 60, args.concurrency or [1, 10]
    levels = args.concurrency or [1, 20]
    rows: list[dict[str, Any]] = []
    for concurrency in levels:
        for platform in args.only or PLATFORMS:
            module = importlib.import_module(f"bench.channel_{platform}")
            measured = await module.measure(args.messages, concurrency, args.rounds)
            rows.extend({**row, "concurrency": concurrency} for row in measured)
    table = Table(
        title=f"channels: {args.messages} messages, zero-latency LLM, each number the median of "
        f"{args.rounds} interleaved rounds, ratios taken round by round"
    )
    columns = ("platform", "at a time", "path", "msgs/s", "p50 ms", "p99 ms", "mean ms",
               "p50 vs bare", "p50 vs bare + model", "goal ≤ 2×")
    for col in columns:
        table.add_column(col, justify="left" if col in ("platform", "path") else "right")
    missed: list[str] = []
    for row in rows:
        same = [r for r in rows
                if r["platform"] == row["platform"] and r["concurrency"] == row["concurrency"]]
        bare = next(r for r in same if r["path"] != "gatehouse" and WITH_MODEL not in r["path"])
        asks = next((r for r in same if WITH_MODEL in r["path"]), None)
        ratio = paired_ratio(row, bare, "p50_ms") if row is not bare else None
        over_asks = (
            paired_ratio(row, asks, "p50_ms") if asks and row["path"] == "gatehouse" else None
        )
        # The gateway's own overhead: against the bare bot making the same one model call (the
        # echo bot makes none, and one SDK call alone outweighs a Discord round trip).
        goal = None if over_asks is None else over_asks <= 2
        if goal is False:
            missed.append(f"{row['platform']} at {row['concurrency']}")
        table.add_row(
            row["platform"], str(row["concurrency"]), row["path"], f"{row['msgs_per_s']:.0f}",
            f"{row['p50_ms']:.2f}", f"{row['p99_ms']:.2f}", f"{row['mean_ms']:.2f}",
            "" if ratio is None else f"×{ratio:.2f}",
            "" if over_asks is None else f"×{over_asks:.2f}",
            "" if goal is None else ("ok" if goal else "MISSED"),
        )
    console = Console(width=170)
    console.print(table)
    console.print(
        "goal (gateway p50 ≤ 2× the bare bot making the same model call): "
        + (f"missed for {', '.join(missed)}" if missed else "met on every platform and level")
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


def run_alone(platform: str) -> None:
    """`bench/channel_<platform>.py` run by itself: this table for its platform, 20 at a time
    unless the command line names levels (its other options are these)."""
    given = sys.argv[1:]
    level = [] if any(a.startswith("--concurrency") for a in given) else ["--concurrency", "20"]
    asyncio.run(main(["--only", platform, *level, *given]))


if __name__ == "__main__":
    asyncio.run(main())
