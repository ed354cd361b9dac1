"""Persistence: SQLModel tables and the async Store."""

from gateway.store.db import SessionInfo, Store, TurnUsage, row_to_message
from gateway.store.models import (
    CompactionRow,
    MemoryFlushRow,
    MessageRow,
    PairingRow,
    SessionRow,
    TurnRecordRow,
)

__all__ = [
    "CompactionRow",
    "MemoryFlushRow",
    "MessageRow",
    "PairingRow",
    "SessionInfo",
    "SessionRow",
    "Store",
    "TurnRecordRow",
    "TurnUsage",
    "row_to_message",
]
