"""Turns the database could not store (a full disk, a file gone read-only): kept, said, tried
again.

A turn whose step fails on a storage fault leaves its messages unanswered in the store (they
were stored before the turn began). Nothing in the platform's world moves on its own, so
without help the message would wait until its sender wrote again. Instead the session is
*blocked* here: the gateway tries its lane again after `RETRY_DELAYS` (at once when a write
succeeds elsewhere, `Gateway`), a person waiting for the reply on a request/response channel
(webchat, terminal) is told at once (`ReplyNotStoredError`), and one line is logged for the
session, not one a try.

When the fault hit the turn's last write (`Store.finish_turn`: the reply, the handled marks,
the outbox row), the model had already answered: the finished turn is kept in memory
(`HeldReply`) and stored on the next try without asking the model again. A process that stops
meanwhile loses only that copy: the messages are still unanswered in the store, and the next
start answers them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from channels.base import OutboundMessage
from gateway.store import MessageRow
from gateway.store.faults import StorageError
from gateway.turn.stats import TurnStats

log = logging.getLogger(__name__)

RETRY_DELAYS: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 15.0)
"""Seconds before each new try of a blocked session's turn; the last repeats while the fault
lasts. A try costs one write that fails at once (or, for a turn that failed before its model
call finished, that turn again)."""

MessageKey = tuple[str, str, str]
"""(platform, chat id, platform message id): how a waiting caller names its message."""


class ReplyNotStoredError(StorageError):
    """The reply to a message could not be stored; the message is kept and answered later."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"the reply could not be stored ({reason})",
            "the message is kept and is answered once the database works again",
        )
        self.reason = reason


@dataclass(slots=True)
class HeldReply:
    """A finished turn the database refused: its `finish_turn`, ready to be called again."""

    store: Callable[[], Awaitable[int | None]]
    """Stores the reply, the handled marks and the outbox row (the outbox id)."""
    outbound: OutboundMessage
    """What to send once stored."""
    stats: TurnStats


@dataclass(slots=True)
class Blocked:
    reason: str
    messages: set[MessageKey] = field(default_factory=set)
    held: HeldReply | None = None
    tries: int = 1
    due: float = 0.0
    """Monotonic time of the next try."""


class StorageBlocks:
    """The sessions whose turn the database refused, until a turn of theirs is stored."""

    def __init__(self, delays: tuple[float, ...] = RETRY_DELAYS) -> None:
        self.delays = delays
        self._blocked: dict[str, Blocked] = {}

    def __contains__(self, session_key: str) -> bool:
        return session_key in self._blocked

    def __len__(self) -> int:
        return len(self._blocked)

    def block(
        self,
        session_key: str,
        fault: StorageError,
        rows: Iterable[MessageRow] = (),
        held: HeldReply | None = None,
    ) -> None:
        """A turn of this session failed on `fault`: its messages (`rows`, added to those
        known already) wait, `held` (if any) is what to store on the next try. Logged once a
        session, until it is stored."""
        reason = str(fault)
        entry = self._blocked.get(session_key)
        if entry is None:
            entry = self._blocked[session_key] = Blocked(reason)
            log.warning(
                "could not store the turn of %s: %s; its messages wait and are answered once "
                "the database works again", session_key, reason,
            )
        else:
            entry.tries += 1
            entry.reason = reason
        entry.messages.update(
            (r.platform or "", r.chat_id or "", r.platform_message_id)
            for r in rows
            if r.platform_message_id
        )
        if held is not None:
            entry.held = held
        entry.due = time.monotonic() + self.delays[min(entry.tries, len(self.delays)) - 1]

    def tries(self, session_key: str) -> int:
        """How many tries of the session's turn the database refused so far (0: none waits)."""
        entry = self._blocked.get(session_key)
        return entry.tries if entry is not None else 0

    def held(self, session_key: str) -> HeldReply | None:
        entry = self._blocked.get(session_key)
        return entry.held if entry is not None else None

    def stored(self, session_key: str) -> None:
        """A turn of this session was stored: it is no longer blocked."""
        entry = self._blocked.pop(session_key, None)
        if entry is not None:
            log.info("stored the turn of %s after %d tries", session_key, entry.tries + 1)

    def reason_for(self, platform: str, chat_id: str, message_id: str) -> str | None:
        """Why the answer to this message could not be stored (None: it was not refused)."""
        key = (platform, chat_id, message_id)
        for entry in self._blocked.values():
            if key in entry.messages:
                return entry.reason
        return None

    def due(self) -> list[str]:
        """The sessions to try again now; each is due again after its current delay, should
        the try not get to run meanwhile."""
        now = time.monotonic()
        keys = [key for key, entry in self._blocked.items() if entry.due <= now]
        for key in keys:
            entry = self._blocked[key]
            entry.due = now + self.delays[min(entry.tries, len(self.delays)) - 1]
        return keys

    def hurry(self) -> None:
        """A write succeeded: every blocked session is due now."""
        for entry in self._blocked.values():
            entry.due = 0.0
