"""Kill -9 `gatehouse run` in the middle of a Telegram burst, restart it, and account for every
message: shared by `tests/e2e/test_crash.py` (small) and `bench/crash.py` (1,000 × 100).

The gateway runs as a real subprocess with the Telegram channel in polling mode, talking to a
`FakeTelegram` Bot API and a zero-latency `FakeOpenAI` in this process. Every message text carries
a token (``u<session>m<index>``); the fake model answers ``ack`` + the tokens of every user
message it is asked about in that turn (messages that arrive mid-turn are collected into one
reply), so counting tokens in the ``sendMessage`` calls the fake received tells how often each
message was answered. The SQLite file tells how often each was stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sqlite3
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.turn.outbox import logged_sent
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.telegram_server import FakeTelegram

GATEHOUSE = str(Path(sys.executable).parent / "gatehouse")
TOKEN = re.compile(r"\bu(\d+)m(\d+)\b")
FIRST_USER = 5_000
"""Telegram user ids of the burst's senders: FIRST_USER + session number."""


def token(session: int, index: int) -> str:
    return f"u{session}m{index}"


def ack_turn(body: dict[str, Any]) -> Reply:
    """The fake model: acknowledge every user message since the last assistant message."""
    tokens: list[str] = []
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "assistant":
            break
        if message.get("role") == "user":
            tokens[:0] = _tokens(str(message.get("content") or ""))
    return Reply("ack " + " ".join(tokens))


@dataclass
class CrashTrial:
    """What happened to every message of one kill-and-restart run."""

    sessions: int
    per_session: int
    answered_at_kill: int = 0
    """Replies the fake had received when SIGKILL was sent."""
    stored_at_kill: int = 0
    unanswered_at_kill: int = 0
    """Messages stored but not answered (in the database) when the process died."""
    replies_in_doubt: list[str] = field(default_factory=list)
    """Tokens of replies stored as "to deliver" at the kill that the fake had already received:
    the one window no Bot API can close (see README, "Crash safety")."""
    redelivered_updates: int = 0
    """Updates Telegram handed out again after the restart (persisted, not yet confirmed)."""
    stored: Counter[str] = field(default_factory=Counter)
    answered: Counter[str] = field(default_factory=Counter)
    order_violations: list[str] = field(default_factory=list)
    recovery_seconds: float = 0.0
    """From the restart to the last message answered."""
    wall_seconds: float = 0.0

    @property
    def messages(self) -> int:
        return self.sessions * self.per_session

    @property
    def expected(self) -> list[str]:
        return [token(s, i) for s in range(self.sessions) for i in range(self.per_session)]

    @property
    def lost(self) -> list[str]:
        return [t for t in self.expected if self.answered[t] == 0]

    @property
    def duplicated(self) -> list[str]:
        return [t for t in self.expected if self.answered[t] > 1]

    @property
    def stored_wrong(self) -> list[str]:
        return [t for t in self.expected if self.stored[t] != 1]

    def row(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "sessions": self.sessions,
            "answered_at_kill": self.answered_at_kill,
            "unanswered_at_kill": self.unanswered_at_kill,
            "redelivered_updates": self.redelivered_updates,
            "stored_exactly_once": self.messages - len(self.stored_wrong),
            "answered_exactly_once": sum(1 for t in self.expected if self.answered[t] == 1),
            "lost": len(self.lost),
            "duplicated": len(self.duplicated),
            "replies_in_doubt": len(self.replies_in_doubt),
            "order_violations": len(self.order_violations),
            "recovery_s": round(self.recovery_seconds, 2),
            "wall_s": round(self.wall_seconds, 2),
        }


def write_config(
    directory: Path, llm: FakeOpenAI, tg: FakeTelegram, api_key: str = "x", concurrency: int = 8
) -> Path:
    path = directory / "gatehouse.toml"
    path.write_text(
        f'[gateway]\ndata_dir = "data"\nmax_concurrent_turns = {concurrency}\n[web]\nport = 0\n'
        "[memory]\nembeddings = false\n"
        f'[llm]\nbase_url = "{llm.base_url}"\napi_key = "{api_key}"\nmodel = "fake-model"\n'
        f"max_retries = 0\n"
        f'[channels.telegram]\nenabled = true\ntoken = "{tg.token}"\n'
        f'base_url = "{tg.base_url}"\ndm_policy = "open"\n',
        encoding="utf-8",
    )
    return path


async def start_gateway(
    config: Path, log: Path, log_level: str = "INFO", env: dict[str, str] | None = None
) -> asyncio.subprocess.Process:
    """`gatehouse run` as a subprocess; returns once its web server listens (channels are up)."""
    env = {**os.environ, "GATEHOUSE_CONFIG": "", **(env or {})}
    with log.open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            GATEHOUSE, "--config", str(config), "--log-level", log_level, "run",
            cwd=config.parent, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=err,
        )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
    if not line.startswith(b"gatehouse listening"):
        await proc.wait()
        tail = (await asyncio.to_thread(log.read_text))[-2000:]
        raise RuntimeError(f"gatehouse run did not start: {tail}")
    return proc


def _database(directory: Path) -> sqlite3.Connection:
    return sqlite3.connect(directory / "data" / "gatehouse.db")


def stored_messages(directory: Path) -> list[tuple[str, int, int | None]]:
    """(text, handled, seq) of every stored Telegram user message, in arrival order."""
    with contextlib.closing(_database(directory)) as db:
        rows = db.execute(
            "SELECT content, handled, seq FROM messages "
            "WHERE role = 'user' AND platform = 'telegram' ORDER BY id"
        ).fetchall()
    return [(json.loads(content), int(handled), seq) for content, handled, seq in rows]


def undelivered_replies(directory: Path) -> list[str]:
    """Texts of replies stored but not recorded as sent (the outbox, minus the delivery log)."""
    sent = set(logged_sent(directory / "data"))
    with contextlib.closing(_database(directory)) as db:
        rows = db.execute("SELECT id, text FROM outbox ORDER BY id").fetchall()
    return [str(text) for outbox_id, text in rows if outbox_id not in sent]


def _tokens(text: str) -> list[str]:
    return [f"u{s}m{i}" for s, i in TOKEN.findall(text)]


def _answered(tg: FakeTelegram) -> Counter[str]:
    return Counter(t for call in tg.calls_to("sendMessage") for t in _tokens(str(call["text"])))


async def _until(predicate: Any, timeout: float, what: str) -> None:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.02)


async def run_trial(
    directory: Path, sessions: int, per_session: int, kill_fraction: float = 0.35,
    timeout: float = 120.0,  # noqa: ASYNC109
) -> CrashTrial:
    """Burst `sessions` × `per_session` messages, SIGKILL after `kill_fraction` of them were
    answered, restart, wait until everything is answered, stop cleanly, and account."""
    trial = CrashTrial(sessions, per_session)
    log = directory / "gatehouse.log"
    began = time.perf_counter()
    async with FakeOpenAI(default=ack_turn) as llm, FakeTelegram() as tg:
        config = write_config(directory, llm, tg)
        proc = await start_gateway(config, log)
        try:
            for index in range(per_session):  # interleaved, like real traffic
                for session in range(sessions):
                    tg.private_message(FIRST_USER + session, f"{token(session, index)} hello")
            kill_at = max(1, int(trial.messages * kill_fraction))
            await _until(
                lambda: sum(_answered(tg).values()) >= kill_at, timeout, "no replies before kill"
            )
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        # Requests the process wrote before it died can still be in the socket buffers: let
        # the fake finish reading them, so "what Telegram had at the kill" is complete.
        await asyncio.sleep(0.5)
        at_kill = _answered(tg)
        trial.answered_at_kill = sum(at_kill.values())
        stored = stored_messages(directory)
        trial.stored_at_kill = len(stored)
        trial.unanswered_at_kill = sum(1 for _text, handled, _seq in stored if not handled)
        trial.replies_in_doubt = [
            t for text in undelivered_replies(directory) for t in _tokens(text) if at_kill[t]
        ]
        served_before = Counter(tg.served)

        restarted = time.perf_counter()
        proc = await start_gateway(config, log)
        try:
            expected = set(trial.expected)
            await _until(
                lambda: expected <= set(_answered(tg)), timeout, "not every message answered"
            )
            trial.recovery_seconds = time.perf_counter() - restarted
            await _until(
                lambda: all(h for _t, h, _s in stored_messages(directory))
                and not undelivered_replies(directory),
                timeout,
                "the database still has unanswered messages or undelivered replies",
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), timeout=60)
        trial.redelivered_updates = sum(
            1 for update_id, n in tg.served.items() if n > 1 and served_before[update_id] >= 1
        )
        trial.answered = _answered(tg)
    stored = stored_messages(directory)
    trial.stored = Counter(t for text, _h, _s in stored for t in _tokens(text))
    trial.order_violations = order_violations(stored, sessions)
    trial.wall_seconds = time.perf_counter() - began
    return trial


def order_violations(stored: list[tuple[str, int, int | None]], sessions: int) -> list[str]:
    """Sessions whose messages are not in the conversation (seq) in the order they were sent."""
    by_session: dict[int, list[tuple[int, int]]] = {}
    for text, _handled, seq in stored:
        for s, i in TOKEN.findall(text):
            by_session.setdefault(int(s), []).append((seq if seq is not None else -1, int(i)))
    bad = []
    for session, pairs in sorted(by_session.items()):
        indexes = [i for _seq, i in sorted(pairs)]
        if indexes != sorted(indexes):
            bad.append(f"session {session}: {indexes}")
    return bad
