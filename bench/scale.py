"""Benchmark: throughput with 1, 2 and 4 `gatehouse run` processes on PostgreSQL, and 1 on SQLite.

Each process is a real `gatehouse run` (webchat on its own port); the zero-latency echo model
runs in a process of its own; PostgreSQL is a throwaway cluster (tests/postgres.py). The driver
spreads `--sessions` chats over the processes like a load balancer would (by session, so a chat
always reaches the same process unless it dies). Every chat first says one message, all at once
(timed apart: "first msgs/s", a burst of new chats: each creates its session and the processes
open their connections; sent once the embedding model has warmed up, see `_settled`), then
`--messages` more per chat, each after the previous reply: the
steady state a running gateway is in ("msgs/s"). Every reply is checked.

On a 2-core machine the extra processes share the same two cores with PostgreSQL, the model and
the driver, so the table shows what scale-out costs and buys *here*; on a bigger machine each
process gets cores of its own.

    .venv/bin/python bench/scale.py [--sessions 40] [--messages 10] [--json out.json]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table

from bench.common import fake_llm_process, paired_ratio, pct
from tests.postgres import ThrowawayPostgres

GATEHOUSE = str(Path(sys.executable).parent / "gatehouse")


async def _start(config: Path, cwd: Path) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        GATEHOUSE, "--config", str(config), "run", cwd=cwd,
        env={**os.environ, "GATEHOUSE_CONFIG": ""},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), timeout=120)).decode()
    if "listening on" not in line:
        raise RuntimeError(f"gatehouse run did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[-1].strip()


async def _settled(url: str) -> None:
    """Wait out the embedding model's warm-up after start (a core for seconds, in the
    background): a burst sent meanwhile would time the warm-up, not the chats."""
    async with aiohttp.ClientSession() as http:
        for _ in range(1200):
            async with http.get(f"{url}/healthz") as resp:
                if (await resp.json())["memory_search"] not in ("loading", "embedding"):
                    return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url}: the embedding model did not finish loading in 120 s")


async def _run(
    label: str, database_url: str, processes: int, llm_url: str, sessions: int, messages: int
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gatehouse-scale-") as tmp:
        root = Path(tmp)
        config = root / "gatehouse.toml"
        config.write_text(
            f'[gateway]\ndata_dir = "{root / "data"}"\ndatabase_url = "{database_url}"\n'
            f"max_concurrent_turns = 64\n[web]\nport = 0\n"
            f'[llm]\nbase_url = "{llm_url}"\napi_key = "x"\nmodel = "fake-model"\n'
            "stream = false\n",
            encoding="utf-8",
        )
        procs = []
        for n in range(processes):
            (root / f"p{n}").mkdir()
            procs.append(await _start(config, root / f"p{n}"))
        for _proc, url in procs:
            await _settled(url)
        latencies: list[float] = []
        try:
            connector = aiohttp.TCPConnector(limit=sessions)
            async with aiohttp.ClientSession(connector=connector) as http:

                async def chat(i: int, first: int, count: int) -> None:
                    url = procs[i % processes][1]
                    for j in range(first, first + count):
                        began = time.perf_counter()
                        async with http.post(
                            f"{url}/api/messages",
                            json={"user_id": f"user{i}", "text": f"message {j}"},
                            timeout=aiohttp.ClientTimeout(total=120),
                        ) as resp:
                            body = await resp.json()
                        if resp.status != 200 or body.get("replies") != [f"echo: message {j}"]:
                            raise RuntimeError(f"bad reply for user{i} message {j}: {body}")
                        latencies.append(time.perf_counter() - began)

                began = time.perf_counter()
                await asyncio.gather(*(chat(i, 0, 1) for i in range(sessions)))
                first_wall = time.perf_counter() - began
                latencies.clear()
                began = time.perf_counter()
                await asyncio.gather(*(chat(i, 1, messages) for i in range(sessions)))
                wall = time.perf_counter() - began
        finally:
            for proc, _url in procs:
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
            for proc, _url in procs:
                await asyncio.wait_for(proc.wait(), timeout=60)
    total = len(latencies)
    return {
        "setup": label,
        "processes": processes,
        "messages": total,
        "msgs_per_s": round(total / wall, 1),
        "first_msgs_per_s": round(sessions / first_wall, 1),
        "p50_ms": round(pct(latencies, 0.50) * 1000, 1),
        "p99_ms": round(pct(latencies, 0.99) * 1000, 1),
    }


async def measure(sessions: int, messages: int, repeat: int) -> list[dict[str, Any]]:
    """Each setup `repeat` times, interleaved (so a slow spell of the machine hits every setup
    alike); each row is the setup's median run, with the slowest and fastest beside it. The
    ratios are paired: the median over rounds of this setup's run against the base's run of
    the same round (a spell that slowed one round slows both sides of its ratio)."""
    setups = [("SQLite", 1)] + [("PostgreSQL", n) for n in (1, 2, 4)]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {s: [] for s in setups}
    pg = ThrowawayPostgres().start()
    try:
        async with fake_llm_process() as llm_url:
            for _ in range(repeat):
                for label, processes in setups:
                    with tempfile.TemporaryDirectory() as tmp:
                        url = f"sqlite:///{tmp}/gatehouse.db" if label == "SQLite" else (
                            pg.new_database()
                        )
                        runs[label, processes].append(
                            await _run(label, url, processes, llm_url, sessions, messages)
                        )
    finally:
        pg.stop()

    def paired(setup: tuple[str, int], base: tuple[str, int]) -> float:
        return round(paired_ratio({"runs": runs[setup]}, {"runs": runs[base]}, "msgs_per_s"), 2)

    rows = []
    for setup in setups:
        ordered = sorted(runs[setup], key=lambda r: r["msgs_per_s"])
        row = dict(ordered[len(ordered) // 2])
        row["range"] = [ordered[0]["msgs_per_s"], ordered[-1]["msgs_per_s"]]
        row["runs"] = [r["msgs_per_s"] for r in runs[setup]]
        row["vs_sqlite"] = paired(setup, setups[0])
        if setup[0] == "PostgreSQL":
            row["vs_pg1"] = paired(setup, setups[1])
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each setup (median)")
    parser.add_argument("--quick", action="store_true", help="10 chats x 4 messages, once")
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.messages, args.repeat = 10, 4, 1
    rows = asyncio.run(measure(args.sessions, args.messages, args.repeat))
    table = Table(
        title=f"scale-out: {args.sessions} chats x {args.messages} messages, zero-latency model, "
        f"{os.cpu_count()} cores, median of {args.repeat} runs (ratios: median of the rounds')"
    )
    # (PG: PostgreSQL; range: the slowest and fastest run of the setup)
    columns = ("database", "procs", "msgs/s", "range", "p50 ms", "p99 ms", "vs SQLite×1",
               "vs PG×1", "first msgs/s")
    for column in columns:
        table.add_column(column, justify="left" if column == "database" else "right")
    for r in rows:
        low, high = r["range"]
        versus_pg = f"×{r['vs_pg1']:.2f}" if "vs_pg1" in r else ""
        table.add_row(
            "PG" if r["setup"] == "PostgreSQL" else r["setup"], str(r["processes"]), f"{r['msgs_per_s']:.1f}", f"{low:.0f}–{high:.0f}",
            f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", f"×{r['vs_sqlite']:.2f}", versus_pg,
            f"{r['first_msgs_per_s']:.1f}",
        )
    Console(width=120).print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
