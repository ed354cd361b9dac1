"""Session rows: one per conversation (a chat, a thread, a scheduled job's own session).

A session is created on its first message and looked up by key on every message after, so
this repository also keeps each key's row id once known (`session_id`), forgotten whenever a
transaction that may have created it rolls back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import update
from sqlmodel import col, select

from gateway.store.engine import Database, execute
from gateway.store.models import SessionRow, utcnow


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


class SessionRepository:
    """Create, find and list sessions; record a session's last error."""

    def __init__(self, database: Database) -> None:
        self._db = database
        self._ids: dict[str, int] = {}
        database.on_rollback(self._ids.clear)

    async def get_session(self, key: str) -> SessionRow | None:
        return await self._db.fast(lambda cursor: self._db.hot.get_session(cursor, key))

    def session_id(self, cursor: Any, info: SessionInfo) -> int:
        """The session's row id, inserting the row first if there is none (inside the caller's
        transaction on `cursor`)."""
        cached = self._ids.get(info.key)
        if cached is not None:
            return cached
        session_id = self._db.hot.session_id(cursor, info.key, asdict(info))
        assert session_id is not None
        self._ids[info.key] = session_id
        return session_id

    async def ensure_session(self, info: SessionInfo) -> SessionRow:
        for _attempt in range(3):
            try:
                await self._db.fast(lambda cursor: self.session_id(cursor, info), write=True)
                break
            except self._db.integrity_errors:  # created concurrently by another process
                self._ids.pop(info.key, None)
                continue
        row = await self.get_session(info.key)
        assert row is not None
        return row

    async def list_sessions(self) -> list[SessionRow]:
        return await self._db.read(
            lambda db: list(
                db.exec(select(SessionRow).order_by(col(SessionRow.updated_at).desc())).all()
            )
        )

    async def sessions_idle_since(self, cutoff: datetime) -> list[SessionRow]:
        """Sessions with no activity (message, compaction) since `cutoff`, oldest first."""
        stmt = (
            select(SessionRow)
            .where(col(SessionRow.updated_at) < cutoff)
            .order_by(col(SessionRow.updated_at))
        )
        return await self._db.read(lambda db: list(db.exec(stmt).all()))

    async def set_session_error(self, session_id: int, error: str | None) -> None:
        stmt = (
            update(SessionRow)
            .where(col(SessionRow.id) == session_id)
            .values(last_error=error, updated_at=utcnow())
        )
        await self._db.write(lambda db: execute(db, stmt))
