"""Messages: what arrives (inbound, deduplicated), what is appended, and how history is read.

Messages are append-only and ordered by `seq`, the conversation position a session hands out
(`HotPath.allocate_seqs`). An inbound message is stored as it arrives, without a seq; the turn
that claims it places it (gateway/store/turns.py). History reads return `context.types.Message`
objects, the same shape on every read path (`row_to_message`, `HotPath.history`).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, update
from sqlmodel import Session, col, select

from channels.base import InboundMessage, OutboundMessage
from context.types import Message, ToolCall
from gateway.store.engine import Database, execute
from gateway.store.hot import message_meta
from gateway.store.models import CompactionRow, MessageRow, TurnRecordRow
from gateway.store.sessions import SessionInfo, SessionRepository

CONTEXT_STATUS = "context"
"""An unmentioned group message: stored, shown to the model with the next mention."""
FETCHING_STATUS = "fetching"
"""An inbound message whose attachments are still being downloaded: stored as it arrived, but
marked handled so no turn claims it until gateway/store/attachments.py completes it."""

Known = tuple[int, int] | None
"""What a cached history holds: (the covered seq it starts after, its last seq); see
`MessageRepository.summary_and_history`."""


@dataclass(frozen=True, slots=True)
class HistoryRead:
    """`summary_and_history`'s answer, and the cache state (`known`) it was read for."""

    known: Known
    summary: CompactionRow | None
    after: int
    messages: list[Message]


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


def reply_values(session_id: int, seq: int, m: Message, status: str | None) -> dict[str, Any]:
    """The row values of an assistant or tool message stored at `seq`."""
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


class MessageRepository:
    """Store inbound and appended messages, read history, mark messages and count them."""

    def __init__(self, database: Database, sessions: SessionRepository) -> None:
        self._db = database
        self._sessions = sessions
        self._inbound_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    async def accept_inbound(
        self,
        info: SessionInfo,
        msg: InboundMessage,
        *,
        status: str | None = None,
        content: Any = None,
    ) -> tuple[int, MessageRow | None]:
        """Persist an inbound user message before its turn, creating the session if needed.

        Returns (session id, row); the row is None when the message is a duplicate (same
        platform message id in the same chat), so a redelivery is never answered twice.
        `content` replaces the text as what is stored (a message with attachments); with
        `FETCHING_STATUS` the row waits, out of every claim, until its downloads finish.
        """

        def op(cursor: Any) -> tuple[int, MessageRow | None]:
            session_id = self._sessions.session_id(cursor, info)
            row = self._db.hot.insert_inbound(
                cursor,
                {
                    "session_id": session_id,
                    "role": "user",
                    "content": msg.text if content is None else content,
                    "sender_id": msg.sender_id,
                    "sender_name": msg.sender_name,
                    "platform": msg.platform,
                    "chat_id": msg.chat_id,
                    "platform_message_id": msg.platform_message_id,
                    "handled": status == FETCHING_STATUS,
                    "status": status,
                },
            )
            return session_id, row

        # One session's messages reach the database in the order they arrived: SQLite's single
        # thread keeps that by itself, a PostgreSQL thread pool needs the (FIFO) lock.
        # Autocommit: the message's INSERT commits by itself (one round trip on PostgreSQL); a
        # session created first stays, with or without it (a retry finds it).
        async with self._arrival_order(info.key):
            for _attempt in range(3):
                try:
                    return await self._db.fast(op, write=True, autocommit=True)
                except self._db.integrity_errors:
                    # A concurrent insert of the same platform message (dedupe) or session.
                    continue
        raise RuntimeError(f"could not persist inbound message for {info.key}")

    def _arrival_order(self, key: str) -> contextlib.AbstractAsyncContextManager[Any]:
        if self._db.is_sqlite:
            return contextlib.nullcontext()
        lock = self._inbound_locks.get(key)
        if lock is None:
            lock = self._inbound_locks[key] = asyncio.Lock()
        return lock

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

        return await self._db.read(op)

    async def append_messages(
        self, session_id: int, messages: Sequence[Message], *, status: str | None = None
    ) -> list[MessageRow]:
        """Append assistant/tool messages, in order, in one transaction."""
        if not messages:
            return []
        hot = self._db.hot

        def op(cursor: Any) -> list[MessageRow]:
            first = hot.allocate_seqs(cursor, session_id, len(messages))
            return [
                hot.insert_message(cursor, reply_values(session_id, first + i, m, status))
                for i, m in enumerate(messages)
            ]

        return await self._db.fast(op, write=True)

    async def post_message(
        self, session_id: int, message: Message, outbound: OutboundMessage
    ) -> int:
        """Append a message between turns (a reminder) and queue it for delivery, atomically;
        returns its outbox id (see `TurnRepository.finish_turn`)."""
        hot = self._db.hot

        def op(cursor: Any) -> int:
            seq = hot.allocate_seqs(cursor, session_id, 1)
            hot.insert_message(cursor, reply_values(session_id, seq, message, None))
            return hot.insert_outbox(cursor, session_id, outbound)

        return await self._db.fast(op, write=True)

    async def summary_and_history(
        self, session_id: int, known: Known = None
    ) -> tuple[CompactionRow | None, int, list[Message]]:
        """The latest summary, the seq it covers up to, and the messages after it, in one step.

        `known` = (the covered seq a caller's cached history starts after, the last seq it
        holds): when the summary has not moved, only messages after the last one are read.
        """
        hot = self._db.hot
        return await self._db.fast(lambda cursor: hot.summary_and_history(cursor, session_id, known))

    async def messages_at(self, session_id: int, seqs: Iterable[int]) -> list[Message]:
        """The stored messages of a session at `seqs`, in seq order (a summary's pinned ask)."""
        wanted = sorted(set(seqs))
        if not wanted:
            return []
        stmt = (
            select(MessageRow)
            .where(MessageRow.session_id == session_id, col(MessageRow.seq).in_(wanted))
            .order_by(col(MessageRow.seq))
        )
        rows = await self._db.read(lambda db: list(db.exec(stmt).all()))
        return [row_to_message(r) for r in rows]

    async def history(self, session_id: int, after_seq: int = 0) -> list[Message]:
        hot = self._db.hot
        return await self._db.fast(lambda cursor: hot.history(cursor, session_id, after_seq))

    async def recent_messages(
        self, session_id: int, after_seq: int, limit: int
    ) -> list[MessageRow]:
        """The newest `limit` user and assistant rows after `after_seq`, oldest first (what
        a chat page shows). Tool results are left out; an assistant row that only called
        tools is still among them (its content is empty), so the caller may get fewer lines."""
        stmt = (
            select(MessageRow)
            .where(
                MessageRow.session_id == session_id,
                col(MessageRow.seq).is_not(None),
                col(MessageRow.seq) > after_seq,
                col(MessageRow.role).in_(("user", "assistant")),
            )
            .order_by(col(MessageRow.seq).desc())
            .limit(limit)
        )
        rows = await self._db.read(lambda db: list(db.exec(stmt).all()))
        return rows[::-1]

    async def _update_messages(self, ids: Iterable[int], **values: Any) -> None:
        ids = list(ids)
        if not ids:
            return
        stmt = update(MessageRow).where(col(MessageRow.id).in_(ids)).values(**values)
        await self._db.write(lambda db: execute(db, stmt))

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
        return await self._db.read(lambda db: int(db.exec(stmt).one()))

    async def latest_senders(self, session_id: int | None = None) -> dict[int, str]:
        """The sender of each session's newest user message that names one, by session id.

        The person a DM session's per-user history limit belongs to: on Slack and Discord a
        DM's chat id is a channel id, not the user's, so only the messages say who it is."""
        query = (
            select(MessageRow.session_id, func.max(MessageRow.seq).label("seq"))
            .where(MessageRow.role == "user", col(MessageRow.sender_id).is_not(None))
            .group_by(col(MessageRow.session_id))
        )
        if session_id is not None:
            query = query.where(MessageRow.session_id == session_id)
        newest = query.subquery()
        stmt = select(MessageRow.session_id, MessageRow.sender_id).join(
            newest,
            (col(MessageRow.session_id) == newest.c.session_id)
            & (col(MessageRow.seq) == newest.c.seq),
        )
        return await self._db.read(
            lambda db: {int(sid): str(sender) for sid, sender in db.exec(stmt).all()}
        )

    async def message_counts(self) -> dict[int, int]:
        """Stored messages per session id, in one query (the sessions list)."""
        stmt = select(MessageRow.session_id, func.count()).group_by(col(MessageRow.session_id))
        return await self._db.read(lambda db: {int(sid): int(n) for sid, n in db.exec(stmt).all()})
