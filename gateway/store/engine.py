"""The database under every repository: engines, the database thread, one transaction a step.

Each gateway step is one transaction run whole (accept a message, claim a turn, finish it), so
a message costs a few transactions rather than one event-loop round trip per statement.

SQLite (WAL) runs steps on one database thread, so this process's writes never contend; a write
transaction starts with BEGIN IMMEDIATE, so another process (the CLI) waits on the busy timeout
instead of failing half-way. The hot-path steps (`Database.fast`) run right on the event loop,
because handing so short a step to a thread costs more than the step; while that thread is busy
they wait for it in arrival order, and with the write lock held by another process they go to
the thread, which waits on the busy timeout instead of the loop.
PostgreSQL runs the hot-path steps on the event loop too, through asyncpg
(gateway/store/postgres.py): a thread hop and the GIL cost more than the statement; its other
steps (the ORM) run on a small thread pool (psycopg, `[gateway] database_threads`).

A step that fails on a storage fault (gateway/store/faults.py) raises a `StorageError` naming
the database and what to do; the last failure is remembered until a write succeeds again, so
`/healthz` reports it without touching the database (`Database.failure`), and whoever watches
(`Database.watch`: the pid file `gatehouse doctor` reads, the gateway's retries) hears of each
change.

A SQLite file deleted or replaced while the process runs would take every later write into a
file nobody will ever open again (the open descriptor still points at the old one). Before
each write the path is compared with the file opened (device and inode, one `stat`); once they
differ the database refuses writes for the rest of the process, its open copy is saved beside
the path, and one line says what to do (`Database.check_file`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import configure_mappers
from sqlmodel import Session

from gateway.config import redacted_url, sync_url
from gateway.store.faults import (
    StorageError,
    StorageHealth,
    damaged,
    storage_error,
    storage_faults,
)
from gateway.store.hot import Dialect, HotPath
from gateway.store.postgres import Connections, run_step
from gateway.store.schema import migrate

log = logging.getLogger(__name__)

T = TypeVar("T")

CHECKPOINT_EVERY = 200
"""Inline SQLite write transactions between WAL checkpoints (SQLite's own autocheckpoint
threshold is reached after about this many turns)."""


HealthWatcher = Callable[[StorageHealth], None]
"""Told of each change of the database's health (called on the event loop)."""


LOCK_CONNECTIONS = 8
"""PostgreSQL: connections holding advisory locks at once: the one holding every session lock
of this process (`LockLine`), the scheduler leader's, and any other lock held apart."""

HOT_CONNECTIONS = 8
"""PostgreSQL: hot-path steps in flight at once (each on an asyncpg connection of its own);
more wait for one. Idle ones stay open. The loop runs one step's Python at a time, so more
only help while round trips are long (a far server): 8 in flight at 1 ms each is 8,000
statements a second, ~1,000 messages."""


def execute(db: Session, statement: Any) -> None:
    """Run an UPDATE or DELETE whose result nobody reads (typed once, for every repository)."""
    db.exec(statement)


class Database:
    """One database (SQLite file or PostgreSQL URL), shared by every repository of a Store.

    Repositories run their work through `read`/`write` (an ORM session on the database thread)
    or `fast` (plain SQL on a driver cursor, see `HotPath`); `run` is the thread hop itself.
    """

    def __init__(self, url: str, *, threads: int = 2) -> None:
        self.url = sync_url(url)
        self.is_sqlite = self.url.startswith("sqlite")
        if self.is_sqlite:
            self.engine: Engine = create_engine(
                self.url, connect_args={"check_same_thread": False, "timeout": 30}
            )
            event.listen(self.engine, "connect", _sqlite_pragmas)
            event.listen(self.engine, "begin", _sqlite_begin)
            workers = 1
            self.lock_connections: Connections | None = None
            self.connections: Connections | None = None
        else:
            # The ORM's steps, one connection a database thread, and the scheduler's job store.
            self.engine = create_engine(
                self.url, pool_size=threads + 2, max_overflow=4, pool_pre_ping=True
            )
            event.listen(self.engine, "connect", _postgres_utc)
            # Advisory locks live as long as the backend connection holding them (gateway/
            # store/locks.py): the session locks share one, the leader's lock has its own.
            self.lock_connections = Connections(self.url, LOCK_CONNECTIONS, keep=2)
            workers = threads
            # Every hot-path statement is a keyed lookup or write, which a generic plan serves;
            # left to choose, the server plans `id = ANY(:ids)` anew on every call (~130 µs of
            # its CPU a message, measured with pg_stat_statements).
            self.connections = Connections(
                self.url, HOT_CONNECTIONS, settings={"plan_cache_mode": "force_generic_plan"}
            )
        configure_mappers()  # rows built with model_construct need configured mappers
        self.hot = HotPath(Dialect(sqlite=self.is_sqlite))
        """The per-message statements in this database's SQL dialect."""
        self._writer = self.engine.execution_options(gatehouse_write=True)
        self._workers = workers
        self._executor: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._held: list[Any] = []
        self._inline: Any = None  # SQLite: the event loop's own connection for `fast` steps
        self._inline_writes = 0
        self._busy_lock = threading.Lock()
        self._busy = 0  # steps submitted to the database thread(s) and not yet finished
        # SQLite steps waiting for the thread to go idle, in arrival order (see `fast`).
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._released = 0  # waiters told to go that have not run yet
        self._checkpoints: set[asyncio.Task[None]] = set()
        self._on_rollback: list[Callable[[], None]] = []
        self.integrity_errors: tuple[type[BaseException], ...] = (
            IntegrityError,
            self.engine.dialect.loaded_dbapi.IntegrityError,
            *self._asyncpg_errors("IntegrityConstraintViolationError"),
        )
        """What a unique-constraint violation raises, through the ORM or on a driver cursor."""
        self._database_errors: tuple[type[BaseException], ...] = (
            DBAPIError,
            self.engine.dialect.loaded_dbapi.Error,
            StorageError,
            *self._asyncpg_errors("PostgresError", "InterfaceError"),
            ConnectionError,  # asyncpg: the server went away, or refused the connection
        )
        self.where: Path | str = self.path or redacted_url(url)
        """How errors name this database: its SQLite file, or its URL without the password."""
        self._failure: str | None = None  # see `failure`
        self.health = StorageHealth()
        """What this process saw of the database's faults (see `watch`)."""
        self._watchers: list[HealthWatcher] = []
        self._failed_at = 0.0  # monotonic time of the current failure's first step
        self._identity: tuple[int, int] | None = None  # the SQLite file opened: device, inode
        self._gone: StorageError | None = None  # see `check_file`
        self._rescues: set[asyncio.Task[None]] = set()

    @property
    def path(self) -> Path | None:
        """The SQLite file, or None for PostgreSQL or an in-memory database."""
        database = make_url(self.url).database
        if not self.is_sqlite or not database or database == ":memory:":
            return None
        return Path(database)

    def on_rollback(self, forget: Callable[[], None]) -> None:
        """Call `forget` whenever a `fast` step rolls back: a repository's cache may name rows
        that transaction created and never committed."""
        self._on_rollback.append(forget)

    async def open(self) -> str:
        """Open (creating the SQLite file and its directory) and migrate; the schema status.
        A storage fault raises the StorageError that says what to do."""
        with storage_faults(self.where):
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            status = await self.run(self._migrate)
        if self.path is not None and self._identity is None:
            with contextlib.suppress(OSError):  # gone already: the first write says so
                found = os.stat(self.path)
                self._identity = (found.st_dev, found.st_ino)
        self._succeeded()
        return status

    def _migrate(self) -> str:
        with self._writer.begin() as conn:
            return migrate(conn)

    async def verify(self) -> None:
        """SQLite: `PRAGMA quick_check` (every page read once), so a damaged file is refused at
        start, not found out by a message. A StorageError says how to recover. Nothing to check
        on PostgreSQL, or before the file exists."""
        if self.path is None or not self.path.exists():
            return

        def step() -> list[str]:
            with self.engine.connect() as conn:
                rows = conn.exec_driver_sql("PRAGMA quick_check(1)").all()
            return [str(row[0]) for row in rows]

        with storage_faults(self.where):
            problems = await self.run(step)
        if problems != ["ok"]:
            lines = [line.strip() for p in problems for line in p.splitlines()]
            first = next((line for line in lines if line and not line.startswith("***")), "?")
            raise damaged(self.where, f"quick_check: {first[:120]}")

    @property
    def failure(self) -> str | None:
        """Why the last step failed, while no write has succeeded since (or for good: the file
        was deleted or replaced); else None. Remembered, not probed: reading it costs nothing
        but the `stat` of the file (`check_file`)."""
        self.check_file()
        return self._failure

    @property
    def gone(self) -> bool:
        """The SQLite file was deleted or replaced while this process ran: writes are refused
        until a restart."""
        return self._gone is not None

    def watch(self, watcher: HealthWatcher) -> None:
        """Call `watcher` with `health` whenever it changes: a step fails (with another reason
        than before), or a write succeeds after a failure."""
        self._watchers.append(watcher)

    def _set_failure(self, reason: str | None, *, permanent: bool = False) -> None:
        """Remember (or, with None, clear) the failure; tell the watchers of a change."""
        if reason == self._failure or (reason is None and self._gone is not None):
            return
        if reason is None:
            log.info(
                "the database %s works again (it failed for %.0f s: %s)",
                self.where, time.monotonic() - self._failed_at, self._failure,
            )
            self.health.recovered()
        else:
            if self._failure is None:
                self._failed_at = time.monotonic()
            self.health.failed(reason, permanent=permanent)
        self._failure = reason
        for watcher in self._watchers:
            try:
                watcher(self.health)
            except Exception:  # a watcher's bug must not fail a database step
                log.exception("a database health watcher failed")

    def _succeeded(self) -> None:
        """A write committed: a failure remembered so far is over (one check when there is
        none)."""
        if self._failure is not None:
            self._set_failure(None)

    def check_file(self) -> StorageError | None:
        """SQLite: the StorageError to raise when the file at the path is no longer the file
        this process opened (deleted, or replaced by another), else None. The first time, it
        is remembered for good (writes are refused from then on, `/healthz` says so), the open
        copy is saved beside the path (`_rescue`) and one line is logged."""
        if self._gone is None and self._identity is not None and self.path is not None:
            what = _file_change(self.path, self._identity)
            if what is not None:
                self._lost(what)
        return self._gone

    def _asyncpg_errors(self, *names: str) -> tuple[type[BaseException], ...]:
        """asyncpg's exception classes of these names on PostgreSQL; none on SQLite (asyncpg
        is not loaded for a database it never talks to)."""
        return () if self.is_sqlite else _asyncpg_errors(*names)

    def _writable(self) -> None:
        """Before a write: refuse it when the file was deleted or replaced (`check_file`)."""
        if self._identity is not None:
            gone = self.check_file()
            if gone is not None:  # a new one each time: no traceback piles up on one object
                raise StorageError(gone.problem, gone.fix)

    def _lost(self, what: str) -> None:
        path = self.path
        assert path is not None
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None  # no loop to save the copy on (a caller outside the gateway)
        source = self._open_connection()
        rescued: Path | None = None
        if loop is not None and source is not None and path.parent.is_dir():
            stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
            rescued = path.with_name(f"{path.name}.rescued-{stamp}")
        if rescued is None:
            fix = f"stop the gateway and restore {path} from a backup"
        elif what == "deleted":
            fix = (
                f"stop the gateway, move {rescued.name} (what it had open) to {path}, then "
                "start it again"
            )
        else:
            fix = (
                f"restart the gateway to use the new {path.name}, or stop it and move "
                f"{rescued.name} (what it had open) into its place first to keep the old one"
            )
        self._gone = StorageError(
            f"{path} was {what} while the gateway ran: it takes no more turns", fix
        )
        self._set_failure(str(self._gone), permanent=True)
        if loop is None or rescued is None:
            log.error("%s", self._gone)
            return
        task = loop.create_task(self._rescue(source, rescued))
        self._rescues.add(task)
        task.add_done_callback(self._rescues.discard)

    def _open_connection(self) -> Any:
        """A connection opened before the file went away (it still reads the old file), or
        None: a new one would open whatever is at the path now."""
        return self._inline if self._inline is not None else next(iter(self._held), None)

    async def _rescue(self, source: Any, target: Path) -> None:
        """Copy what `source` still reads (the old file, its write-ahead log included) to
        `target` with SQLite's backup, on the database thread (the connection is used by no
        other step meanwhile), then log the one line that says what happened."""

        def copy() -> None:
            with contextlib.closing(sqlite3.connect(target)) as copy_to:
                source.driver_connection.backup(copy_to)

        try:
            await self.run(copy)
        except Exception as exc:
            assert self._gone is not None and self.path is not None
            self._gone = StorageError(
                self._gone.problem,
                f"stop the gateway and restore {self.path} from a backup (saving what it had "
                f"open as {target.name} failed: {exc})",
            )
            self._set_failure(str(self._gone), permanent=True)
        log.error("%s", self._gone)

    def _failed(self, exc: Exception) -> Exception:
        """A step failed with `exc`: remember a database error for `failure`, and give the
        exception to raise (a storage fault becomes the StorageError that names the file)."""
        if isinstance(exc, self.integrity_errors) or not isinstance(exc, self._database_errors):
            return exc
        fault = storage_error(exc, self.where)
        if fault is None:
            driver = getattr(exc, "orig", None) or exc
            reason = (str(driver).strip() or type(driver).__name__).splitlines()[0]
        else:
            reason = str(fault)
        if self._gone is None:
            self._set_failure(reason[:500])
        if fault is None or fault is exc:
            return exc
        fault.__cause__ = exc
        return fault

    async def close(self) -> None:
        if self._rescues:  # the open copy of a deleted file: saved before its connection closes
            await asyncio.gather(*self._rescues, return_exceptions=True)
        for connections in (self.connections, self.lock_connections):
            if connections is not None:
                await connections.close()
        await asyncio.get_running_loop().run_in_executor(None, self._shutdown)

    def _shutdown(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        self._local = threading.local()
        self._inline = None
        for conn in self._held:
            conn.close()
        self._held.clear()
        self.engine.dispose()

    # -- the database thread ----------------------------------------------------------------

    async def run(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the database thread (SQLite) or thread pool (PostgreSQL)."""
        if self._executor is None:  # first use, or used again after close() like an engine
            self._executor = ThreadPoolExecutor(self._workers, thread_name_prefix="gatehouse-db")
        loop = asyncio.get_running_loop()
        try:
            if not self.is_sqlite:  # nothing waits for PostgreSQL's threads to go idle
                return await loop.run_in_executor(self._executor, fn)
            with self._busy_lock:
                self._busy += 1
            # Counted until the thread is done with it, even if the awaiting task is cancelled.
            future = self._executor.submit(fn)
            future.add_done_callback(lambda _f: self._done(loop))
            return await asyncio.wrap_future(future)
        except Exception as exc:
            raise self._failed(exc)  # noqa: B904  (_failed chains a StorageError to exc)

    def _done(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the database thread: one step fewer; the loop lets the next waiter go."""
        with self._busy_lock:
            self._busy -= 1
            idle = self._busy == 0
        if idle:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(self._next)

    def _next(self) -> None:
        """Let every waiting step go, if the thread is idle and those let go before have run.

        All at once: they wake in arrival order within one turn of the loop, and steps arriving
        meanwhile queue behind them. Let go one at a time, a queue that formed behind a busy
        thread would drain one step per loop turn while new steps joined it, and rarely empty.
        """
        if self._busy or self._released:
            return
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._released += 1

    async def _my_turn(self) -> None:
        """Wait, in arrival order, until the database thread is idle and earlier steps ran."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        self._next()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # let go, but will not run
                self._released -= 1
                self._next()
            raise
        self._released -= 1

    # -- steps ------------------------------------------------------------------------------

    async def read(self, fn: Callable[[Session], T]) -> T:
        """Run `fn` in a read transaction on the database thread."""

        def step() -> T:
            with Session(self.engine, expire_on_commit=False) as db:
                return fn(db)

        return await self.run(step)

    async def write(self, fn: Callable[[Session], T]) -> T:
        """Run `fn` in one write transaction: committed on success, rolled back on error."""
        self._writable()

        def step() -> T:
            with Session(self._writer, expire_on_commit=False) as db, db.begin():
                return fn(db)

        result = await self.run(step)
        self._succeeded()
        return result

    async def fast(
        self, fn: Callable[[Any], T], *, write: bool = False, autocommit: bool = False
    ) -> T:
        """Run `fn(cursor)` in one transaction on a driver connection of its own.

        `autocommit`: each statement of `fn` may commit on its own (one statement, or writes
        that need not be atomic together), so on PostgreSQL they run in autocommit: a round
        trip a statement, no BEGIN or COMMIT.

        SQLite: right here on the event loop. While the database thread is busy (an ORM step,
        a checkpoint, a step waiting for another process's lock) it waits for it, in arrival
        order, so steps never overtake each other; sending it to the thread instead would queue
        every later step there too, each then paying the hop. See the module docstring for why.
        """
        if write:
            self._writable()
        if self.is_sqlite:
            if self._busy or self._waiting or self._released:
                await self._my_turn()
            try:
                result = self._transaction(self._inline_connection(), fn, write)
            except sqlite3.OperationalError as exc:
                if not _is_locked(exc):
                    self._next()
                    raise self._failed(exc)  # noqa: B904
                # Another process holds the lock: wait for it on the thread, not on the loop.
                # The next waiter is let go once that step is done (`_done`), not before: it
                # would overtake it.
            except Exception as exc:
                self._next()
                raise self._failed(exc)  # noqa: B904
            except BaseException:
                self._next()
                raise
            else:
                self._next()
                if write:
                    self._succeeded()
                return result

        if self.connections is not None:
            return await self._postgres_step(self.connections, fn, write, autocommit)

        def step() -> T:  # SQLite: the inline step found the write lock taken: wait for it here
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = self.engine.raw_connection()
                self._held.append(conn)
            return self._transaction(conn, fn, write)

        result = await self.run(step)
        if write:
            self._succeeded()
        return result

    async def _postgres_step(
        self, connections: Connections, fn: Callable[[Any], T], write: bool, autocommit: bool
    ) -> T:
        """A `fast` step on PostgreSQL, on the event loop (asyncpg): a read, or a write marked
        `autocommit`, runs in autocommit (no BEGIN, no COMMIT: one round trip a statement;
        under READ COMMITTED each statement of a transaction takes a snapshot of its own
        anyway); any other write is one transaction."""
        try:
            async with connections.connection() as conn:
                result = await run_step(conn, fn, transaction=write and not autocommit)
        except BaseException as exc:
            for forget in self._on_rollback:
                forget()
            if isinstance(exc, Exception):
                raise self._failed(exc)  # noqa: B904  (_failed chains a StorageError to exc)
            raise
        if write:
            self._succeeded()
        return result

    def _transaction(self, conn: Any, fn: Callable[[Any], T], write: bool) -> T:
        cursor = conn.cursor()
        try:
            if write and self.is_sqlite:
                cursor.execute("BEGIN IMMEDIATE")
            result = fn(cursor)
            conn.commit()
        except BaseException:
            conn.rollback()
            for forget in self._on_rollback:
                forget()
            raise
        finally:
            cursor.close()
        if write and conn is self._inline:
            self._after_inline_write()
        return result

    def _inline_connection(self) -> Any:
        """The loop's SQLite connection: never waits for a lock (busy timeout 0) and leaves
        WAL checkpoints (disk writes and an fsync) to the database thread."""
        if self._inline is None:
            conn = self.engine.raw_connection()
            cursor = conn.cursor()
            cursor.execute("PRAGMA busy_timeout=0")
            cursor.execute("PRAGMA wal_autocheckpoint=0")
            cursor.close()
            self._held.append(conn)
            self._inline = conn
        return self._inline

    def _after_inline_write(self) -> None:
        self._inline_writes += 1
        if self._inline_writes % CHECKPOINT_EVERY == 0:
            task = asyncio.get_running_loop().create_task(self._checkpoint())
            self._checkpoints.add(task)
            task.add_done_callback(self._checkpoints.discard)

    async def _checkpoint(self) -> None:
        """Move the write-ahead log into the database file (what SQLite's autocheckpoint
        would do at commit), on the database thread."""

        def step() -> None:
            with self.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

        if self.check_file() is not None:
            return  # nothing of the old file is worth moving about
        try:
            await self.run(step)
        except Exception:
            log.warning("SQLite WAL checkpoint failed; the next one retries", exc_info=True)


def _file_change(path: Path, opened: tuple[int, int]) -> str | None:
    """What happened to the file at `path` since the one with (device, inode) `opened` was
    opened there: "deleted", "replaced by another file", or None (still the same)."""
    try:
        found = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return "deleted"
    except OSError:
        return None  # cannot tell (its directory's permissions changed): a write will say
    return None if (found.st_dev, found.st_ino) == opened else "replaced by another file"


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    message = str(exc).lower()
    return "locked" in message or "busy" in message


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # The driver's own implicit transactions are off: _sqlite_begin says when one starts.
    dbapi_conn.isolation_level = None
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _postgres_utc(dbapi_conn: Any, _record: Any) -> None:
    """Timestamps are stored as UTC wall time whatever the server's time zone."""
    with dbapi_conn.cursor() as cursor:
        cursor.execute("SET TIME ZONE 'UTC'")
    dbapi_conn.commit()


def _sqlite_begin(conn: Connection) -> None:
    """Writers take the write lock up front, so a transaction never fails half-way on BUSY."""
    write = conn.get_execution_options().get("gatehouse_write", False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _asyncpg_errors(*names: str) -> tuple[type[BaseException], ...]:
    """asyncpg's exception classes of these names (none without the [postgres] extra)."""
    try:
        import asyncpg
    except ImportError:
        return ()
    return tuple(getattr(asyncpg, name) for name in names)
