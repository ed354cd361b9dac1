"""SQLModel tables. Messages are append-only: a compaction adds a row to `compactions` and
never deletes one."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, Index, Text, UniqueConstraint
from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    return datetime.now(UTC)


class SessionRow(SQLModel, table=True):
    __tablename__ = "sessions"

    id: int | None = Field(default=None, primary_key=True)
    key: str = Field(sa_column=Column(Text, unique=True, nullable=False))
    agent: str = "main"
    platform: str = ""
    chat_type: str = ""
    chat_id: str = ""
    thread_id: str | None = None
    account: str = "default"
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    next_seq: int = Field(default=1, sa_column=Column(BigInteger, nullable=False, default=1))
    # Token counters from the provider's reported usage.
    last_prompt_tokens: int | None = None
    # Provider-reported / locally counted prompt tokens (the usage calibration), per session.
    token_ratio: float | None = None
    # How many provider reports the ratio is made of (so every process describes it alike).
    token_ratio_samples: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    tokens_in: int = 0
    tokens_out: int = 0
    # Of `tokens_in`, what the provider read from its prompt cache (None: it never said).
    tokens_cached: int | None = None
    turns: int = 0
    # Compaction / memory-flush cycles: flushed_cycle None means "never flushed", never 0 == 0.
    compaction_cycle: int = 0
    flushed_cycle: int | None = None
    # Anti-thrash: consecutive automatic compactions that did not get under the threshold, and a
    # cool-down after a failed summary.
    ineffective_compactions: int = 0
    compaction_cooldown_until: datetime | None = None
    last_error: str | None = Field(default=None, sa_column=Column(Text))

    def flush_due(self) -> bool:
        """The memory flush has not run in this compaction cycle (it runs once a cycle;
        `flushed_cycle` None, never flushed, is not flushed)."""
        return self.flushed_cycle is None or self.flushed_cycle < self.compaction_cycle


class MessageRow(SQLModel, table=True):
    __tablename__ = "messages"
    __table_args__ = (
        UniqueConstraint("session_id", "seq", name="uq_messages_session_seq"),
        UniqueConstraint(
            "platform", "chat_id", "platform_message_id", name="uq_messages_platform_msg"
        ),
        Index("ix_messages_pending", "session_id", "handled"),
    )

    id: int | None = Field(default=None, primary_key=True)
    # No index of its own: uq_messages_session_seq and ix_messages_pending both lead with it,
    # and every message row is written three times (stored, placed, answered).
    session_id: int = Field(foreign_key="sessions.id")
    # Position in the conversation. Inbound messages get theirs when a turn claims them, so the
    # conversation order is the prompt order even when messages arrive mid-turn.
    seq: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True))
    role: str
    content: Any = Field(default=None, sa_column=Column(JSON))
    tool_calls: Any = Field(default=None, sa_column=Column(JSON))
    tool_call_id: str | None = None
    name: str | None = None
    sender_id: str | None = None
    sender_name: str | None = None
    platform: str | None = None
    chat_id: str | None = None
    platform_message_id: str | None = None
    created_at: datetime = Field(default_factory=utcnow)
    tokens: int | None = None
    # Inbound user messages start unhandled; the turn that answers them marks them handled.
    handled: bool = True
    # "interrupted" when a shutdown stopped the turn; "error" for a failed turn's notice.
    status: str | None = None
    # A tool result's own error flag (the registry's `ToolResult.is_error`); None for other
    # roles and for results stored before the flag was (see `context.failures`).
    tool_error: bool | None = None


class CompactionRow(SQLModel, table=True):
    __tablename__ = "compactions"

    id: int | None = Field(default=None, primary_key=True)
    session_id: int = Field(foreign_key="sessions.id", index=True)
    first_seq: int
    last_seq: int
    summary: str = Field(sa_column=Column(Text, nullable=False))
    tokens_before: int
    tokens_after: int
    quality: Any = Field(default=None, sa_column=Column(JSON))
    model: str | None = None
    created_at: datetime = Field(default_factory=utcnow)
    undone: bool = False
    # Set once the post-compaction refresh block has gone out with a model call.
    refreshed: bool = False


class PairingRow(SQLModel, table=True):
    """A DM pairing request: an unknown sender gets a code; an operator approves it."""

    __tablename__ = "pairings"
    __table_args__ = (UniqueConstraint("code", name="uq_pairings_code"),)

    id: int | None = Field(default=None, primary_key=True)
    platform: str = Field(index=True)
    sender_id: str
    sender_name: str | None = None
    code: str
    status: str = "pending"  # pending | approved | denied | expired
    created_at: datetime = Field(default_factory=utcnow)
    expires_at: datetime
    decided_at: datetime | None = None


class TurnRecordRow(SQLModel, table=True):
    """What one turn cost: the token pressure the admin UI charts and the metrics count.

    Written in the same transaction as the turn's reply. `prompt_tokens` is what the provider
    reported; `local_prompt_tokens` the gateway's own count of what it sent.
    """

    __tablename__ = "turn_records"

    id: int | None = Field(default=None, primary_key=True)
    session_id: int = Field(foreign_key="sessions.id", index=True)
    reply_seq: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True))
    created_at: datetime = Field(default_factory=utcnow)
    prompt_tokens: int | None = None
    local_prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    """Of `prompt_tokens`, what the provider read from its prompt cache (None: not reported)."""
    window: int | None = None
    compact_at: int | None = None
    flush_at: int | None = None
    seconds: float = 0.0
    tool_rounds: int = 0
    compactions: int = 0
    error: str | None = Field(default=None, sa_column=Column(Text))


class MemoryFlushRow(SQLModel, table=True):
    """One silent memory-flush turn (successful or not), for the session page's markers."""

    __tablename__ = "memory_flushes"

    id: int | None = Field(default=None, primary_key=True)
    session_id: int = Field(foreign_key="sessions.id", index=True)
    cycle: int
    ok: bool
    notes_written: int = 0
    created_at: datetime = Field(default_factory=utcnow)


class OutboxRow(SQLModel, table=True):
    """A stored reply not yet confirmed as delivered to its platform.

    Written in the transaction that finishes the turn and deleted once the channel sent it, so
    a crash between the two never loses the answer: it is sent on the next start.
    """

    __tablename__ = "outbox"

    id: int | None = Field(default=None, primary_key=True)
    session_id: int = Field(foreign_key="sessions.id", index=True)
    session_key: str = Field(sa_column=Column(Text, nullable=False))
    platform: str
    chat_id: str
    thread_id: str | None = None
    account: str = "default"
    reply_to: str | None = None
    answers: Any = Field(default=None, sa_column=Column(JSON))
    text: str = Field(sa_column=Column(Text, nullable=False))
    created_at: datetime = Field(default_factory=utcnow)
    attempts: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    """Tries that failed so far; at `[gateway] delivery_attempts` the reply is given up."""
    sent_parts: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    """Chunks the platform already has (a reply that failed halfway resumes after them)."""
    preview_id: str | None = None
    """The streamed preview the reply replaces (edited into its first chunk), if any."""
    last_error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    given_up_at: datetime | None = None
    """Set when the reply ran out of tries: no longer sent by itself (`gatehouse outbox retry`)."""
