"""The Store: the one object the rest of the gateway holds for every read and write.

It is a façade. The work lives in one repository per aggregate, each taking the shared
`Database` (gateway/store/engine.py: engines, the database thread, one transaction a step):
sessions.py, messages.py (inbound, appends, history), turns.py (claim and finish a turn, turn
records), outbox.py, pairings.py, compactions.py (with memory flushes) and locks.py
(cross-process advisory locks). Each Store method hands its call to one of them unchanged, so
callers keep one object while a change to, say, the outbox is made in outbox.py alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path

from channels.base import InboundMessage, OutboundMessage
from context.types import Message
from gateway.config import SUPPORTED_SCHEMES, sync_url
from gateway.store.compactions import CompactionRepository
from gateway.store.engine import Database
from gateway.store.locks import AdvisoryLock, LockBusyError, Locks
from gateway.store.messages import (
    CONTEXT_STATUS,
    HistoryRead,
    Known,
    MessageRepository,
    row_to_message,
)
from gateway.store.models import (
    CompactionRow,
    MemoryFlushRow,
    MessageRow,
    OutboxRow,
    PairingRow,
    SessionRow,
    TurnRecordRow,
)
from gateway.store.outbox import OutboxRepository
from gateway.store.pairings import PairingRepository
from gateway.store.sessions import SessionInfo, SessionRepository
from gateway.store.turns import TurnRepository, TurnUsage

__all__ = [
    "CONTEXT_STATUS",
    "SUPPORTED_SCHEMES",
    "AdvisoryLock",
    "HistoryRead",
    "Known",
    "LockBusyError",
    "SessionInfo",
    "Store",
    "TurnUsage",
    "row_to_message",
    "sync_url",
]


class Store:
    """SQLite (WAL) by default, PostgreSQL by URL; same models, same code."""

    def __init__(self, url: str, *, pool_size: int = 8) -> None:
        self.database = Database(url, pool_size=pool_size)
        self.url = self.database.url
        self.is_sqlite = self.database.is_sqlite
        self.engine = self.database.engine
        self.where: Path | str = self.database.where
        """How errors name this database: its SQLite file, or its URL without the password."""
        self.schema_status = "not opened"
        self.locks = Locks(self.database)
        self.session_repo = SessionRepository(self.database)
        self.message_repo = MessageRepository(self.database, self.session_repo)
        self.turn_repo = TurnRepository(self.database)
        self.outbox_repo = OutboxRepository(self.database)
        self.pairing_repo = PairingRepository(self.database)
        self.compaction_repo = CompactionRepository(self.database)

    # -- the database -----------------------------------------------------------------------

    @property
    def path(self) -> Path | None:
        """The SQLite file, or None for PostgreSQL or an in-memory database."""
        return self.database.path

    @property
    def failure(self) -> str | None:
        """Why the last store step failed, while no write has succeeded since; else None."""
        return self.database.failure

    async def init(self) -> None:
        """Open (creating the SQLite file and its directory) and migrate; a storage fault
        raises the StorageError that says what to do."""
        self.schema_status = await self.database.open()

    async def verify(self) -> None:
        """SQLite: refuse a damaged file at start (`Database.verify`)."""
        await self.database.verify()

    async def close(self) -> None:
        await self.database.close()

    # -- cross-process locks (locks.py) -----------------------------------------------------

    def session_lock(
        self, key: str, poll: float = 0.05
    ) -> contextlib.AbstractAsyncContextManager[None]:
        return self.locks.session_lock(key, poll)

    async def advisory_lock(
        self, lock_id: int, *, wait: bool, poll: float = 0.05
    ) -> AdvisoryLock | None:
        return await self.locks.advisory_lock(lock_id, wait=wait, poll=poll)

    async def lock_alive(self, lock: AdvisoryLock) -> bool:
        return await self.locks.lock_alive(lock)

    async def release_lock(self, lock: AdvisoryLock) -> None:
        await self.locks.release_lock(lock)

    # -- sessions (sessions.py) -------------------------------------------------------------

    async def get_session(self, key: str) -> SessionRow | None:
        return await self.session_repo.get_session(key)

    async def ensure_session(self, info: SessionInfo) -> SessionRow:
        return await self.session_repo.ensure_session(info)

    async def list_sessions(self) -> list[SessionRow]:
        return await self.session_repo.list_sessions()

    async def sessions_idle_since(self, cutoff: datetime) -> list[SessionRow]:
        return await self.session_repo.sessions_idle_since(cutoff)

    async def set_session_error(self, session_id: int, error: str | None) -> None:
        await self.session_repo.set_session_error(session_id, error)

    # -- messages (messages.py) -------------------------------------------------------------

    async def accept_inbound(
        self, info: SessionInfo, msg: InboundMessage, *, status: str | None = None
    ) -> tuple[int, MessageRow | None]:
        return await self.message_repo.accept_inbound(info, msg, status=status)

    async def reply_to(
        self, platform: str, chat_id: str, platform_message_id: str
    ) -> list[str] | None:
        return await self.message_repo.reply_to(platform, chat_id, platform_message_id)

    async def append_messages(
        self, session_id: int, messages: Sequence[Message], *, status: str | None = None
    ) -> list[MessageRow]:
        return await self.message_repo.append_messages(session_id, messages, status=status)

    async def post_message(
        self, session_id: int, message: Message, outbound: OutboundMessage
    ) -> int:
        return await self.message_repo.post_message(session_id, message, outbound)

    async def summary_and_history(
        self, session_id: int, known: Known = None
    ) -> tuple[CompactionRow | None, int, list[Message]]:
        return await self.message_repo.summary_and_history(session_id, known)

    async def history(self, session_id: int, after_seq: int = 0) -> list[Message]:
        return await self.message_repo.history(session_id, after_seq)

    async def mark_handled(self, ids: Iterable[int], status: str | None = None) -> None:
        await self.message_repo.mark_handled(ids, status)

    async def mark_status(self, ids: Iterable[int], status: str) -> None:
        await self.message_repo.mark_status(ids, status)

    async def mark_interrupted(self, ids: Iterable[int]) -> None:
        await self.message_repo.mark_interrupted(ids)

    async def message_count(self, session_id: int | None = None) -> int:
        return await self.message_repo.message_count(session_id)

    async def message_counts(self) -> dict[int, int]:
        return await self.message_repo.message_counts()

    # -- turns (turns.py) -------------------------------------------------------------------

    async def claim_pending(
        self, session_id: int, context_limit: int | None = None
    ) -> list[MessageRow]:
        return await self.turn_repo.claim_pending(session_id, context_limit)

    async def claim_turn(
        self,
        key: str,
        context_limit: Callable[[SessionRow], int | None],
        known: Callable[[int], Known] | None = None,
    ) -> tuple[SessionRow | None, list[MessageRow], HistoryRead | None]:
        return await self.turn_repo.claim_turn(key, context_limit, known)

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
        return await self.turn_repo.finish_turn(
            session_id,
            reply,
            handled_ids,
            usage,
            reply_status=reply_status,
            error=error,
            token_ratio=token_ratio,
            token_counts=token_counts,
            record=record,
            outbound=outbound,
        )

    async def sessions_with_pending(self, older_than: float | None = None) -> list[SessionRow]:
        return await self.turn_repo.sessions_with_pending(older_than)

    async def has_pending(self, session_id: int) -> bool:
        return await self.turn_repo.has_pending(session_id)

    async def turn_records(self, session_id: int, limit: int = 500) -> list[TurnRecordRow]:
        return await self.turn_repo.turn_records(session_id, limit)

    async def latest_turn_records(self) -> dict[int, TurnRecordRow]:
        return await self.turn_repo.latest_turn_records()

    # -- outbox (outbox.py) -----------------------------------------------------------------

    async def forget_outbox(self, outbox_ids: Iterable[int]) -> int:
        return await self.outbox_repo.forget_outbox(outbox_ids)

    async def claim_stale_outbox(self, older_than: float) -> list[tuple[int, OutboundMessage]]:
        return await self.outbox_repo.claim_stale_outbox(older_than)

    async def undelivered(
        self, older_than: float | None = None, *, retried: bool = False
    ) -> list[tuple[int, OutboundMessage]]:
        return await self.outbox_repo.undelivered(older_than, retried=retried)

    async def outbox(self) -> list[OutboxRow]:
        return await self.outbox_repo.outbox()

    async def outbox_failed(
        self, outbox_id: int, sent_parts: int, error: str, max_attempts: int
    ) -> OutboxRow | None:
        return await self.outbox_repo.outbox_failed(outbox_id, sent_parts, error, max_attempts)

    async def retry_outbox(self, outbox_ids: Iterable[int] | None = None) -> int:
        return await self.outbox_repo.retry_outbox(outbox_ids)

    # -- pairing (pairings.py) --------------------------------------------------------------

    async def pairing_for(self, platform: str, sender_id: str) -> PairingRow | None:
        return await self.pairing_repo.pairing_for(platform, sender_id)

    async def pending_pairings(self, platform: str | None = None) -> list[PairingRow]:
        return await self.pairing_repo.pending_pairings(platform)

    async def list_pairings(self) -> list[PairingRow]:
        return await self.pairing_repo.list_pairings()

    async def add_pairing(self, row: PairingRow) -> PairingRow:
        return await self.pairing_repo.add_pairing(row)

    async def decide_pairing(self, code: str, status: str) -> PairingRow | None:
        return await self.pairing_repo.decide_pairing(code, status)

    async def expire_pairings(self) -> list[PairingRow]:
        return await self.pairing_repo.expire_pairings()

    async def approved_senders(self, platform: str) -> set[str]:
        return await self.pairing_repo.approved_senders(platform)

    # -- compactions and memory flushes (compactions.py) ------------------------------------

    async def add_compaction(
        self,
        row: CompactionRow,
        *,
        ineffective: bool | None = None,
        cooldown_until: datetime | None = None,
    ) -> CompactionRow:
        return await self.compaction_repo.add_compaction(
            row, ineffective=ineffective, cooldown_until=cooldown_until
        )

    async def set_compaction_state(
        self,
        session_id: int,
        *,
        cooldown_until: datetime | None = None,
        reset_ineffective: bool = False,
    ) -> None:
        await self.compaction_repo.set_compaction_state(
            session_id, cooldown_until=cooldown_until, reset_ineffective=reset_ineffective
        )

    async def mark_refreshed(self, compaction_id: int) -> None:
        await self.compaction_repo.mark_refreshed(compaction_id)

    async def compactions(self, session_id: int) -> list[CompactionRow]:
        return await self.compaction_repo.compactions(session_id)

    async def undo_latest_compaction(self, session_id: int) -> CompactionRow | None:
        return await self.compaction_repo.undo_latest_compaction(session_id)

    async def latest_compaction(self, session_id: int) -> CompactionRow | None:
        return await self.compaction_repo.latest_compaction(session_id)

    async def record_flush(self, session_id: int, cycle: int, ok: bool, notes_written: int) -> None:
        await self.compaction_repo.record_flush(session_id, cycle, ok, notes_written)

    async def memory_flushes(self, session_id: int) -> list[MemoryFlushRow]:
        return await self.compaction_repo.memory_flushes(session_id)
