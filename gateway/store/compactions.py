"""Compactions and the memory flushes that go with them.

A compaction stores a summary next to the untouched original messages (it never deletes), so
it can be undone; each one starts a new compaction cycle on its session. Before compacting, the
gateway may flush durable notes to memory once per cycle: `record_flush` keeps each attempt and
marks the cycle flushed when it succeeded. The session's cooldown and ineffective-compaction
counters, which decide when to try again, live on the session row and change here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import update
from sqlmodel import Session, col, select

from gateway.store.engine import Database, execute
from gateway.store.models import CompactionRow, MemoryFlushRow, SessionRow, utcnow

SessionRows = TypeVar("SessionRows", CompactionRow, MemoryFlushRow)


def _latest_compaction(session_id: int) -> Any:
    return (
        select(CompactionRow)
        .where(CompactionRow.session_id == session_id, col(CompactionRow.undone).is_(False))
        .order_by(col(CompactionRow.id).desc())
    )


class CompactionRepository:
    """Add, undo, refresh and list compactions; a session's compaction state; memory flushes."""

    def __init__(self, database: Database) -> None:
        self._db = database

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
            execute(db, stmt.values(**values))
            db.flush()
            return row

        return await self._db.write(op)

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
        await self._db.write(lambda db: execute(db, stmt))

    async def mark_refreshed(self, compaction_id: int) -> None:
        stmt = update(CompactionRow).where(col(CompactionRow.id) == compaction_id)
        await self._db.write(lambda db: execute(db, stmt.values(refreshed=True)))

    async def compactions(self, session_id: int) -> list[CompactionRow]:
        return await self._in_order(CompactionRow, session_id)

    async def undo_latest_compaction(self, session_id: int) -> CompactionRow | None:
        """Restore the state before the last compaction (its row is kept, marked undone)."""

        def op(db: Session) -> CompactionRow | None:
            latest: CompactionRow | None = db.exec(_latest_compaction(session_id)).first()
            if latest is None:
                return None
            stmt = update(CompactionRow).where(col(CompactionRow.id) == latest.id)
            execute(db, stmt.values(undone=True))
            stmt2 = update(SessionRow).where(col(SessionRow.id) == session_id)
            execute(db, stmt2.values(ineffective_compactions=0, compaction_cooldown_until=None))
            return latest

        return await self._db.write(op)

    async def latest_compaction(self, session_id: int) -> CompactionRow | None:
        return await self._db.fast(
            lambda cursor: self._db.hot.latest_compaction(cursor, session_id)
        )

    async def record_flush(self, session_id: int, cycle: int, ok: bool, notes_written: int) -> None:
        """Keep a record of a memory flush; a successful one also marks its cycle flushed."""

        def op(db: Session) -> None:
            db.add(MemoryFlushRow(session_id=session_id, cycle=cycle, ok=ok,
                                  notes_written=notes_written))
            if ok:
                stmt = update(SessionRow).where(col(SessionRow.id) == session_id)
                execute(db, stmt.values(flushed_cycle=cycle))

        await self._db.write(op)

    async def memory_flushes(self, session_id: int) -> list[MemoryFlushRow]:
        return await self._in_order(MemoryFlushRow, session_id)

    async def _in_order(self, table: type[SessionRows], session_id: int) -> list[SessionRows]:
        """The session's rows of `table`, oldest first."""
        stmt = select(table).where(table.session_id == session_id).order_by(col(table.id))
        return await self._db.read(lambda db: list(db.exec(stmt).all()))
