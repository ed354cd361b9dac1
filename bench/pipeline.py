"""Benchmark: N sessions x M messages through the webchat HTTP path, zero-latency fake LLM, SQLite.

Prints messages/s and per-message latency (p50/p99) for the gateway, side by side with the floor:
the same number of chat-completion calls made with the bare openai SDK against the same fake.
Gateway overhead = gateway - floor (persist, session lane, prompt assembly, tool specs, HTTP
hop, reply delivery). ms/msg is wall time divided by messages: the per-message cost on this
machine when every session is busy. Everything runs in one process on loopback, so client,
fake LLM and gateway share the same 2 cores.

    .venv/bin/python bench/pipeline.py --sessions 50 --messages 20 [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import openai
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_config, fake_llm_process, pct
from channels.webchat import WebchatChannel
from gateway.app import Gateway
from gateway.web.server import WebServer, build_app


async def run_gateway(llm_url: str, sessions: int, messages: int, data: Path) -> dict:
    config = bench_config(llm_url, data)
    gateway = Gateway(config)
    webchat = WebchatChannel()
    gateway.add_channel(webchat)
    await gateway.start()
    server = WebServer(build_app(gateway, webchat), "127.0.0.1", 0)
    url = await server.start()
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=sessions)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def session(i: int) -> None:
            for j in range(messages):
                t0 = time.perf_counter()
                async with http.post(
                    f"{url}/api/messages", json={"user_id": f"user{i}", "text": f"message {j}"}
                ) as resp:
                    body = await resp.json()
                    assert resp.status == 200, body
                latencies.append(time.perf_counter() - t0)

        start = time.perf_counter()
        await asyncio.gather(*(session(i) for i in range(sessions)))
        wall = time.perf_counter() - start
    await server.stop()
    await gateway.stop()
    return {"wall": wall, "latencies": latencies}


async def run_floor(llm_url: str, sessions: int, messages: int) -> dict:
    # The same SDK and transport the gateway uses.
    client = openai.AsyncOpenAI(
        base_url=llm_url, api_key="x", max_retries=0, http_client=openai.DefaultAioHttpClient()
    )
    latencies: list[float] = []

    async def session(i: int) -> None:
        history: list[dict] = [{"role": "system", "content": "You are a helpful assistant."}]
        for j in range(messages):
            history.append({"role": "user", "content": f"message {j}"})
            t0 = time.perf_counter()
            resp = await client.chat.completions.create(model="fake-model", messages=history)
            latencies.append(time.perf_counter() - t0)
            history.append({"role": "assistant", "content": resp.choices[0].message.content})

    start = time.perf_counter()
    await asyncio.gather(*(session(i) for i in range(sessions)))
    wall = time.perf_counter() - start
    await client.close()
    return {"wall": wall, "latencies": latencies}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--quick", action="store_true", help="10 sessions × 5 messages")
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.messages = 10, 5
    n = args.sessions * args.messages
    async with fake_llm_process() as llm_url:
        floor = await run_floor(llm_url, args.sessions, args.messages)
        with tempfile.TemporaryDirectory() as tmp:
            gw = await run_gateway(llm_url, args.sessions, args.messages, Path(tmp))
    rows = []
    for name, r in (("bare openai SDK (floor)", floor), ("gatehouse webchat, SQLite", gw)):
        lat = r["latencies"]
        rows.append(
            {
                "path": name,
                "messages": len(lat),
                "msgs_per_s": len(lat) / r["wall"],
                "p50_ms": pct(lat, 0.50) * 1000,
                "p99_ms": pct(lat, 0.99) * 1000,
                "mean_ms": statistics.fmean(lat) * 1000,
                "wall_ms_per_msg": r["wall"] / len(lat) * 1000,
            }
        )
    overhead = {
        "wall_ms_per_msg": rows[1]["wall_ms_per_msg"] - rows[0]["wall_ms_per_msg"],
        "p50_ms": rows[1]["p50_ms"] - rows[0]["p50_ms"],
        "p99_ms": rows[1]["p99_ms"] - rows[0]["p99_ms"],
        "throughput_ratio": rows[1]["msgs_per_s"] / rows[0]["msgs_per_s"],
    }
    table = Table(title=f"pipeline: {args.sessions} sessions x {args.messages} messages ({n} total)")
    for col in ("path", "messages", "msgs/s", "ms/msg", "p50 ms", "p99 ms", "mean ms"):
        table.add_column(col, justify="left" if col == "path" else "right")
    for r in rows:
        table.add_row(
            r["path"], str(r["messages"]), f"{r['msgs_per_s']:.0f}",
            f"{r['wall_ms_per_msg']:.2f}", f"{r['p50_ms']:.2f}",
            f"{r['p99_ms']:.2f}", f"{r['mean_ms']:.2f}",
        )
    table.add_row(
        "gateway overhead per message", "", f"x{overhead['throughput_ratio']:.2f}",
        f"+{overhead['wall_ms_per_msg']:.2f}", f"+{overhead['p50_ms']:.2f}",
        f"+{overhead['p99_ms']:.2f}", "",
    )
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "overhead": overhead}, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
