"""Pairing codes: how an unknown sender asks for access and an operator grants or denies it.

Each request is a row (pending, then approved, denied or expired); the latest row for a sender
is their standing. Codes expire, so a stale one can neither be approved nor stay pending.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlmodel import Session, col, select

from gateway.store.engine import Database
from gateway.store.models import PairingRow, utcnow


def _aware(value: datetime) -> datetime:
    """SQLite hands back naive datetimes; they were stored as UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class PairingRepository:
    """Add, decide, expire and list pairing requests; the senders a platform approved."""

    def __init__(self, database: Database) -> None:
        self._db = database

    async def pairing_for(self, platform: str, sender_id: str) -> PairingRow | None:
        """The latest pairing row for a sender (approved, denied or pending)."""
        stmt = (
            select(PairingRow)
            .where(PairingRow.platform == platform, PairingRow.sender_id == sender_id)
            .order_by(col(PairingRow.id).desc())
        )
        return await self._db.read(lambda db: db.exec(stmt).first())

    async def pending_pairings(self, platform: str | None = None) -> list[PairingRow]:
        now = utcnow()
        stmt = select(PairingRow).where(PairingRow.status == "pending")
        if platform is not None:
            stmt = stmt.where(PairingRow.platform == platform)
        rows = await self._db.read(
            lambda db: list(db.exec(stmt.order_by(col(PairingRow.id))).all())
        )
        return [r for r in rows if _aware(r.expires_at) > now]

    async def list_pairings(self) -> list[PairingRow]:
        stmt = select(PairingRow).order_by(col(PairingRow.id))
        return await self._db.read(lambda db: list(db.exec(stmt).all()))

    async def add_pairing(self, row: PairingRow) -> PairingRow:
        def op(db: Session) -> PairingRow:
            db.add(row)
            db.flush()
            return row

        return await self._db.write(op)

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

        return await self._db.write(op)

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

        return await self._db.write(op)

    async def approved_senders(self, platform: str) -> set[str]:
        stmt = select(PairingRow.sender_id).where(
            PairingRow.platform == platform, PairingRow.status == "approved"
        )
        return await self._db.read(lambda db: set(db.exec(stmt).all()))
