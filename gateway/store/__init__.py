"""Persistence: SQLModel tables and the async Store."""

from gateway.store.db import SessionInfo, Store, row_to_message
from gateway.store.models import CompactionRow, MessageRow, SessionRow

__all__ = ["CompactionRow", "MessageRow", "SessionInfo", "SessionRow", "Store", "row_to_message"]
