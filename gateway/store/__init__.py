"""Persistence: SQLModel tables, their migrations and the Store."""

from gateway.store.db import HistoryRead, SessionInfo, Store, TurnUsage, row_to_message
from gateway.store.models import (
    CompactionRow,
    MemoryFlushRow,
    MessageRow,
    OutboxRow,
    PairingRow,
    SessionRow,
    TurnRecordRow,
)

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
