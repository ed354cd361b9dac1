"""Session lanes: one turn at a time per session, many sessions at once.

Messages are persisted before a lane is notified, so a lane only needs to know *that* a session
has work. A notification during a turn marks the lane dirty and the lane runs one more turn,
which collects every message that arrived meanwhile. Nothing is queued in memory but session
keys, so nothing can be lost here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

log = logging.getLogger(__name__)

TurnFn = Callable[[str], Awaitable[None]]


class LanesClosedError(RuntimeError):
    pass


class SessionLanes:
    def __init__(self, run_turn: TurnFn, max_concurrent: int = 8) -> None:
        self._run_turn = run_turn
        self._slots = asyncio.Semaphore(max_concurrent)
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._dirty: set[str] = set()
        self._closed = False
        self._paused: set[str] = set()
        self._exclusive: dict[str, asyncio.Lock] = {}
        self.max_concurrent = max_concurrent

    @property
    def active(self) -> int:
        return len(self._workers)

    @property
    def queued(self) -> int:
        """Sessions waiting for a concurrency slot or with a follow-up turn due."""
        return len(self._dirty)

    def notify(self, session_key: str) -> None:
        """Say that `session_key` has unanswered messages in the store."""
        if self._closed:
            raise LanesClosedError("the gateway is shutting down")
        self._dirty.add(session_key)
        self._start(session_key)

    def _start(self, session_key: str) -> None:
        if session_key not in self._workers and session_key not in self._paused:
            task = asyncio.create_task(self._lane(session_key), name=f"lane:{session_key}")
            self._workers[session_key] = task

    @contextlib.asynccontextmanager
    async def exclusive(self, session_key: str) -> AsyncIterator[None]:
        """Hold a session's lane: the turn in progress finishes, no new one starts until the
        block ends (an operator's compaction never races a turn). Messages that arrive
        meanwhile are answered right after."""
        lock = self._exclusive.setdefault(session_key, asyncio.Lock())
        async with lock:
            self._paused.add(session_key)
            try:
                worker = self._workers.get(session_key)
                if worker is not None:
                    await asyncio.wait({worker})
                yield
            finally:
                self._paused.discard(session_key)
                if session_key in self._dirty and not self._closed:
                    self._start(session_key)

    async def _lane(self, key: str) -> None:
        try:
            while key in self._dirty and not self._closed and key not in self._paused:
                async with self._slots:
                    self._dirty.discard(key)
                    try:
                        await self._run_turn(key)
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        # The runner records its own failures; a bug must not kill the lane.
                        log.exception("turn failed for session %s", key)
        finally:
            self._workers.pop(key, None)

    async def join(self) -> None:
        """Wait until every lane is idle (used by tests and benchmarks)."""
        while self._workers:
            await asyncio.gather(*list(self._workers.values()), return_exceptions=True)

    async def close(self, grace: float = 10.0) -> None:
        """Stop taking work; let in-flight turns finish for `grace` seconds, then cancel them."""
        self._closed = True
        tasks = list(self._workers.values())
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
