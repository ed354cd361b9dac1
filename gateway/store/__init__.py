"""Persistence: SQLModel tables, their migrations and the Store.

The Store (db.py) is the façade the gateway holds; each aggregate has its own repository module
next to it (sessions, messages, turns, outbox, pairings, compactions, locks), all sharing one
`Database` (engine.py). hot.py holds the per-message SQL; models.py and schema.py the tables.

The names below are loaded when first used (gateway/lazy.py): a command that needs one module
of the store (`gateway.store.faults`, `gateway.store.schema`) does not load all of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.lazy import lazy_exports

if TYPE_CHECKING:
    from gateway.store.db import Store
    from gateway.store.messages import HistoryRead, row_to_message
    from gateway.store.models import (
        CompactionRow,
        MemoryFlushRow,
        MessageRow,
        OutboxRow,
        PairingRow,
        SessionRow,
        TurnRecordRow,
    )
    from gateway.store.sessions import SessionInfo
    from gateway.store.turns import TurnUsage

_HOMES = {
    "Store": "db",
    "HistoryRead": "messages",
    "row_to_message": "messages",
    "CompactionRow": "models",
    "MemoryFlushRow": "models",
    "MessageRow": "models",
    "OutboxRow": "models",
    "PairingRow": "models",
    "SessionRow": "models",
    "TurnRecordRow": "models",
    "SessionInfo": "sessions",
    "TurnUsage": "turns",
}
"""Each exported name and the module of this package that defines it."""

__all__ = [
    "CompactionRow",
    "HistoryRead",
    "MemoryFlushRow",
    "MessageRow",
    "OutboxRow",
    "PairingRow",
    "SessionInfo",
    "SessionRow",
    "Store",
    "TurnRecordRow",
    "TurnUsage",
    "row_to_message",
]


__getattr__ = lazy_exports(__name__, _HOMES, globals())
