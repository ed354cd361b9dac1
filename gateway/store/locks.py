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

from gateway.store.engine import Database
from gateway.store.postgres import Connections


class LockBusyError(RuntimeError):
    """Another connection holds the advisory lock asked for without waiting."""


def lock_id(name: str) -> int:
    """A stable signed 64-bit id for an advisory lock (a collision only serializes more)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), signed=True)


class AdvisoryLock:
    """A session-level advisory lock and the asyncpg connection that holds it."""

    def __init__(self, connections: Connections, conn: Any, lock_id: int) -> None:
        self.connections = connections
        self.conn = conn
        self.lock_id = lock_id
        self.held = False

    async def try_acquire(self) -> bool:
        self.held = bool(await self.conn.fetchval("SELECT pg_try_advisory_lock($1)", self.lock_id))
        return self.held

    async def alive(self) -> bool:
        """Is the holding connection still there (so the lock still held)?"""
        try:
            await self.conn.fetchval("SELECT 1")
            return True
        except Exception:
            return False

    async def release(self) -> None:
        """Unlock and hand the connection back; a broken connection is dropped (which unlocks)."""
        try:
            if self.held:
                await self.conn.fetchval("SELECT pg_advisory_unlock($1)", self.lock_id)
        except Exception:
            self.connections.give(self.conn, broken=True)
        except BaseException:
            self.connections.give(self.conn, broken=True)
            raise
        else:
            self.connections.give(self.conn)
        finally:
            self.held = False


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
                await asyncio.shield(lock.release())

    async def advisory_lock(
        self, lock_id: int, *, wait: bool, poll: float = 0.05
    ) -> AdvisoryLock | None:
        """Take a PostgreSQL advisory lock on a connection of its own; None on SQLite.

        With `wait=False`, raises `LockBusyError` if another connection holds it.
        """
        connections = self._db.lock_connections
        if connections is None:
            return None

        async def connect_and_try() -> tuple[AdvisoryLock, bool]:
            lock = AdvisoryLock(connections, await connections.take(), lock_id)
            try:
                return lock, await lock.try_acquire()
            except BaseException:
                await lock.release()
                raise

        first = asyncio.ensure_future(connect_and_try())
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
                held = await lock.try_acquire()
        except BaseException:
            await asyncio.shield(lock.release())
            raise
        return lock

    def _release_when_done(self, first: asyncio.Future[tuple[AdvisoryLock, bool]]) -> None:
        if not first.cancelled() and first.exception() is None:
            lock, _held = first.result()
            task = asyncio.ensure_future(lock.release())
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)

    async def lock_alive(self, lock: AdvisoryLock) -> bool:
        return await lock.alive()

    async def release_lock(self, lock: AdvisoryLock) -> None:
        await asyncio.shield(lock.release())
