"""Persistence: SQLModel tables, their migrations and the Store.

The Store (db.py) is the façade the gateway holds; each aggregate has its own repository module
next to it (sessions, messages, turns, outbox, pairings, compactions, locks), all sharing one
`Database` (engine.py). hot.py holds the per-message SQL; models.py and schema.py the tables.
"""

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
