"""The outbox: replies stored with their turn and kept until a channel confirms sending them.

A reply enters the outbox in its turn's own transaction (`TurnRepository.finish_turn`), so a
crash between storing and sending loses nothing. This repository reads what is left, counts
failed tries and gives a reply up, hands replies back to an operator's retry, and lets several
processes share the sweep without sending a reply twice (`claim_stale_outbox`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from sqlalchemy import update
from sqlmodel import Session, col, select

from channels.base import OutboundMessage
from gateway.store.engine import Database
from gateway.store.models import OutboxRow, utcnow


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


class OutboxRepository:
    """Read, claim, fail, retry and forget the replies waiting in the outbox."""

    def __init__(self, database: Database) -> None:
        self._db = database

    async def forget_outbox(self, outbox_ids: Iterable[int]) -> int:
        """Drop these replies from the outbox (sent, or an operator stopped trying: they stay in
        their conversation); how many rows were there."""
        ids = list(outbox_ids)
        if not ids:
            return 0
        hot = self._db.hot
        # Once a reply a turn: one statement, one round trip on PostgreSQL (no ORM session).
        return await self._db.fast(
            lambda cursor: hot.forget_outbox(cursor, ids), write=True, autocommit=True
        )

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

        rows = await self._db.write(op)
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
            select(OutboxRow)
            .where(col(OutboxRow.given_up_at).is_(None))
            .order_by(col(OutboxRow.id))
        )
        if older_than is not None:
            cutoff = utcnow() - timedelta(seconds=older_than)
            stmt = stmt.where(col(OutboxRow.created_at) < cutoff)
        if retried:
            stmt = stmt.where(OutboxRow.attempts == 0, col(OutboxRow.last_error).is_not(None))
        rows = await self._db.read(lambda db: list(db.exec(stmt).all()))
        return [(row.id, _outbound(row)) for row in rows if row.id is not None]

    async def outbox(self) -> list[OutboxRow]:
        """Every reply not confirmed as sent, given-up ones included (`gatehouse outbox list`)."""
        stmt = select(OutboxRow).order_by(col(OutboxRow.id))
        return await self._db.read(lambda db: list(db.exec(stmt).all()))

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

        return await self._db.write(op)

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
        return await self._db.write(lambda db: db.exec(stmt).rowcount)
