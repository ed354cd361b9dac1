"""Many Telegram sessions at once through `gatehouse run`: shared by `tests/e2e/test_load.py`
(50 × 4) and `bench/load.py` (1,000 × 10).

The gateway is a real subprocess (python-telegram-bot long-polling the fake Bot API, SQLite, a
zero-latency fake model that acknowledges each message's token). Every session is a person
who sends two messages in a row (the second reaches the gateway while the first is being
answered, so the two are collected into one turn or answered in two, in order), waits for the
answers, and goes on; all sessions at the same time. Latency is measured at the fake: from the update being queued to the ``sendMessage``
that answers it. Peak RSS is the gateway process's high-water mark (``VmHWM``).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import Call, FakeTelegram
from tests.helpers.kill_restart import (
    FIRST_USER,
    TOKEN,
    ack_turn,
    order_violations,
    start_gateway,
    stored_messages,
    token,
    write_config,
)


@dataclass
class LoadRun:
    sessions: int
    per_session: int
    burst: int = 2
    latencies: list[float] = field(default_factory=list)
    answered: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    """Per session: message indexes in the order their answers reached Telegram."""
    lost: list[str] = field(default_factory=list)
    stored_order_violations: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0
    peak_rss_mb: float | None = None

    @property
    def messages(self) -> int:
        return self.sessions * self.per_session

    @property
    def reply_order_violations(self) -> list[str]:
        expected = list(range(self.per_session))
        return [
            f"session {s}: {self.answered.get(s, [])}"
            for s in range(self.sessions)
            if self.answered.get(s, []) != expected[: len(self.answered.get(s, []))]
        ]

    def row(self) -> dict[str, Any]:
        from bench.common import pct

        lat = sorted(self.latencies)
        return {
            "sessions": self.sessions,
            "messages": self.messages,
            "in_flight": self.sessions * min(self.burst, self.per_session),
            "answered": sum(len(v) for v in self.answered.values()),
            "lost": len(self.lost),
            "order_violations": len(self.reply_order_violations) + len(self.stored_order_violations),
            "msgs_per_s": round(len(lat) / self.wall_seconds, 1) if self.wall_seconds else 0.0,
            "p50_ms": round(pct(lat, 0.50) * 1000, 1) if lat else None,
            "p99_ms": round(pct(lat, 0.99) * 1000, 1) if lat else None,
            "max_ms": round(lat[-1] * 1000, 1) if lat else None,
            "peak_rss_mb": self.peak_rss_mb,
            "wall_s": round(self.wall_seconds, 1),
        }


def peak_rss_mb(pid: int) -> float | None:
    """The process's resident-set high-water mark (Linux ``/proc``), in MiB."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return None


async def run_load(
    directory: Path, sessions: int, per_session: int, *, burst: int = 2,
    reply_timeout: float = 300.0, concurrency: int = 8,
) -> LoadRun:
    """Every session sends `per_session` messages, `burst` at a time (the next ones while the
    first is being answered, as people do), waits for the answers, repeats; all at once."""
    run = LoadRun(sessions, per_session, burst)
    loop = asyncio.get_running_loop()
    waiting: dict[str, asyncio.Future[float]] = {}

    def on_call(call: Call) -> None:
        if call.method != "sendMessage":
            return
        now = time.perf_counter()
        for s, i in TOKEN.findall(str(call.params.get("text", ""))):
            run.answered[int(s)].append(int(i))
            future = waiting.get(f"u{s}m{i}")
            if future is not None and not future.done():
                future.set_result(now)

    async with FakeOpenAI(default=ack_turn) as llm, FakeTelegram() as tg:
        config = write_config(directory, llm, tg, concurrency=concurrency)
        proc = await start_gateway(config, directory / "gatehouse.log")
        tg.on_call = on_call

        async def person(session: int) -> None:
            for first in range(0, per_session, burst):
                names = [token(session, i) for i in range(first, min(first + burst, per_session))]
                sent: dict[str, float] = {}
                for name in names:
                    waiting[name] = loop.create_future()
                    sent[name] = time.perf_counter()
                    tg.private_message(FIRST_USER + session, f"{name} hello")
                for name in names:
                    try:
                        answered = await asyncio.wait_for(waiting[name], reply_timeout)
                    except TimeoutError:
                        run.lost.extend(token(session, i) for i in range(first, per_session))
                        return
                    run.latencies.append(answered - sent[name])

        try:
            began = time.perf_counter()
            await asyncio.gather(*(person(s) for s in range(sessions)))
            run.wall_seconds = time.perf_counter() - began
            run.peak_rss_mb = peak_rss_mb(proc.pid)
        finally:
            tg.on_call = None
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), timeout=120)
    run.stored_order_violations = order_violations(stored_messages(directory), sessions)
    return run
