"""Cross-process locks: PostgreSQL advisory locks, held by a connection of their own.

Several gateway processes may share one PostgreSQL database: a session's turns must still run
one at a time (`Locks.session_lock`), and one process leads the scheduler (gateway/jobs/leader.py).
A lock lives as long as the backend connection holding it, so a dead process frees its locks.
One gateway process per SQLite file needs none of this: on SQLite every lock is a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy import Engine

from gateway.store.engine import Database


class LockBusyError(RuntimeError):
    """Another connection holds the advisory lock asked for without waiting."""


def lock_id(name: str) -> int:
    """A stable signed 64-bit id for an advisory lock (a collision only serializes more)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), signed=True)


class AdvisoryLock:
    """A session-level advisory lock and the connection that holds it (sync; database thread)."""

    def __init__(self, conn: Any, lock_id: int) -> None:
        self.conn = conn
        self.lock_id = lock_id
        self.held = False

    @classmethod
    def connect(cls, engine: Engine | None, lock_id: int) -> AdvisoryLock:
        assert engine is not None
        return cls(engine.raw_connection(), lock_id)

    def try_acquire(self) -> bool:
        with self.conn.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", (self.lock_id,))
            self.held = bool(cursor.fetchone()[0])
        return self.held

    def alive(self) -> bool:
        """Is the holding connection still there (so the lock still held)?"""
        try:
            with self.conn.cursor() as cursor:
                cursor.execute("SELECT 1")
            return True
        except Exception:
            return False

    def release(self) -> None:
        """Unlock and hand the connection back; a broken connection is dropped (which unlocks)."""
        try:
            if self.held:
                with self.conn.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s)", (self.lock_id,))
            self.held = False
            self.conn.close()
        except Exception:
            self.conn.invalidate()


class Locks:
    """Take, check and release advisory locks on the database's lock connections."""

    def __init__(self, database: Database) -> None:
        self._db = database
        self._releasing: set[asyncio.Future[None]] = set()

    @contextlib.asynccontextmanager
    async def session_lock(self, key: str, poll: float = 0.05) -> AsyncIterator[None]:
        """Hold a session's lane across processes (PostgreSQL advisory lock; SQLite: no-op).

        One gateway process per SQLite file needs no more than the in-process lanes; on
        PostgreSQL every process that wants to run a turn for `key` waits here first.
        """
        lock = await self.advisory_lock(lock_id("session:" + key), wait=True, poll=poll)
        try:
            yield
        finally:
            if lock is not None:
                await asyncio.shield(self._db.run(lock.release))

    async def advisory_lock(
        self, lock_id: int, *, wait: bool, poll: float = 0.05
    ) -> AdvisoryLock | None:
        """Take a PostgreSQL advisory lock on a connection of its own; None on SQLite.

        With `wait=False`, raises `LockBusyError` if another connection holds it.
        """
        engine = self._db.lock_engine
        if engine is None:
            return None

        def connect_and_try() -> tuple[AdvisoryLock, bool]:
            # One thread hop for the connection and the first try (usually the only one).
            lock = AdvisoryLock.connect(engine, lock_id)
            try:
                return lock, lock.try_acquire()
            except BaseException:
                lock.release()
                raise

        first = asyncio.ensure_future(self._db.run(connect_and_try))
        try:
            lock, held = await asyncio.shield(first)
        except asyncio.CancelledError:
            first.add_done_callback(self._release_when_done)  # cancelled: never keep it
            raise
        try:
            delay = poll
            while not held:
                if not wait:
                    raise LockBusyError(lock_id)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                held = await self._db.run(lock.try_acquire)
        except BaseException:
            await asyncio.shield(self._db.run(lock.release))
            raise
        return lock

    def _release_when_done(self, first: asyncio.Future[tuple[AdvisoryLock, bool]]) -> None:
        if not first.cancelled() and first.exception() is None:
            lock, _held = first.result()
            task = asyncio.ensure_future(self._db.run(lock.release))
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)

    async def lock_alive(self, lock: AdvisoryLock) -> bool:
        return await self._db.run(lock.alive)

    async def release_lock(self, lock: AdvisoryLock) -> None:
        await asyncio.shield(self._db.run(lock.release))
