"""Pairing codes: how an unknown sender asks for access and an operator grants or denies it.

Each request is a row (pending, then approved, denied or expired); the latest row for a sender
is their standing. Codes expire, so a stale one can neither be approved nor stay pending.
A sender holds at most one pending code (`request_pairing` hands back the one they have), so a
platform's cap on pending codes takes as many accounts as the cap to fill.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlmodel import Session, col, select

from gateway.store.engine import Database
from gateway.store.locks import lock_id
from gateway.store.models import PairingRow, utcnow


def _aware(value: datetime) -> datetime:
    """SQLite hands back naive datetimes; they were stored as UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class PairingRequest:
    """What asking for a code gave a sender."""

    row: PairingRow | None
    """Their pending code, or None: the platform has `max_pending` codes pending already."""
    issued: bool
    """A new code (False: the one they already had, still valid, or none)."""


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

    async def request_pairing(
        self,
        platform: str,
        sender_id: str,
        sender_name: str | None,
        *,
        code: str,
        ttl: timedelta,
        max_pending: int,
    ) -> PairingRequest:
        """The sender's valid pending code, else a new one (`code`) unless the platform has
        `max_pending` pending; one transaction, so two messages at once never give a sender two
        codes nor the platform one over its cap (PostgreSQL: under a per-platform advisory
        lock; SQLite's write transactions are serial already)."""
        now = utcnow()

        def op(db: Session) -> PairingRequest:
            if db.get_bind().dialect.name == "postgresql":
                db.connection().execute(
                    text("SELECT pg_advisory_xact_lock(:id)"),
                    {"id": lock_id(f"gatehouse:pairings:{platform}")},
                )
            pending = db.exec(
                select(PairingRow).where(
                    PairingRow.platform == platform, PairingRow.status == "pending"
                )
            ).all()
            valid = [r for r in pending if _aware(r.expires_at) > now]
            for row in valid:
                if row.sender_id == sender_id:
                    return PairingRequest(row, issued=False)
            if len(valid) >= max_pending:
                return PairingRequest(None, issued=False)
            for row in pending:  # their stale code goes, so one sender holds one pending row
                if row.sender_id == sender_id:
                    row.status = "expired"
                    row.decided_at = now
                    db.add(row)
            row = PairingRow(
                platform=platform, sender_id=sender_id, sender_name=sender_name, code=code,
                expires_at=now + ttl,
            )
            db.add(row)
            db.flush()
            return PairingRequest(row, issued=True)

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
