"""Cross-process locks: PostgreSQL advisory locks, which die with the connection holding them.

Several gateway processes may share one PostgreSQL database: a session's turns must still run
one at a time (`Locks.session_lock`), and one process leads the scheduler (gateway/jobs/leader.py).
A lock lives as long as the backend connection holding it, so a dead process frees its locks.
One gateway process per SQLite file needs none of this: on SQLite every lock is a no-op.

A process holds all its session locks on one connection (`LockLine`): a backend can hold many
advisory locks at once, and the takes and releases asked for while one statement runs go
together in the next, so under load a message costs a fraction of a lock statement, and a
process one lock connection instead of one per running turn. The leader's lock keeps a
connection of its own (`AdvisoryLock`): losing it must mean losing only the leadership.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from gateway.store.engine import Database
from gateway.store.postgres import Connections, close

log = logging.getLogger(__name__)


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
        broken = True
        try:
            if self.held:
                await self.conn.fetchval("SELECT pg_advisory_unlock($1)", self.lock_id)
            broken = False
        except Exception:
            pass  # closing the connection unlocks
        finally:
            self.connections.give(self.conn, broken=broken)
            self.held = False


_TAKE_OR_RELEASE = (
    "SELECT CASE WHEN t.take THEN pg_try_advisory_lock(t.id) ELSE pg_advisory_unlock(t.id) END "
    "FROM unnest($1::bigint[], $2::boolean[]) WITH ORDINALITY AS t(id, take, n) ORDER BY t.n"
)
"""Takes and releases in the order asked (a release and the next take of the same lock can
share a statement), each answered true when it took or released the lock."""


class LockLine:
    """One connection holding every session lock of this process; each request waits for at
    most the statement in flight, and those asked meanwhile go in the next one together."""

    def __init__(self, connections: Connections) -> None:
        self._connections = connections
        self._conn: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop `_conn` belongs to
        self._asked: list[tuple[int, bool, asyncio.Future[bool] | None]] = []
        """Requests not yet sent, in order; a release nobody waits for has no future."""
        self._running: asyncio.Task[None] | None = None

    async def ask(self, lock_id: int, take: bool) -> bool:
        """Take (without waiting for another holder) or release `lock_id`; did it?"""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a connection (and a run) of a loop that is gone
            conn, self._conn, self._running, self._asked = self._conn, None, None, []
            if conn is not None:
                self._connections.give(conn, broken=True)
            self._loop = loop
        answer: asyncio.Future[bool] = loop.create_future()
        self._asked.append((lock_id, take, answer))
        if self._running is None:
            self._running = asyncio.create_task(self._run())
        return await answer

    async def _run(self) -> None:
        try:
            while self._asked:
                batch, self._asked = self._asked, []
                try:
                    conn = await self._connection()
                    rows = await conn.fetch(
                        _TAKE_OR_RELEASE, [b[0] for b in batch], [b[1] for b in batch]
                    )
                except Exception as exc:
                    self._drop()
                    for _id, _take, answer in batch:
                        if answer is not None and not answer.done():
                            answer.set_exception(exc)
                    continue
                for (lock_id, take, answer), row in zip(batch, rows, strict=True):
                    if answer is None:
                        continue
                    if answer.done():  # its asker was cancelled: never keep a lock nobody holds
                        if take and row[0]:
                            self._asked.append((lock_id, False, None))
                    else:
                        answer.set_result(bool(row[0]))
        finally:
            self._running = None

    async def _connection(self) -> Any:
        if self._conn is not None and self._conn.is_closed():
            log.warning(
                "lost the connection holding this process's session locks; turns running now "
                "are no longer exclusive across processes"
            )
            self._drop()
        if self._conn is None:
            self._conn = await self._connections.take()
        return self._conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._connections.give(conn, broken=True)

    async def close(self) -> None:
        """Release every lock (by closing the connection that holds them)."""
        if self._running is not None:
            await asyncio.gather(self._running, return_exceptions=True)
        conn, self._conn = self._conn, None
        if conn is not None:  # closed, never reused: it may still hold a lock
            await close(conn)
            self._connections.give(conn, broken=True)


class Locks:
    """Take, check and release advisory locks on the database's lock connections."""

    def __init__(self, database: Database) -> None:
        self._db = database
        self._releasing: set[asyncio.Future[None]] = set()
        connections = database.lock_connections
        self._line = LockLine(connections) if connections is not None else None
        self._mine: dict[str, tuple[asyncio.Lock, int]] = {}
        """Per session key asked for in this process: its lock here, and how many hold or wait."""

    @contextlib.asynccontextmanager
    async def session_lock(self, key: str, poll: float = 0.05) -> AsyncIterator[None]:
        """Hold a session's lane across processes (PostgreSQL advisory lock; SQLite: no-op).

        One gateway process per SQLite file needs no more than the in-process lanes; on
        PostgreSQL every process that wants to run a turn for `key` waits here first. The
        locks share one connection, where a second take of a lock would succeed; so this
        process's own askers for `key` take turns here first.
        """
        line = self._line
        if line is None:
            yield
            return
        mine, users = self._mine.get(key) or (asyncio.Lock(), 0)
        self._mine[key] = (mine, users + 1)
        lock = lock_id("session:" + key)
        try:
            async with mine:
                await self._take(line, lock, poll)
                try:
                    yield
                finally:
                    await asyncio.shield(self._release(line, lock))
        finally:
            _mine, users = self._mine[key]
            if users == 1:
                del self._mine[key]
            else:
                self._mine[key] = (mine, users - 1)

    async def _take(self, line: LockLine, lock: int, poll: float) -> None:
        delay = poll
        while not await line.ask(lock, take=True):
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _release(self, line: LockLine, lock: int) -> None:
        try:
            await line.ask(lock, take=False)
        except Exception:  # the connection is gone, and the lock with it
            log.debug("session lock %d released with its connection", lock, exc_info=True)

    async def close(self) -> None:
        if self._line is not None:
            await self._line.close()

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
