"""What the benchmark scripts share: percentiles, a Gatehouse config for a run, result rows."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from gateway.config import Config, parse_config

ROOT = Path(__file__).resolve().parent.parent

_SERVE_FAKE_LLM = """
import asyncio, json, socket, time
from aiohttp import web
from tests.fakes.openai_server import last_user_text

# A zero-latency OpenAI-compatible echo model, as lean as a server can be: it shares the
# machine's two cores with what is measured, so every microsecond it spends is billed to the
# paths that call it, the more the larger their requests. (tests.fakes.FakeOpenAI records
# and scripts every request, estimates tokens message by message: right for tests, and ~3x
# the CPU per request here.)

async def chat(request):
    raw = await request.read()
    body = json.loads(raw)
    reply = "echo: " + last_user_text(body)  # what FakeOpenAI's default step answers
    prompt, completion = len(raw) // 4, len(reply) // 4 + 1
    return web.json_response({
        "id": "chatcmpl-bench", "object": "chat.completion", "created": int(time.time()),
        "model": body.get("model", "fake-model"),
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": reply}}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
    })

async def models(request):
    return web.json_response({"object": "list", "data": [
        {"id": "fake-model", "object": "model", "created": 0, "owned_by": "bench"}]})

async def main():
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    print(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@contextlib.asynccontextmanager
async def fake_llm_process() -> AsyncIterator[str]:
    """The zero-latency echo model in a process of its own; yields its base URL.

    The model is another service in any deployment, so its own CPU is not the gateway's: run
    in the measured process, the fake's request parsing would be billed to Gatehouse.
    """
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _SERVE_FAKE_LLM, cwd=ROOT, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        if not line:
            raise RuntimeError("the fake LLM process exited before it listened")
        yield line.decode().strip()
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()


Answer = Callable[[str], Awaitable[str]]


@contextlib.asynccontextmanager
async def model_call(llm_url: str | None) -> AsyncIterator[Answer]:
    """What a bare bot that asks the model before replying does: one chat completion with the
    openai SDK (the gateway's transport), nothing else. Without a URL: echo the text back."""
    if llm_url is None:

        async def echo(text: str) -> str:
            return text

        yield echo
        return
    import openai

    client = openai.AsyncOpenAI(
        base_url=llm_url, api_key="x", max_retries=0, http_client=openai.DefaultAioHttpClient()
    )

    async def ask(text: str) -> str:
        reply = await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": text}]
        )
        return reply.choices[0].message.content or ""

    try:
        yield ask
    finally:
        await client.close()


WITH_MODEL = " + 1 model call"
"""Suffix of the path name of a bare bot that asks the model first."""


@contextlib.asynccontextmanager
async def bench_gateway(
    platform: str,
    settings: dict[str, Any],
    make_channel: Callable[[Any], Any],
    concurrency: int,
    grace: float = 10.0,
) -> AsyncIterator[Any]:
    """A started Gateway with one platform channel (open DMs), its own data dir and the
    zero-latency model in its own process; stopped on exit."""
    from gateway.app import Gateway

    with tempfile.TemporaryDirectory(prefix="gatehouse-bench-") as data:
        async with fake_llm_process() as llm_url:
            section = {"enabled": True, "dm_policy": "open", **settings}
            config = bench_config(
                llm_url, data, concurrency=concurrency, channels={platform: section}
            )
            gateway = Gateway(config)
            gateway.add_channel(make_channel(config.channels.get(platform)))
            await gateway.start()
            try:
                yield gateway
            finally:
                await gateway.stop(grace=grace)


Path_ = Callable[..., Awaitable[dict[str, Any]]]


ROUNDS = 5
"""Rounds of the three paths, interleaved: a 2-core VM's speed drifts between runs (seen here:
the same path 4x slower an hour later), so each path's numbers are the median over rounds in
which all three paths ran side by side. Five, not three: the floor alone (the bare Discord bot
asking the model, 20 at a time) moved between 48 and 71 ms p50 from one run to the next, and
the median of three paired ratios went with it (1.35-2.19x in eleven runs)."""


async def floors_and_gatehouse(
    bare: Path_, gatehouse: Path_, messages: int, concurrency: int, rounds: int = ROUNDS
) -> list[dict[str, Any]]:
    """The three rows of a platform: the bare echo bot, the same bot asking the model first
    (one call to the zero-latency fake), and Gatehouse; each the median of `rounds` runs."""
    runs: list[list[dict[str, Any]]] = [[], [], []]
    for _ in range(rounds):
        runs[0].append(await bare(messages, concurrency))
        async with fake_llm_process() as llm_url:
            runs[1].append(await bare(messages, concurrency, llm_url))
        runs[2].append(await gatehouse(messages, concurrency))
    return [median_row(path_runs) for path_runs in runs]


_MEASURES = ("msgs_per_s", "p50_ms", "p99_ms", "mean_ms")


def median_row(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One path's row over several runs: each number the median of its runs, which are kept
    (`runs`) so ratios can be taken round by round (`paired_ratio`)."""
    row = dict(runs[0])
    for key in _MEASURES:
        if all(key in run for run in runs):
            row[key] = statistics.median(run[key] for run in runs)
    row["rounds"] = len(runs)
    row["runs"] = [{k: run[k] for k in _MEASURES if k in run} for run in runs]
    return row


def paired_ratio(row: dict[str, Any], floor: dict[str, Any], key: str) -> float:
    """`row[key] / floor[key]`, as the median of the ratios within each round: both paths ran
    minutes apart at most there, so a change of the machine's speed between rounds cancels."""
    mine, theirs = row.get("runs"), floor.get("runs")
    if mine and theirs and len(mine) == len(theirs):
        return statistics.median(a[key] / b[key] for a, b in zip(mine, theirs, strict=True))
    return float(row[key]) / float(floor[key])


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile by rank (no interpolation): what p50/p99 mean in every table here."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


GATEWAY_OVERRIDES: dict[str, Any] = {}
"""Extra `[gateway]` keys for every benchmark gateway (`bench/instructions.py` sets the typing
delay: under valgrind every turn outlasts it, which a native run's turns never do)."""


def bench_config(
    llm_base_url: str,
    data_dir: str | Path,
    *,
    concurrency: int = 8,
    channels: dict[str, Any] | None = None,
) -> Config:
    """A gateway on a throwaway data dir, talking to a fake OpenAI server, no web port."""
    return parse_config(
        {
            "gateway": {
                "data_dir": str(data_dir),
                "max_concurrent_turns": concurrency,
                **GATEWAY_OVERRIDES,
            },
            "web": {"port": 0},
            "llm": {
                "base_url": llm_base_url,
                "api_key": "x",
                "model": "fake-model",
                "stream": False,
            },
            "channels": channels or {},
        },
        "bench",
    )


def channel_row(
    platform: str, path: str, messages: int, wall: float, latencies: Sequence[float]
) -> dict[str, Any]:
    """One row of `bench/channels.py` (latencies in seconds)."""
    return {
        "platform": platform,
        "path": path,
        "messages": messages,
        "msgs_per_s": round(messages / wall, 1),
        "p50_ms": round(pct(latencies, 0.50) * 1000, 2),
        "p99_ms": round(pct(latencies, 0.99) * 1000, 2),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 2),
    }
