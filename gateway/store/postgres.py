"""PostgreSQL on the event loop: asyncpg connections for the per-message statements and locks.

A message on PostgreSQL costs about ten short statements. Run on database threads through
psycopg, each paid a thread hop and a fight for the GIL with the event loop (measured with 40
chats at once: 250 µs of the gateway's CPU for a one-statement step; docs/scaling.md); asyncpg
answers on the loop itself, with no thread (about 90 µs). `HotPath`'s statements stay
synchronous code written against a DB-API cursor: `run_step` runs one inside a greenlet
(SQLAlchemy's bridge, as its own asyncio support does), and `Cursor` turns each `execute` into
an awaited asyncpg call. Everything else (the ORM, migrations, the scheduler's job store) keeps
psycopg on the database threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import lru_cache
from typing import Any, TypeVar

from sqlalchemy.engine import make_url
from sqlalchemy.util import await_only, greenlet_spawn

T = TypeVar("T")

_PARAM = re.compile(r"%\((\w+)\)s|%%")


@lru_cache(maxsize=512)
def dollar(statement: str) -> tuple[str, tuple[str, ...]]:
    """A psycopg statement (`%(name)s`, `%%`) as asyncpg's (`$1`, `%`), and the parameter
    names in `$n` order (a name used twice is one parameter)."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return _PARAM.sub(number, statement), tuple(names)


class Cursor:
    """The part of a DB-API cursor `HotPath` uses, over an asyncpg connection. `wait` turns
    each call into its result: by default `await_only`, callable only inside `run_step`'s
    greenlet (each statement is awaited on the loop)."""

    def __init__(self, conn: Any, wait: Callable[[Awaitable[Any]], Any] = await_only) -> None:
        self._conn = conn
        self._wait = wait
        self._rows: list[Any] = []
        self.rowcount = -1

    def execute(self, statement: str, params: dict[str, Any] | None = None) -> None:
        sql, names = dollar(statement)
        values = params or {}
        self._rows = self._wait(self._conn.fetch(sql, *(values[n] for n in names)))
        self.rowcount = len(self._rows)

    def executemany(self, statement: str, params: Sequence[dict[str, Any]]) -> None:
        sql, names = dollar(statement)
        self._wait(self._conn.executemany(sql, [tuple(p[n] for n in names) for p in params]))
        self._rows, self.rowcount = [], -1

    def fetchone(self) -> Any:
        return tuple(self._rows[0]) if self._rows else None

    def fetchall(self) -> list[Any]:
        return [tuple(row) for row in self._rows]

    def close(self) -> None:
        self._rows = []


async def run_step(conn: Any, fn: Callable[[Cursor], T], transaction: bool) -> T:
    """`fn(cursor)` on `conn`: in autocommit (each statement commits on its own), or as one
    transaction."""
    if not transaction:
        return await greenlet_spawn(fn, Cursor(conn))
    async with conn.transaction():
        return await greenlet_spawn(fn, Cursor(conn))


def asyncpg_dsn(url: str) -> str:
    """A SQLAlchemy PostgreSQL URL (any driver) as the plain DSN asyncpg takes."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def discard(conn: Any) -> None:
    """Close a connection at once, without a word to the server (which then drops its locks
    and any open transaction). One of an event loop already closed cannot be told to: its
    socket goes with the object."""
    with contextlib.suppress(RuntimeError):  # "Event loop is closed"
        conn.terminate()


async def close(conn: Any) -> None:
    """Close a connection telling the server (at most 5 s), or else at once."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.close(), timeout=5)
    if not conn.is_closed():
        discard(conn)


class Connections:
    """asyncpg connections opened as needed and kept for reuse, at most `limit` in use.

    Not asyncpg's own pool: its acquire and release cost more of the loop's CPU than the
    statement (measured: 300 µs a step against 90 µs with a plain free list). The newest
    idle connection goes first, so a quiet gateway keeps using a few. A connection that
    failed, or whose step was cancelled mid-statement, is closed rather than reused. Bound to
    the event loop that opened it: another loop (the CLI runs one per command) opens its own.
    """

    def __init__(
        self, url: str, limit: int, keep: int | None = None, settings: dict[str, str] | None = None
    ) -> None:
        import asyncpg  # the [postgres] extra: imported only when PostgreSQL is used

        self._asyncpg = asyncpg
        self.dsn = asyncpg_dsn(url)
        self.limit = limit
        self.keep = limit if keep is None else keep
        self.settings = settings or {}
        self._idle: list[Any] = []
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _bind(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._slots is None:
            for conn in self._idle:  # opened on a loop that is gone: no await possible
                discard(conn)
            self._idle = []
            self._loop, self._slots = loop, asyncio.Semaphore(self.limit)
        return self._slots

    async def take(self) -> Any:
        """An open connection of this loop, waiting for a free slot; hand it back with
        `give` (always: it frees the slot)."""
        slots = self._bind()
        await slots.acquire()
        try:
            while self._idle:
                conn = self._idle.pop()
                if not conn.is_closed():
                    return conn
            return await self._asyncpg.connect(
                self.dsn, statement_cache_size=256, server_settings=self.settings
            )
        except BaseException:
            slots.release()
            raise

    def give(self, conn: Any, *, broken: bool = False) -> None:
        """Hand back a connection from `take`; `broken` (or no room to keep it) closes it."""
        if self._slots is not None and self._loop is asyncio.get_running_loop():
            self._slots.release()
        # A step that left it mid-transaction: never reuse it either.
        if broken or conn.is_closed() or conn.is_in_transaction() or len(self._idle) >= self.keep:
            discard(conn)
        else:
            self._idle.append(conn)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        conn = await self.take()
        broken = False
        try:
            yield conn
        except self._asyncpg.PostgresError:  # the server answered: the connection is fine
            raise
        except BaseException:  # cancelled mid-statement, or the connection failed
            broken = True
            raise
        finally:
            self.give(conn, broken=broken)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        mine = self._loop is asyncio.get_running_loop()
        self._loop = self._slots = None
        for conn in idle:
            if mine:
                await close(conn)
            else:
                discard(conn)
