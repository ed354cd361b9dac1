"""The Store: the one object the rest of the gateway holds for every read and write.

It is a façade. The work lives in one repository per aggregate, each taking the shared
`Database` (gateway/store/engine.py: engines, the database thread, one transaction a step):
sessions.py, messages.py (inbound, appends, history), turns.py (claim and finish a turn, turn
records), outbox.py, pairings.py, compactions.py (with memory flushes) and locks.py
(cross-process advisory locks). Each Store operation is the repository's own bound method, so
callers keep one object while a change to, say, the outbox is made in outbox.py alone, and a
signature or docstring lives only where the work is.
"""

from __future__ import annotations

from pathlib import Path

from gateway.store.attachments import AttachmentRepository
from gateway.store.compactions import CompactionRepository
from gateway.store.engine import Database, HealthWatcher
from gateway.store.faults import StorageError, StorageHealth
from gateway.store.locks import Locks
from gateway.store.messages import MessageRepository
from gateway.store.outbox import OutboxRepository
from gateway.store.pairings import PairingRepository
from gateway.store.sessions import SessionRepository
from gateway.store.turns import TurnRepository

__all__ = ["Store"]


class Store:
    """SQLite (WAL) by default, PostgreSQL by URL; same models, same code."""

    def __init__(self, url: str, *, threads: int = 2) -> None:
        self.database = Database(url, threads=threads)
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
        self.attachment_repo = AttachmentRepository(self.database)

        # The operations: each one the repository's own bound method.
        # cross-process locks (locks.py)
        self.session_lock = self.locks.session_lock
        self.advisory_lock = self.locks.advisory_lock
        self.lock_alive = self.locks.lock_alive
        self.release_lock = self.locks.release_lock

        # sessions (sessions.py)
        self.get_session = self.session_repo.get_session
        self.ensure_session = self.session_repo.ensure_session
        self.list_sessions = self.session_repo.list_sessions
        self.sessions_idle_since = self.session_repo.sessions_idle_since
        self.set_session_error = self.session_repo.set_session_error

        # messages (messages.py)
        self.accept_inbound = self.message_repo.accept_inbound
        self.reply_to = self.message_repo.reply_to
        self.append_messages = self.message_repo.append_messages
        self.post_message = self.message_repo.post_message
        self.summary_and_history = self.message_repo.summary_and_history
        self.history = self.message_repo.history
        self.messages_at = self.message_repo.messages_at
        self.recent_messages = self.message_repo.recent_messages
        self.mark_handled = self.message_repo.mark_handled
        self.mark_status = self.message_repo.mark_status
        self.mark_interrupted = self.message_repo.mark_interrupted
        self.message_count = self.message_repo.message_count
        self.message_counts = self.message_repo.message_counts
        self.latest_senders = self.message_repo.latest_senders

        # turns (turns.py)
        self.claim_pending = self.turn_repo.claim_pending
        self.claim_turn = self.turn_repo.claim_turn
        self.arrivals = self.turn_repo.arrivals
        self.claim_arrivals = self.turn_repo.claim_arrivals
        self.finish_turn = self.turn_repo.finish_turn
        self.sessions_with_pending = self.turn_repo.sessions_with_pending
        self.has_pending = self.turn_repo.has_pending
        self.turn_records = self.turn_repo.turn_records
        self.latest_turn_records = self.turn_repo.latest_turn_records

        # outbox (outbox.py)
        self.forget_outbox = self.outbox_repo.forget_outbox
        self.claim_stale_outbox = self.outbox_repo.claim_stale_outbox
        self.undelivered = self.outbox_repo.undelivered
        self.outbox = self.outbox_repo.outbox
        self.outbox_failed = self.outbox_repo.outbox_failed
        self.retry_outbox = self.outbox_repo.retry_outbox

        # pairing (pairings.py)
        self.pairing_for = self.pairing_repo.pairing_for
        self.pending_pairings = self.pairing_repo.pending_pairings
        self.list_pairings = self.pairing_repo.list_pairings
        self.add_pairing = self.pairing_repo.add_pairing
        self.request_pairing = self.pairing_repo.request_pairing
        self.decide_pairing = self.pairing_repo.decide_pairing
        self.expire_pairings = self.pairing_repo.expire_pairings
        self.approved_senders = self.pairing_repo.approved_senders

        # compactions and memory flushes (compactions.py)
        self.add_compaction = self.compaction_repo.add_compaction
        self.set_compaction_state = self.compaction_repo.set_compaction_state
        self.mark_refreshed = self.compaction_repo.mark_refreshed
        self.compactions = self.compaction_repo.compactions
        self.undo_latest_compaction = self.compaction_repo.undo_latest_compaction
        self.latest_compaction = self.compaction_repo.latest_compaction
        self.record_flush = self.compaction_repo.record_flush
        self.memory_flushes = self.compaction_repo.memory_flushes

        # inbound messages waiting for their attachments (attachments.py)
        self.complete_inbound = self.attachment_repo.complete_inbound
        self.answer_inbound = self.attachment_repo.answer_inbound
        self.fetching_messages = self.attachment_repo.fetching_messages

    # -- the database -----------------------------------------------------------------------

    @property
    def path(self) -> Path | None:
        """The SQLite file, or None for PostgreSQL or an in-memory database."""
        return self.database.path

    @property
    def failure(self) -> str | None:
        """Why the last store step failed, while no write has succeeded since; else None."""
        return self.database.failure

    @property
    def health(self) -> StorageHealth:
        """What this process saw of the database's faults (`Database.watch`)."""
        return self.database.health

    @property
    def gone(self) -> bool:
        """The SQLite file was deleted or replaced while running: no write until a restart."""
        return self.database.gone

    def watch(self, watcher: HealthWatcher) -> None:
        """Be told of each change of `health` (`Database.watch`)."""
        self.database.watch(watcher)

    def check_file(self) -> StorageError | None:
        """SQLite: whether the file was deleted or replaced (`Database.check_file`)."""
        return self.database.check_file()

    async def init(self) -> None:
        """Open (creating the SQLite file and its directory) and migrate; a storage fault
        raises the StorageError that says what to do."""
        self.schema_status = await self.database.open()

    async def verify(self) -> None:
        """SQLite: refuse a damaged file at start (`Database.verify`)."""
        await self.database.verify()

    async def close(self) -> None:
        await self.locks.close()
        await self.database.close()
