"""Persistence: SQLModel tables and the async Store."""

from gateway.store.db import SessionInfo, Store, TurnUsage, row_to_message
from gateway.store.models import CompactionRow, MessageRow, OutboxRow, PairingRow, SessionRow

__all__ = [
    "CompactionRow",
    "MessageRow",
    "OutboxRow",
    "PairingRow",
    "SessionInfo",
    "SessionRow",
    "Store",
    "TurnUsage",
    "row_to_message",
]
