"""The store: one place for every read and write of sessions, messages and compactions.

Each gateway step is one transaction run whole: accepting an inbound message (session
get-or-create, dedupe, insert), claiming a turn's messages, finishing a turn (reply, handled
marks, usage). One transaction per step, not one event-loop round trip per statement: an async
driver paid ~130 round trips and ~40 ms a message.

SQLite (WAL) runs steps on one database thread, so this process's writes never contend; each
write transaction starts with BEGIN IMMEDIATE, so another process (the CLI) waits on the busy
timeout instead of failing mid-transaction. The hot-path steps (`_fast`, ~0.1 ms of SQLite each)
run right on the event loop: handing one to a thread cost more than the step (a future, a
wake-up, a GIL hand-off). While that thread is busy they wait for it in arrival order (`_fast`).
They never wait for a lock on the loop: with the write lock held by another process they go to
the thread, which waits on the busy timeout instead.
PostgreSQL runs every step on a small thread pool (psycopg): its steps wait on the network.

A step that fails on a storage fault (gateway/store/faults.py: a damaged page, a full disk, a
server gone) raises a `StorageError` naming the database and what to do. The store remembers
the last failed step until a write succeeds again: `/healthz` reports it without touching the
database (`Store.failure`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import sqlite3
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, delete, event, func, or_, update
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError
from sqlalchemy.orm import configure_mappers
from sqlmodel import Session, col, select

from channels.base import InboundMessage, OutboundMessage
from context.types import Message, ToolCall
from gateway.config import redacted_url
from gateway.store.faults import StorageError, damaged, storage_error, storage_faults
from gateway.store.hot import Dialect, HotPath, message_meta
from gateway.store.models import (
    CompactionRow,
    MemoryFlushRow,
    MessageRow,
    OutboxRow,
    PairingRow,
    SessionRow,
    TurnRecordRow,
    utcnow,
)
from gateway.store.schema import migrate

log = logging.getLogger(__name__)

CONTEXT_STATUS = "context"
"""An unmentioned group message: stored, shown to the model with the next mention."""

T = TypeVar("T")

_DRIVERS = {
    "sqlite": "sqlite",
    "sqlite+aiosqlite": "sqlite",
    "sqlite+pysqlite": "sqlite",
    "postgresql": "postgresql+psycopg",
    "postgresql+asyncpg": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
}
SUPPORTED_SCHEMES = tuple(sorted(_DRIVERS))


def sync_url(url: str) -> str:
    """The driver the store runs on for a configured URL (older async spellings still accepted)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ValueError(
            "not a database URL: use sqlite:///PATH or postgresql://USER:PASSWORD@HOST/DB"
        ) from None
    driver = _DRIVERS.get(parsed.drivername)
    if driver is None:
        raise ValueError(
            f"unsupported database URL scheme {parsed.drivername!r}: use sqlite:///PATH or "
            "postgresql://USER:PASSWORD@HOST/DB"
        )
    return parsed.set(drivername=driver).render_as_string(hide_password=False)


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """Where a session lives; used when the session row is first created."""

    key: str
    agent: str = "main"
    platform: str = ""
    chat_type: str = ""
    chat_id: str = ""
    thread_id: str | None = None
    account: str = "default"


Known = tuple[int, int] | None
"""What a cached history holds: (the covered seq it starts after, its last seq); see
`Store.summary_and_history`."""


@dataclass(frozen=True, slots=True)
class HistoryRead:
    """`Store.summary_and_history`'s answer, and the cache state (`known`) it was read for."""

    known: Known
    summary: CompactionRow | None
    after: int
    messages: list[Message]


@dataclass(frozen=True, slots=True)
class TurnUsage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def row_to_message(row: MessageRow) -> Message:
    calls = tuple(ToolCall.from_openai(tc) for tc in row.tool_calls or ())
    return Message(
        role=row.role,  # type: ignore[arg-type]
        content=row.content,
        tool_calls=calls,
        tool_call_id=row.tool_call_id,
        name=row.name,
        seq=row.seq,
        tokens=row.tokens,
        meta=message_meta(row.id, row.sender_id, row.status, row.tool_error, row.created_at),
    )


def _update(db: Session, stmt: Any) -> None:
    db.exec(stmt)


class Store:
    """SQLite (WAL) by default, PostgreSQL by URL; same models, same code."""

    def __init__(self, url: str, *, pool_size: int = 8) -> None:
        self.url = sync_url(url)
        self.is_sqlite = self.url.startswith("sqlite")
        if self.is_sqlite:
            self.engine: Engine = create_engine(
                self.url, connect_args={"check_same_thread": False, "timeout": 30}
            )
            event.listen(self.engine, "connect", _sqlite_pragmas)
            event.listen(self.engine, "begin", _sqlite_begin)
            workers = 1
            self._lock_engine: Engine | None = None
        else:
            # Each database thread keeps one connection for the hot path and borrows another
            # for ORM steps.
            self.engine = create_engine(
                self.url, pool_size=2 * pool_size, max_overflow=4, pool_pre_ping=True
            )
            event.listen(self.engine, "connect", _postgres_utc)
            # Advisory locks live as long as the backend connection holding them: one
            # autocommit connection per held lock (a session's lane, the scheduler's leader).
            self._lock_engine = create_engine(
                self.url, isolation_level="AUTOCOMMIT", pool_size=pool_size, max_overflow=256
            )
            workers = pool_size
        configure_mappers()  # rows built with model_construct need configured mappers
        self._writer = self.engine.execution_options(gatehouse_write=True)
        self._workers = workers
        self._executor: ThreadPoolExecutor | None = None
        self._session_ids: dict[str, int] = {}
        self._inbound_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self.schema_status = "not opened"
        self._hot = HotPath(Dialect(sqlite=self.is_sqlite))
        self._local = threading.local()
        self._held: list[Any] = []
        self._inline: Any = None  # SQLite: the event loop's own connection for `_fast` steps
        self._inline_writes = 0
        self._busy_lock = threading.Lock()
        self._busy = 0  # steps submitted to the database thread(s) and not yet finished
        # SQLite steps waiting for the thread to go idle, in arrival order (see `_fast`).
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._released = 0  # waiters told to go that have not run yet
        self._checkpoints: set[asyncio.Task[None]] = set()
        self._integrity_errors: tuple[type[BaseException], ...] = (
            IntegrityError,
            self.engine.dialect.loaded_dbapi.IntegrityError,
        )
        self._database_errors: tuple[type[BaseException], ...] = (
            DBAPIError,
            self.engine.dialect.loaded_dbapi.Error,
            StorageError,
        )
        self.where: Path | str = self.path or redacted_url(url)
        """How errors name this database: its SQLite file, or its URL without the password."""
        self._failure: str | None = None  # see `failure`

    @property
    def path(self) -> Path | None:
        """The SQLite file, or None for PostgreSQL or an in-memory database."""
        database = make_url(self.url).database
        if not self.is_sqlite or not database or database == ":memory:":
            return None
        return Path(database)

    async def init(self) -> None:
        """Open (creating the SQLite file and its directory) and migrate; a storage fault
        raises the StorageError that says what to do."""
        with storage_faults(self.where):
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self.schema_status = await self._run(self._migrate)

    def _migrate(self) -> str:
        with self._writer.begin() as conn:
            status = migrate(conn)
        self._failure = None
        return status

    async def verify(self) -> None:
        """SQLite: `PRAGMA quick_check` (every page read once; seconds for gigabytes), so a
        damaged file is refused at start, not found out by a message. A StorageError says how
        to recover. Nothing to check on PostgreSQL, or before the file exists."""
        if self.path is None or not self.path.exists():
            return

        def step() -> list[str]:
            with self.engine.connect() as conn:
                rows = conn.exec_driver_sql("PRAGMA quick_check(1)").all()
            return [str(row[0]) for row in rows]

        with storage_faults(self.where):
            problems = await self._run(step)
        if problems != ["ok"]:
            lines = [line.strip() for p in problems for line in p.splitlines()]
            first = next((line for line in lines if line and not line.startswith("***")), "?")
            raise damaged(self.where, f"quick_check: {first[:120]}")

    @property
    def failure(self) -> str | None:
        """Why the last store step failed, while no write has succeeded since; else None.
        Remembered, not probed: reading it costs nothing."""
        return self._failure

    def _failed(self, exc: Exception) -> Exception:
        """A step failed with `exc`: remember a database error for `failure`, and give the
        exception to raise (a storage fault becomes the StorageError that names the file)."""
        if isinstance(exc, self._integrity_errors) or not isinstance(exc, self._database_errors):
            return exc
        fault = storage_error(exc, self.where)
        if fault is None:
            driver = getattr(exc, "orig", None) or exc
            reason = (str(driver).strip() or type(driver).__name__).splitlines()[0]
        else:
            reason = str(fault)
        self._failure = reason[:500]
        if fault is None or fault is exc:
            return exc
        fault.__cause__ = exc
        return fault

    async def close(self) -> None:
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
        if self._lock_engine is not None:
            self._lock_engine.dispose()

    async def _run(self, fn: Callable[[], T]) -> T:
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
        meanwhile queue behind them. One at a time, a queue that formed behind a busy thread
        drained one step per loop turn while new steps joined it, so it rarely emptied.
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

    async def _read(self, fn: Callable[[Session], T]) -> T:
        """Run `fn` in a read transaction on the database thread."""

        def step() -> T:
            with Session(self.engine, expire_on_commit=False) as db:
                return fn(db)

        return await self._run(step)

    async def _write(self, fn: Callable[[Session], T]) -> T:
        """Run `fn` in one write transaction: committed on success, rolled back on error."""

        def step() -> T:
            with Session(self._writer, expire_on_commit=False) as db, db.begin():
                result = fn(db)
            self._failure = None
            return result

        return await self._run(step)

    async def _fast(self, fn: Callable[[Any], T], *, write: bool = False) -> T:
        """Run `fn(cursor)` in one transaction on a driver connection of its own.

        SQLite: right here on the event loop. While the database thread is busy (an ORM step,
        a checkpoint, a step waiting for another process's lock) it waits for it, in arrival
        order, so steps never overtake each other; sending it to the thread instead would queue
        every later step there too, each then paying the hop. See the module docstring for why.
        """
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
                return result

        def step() -> T:
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = self.engine.raw_connection()
                self._held.append(conn)
            return self._transaction(conn, fn, write)

        return await self._run(step)

    def _transaction(self, conn: Any, fn: Callable[[Any], T], write: bool) -> T:
        cursor = conn.cursor()
        try:
            if write and self.is_sqlite:
                cursor.execute("BEGIN IMMEDIATE")
            result = fn(cursor)
            conn.commit()
            if write:
                self._failure = None
        except BaseException:
            conn.rollback()
            self._session_ids.clear()  # may name a session whose insert was rolled back
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

        try:
            await self._run(step)
        except Exception:
            log.warning("SQLite WAL checkpoint failed; the next one retries", exc_info=True)

    # -- cross-process locks ----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def session_lock(self, key: str, poll: float = 0.05) -> AsyncIterator[None]:
        """Hold a session's lane across processes (PostgreSQL advisory lock; SQLite: no-op).

        One gateway process per SQLite file needs no more than the in-process lanes; on
        PostgreSQL every process that wants to run a turn for `key` waits here first.
        """
        lock = await self.advisory_lock(_lock_id("session:" + key), wait=True, poll=poll)
        try:
            yield
        finally:
            if lock is not None:
                await asyncio.shield(self._run(lock.release))

    async def advisory_lock(
        self, lock_id: int, *, wait: bool, poll: float = 0.05
    ) -> AdvisoryLock | None:
        """Take a PostgreSQL advisory lock on a connection of its own; None on SQLite.

        With `wait=False`, raises `LockBusyError` if another connection holds it.
        """
        if self._lock_engine is None:
            return None
        lock = await self._run(lambda: AdvisoryLock.connect(self._lock_engine, lock_id))
        try:
            delay = poll
            while not await self._run(lock.try_acquire):
                if not wait:
                    raise LockBusyError(lock_id)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        except BaseException:
            await asyncio.shield(self._run(lock.release))
            raise
        return lock

    async def lock_alive(self, lock: AdvisoryLock) -> bool:
        return await self._run(lock.alive)

    async def release_lock(self, lock: AdvisoryLock) -> None:
        await asyncio.shield(self._run(lock.release))

    # -- sessions ---------------------------------------------------------------------------

    async def get_session(self, key: str) -> SessionRow | None:
        return await self._fast(lambda cursor: self._hot.get_session(cursor, key))

    def _session_id(self, cursor: Any, info: SessionInfo) -> int:
        cached = self._session_ids.get(info.key)
        if cached is not None:
            return cached
        create = {
            "key": info.key,
            "agent": info.agent,
            "platform": info.platform,
            "chat_type": info.chat_type,
            "chat_id": info.chat_id,
            "thread_id": info.thread_id,
            "account": info.account,
        }
        session_id = self._hot.session_id(cursor, info.key, create)
        assert session_id is not None
        self._session_ids[info.key] = session_id
        return session_id

    async def ensure_session(self, info: SessionInfo) -> SessionRow:
        for _attempt in range(3):
            try:
                await self._fast(lambda cursor: self._session_id(cursor, info), write=True)
                break
            except self._integrity_errors:  # created concurrently by another process
                self._session_ids.pop(info.key, None)
                continue
        row = await self.get_session(info.key)
        assert row is not None
        return row

    async def list_sessions(self) -> list[SessionRow]:
        return await self._read(
            lambda db: list(
                db.exec(select(SessionRow).order_by(col(SessionRow.updated_at).desc())).all()
            )
        )

    async def sessions_with_pending(self, older_than: float | None = None) -> list[SessionRow]:
        """Sessions with inbound messages no turn has answered yet (e.g. after a crash).

        `older_than` (seconds) skips messages that just arrived: their own process is on them.
        """

        def op(db: Session) -> list[SessionRow]:
            pending = select(MessageRow.session_id).where(*_awaiting_answer())
            if older_than is not None:
                cutoff = utcnow() - timedelta(seconds=older_than)
                pending = pending.where(col(MessageRow.created_at) < cutoff)
            return list(db.exec(select(SessionRow).where(col(SessionRow.id).in_(pending))).all())

        return await self._read(op)

    async def has_pending(self, session_id: int) -> bool:
        """Whether inbound messages of this session still wait for a turn's answer."""
        stmt = select(MessageRow.id).where(MessageRow.session_id == session_id, *_awaiting_answer())
        return await self._read(lambda db: db.exec(stmt).first() is not None)

    async def sessions_idle_since(self, cutoff: datetime) -> list[SessionRow]:
        """Sessions with no activity (message, compaction) since `cutoff`, oldest first."""
        stmt = (
            select(SessionRow)
            .where(col(SessionRow.updated_at) < cutoff)
            .order_by(col(SessionRow.updated_at))
        )
        return await self._read(lambda db: list(db.exec(stmt).all()))

    async def set_session_error(self, session_id: int, error: str | None) -> None:
        stmt = (
            update(SessionRow)
            .where(col(SessionRow.id) == session_id)
            .values(last_error=error, updated_at=utcnow())
        )
        await self._write(lambda db: _update(db, stmt))

    # -- messages ---------------------------------------------------------------------------

    async def accept_inbound(
        self, info: SessionInfo, msg: InboundMessage, *, status: str | None = None
    ) -> tuple[int, MessageRow | None]:
        """Persist an inbound user message before its turn, creating the session if needed.

        Returns (session id, row); the row is None when the message is a duplicate (same
        platform message id in the same chat), so a redelivery is never answered twice.
        """

        def op(cursor: Any) -> tuple[int, MessageRow | None]:
            session_id = self._session_id(cursor, info)
            row = self._hot.insert_inbound(
                cursor,
                {
                    "session_id": session_id,
                    "role": "user",
                    "content": msg.text,
                    "sender_id": msg.sender_id,
                    "sender_name": msg.sender_name,
                    "platform": msg.platform,
                    "chat_id": msg.chat_id,
                    "platform_message_id": msg.platform_message_id,
                    "handled": False,
                    "status": status,
                },
            )
            return session_id, row

        # One session's messages reach the database in the order they arrived: SQLite's single
        # thread keeps that by itself, a PostgreSQL thread pool needs the (FIFO) lock.
        async with self._arrival_order(info.key):
            for _attempt in range(3):
                try:
                    return await self._fast(op, write=True)
                except self._integrity_errors:
                    # A concurrent insert of the same platform message (dedupe) or session.
                    continue
        raise RuntimeError(f"could not persist inbound message for {info.key}")

    async def reply_to(
        self, platform: str, chat_id: str, platform_message_id: str
    ) -> list[str] | None:
        """The stored reply to an inbound message, found by the key `accept_inbound` dedupes by.

        None while the message is unanswered (or unknown); [] when it was handled without a
        reply of its own (kept as context and expired). The reply is the one its turn stored:
        the turn that answered a message is the first to finish after the message got its place
        (turns of one session run one at a time), and its record names the reply's seq.
        """

        def op(db: Session) -> list[str] | None:
            found = db.exec(
                select(MessageRow.session_id, MessageRow.seq, MessageRow.handled).where(
                    MessageRow.platform == platform,
                    MessageRow.chat_id == chat_id,
                    MessageRow.platform_message_id == platform_message_id,
                )
            ).first()
            if found is None:
                return None
            session_id, seq, handled = found
            if not handled:
                return None
            if seq is None:
                return []
            reply_seq = db.exec(
                select(func.min(TurnRecordRow.reply_seq)).where(
                    TurnRecordRow.session_id == session_id,
                    col(TurnRecordRow.reply_seq) > seq,
                )
            ).one()
            if reply_seq is None:
                return []
            content = db.exec(
                select(MessageRow.content).where(
                    MessageRow.session_id == session_id, MessageRow.seq == reply_seq
                )
            ).first()
            return [content] if isinstance(content, str) else []

        return await self._read(op)

    def _arrival_order(self, key: str) -> contextlib.AbstractAsyncContextManager[Any]:
        if self.is_sqlite:
            return contextlib.nullcontext()
        lock = self._inbound_locks.get(key)
        if lock is None:
            lock = self._inbound_locks[key] = asyncio.Lock()
        return lock

    async def claim_pending(
        self, session_id: int, context_limit: int | None = None
    ) -> list[MessageRow]:
        """Give unanswered inbound messages their conversation position; return them in order.

        Messages claimed by a turn that never finished (crash, shutdown) are returned again, so
        every inbound message is answered exactly once. Group messages kept as context join the
        next turn; beyond the newest `context_limit` of them, older ones stay stored but out of
        the conversation.
        """

        return await self._fast(
            lambda cursor: self._claim(cursor, session_id, context_limit), write=True
        )

    async def claim_turn(
        self,
        key: str,
        context_limit: Callable[[SessionRow], int | None],
        known: Callable[[int], Known] | None = None,
    ) -> tuple[SessionRow | None, list[MessageRow], HistoryRead | None]:
        """The session and its claimed messages (see `claim_pending`) in one step; with
        `known` (session id → what the caller's cached history holds, called inside the step),
        also the turn's `summary_and_history`, saving the turn a transaction of its own."""

        def op(cursor: Any) -> tuple[SessionRow | None, list[MessageRow], HistoryRead | None]:
            session = self._hot.get_session(cursor, key)
            if session is None or session.id is None:
                return None, [], None
            claimed = self._claim(cursor, session.id, context_limit(session))
            read = None
            if known is not None and claimed:
                state = known(session.id)
                read = HistoryRead(state, *self._summary_and_history(cursor, session.id, state))
            return session, claimed, read

        return await self._fast(op, write=True)

    def _claim(self, cursor: Any, session_id: int, context_limit: int | None) -> list[MessageRow]:
        rows = self._hot.unhandled(cursor, session_id)
        unplaced = [r for r in rows if r.seq is None]
        context = [r for r in unplaced if r.status == CONTEXT_STATUS]
        if context_limit is not None and len(context) > context_limit:
            expired = context[: len(context) - context_limit]
            self._hot.mark_handled(cursor, (r.id for r in expired if r.id), "context-expired")
            gone = {id(r) for r in expired}
            unplaced = [r for r in unplaced if id(r) not in gone]
            rows = [r for r in rows if id(r) not in gone]
        if unplaced:
            first = self._hot.allocate_seqs(cursor, session_id, len(unplaced))
            for i, row in enumerate(unplaced):
                row.seq = first + i
            self._hot.set_seqs(cursor, ((r.id, r.seq) for r in unplaced if r.id and r.seq))
        return sorted(rows, key=lambda r: r.seq or 0)

    @staticmethod
    def _reply_values(session_id: int, seq: int, m: Message, status: str | None) -> dict[str, Any]:
        tool_error = m.meta.get("tool_error") if m.role == "tool" else None
        return {
            "session_id": session_id,
            "seq": seq,
            "role": m.role,
            "content": m.content,
            "tool_calls": [tc.to_openai() for tc in m.tool_calls] or None,
            "tool_call_id": m.tool_call_id,
            "name": m.name,
            "tokens": m.tokens,
            "status": status,
            "tool_error": None if tool_error is None else bool(tool_error),
        }

    async def append_messages(
        self, session_id: int, messages: Sequence[Message], *, status: str | None = None
    ) -> list[MessageRow]:
        """Append assistant/tool messages, in order, in one transaction."""
        if not messages:
            return []

        def op(cursor: Any) -> list[MessageRow]:
            first = self._hot.allocate_seqs(cursor, session_id, len(messages))
            return [
                self._hot.insert_message(
                    cursor, self._reply_values(session_id, first + i, m, status)
                )
                for i, m in enumerate(messages)
            ]

        return await self._fast(op, write=True)

    async def post_message(
        self, session_id: int, message: Message, outbound: OutboundMessage
    ) -> int:
        """Append a message between turns (a reminder) and queue it for delivery, atomically;
        returns its outbox id (see `finish_turn`)."""

        def op(cursor: Any) -> int:
            seq = self._hot.allocate_seqs(cursor, session_id, 1)
            self._hot.insert_message(cursor, self._reply_values(session_id, seq, message, None))
            return self._hot.insert_outbox(cursor, session_id, outbound)

        return await self._fast(op, write=True)

    async def finish_turn(
        self,
        session_id: int,
        reply: Message,
        handled_ids: Iterable[int],
        usage: TurnUsage,
        *,
        reply_status: str | None = None,
        error: str | None = None,
        token_ratio: float | None = None,
        token_counts: dict[int, int] | None = None,
        record: TurnRecordRow | None = None,
        outbound: OutboundMessage | None = None,
    ) -> int | None:
        """Store the reply, mark the turn's inbound messages answered and count usage: atomically.

        `token_counts` ({message id: tokens}) rides along so counting costs no extra transaction;
        `record` (the turn's token pressure, for the admin UI) is stored with the reply. With
        `outbound`, the reply also enters the outbox in the same transaction; the returned
        outbox id goes to `gateway.turn.outbox.DeliveryLog` once the channel sent it.
        """
        ids = list(handled_ids)

        def op(cursor: Any) -> int | None:
            seq = self._hot.finish_turn(
                cursor,
                session_id,
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                error=error,
                token_ratio=token_ratio,
            )
            self._hot.insert_message_only(
                cursor, self._reply_values(session_id, seq, reply, reply_status)
            )
            outbox_id = None
            if outbound is not None:
                outbox_id = self._hot.insert_outbox(cursor, session_id, outbound)
            if record is not None:
                self._hot.insert_turn_record(cursor, record, session_id, seq)
            counts = token_counts or {}
            self._hot.mark_handled(cursor, ids, None, counts)
            handled = set(ids)
            earlier = {i: t for i, t in counts.items() if i not in handled}
            if earlier:  # history messages counted for the first time
                self._hot.set_tokens(cursor, earlier)
            return outbox_id

        return await self._fast(op, write=True)

    # -- outbox -----------------------------------------------------------------------------

    async def forget_outbox(self, outbox_ids: Iterable[int]) -> int:
        """Drop these replies from the outbox (sent, or an operator stopped trying: they stay in
        their conversation); how many rows were there."""
        ids = list(outbox_ids)
        if not ids:
            return 0
        stmt = delete(OutboxRow).where(col(OutboxRow.id).in_(ids))
        return await self._write(lambda db: db.exec(stmt).rowcount)

    async def claim_stale_outbox(self, older_than: float) -> list[tuple[int, OutboundMessage]]:
        """Several processes: take over replies left unsent longer than `older_than` seconds.

        Each row is claimed by restarting its clock (`UPDATE … WHERE created_at < cutoff`), so of
        processes sweeping at once exactly one sends it; if that one dies too, the row is stale
        again after the same wait.
        """
        cutoff = utcnow() - timedelta(seconds=older_than)

        def op(db: Session) -> list[OutboxRow]:
            stale = db.exec(
                select(OutboxRow)
                .where(col(OutboxRow.created_at) < cutoff, col(OutboxRow.given_up_at).is_(None))
                .order_by(col(OutboxRow.id))
            ).all()
            mine: list[OutboxRow] = []
            for row in stale:
                claim = (
                    update(OutboxRow)
                    .where(col(OutboxRow.id) == row.id, col(OutboxRow.created_at) < cutoff)
                    .values(created_at=utcnow())
                )
                if db.exec(claim).rowcount == 1:
                    mine.append(row)
            return mine

        rows = await self._write(op)
        return [(row.id, _outbound(row)) for row in rows if row.id is not None]

    async def undelivered(
        self, older_than: float | None = None, *, retried: bool = False
    ) -> list[tuple[int, OutboundMessage]]:
        """Replies stored by a finished turn that no channel confirmed sending (a crash).

        `older_than` (seconds): with several processes, a fresh row may be one another live
        process is sending right now; only replies left that long are someone else's to send.
        `retried`: only replies an operator gave their tries back (`retry_outbox`): they failed
        before (an error is recorded) and have no failed try since.
        """
        stmt = (
            select(OutboxRow).where(col(OutboxRow.given_up_at).is_(None)).order_by(col(OutboxRow.id))
        )
        if older_than is not None:
            cutoff = utcnow() - timedelta(seconds=older_than)
            stmt = stmt.where(col(OutboxRow.created_at) < cutoff)
        if retried:
            stmt = stmt.where(OutboxRow.attempts == 0, col(OutboxRow.last_error).is_not(None))
        rows = await self._read(lambda db: list(db.exec(stmt).all()))
        return [(row.id, _outbound(row)) for row in rows if row.id is not None]

    async def outbox(self) -> list[OutboxRow]:
        """Every reply not confirmed as sent, given-up ones included (`gatehouse outbox list`)."""
        stmt = select(OutboxRow).order_by(col(OutboxRow.id))
        return await self._read(lambda db: list(db.exec(stmt).all()))

    async def outbox_failed(
        self, outbox_id: int, sent_parts: int, error: str, max_attempts: int
    ) -> OutboxRow | None:
        """Count a failed try at sending a reply; give it up at `max_attempts` tries.

        Keeps how many chunks the platform already has, so the next try resumes after them.
        None when the row is gone (sent meanwhile, or dropped by an operator).
        """
        error = error[:2000]

        def op(db: Session) -> OutboxRow | None:
            row = db.get(OutboxRow, outbox_id)
            if row is None:
                return None
            row.attempts += 1
            row.sent_parts = max(row.sent_parts, sent_parts)
            row.last_error = error
            if row.attempts >= max_attempts and row.given_up_at is None:
                row.given_up_at = utcnow()
            return row  # written by the commit; its values stay loaded (no expire on commit)

        return await self._write(op)

    async def retry_outbox(self, outbox_ids: Iterable[int] | None = None) -> int:
        """Give replies their tries back (all given-up ones with no ids); how many rows changed.

        A running gateway sends them within its sweep (`[gateway] pending_sweep_seconds`), a
        stopped one when it next starts. The last error stays, which marks them as retried.
        """
        stmt = update(OutboxRow).values(given_up_at=None, attempts=0)
        ids = None if outbox_ids is None else list(outbox_ids)
        if ids is None:
            stmt = stmt.where(col(OutboxRow.given_up_at).is_not(None))
        else:
            stmt = stmt.where(col(OutboxRow.id).in_(ids))
        return await self._write(lambda db: db.exec(stmt).rowcount)

    async def summary_and_history(
        self, session_id: int, known: Known = None
    ) -> tuple[CompactionRow | None, int, list[Message]]:
        """The latest summary, the seq it covers up to, and the messages after it, in one step.

        `known` = (the covered seq a caller's cached history starts after, the last seq it
        holds): when the summary has not moved, only messages after the last one are read.
        """
        return await self._fast(lambda cursor: self._summary_and_history(cursor, session_id, known))

    def _summary_and_history(
        self, cursor: Any, session_id: int, known: Known
    ) -> tuple[CompactionRow | None, int, list[Message]]:
        summary = self._hot.latest_compaction(cursor, session_id)
        after = summary.last_seq if summary is not None else 0
        start = known[1] if known is not None and known[0] == after else after
        return summary, after, self._hot.history(cursor, session_id, start)

    async def history(self, session_id: int, after_seq: int = 0) -> list[Message]:
        return await self._fast(lambda cursor: self._hot.history(cursor, session_id, after_seq))

    async def _update_messages(self, ids: Iterable[int], **values: Any) -> None:
        ids = list(ids)
        if not ids:
            return
        stmt = update(MessageRow).where(col(MessageRow.id).in_(ids)).values(**values)
        await self._write(lambda db: _update(db, stmt))

    async def mark_handled(self, ids: Iterable[int], status: str | None = None) -> None:
        await self._update_messages(ids, handled=True, status=status)

    async def mark_status(self, ids: Iterable[int], status: str) -> None:
        await self._update_messages(ids, status=status)

    async def mark_interrupted(self, ids: Iterable[int]) -> None:
        """Record that a shutdown stopped these messages' turn; they stay pending."""
        await self._update_messages(ids, status="interrupted")

    async def message_count(self, session_id: int | None = None) -> int:
        stmt = select(func.count()).select_from(MessageRow)
        if session_id is not None:
            stmt = stmt.where(MessageRow.session_id == session_id)
        return await self._read(lambda db: int(db.exec(stmt).one()))

    # -- pairing ----------------------------------------------------------------------------

    async def pairing_for(self, platform: str, sender_id: str) -> PairingRow | None:
        """The latest pairing row for a sender (approved, denied or pending)."""
        stmt = (
            select(PairingRow)
            .where(PairingRow.platform == platform, PairingRow.sender_id == sender_id)
            .order_by(col(PairingRow.id).desc())
        )
        return await self._read(lambda db: db.exec(stmt).first())

    async def pending_pairings(self, platform: str | None = None) -> list[PairingRow]:
        now = utcnow()
        stmt = select(PairingRow).where(PairingRow.status == "pending")
        if platform is not None:
            stmt = stmt.where(PairingRow.platform == platform)
        rows = await self._read(lambda db: list(db.exec(stmt.order_by(col(PairingRow.id))).all()))
        return [r for r in rows if _aware(r.expires_at) > now]

    async def list_pairings(self) -> list[PairingRow]:
        stmt = select(PairingRow).order_by(col(PairingRow.id))
        return await self._read(lambda db: list(db.exec(stmt).all()))

    async def add_pairing(self, row: PairingRow) -> PairingRow:
        def op(db: Session) -> PairingRow:
            db.add(row)
            db.flush()
            return row

        return await self._write(op)

    async def decide_pairing(self, code: str, status: str) -> PairingRow | None:
        """Approve or deny a pending, unexpired code; None when there is no such code."""

        def op(db: Session) -> PairingRow | None:
            row = db.exec(
                select(PairingRow).where(
                    PairingRow.code == code.strip().upper(), PairingRow.status == "pending"
                )
            ).first()
            if row is None or _aware(row.expires_at) <= utcnow():
                return None
            row.status = status
            row.decided_at = utcnow()
            db.add(row)
            db.flush()
            return row

        return await self._write(op)

    async def expire_pairings(self) -> list[PairingRow]:
        """Mark pending codes past their expiry as "expired"; return them."""
        now = utcnow()

        def op(db: Session) -> list[PairingRow]:
            pending = db.exec(select(PairingRow).where(PairingRow.status == "pending")).all()
            expired = [r for r in pending if _aware(r.expires_at) <= now]
            for row in expired:
                row.status = "expired"
                row.decided_at = now
                db.add(row)
            db.flush()
            return expired

        return await self._write(op)

    async def approved_senders(self, platform: str) -> set[str]:
        stmt = select(PairingRow.sender_id).where(
            PairingRow.platform == platform, PairingRow.status == "approved"
        )
        return await self._read(lambda db: set(db.exec(stmt).all()))

    # -- compactions ------------------------------------------------------------------------

    async def add_compaction(self, row: CompactionRow, *, ineffective: bool | None = None,
                             cooldown_until: datetime | None = None) -> CompactionRow:
        """Store a compaction next to the untouched originals; start a new compaction cycle."""
        values: dict[str, Any] = {
            "compaction_cycle": SessionRow.compaction_cycle + 1,
            "updated_at": utcnow(),
            "compaction_cooldown_until": cooldown_until,
        }
        if ineffective is not None:
            values["ineffective_compactions"] = (
                SessionRow.ineffective_compactions + 1 if ineffective else 0
            )

        def op(db: Session) -> CompactionRow:
            db.add(row)
            stmt = update(SessionRow).where(col(SessionRow.id) == row.session_id)
            _update(db, stmt.values(**values))
            db.flush()
            return row

        return await self._write(op)

    async def set_compaction_state(
        self,
        session_id: int,
        *,
        cooldown_until: datetime | None = None,
        reset_ineffective: bool = False,
    ) -> None:
        values: dict[str, Any] = {"compaction_cooldown_until": cooldown_until}
        if reset_ineffective:
            values["ineffective_compactions"] = 0
        stmt = update(SessionRow).where(col(SessionRow.id) == session_id).values(**values)
        await self._write(lambda db: _update(db, stmt))

    async def mark_refreshed(self, compaction_id: int) -> None:
        stmt = update(CompactionRow).where(col(CompactionRow.id) == compaction_id)
        await self._write(lambda db: _update(db, stmt.values(refreshed=True)))

    async def record_flush(self, session_id: int, cycle: int, ok: bool, notes_written: int) -> None:
        """Keep a record of a memory flush; a successful one also marks its cycle flushed."""

        def op(db: Session) -> None:
            db.add(MemoryFlushRow(session_id=session_id, cycle=cycle, ok=ok,
                                  notes_written=notes_written))
            if ok:
                stmt = update(SessionRow).where(col(SessionRow.id) == session_id)
                _update(db, stmt.values(flushed_cycle=cycle))

        await self._write(op)

    async def turn_records(self, session_id: int, limit: int = 500) -> list[TurnRecordRow]:
        """The session's latest `limit` turn records, oldest first."""
        stmt = (
            select(TurnRecordRow)
            .where(TurnRecordRow.session_id == session_id)
            .order_by(col(TurnRecordRow.id).desc())
            .limit(limit)
        )
        return await self._read(lambda db: list(db.exec(stmt).all())[::-1])

    async def latest_turn_records(self) -> dict[int, TurnRecordRow]:
        """Each session's latest turn record, by session id, in one query."""
        latest = select(func.max(TurnRecordRow.id)).group_by(col(TurnRecordRow.session_id))
        stmt = select(TurnRecordRow).where(col(TurnRecordRow.id).in_(latest))
        return await self._read(lambda db: {r.session_id: r for r in db.exec(stmt).all()})

    async def memory_flushes(self, session_id: int) -> list[MemoryFlushRow]:
        stmt = (
            select(MemoryFlushRow)
            .where(MemoryFlushRow.session_id == session_id)
            .order_by(col(MemoryFlushRow.id))
        )
        return await self._read(lambda db: list(db.exec(stmt).all()))

    async def message_counts(self) -> dict[int, int]:
        """Stored messages per session id, in one query (the sessions list)."""
        stmt = select(MessageRow.session_id, func.count()).group_by(col(MessageRow.session_id))
        return await self._read(lambda db: {int(sid): int(n) for sid, n in db.exec(stmt).all()})

    async def compactions(self, session_id: int) -> list[CompactionRow]:
        stmt = (
            select(CompactionRow)
            .where(CompactionRow.session_id == session_id)
            .order_by(col(CompactionRow.id))
        )
        return await self._read(lambda db: list(db.exec(stmt).all()))

    async def undo_latest_compaction(self, session_id: int) -> CompactionRow | None:
        """Restore the state before the last compaction (its row is kept, marked undone)."""

        def op(db: Session) -> CompactionRow | None:
            latest: CompactionRow | None = db.exec(_latest_compaction(session_id)).first()
            if latest is None:
                return None
            stmt = update(CompactionRow).where(col(CompactionRow.id) == latest.id)
            _update(db, stmt.values(undone=True))
            stmt2 = update(SessionRow).where(col(SessionRow.id) == session_id)
            _update(db, stmt2.values(ineffective_compactions=0, compaction_cooldown_until=None))
            return latest

        return await self._write(op)

    async def latest_compaction(self, session_id: int) -> CompactionRow | None:
        return await self._fast(lambda cursor: self._hot.latest_compaction(cursor, session_id))


class LockBusyError(RuntimeError):
    pass


def _lock_id(name: str) -> int:
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


def _outbound(row: OutboxRow) -> OutboundMessage:
    return OutboundMessage(
        platform=row.platform,
        chat_id=row.chat_id,
        text=row.text,
        session_key=row.session_key,
        thread_id=row.thread_id,
        reply_to=row.reply_to,
        account=row.account,
        answers=tuple(row.answers or ()),
        sent_parts=row.sent_parts,
        preview_id=row.preview_id,
    )


def _latest_compaction(session_id: int) -> Any:
    return (
        select(CompactionRow)
        .where(CompactionRow.session_id == session_id, col(CompactionRow.undone).is_(False))
        .order_by(col(CompactionRow.id).desc())
    )


def _awaiting_answer() -> tuple[Any, ...]:
    """Inbound messages no turn has answered yet (context-only group messages excluded)."""
    return (
        col(MessageRow.handled).is_(False),
        or_(col(MessageRow.status).is_(None), col(MessageRow.status) != CONTEXT_STATUS),
    )


CHECKPOINT_EVERY = 200
"""Inline SQLite write transactions between WAL checkpoints (autocheckpoint's 1,000 pages is
about this many turns)."""


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    message = str(exc).lower()
    return "locked" in message or "busy" in message


def _aware(value: datetime) -> datetime:
    """SQLite hands back naive datetimes; they were stored as UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


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
