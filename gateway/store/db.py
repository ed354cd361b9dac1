"""The async store: one place for every read and write of sessions, messages and compactions.

Each gateway step is one transaction: accepting an inbound message (session get-or-create,
dedupe, insert), claiming a turn's messages, and finishing a turn (reply, handled marks, usage).
On SQLite, writes from this process are serialized by one asyncio lock so they never spin on
SQLite's busy handler; readers run concurrently thanks to WAL.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import delete, event, func, or_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlmodel import SQLModel, col, select
from sqlmodel.ext.asyncio.session import AsyncSession

from channels.base import InboundMessage, OutboundMessage
from context.types import Message, ToolCall
from gateway.store.models import (
    CompactionRow,
    MessageRow,
    OutboxRow,
    PairingRow,
    SessionRow,
    utcnow,
)

CONTEXT_STATUS = "context"
"""An unmentioned group message: stored, shown to the model with the next mention."""


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
        meta={"id": row.id, "sender_id": row.sender_id, "status": row.status},
    )


def _message_row(session_id: int, seq: int, m: Message, status: str | None) -> MessageRow:
    return MessageRow(
        session_id=session_id,
        seq=seq,
        role=m.role,
        content=m.content,
        tool_calls=[tc.to_openai() for tc in m.tool_calls] or None,
        tool_call_id=m.tool_call_id,
        name=m.name,
        tokens=m.tokens,
        status=status,
    )


def _outbox_row(session_id: int, message: OutboundMessage) -> OutboxRow:
    return OutboxRow(
        session_id=session_id,
        session_key=message.session_key,
        platform=message.platform,
        chat_id=message.chat_id,
        thread_id=message.thread_id,
        account=message.account,
        reply_to=message.reply_to,
        answers=list(message.answers),
        text=message.text,
    )


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
    )


class Store:
    """SQLite (WAL) by default, PostgreSQL by URL; same models, same code."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine: AsyncEngine = create_async_engine(url)
        if self.is_sqlite:
            event.listen(self.engine.sync_engine, "connect", _sqlite_pragmas)
        self._sessions = async_sessionmaker(
            self.engine, class_=AsyncSession, expire_on_commit=False
        )
        self._write_lock = asyncio.Lock() if self.is_sqlite else None
        self._session_ids: dict[str, int] = {}

    @property
    def is_sqlite(self) -> bool:
        return self.url.startswith("sqlite")

    async def init(self) -> None:
        if self.is_sqlite:
            path = self.url.split("///", 1)[-1]
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
        async with self.engine.begin() as conn:
            await conn.run_sync(SQLModel.metadata.create_all)

    async def close(self) -> None:
        await self.engine.dispose()

    @contextlib.asynccontextmanager
    async def _write(self) -> AsyncIterator[AsyncSession]:
        """A write transaction: committed on success, rolled back on error."""
        lock = self._write_lock or contextlib.nullcontext()
        async with lock, self._sessions() as db:
            try:
                yield db
                await db.commit()
            except BaseException:
                await db.rollback()
                raise

    # -- sessions ---------------------------------------------------------------------------

    async def get_session(self, key: str) -> SessionRow | None:
        async with self._sessions() as db:
            result = await db.exec(select(SessionRow).where(SessionRow.key == key))
            return result.first()

    async def _session_id(self, db: AsyncSession, info: SessionInfo) -> int:
        cached = self._session_ids.get(info.key)
        if cached is not None:
            return cached
        found = await db.exec(select(SessionRow.id).where(SessionRow.key == info.key))
        session_id = found.first()
        if session_id is None:
            row = SessionRow(
                key=info.key,
                agent=info.agent,
                platform=info.platform,
                chat_type=info.chat_type,
                chat_id=info.chat_id,
                thread_id=info.thread_id,
                account=info.account,
            )
            async with db.begin_nested():
                db.add(row)
            session_id = row.id
        assert session_id is not None
        self._session_ids[info.key] = session_id
        return session_id

    async def ensure_session(self, info: SessionInfo) -> SessionRow:
        for _attempt in range(3):
            try:
                async with self._write() as db:
                    await self._session_id(db, info)
                break
            except IntegrityError:  # created concurrently by another process
                continue
        row = await self.get_session(info.key)
        assert row is not None
        return row

    async def list_sessions(self) -> list[SessionRow]:
        async with self._sessions() as db:
            result = await db.exec(select(SessionRow).order_by(col(SessionRow.updated_at).desc()))
            return list(result.all())

    async def sessions_with_pending(self) -> list[SessionRow]:
        """Sessions with inbound messages no turn has answered yet (e.g. after a crash)."""
        async with self._sessions() as db:
            pending = select(MessageRow.session_id).where(
                col(MessageRow.handled).is_(False),
                or_(col(MessageRow.status).is_(None), col(MessageRow.status) != CONTEXT_STATUS),
            )
            result = await db.exec(select(SessionRow).where(col(SessionRow.id).in_(pending)))
            return list(result.all())

    async def set_session_error(self, session_id: int, error: str | None) -> None:
        async with self._write() as db:
            stmt = update(SessionRow).where(col(SessionRow.id) == session_id)
            await db.exec(stmt.values(last_error=error, updated_at=utcnow()))

    # -- messages ---------------------------------------------------------------------------

    async def _allocate_seqs(self, db: AsyncSession, session_id: int, count: int) -> int:
        """Reserve `count` consecutive seqs atomically (safe across processes); return the first."""
        stmt = (
            update(SessionRow)
            .where(col(SessionRow.id) == session_id)
            .values(next_seq=SessionRow.next_seq + count, updated_at=utcnow())
            .returning(col(SessionRow.next_seq))
        )
        result = await db.exec(stmt)
        new_next = int(result.scalar_one())
        return new_next - count

    async def accept_inbound(
        self, info: SessionInfo, msg: InboundMessage, *, status: str | None = None
    ) -> tuple[int, MessageRow | None]:
        """Persist an inbound user message before its turn, creating the session if needed.

        Returns (session id, row); the row is None when the message is a duplicate (same
        platform message id in the same chat), so a redelivery is never answered twice.
        """
        for _attempt in range(3):
            try:
                async with self._write() as db:
                    session_id = await self._session_id(db, info)
                    if msg.platform_message_id is not None:
                        dup = await db.exec(
                            select(MessageRow.id).where(
                                MessageRow.platform == msg.platform,
                                MessageRow.chat_id == msg.chat_id,
                                MessageRow.platform_message_id == msg.platform_message_id,
                            )
                        )
                        if dup.first() is not None:
                            return session_id, None
                    row = MessageRow(
                        session_id=session_id,
                        seq=None,
                        role="user",
                        content=msg.text,
                        sender_id=msg.sender_id,
                        sender_name=msg.sender_name,
                        platform=msg.platform,
                        chat_id=msg.chat_id,
                        platform_message_id=msg.platform_message_id,
                        handled=False,
                        status=status,
                    )
                    db.add(row)
                return session_id, row
            except IntegrityError:
                # A concurrent insert of the same platform message (dedupe) or session.
                self._session_ids.pop(info.key, None)
                continue
        raise RuntimeError(f"could not persist inbound message for {info.key}")

    async def claim_pending(
        self, session_id: int, context_limit: int | None = None
    ) -> list[MessageRow]:
        """Give unanswered inbound messages their conversation position; return them in order.

        Messages claimed by a turn that never finished (crash, shutdown) are returned again, so
        every inbound message is answered exactly once. Group messages kept as context join the
        next turn; beyond the newest `context_limit` of them, older ones stay stored but out of
        the conversation.
        """
        async with self._write() as db:
            unplaced = await db.exec(
                select(MessageRow)
                .where(MessageRow.session_id == session_id, col(MessageRow.seq).is_(None))
                .where(col(MessageRow.handled).is_(False))
                .order_by(col(MessageRow.id))
            )
            rows = list(unplaced.all())
            context = [r for r in rows if r.status == CONTEXT_STATUS]
            if context_limit is not None and len(context) > context_limit:
                expired = context[: len(context) - context_limit]
                for row in expired:
                    row.handled, row.status = True, "context-expired"
                    db.add(row)
                rows = [r for r in rows if r not in expired]
            if rows:
                first = await self._allocate_seqs(db, session_id, len(rows))
                for i, row in enumerate(rows):
                    row.seq = first + i
                    db.add(row)
                await db.flush()
            result = await db.exec(
                select(MessageRow)
                .where(MessageRow.session_id == session_id, col(MessageRow.handled).is_(False))
                .order_by(col(MessageRow.seq))
            )
            return list(result.all())

    async def append_messages(
        self, session_id: int, messages: Sequence[Message], *, status: str | None = None
    ) -> list[MessageRow]:
        """Append assistant/tool messages, in order, in one transaction."""
        if not messages:
            return []
        async with self._write() as db:
            first = await self._allocate_seqs(db, session_id, len(messages))
            rows = [_message_row(session_id, first + i, m, status) for i, m in enumerate(messages)]
            db.add_all(rows)
        return rows

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
        outbound: OutboundMessage | None = None,
    ) -> int | None:
        """Store the reply, mark the turn's inbound messages answered and count usage: atomically.

        With `outbound`, the reply also goes into the outbox in the same transaction; the
        returned outbox id is reported to `gateway.outbox.DeliveryLog` once the channel sent it.
        """
        ids = list(handled_ids)
        pending: OutboxRow | None = None
        async with self._write() as db:
            seq = await self._allocate_seqs(db, session_id, 1)
            db.add(_message_row(session_id, seq, reply, reply_status))
            if outbound is not None:
                pending = _outbox_row(session_id, outbound)
                db.add(pending)
            if ids:
                stmt = update(MessageRow).where(col(MessageRow.id).in_(ids))
                await db.exec(stmt.values(handled=True, status=None))
            values: dict[str, Any] = {"turns": SessionRow.turns + 1, "last_error": error}
            if token_ratio is not None:
                values["token_ratio"] = token_ratio
            if usage.prompt_tokens is not None:
                values["last_prompt_tokens"] = usage.prompt_tokens
                values["tokens_in"] = SessionRow.tokens_in + usage.prompt_tokens
            if usage.completion_tokens is not None:
                values["tokens_out"] = SessionRow.tokens_out + usage.completion_tokens
            await db.exec(update(SessionRow).where(col(SessionRow.id) == session_id).values(**values))
        return pending.id if pending is not None else None

    # -- outbox -----------------------------------------------------------------------------

    async def forget_outbox(self, outbox_ids: Iterable[int]) -> None:
        """These replies were sent: drop them from the outbox."""
        ids = list(outbox_ids)
        if not ids:
            return
        async with self._write() as db:
            await db.exec(delete(OutboxRow).where(col(OutboxRow.id).in_(ids)))

    async def undelivered(self) -> list[tuple[int, OutboundMessage]]:
        """Replies stored by a finished turn that no channel confirmed sending (a crash)."""
        async with self._sessions() as db:
            rows = (await db.exec(select(OutboxRow).order_by(col(OutboxRow.id)))).all()
        return [(row.id, _outbound(row)) for row in rows if row.id is not None]

    async def history(self, session_id: int, after_seq: int = 0) -> list[Message]:
        async with self._sessions() as db:
            result = await db.exec(
                select(MessageRow)
                .where(
                    MessageRow.session_id == session_id,
                    col(MessageRow.seq).is_not(None),
                    col(MessageRow.seq) > after_seq,
                )
                .order_by(col(MessageRow.seq))
            )
            return [row_to_message(r) for r in result.all()]

    async def mark_handled(self, ids: Iterable[int], status: str | None = None) -> None:
        ids = list(ids)
        if not ids:
            return
        async with self._write() as db:
            stmt = update(MessageRow).where(col(MessageRow.id).in_(ids))
            await db.exec(stmt.values(handled=True, status=status))

    async def mark_status(self, ids: Iterable[int], status: str) -> None:
        ids = list(ids)
        if not ids:
            return
        async with self._write() as db:
            stmt = update(MessageRow).where(col(MessageRow.id).in_(ids))
            await db.exec(stmt.values(status=status))

    async def mark_interrupted(self, ids: Iterable[int]) -> None:
        """Record that a shutdown stopped these messages' turn; they stay pending."""
        ids = list(ids)
        if not ids:
            return
        async with self._write() as db:
            stmt = update(MessageRow).where(col(MessageRow.id).in_(ids))
            await db.exec(stmt.values(status="interrupted"))

    async def cache_token_counts(self, counts: dict[int, int]) -> None:
        """Store each message's token count once, so it is never recounted."""
        if not counts:
            return
        async with self._write() as db:
            for message_id, tokens in counts.items():
                stmt = update(MessageRow).where(col(MessageRow.id) == message_id)
                await db.exec(stmt.values(tokens=tokens))

    async def message_count(self, session_id: int | None = None) -> int:
        async with self._sessions() as db:
            stmt = select(func.count()).select_from(MessageRow)
            if session_id is not None:
                stmt = stmt.where(MessageRow.session_id == session_id)
            result = await db.exec(stmt)
            return int(result.one())

    # -- pairing ----------------------------------------------------------------------------

    async def pairing_for(self, platform: str, sender_id: str) -> PairingRow | None:
        """The latest pairing row for a sender (approved, denied or pending)."""
        async with self._sessions() as db:
            result = await db.exec(
                select(PairingRow)
                .where(PairingRow.platform == platform, PairingRow.sender_id == sender_id)
                .order_by(col(PairingRow.id).desc())
            )
            return result.first()

    async def pending_pairings(self, platform: str | None = None) -> list[PairingRow]:
        now = utcnow()
        async with self._sessions() as db:
            stmt = select(PairingRow).where(PairingRow.status == "pending")
            if platform is not None:
                stmt = stmt.where(PairingRow.platform == platform)
            rows = (await db.exec(stmt.order_by(col(PairingRow.id)))).all()
            return [r for r in rows if _aware(r.expires_at) > now]

    async def list_pairings(self) -> list[PairingRow]:
        async with self._sessions() as db:
            result = await db.exec(select(PairingRow).order_by(col(PairingRow.id)))
            return list(result.all())

    async def add_pairing(self, row: PairingRow) -> PairingRow:
        async with self._write() as db:
            db.add(row)
        return row

    async def decide_pairing(self, code: str, status: str) -> PairingRow | None:
        """Approve or deny a pending, unexpired code; None when there is no such code."""
        async with self._write() as db:
            result = await db.exec(
                select(PairingRow).where(
                    PairingRow.code == code.strip().upper(), PairingRow.status == "pending"
                )
            )
            row = result.first()
            if row is None or _aware(row.expires_at) <= utcnow():
                return None
            row.status = status
            row.decided_at = utcnow()
            db.add(row)
        return row

    async def approved_senders(self, platform: str) -> set[str]:
        async with self._sessions() as db:
            result = await db.exec(
                select(PairingRow.sender_id).where(
                    PairingRow.platform == platform, PairingRow.status == "approved"
                )
            )
            return set(result.all())

    # -- compactions ------------------------------------------------------------------------

    async def add_compaction(self, row: CompactionRow, *, ineffective: bool | None = None,
                             cooldown_until: datetime | None = None) -> CompactionRow:
        """Store a compaction next to the untouched originals; start a new compaction cycle."""
        async with self._write() as db:
            db.add(row)
            values: dict[str, Any] = {
                "compaction_cycle": SessionRow.compaction_cycle + 1,
                "updated_at": utcnow(),
                "compaction_cooldown_until": cooldown_until,
            }
            if ineffective is not None:
                values["ineffective_compactions"] = (
                    SessionRow.ineffective_compactions + 1 if ineffective else 0
                )
            stmt = update(SessionRow).where(col(SessionRow.id) == row.session_id)
            await db.exec(stmt.values(**values))
        return row

    async def set_compaction_state(
        self,
        session_id: int,
        *,
        cooldown_until: datetime | None = None,
        reset_ineffective: bool = False,
    ) -> None:
        async with self._write() as db:
            values: dict[str, Any] = {"compaction_cooldown_until": cooldown_until}
            if reset_ineffective:
                values["ineffective_compactions"] = 0
            stmt = update(SessionRow).where(col(SessionRow.id) == session_id)
            await db.exec(stmt.values(**values))

    async def mark_refreshed(self, compaction_id: int) -> None:
        async with self._write() as db:
            stmt = update(CompactionRow).where(col(CompactionRow.id) == compaction_id)
            await db.exec(stmt.values(refreshed=True))

    async def mark_flushed(self, session_id: int, cycle: int) -> None:
        """Record that the memory flush ran for this compaction cycle (never on failure)."""
        async with self._write() as db:
            stmt = update(SessionRow).where(col(SessionRow.id) == session_id)
            await db.exec(stmt.values(flushed_cycle=cycle))

    async def compactions(self, session_id: int) -> list[CompactionRow]:
        async with self._sessions() as db:
            result = await db.exec(
                select(CompactionRow)
                .where(CompactionRow.session_id == session_id)
                .order_by(col(CompactionRow.id))
            )
            return list(result.all())

    async def undo_latest_compaction(self, session_id: int) -> CompactionRow | None:
        """Restore the state before the last compaction (its row is kept, marked undone)."""
        latest = await self.latest_compaction(session_id)
        if latest is None:
            return None
        async with self._write() as db:
            stmt = update(CompactionRow).where(col(CompactionRow.id) == latest.id)
            await db.exec(stmt.values(undone=True))
            stmt2 = update(SessionRow).where(col(SessionRow.id) == session_id)
            await db.exec(stmt2.values(ineffective_compactions=0, compaction_cooldown_until=None))
        return latest

    async def latest_compaction(self, session_id: int) -> CompactionRow | None:
        async with self._sessions() as db:
            result = await db.exec(
                select(CompactionRow)
                .where(CompactionRow.session_id == session_id, col(CompactionRow.undone).is_(False))
                .order_by(col(CompactionRow.id).desc())
            )
            return result.first()


def _aware(value: datetime) -> datetime:
    """SQLite hands back naive datetimes; they were stored as UTC."""
    from datetime import UTC

    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()
