"""Session lanes: one turn at a time per session, many sessions at once.

Messages are persisted before a lane is notified, so a lane only needs to know *that* a session
has work. A notification during a turn marks the lane dirty and the lane runs one more turn,
which collects every message that arrived meanwhile. A turn that answered only part of what
waits (queue mode `followup`: one message a turn) returns True, and the lane runs another.
Nothing is queued in memory but session keys, so nothing can be lost here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

log = logging.getLogger(__name__)

TurnFn = Callable[[str], Awaitable[bool | None]]
"""Runs one turn for a session; True when more of its messages wait for another turn."""
SessionLock = Callable[[str], AbstractAsyncContextManager[None]]
"""The store's cross-process session lock (a PostgreSQL advisory lock)."""



async def finish_or_cancel(tasks: Sequence[asyncio.Task[Any]], grace: float) -> None:
    """Let `tasks` finish for `grace` seconds, then cancel the rest and wait for them to end."""
    if not tasks:
        return
    _done, pending = await asyncio.wait(tasks, timeout=grace)
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

class LanesClosedError(RuntimeError):
    pass


class SessionLanes:
    def __init__(
        self, run_turn: TurnFn, max_concurrent: int = 8, session_lock: SessionLock | None = None
    ) -> None:
        self._run_turn = run_turn
        self._session_lock = session_lock
        self._slots = asyncio.Semaphore(max_concurrent)
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._dirty: set[str] = set()
        self._held: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._closed = False
        self.max_concurrent = max_concurrent

    @property
    def active(self) -> int:
        return len(self._workers)

    @property
    def busy(self) -> set[str]:
        """Sessions with a lane running or due in this process."""
        return set(self._workers)

    @property
    def queued(self) -> int:
        """Sessions waiting for a concurrency slot or with a follow-up turn due."""
        return len(self._dirty)

    def notify(self, session_key: str) -> None:
        """Say that `session_key` has unanswered messages in the store."""
        if self._closed:
            raise LanesClosedError("the gateway is shutting down")
        self._dirty.add(session_key)
        if session_key not in self._workers:
            task = asyncio.create_task(self._lane(session_key), name=f"lane:{session_key}")
            self._workers[session_key] = task

    async def _lane(self, key: str) -> None:
        try:
            while key in self._dirty and not self._closed:
                async with self._lane_lock(key), self._slots:
                    self._dirty.discard(key)
                    try:
                        async with self._across_processes(key):
                            if await self._run_turn(key):
                                self._dirty.add(key)
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        # The runner records its own failures; a bug must not kill the lane.
                        log.exception("turn failed for session %s", key)
        finally:
            self._workers.pop(key, None)

    def _lane_lock(self, key: str) -> asyncio.Lock:
        lock = self._held.get(key)
        if lock is None:
            lock = self._held[key] = asyncio.Lock()
        return lock

    @contextlib.asynccontextmanager
    async def _across_processes(self, key: str) -> AsyncIterator[None]:
        if self._session_lock is None:
            yield
        else:
            async with self._session_lock(key):
                yield

    @contextlib.asynccontextmanager
    async def hold(self, session_key: str) -> AsyncIterator[None]:
        """Own a session's lane without a turn: waits for a running turn to finish and keeps
        new turns out until released (idle compaction, a reset, a reminder landing in the
        history). Messages that arrive meanwhile are answered right after."""
        async with self._lane_lock(session_key), self._across_processes(session_key):
            yield

    async def run_now(self, session_key: str) -> None:
        """Run one turn for a session and wait for it (a scheduled task's turn), under the
        same rules as any turn: its lane, and a concurrency slot."""
        if self._closed:
            raise LanesClosedError("the gateway is shutting down")
        async with self._lane_lock(session_key), self._slots:
            async with self._across_processes(session_key):
                more = await self._run_turn(session_key)
        if more and not self._closed:
            self.notify(session_key)

    async def join(self) -> None:
        """Wait until every lane is idle (used by tests and benchmarks)."""
        while self._workers:
            await asyncio.gather(*list(self._workers.values()), return_exceptions=True)

    async def close(self, grace: float = 10.0) -> None:
        """Stop taking work; let in-flight turns finish for `grace` seconds, then cancel them."""
        self._closed = True
        await finish_or_cancel(list(self._workers.values()), grace)
