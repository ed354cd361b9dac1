"""Inbound messages whose attachments are still being downloaded.

Such a message is stored the moment it arrives (`MessageRepository.accept_inbound` with
`FETCHING_STATUS`: its text, what was attached and how to fetch it), marked handled so no turn
claims it half-made. Once the files are saved (gateway/inbound/attachments.py) it is made whole,
once: `complete_inbound` gives it the content the model will read and lets the next turn claim
it like any arrival; `answer_inbound` does so and answers it in the same transaction, without a
turn (a photo the model cannot see, a file that was refused). Until then its content is not in
any conversation, so nothing that was shown to the model is ever rewritten. A restart finds the
unfinished ones with `fetching_messages`.
"""

from __future__ import annotations

from typing import Any

from sqlmodel import Session, col, select

from channels.base import OutboundMessage
from context.types import Message
from gateway.store.engine import Database
from gateway.store.messages import FETCHING_STATUS, reply_values
from gateway.store.models import MessageRow, SessionRow

_COMPLETE = (
    "UPDATE messages SET content = :content, handled = :handled, status = NULL "
    "WHERE id = :id AND status = :fetching RETURNING id"
)


class AttachmentRepository:
    """Finish the inbound messages that wait for their attachments."""

    def __init__(self, database: Database) -> None:
        self._db = database

    def _complete(self, cursor: Any, message_id: int, content: Any, *, handled: bool) -> bool:
        d = self._db.hot.d
        params = {
            "id": message_id,
            "content": d.dump_json(content),
            "handled": handled,
            "fetching": FETCHING_STATUS,
        }
        cursor.execute(d.sql(_COMPLETE), params)
        # RETURNING: whether the row was still fetching, in the statement that changed it.
        return cursor.fetchone() is not None

    async def complete_inbound(self, message_id: int, content: Any) -> bool:
        """Give a fetching message its final content and let a turn claim it. False when it
        was not fetching any more (another process finished it first)."""
        return await self._db.fast(
            lambda cursor: self._complete(cursor, message_id, content, handled=False), write=True
        )

    async def answer_inbound(
        self,
        session_id: int,
        message_id: int,
        content: Any,
        reply: Message,
        outbound: OutboundMessage,
    ) -> int | None:
        """Complete a fetching message and answer it without a turn, in one transaction: the
        message takes its place in the conversation, `reply` the next one, and the reply enters
        the outbox. Returns the outbox id; None when the message was not fetching any more.
        The caller holds the session's lane, so no turn's seqs interleave."""
        hot = self._db.hot

        def op(cursor: Any) -> int | None:
            if not self._complete(cursor, message_id, content, handled=True):
                return None
            first = hot.allocate_seqs(cursor, session_id, 2)
            hot.set_seqs(cursor, [(message_id, first)])
            hot.insert_message_only(cursor, reply_values(session_id, first + 1, reply, None))
            return hot.insert_outbox(cursor, session_id, outbound)

        return await self._db.fast(op, write=True)

    async def fetching_messages(self) -> list[tuple[MessageRow, SessionRow]]:
        """Messages still waiting for their attachments (a stop or crash interrupted them),
        with their sessions, oldest first."""

        def op(db: Session) -> list[tuple[MessageRow, SessionRow]]:
            stmt = (
                select(MessageRow, SessionRow)
                .join(SessionRow, col(MessageRow.session_id) == col(SessionRow.id))
                .where(MessageRow.status == FETCHING_STATUS)
                .order_by(col(MessageRow.id))
            )
            return [(m, s) for m, s in db.exec(stmt).all()]

        return await self._db.read(op)
