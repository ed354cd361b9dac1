"""The history a prompt is built from, cached per session so a turn loads only new rows.

A session's prompt is "latest summary + the stored messages after its range"; a reset boundary
is a compaction row whose range leaves nothing to summarize. The cache belongs to the turn in
progress (one lane per session), so readers outside the lane bypass it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from context.types import Message
from gateway.store import CompactionRow, HistoryRead, MessageRow, Store, row_to_message

ERROR_STATUS = "error"
COMMAND_STATUS = "command"
INTERRUPTED_STATUS = "interrupted"
HIDDEN_STATUSES = (ERROR_STATUS, COMMAND_STATUS)
"""Stored but never sent to the model: error notices and `/compact` commands."""
RESET_REASON = "reset"


def is_reset(row: CompactionRow | None) -> bool:
    """A reset boundary (see `Runner.reset_session`), not a summary."""
    return row is not None and isinstance(row.quality, dict) and (
        row.quality.get("reason") == RESET_REASON
    )


PINNED_KEY = "pinned_seqs"
"""Where a compaction row keeps the seqs of the messages sent after its summary although its
range covers them: the ask of the turn it cut into (`CompactionResult.pinned_seqs`)."""


def pinned_seqs(row: CompactionRow | None) -> list[int]:
    """The pinned seqs of a summary row (none for a reset or an older row)."""
    if row is None or is_reset(row) or not isinstance(row.quality, dict):
        return []
    found = row.quality.get(PINNED_KEY) or []
    return [int(s) for s in found if isinstance(s, int) and 0 < s <= row.last_seq]


@dataclass
class SessionView:
    """What the prompt is built from: the latest summary and the messages after its range."""

    summary: CompactionRow | None
    history: list[Message]


@dataclass
class _Cached:
    after_seq: int
    messages: list[Message]


class HistoryCache:
    """The visible history of the most recently used sessions, kept between turns."""

    def __init__(self, store: Store, sessions: int = 256) -> None:
        self.store = store
        self.sessions = sessions
        """How many sessions' histories are kept (least recently used leave first)."""
        self._histories: dict[int, _Cached] = {}

    async def view(
        self, session_id: int, *, use_cache: bool = True, read: HistoryRead | None = None
    ) -> SessionView:
        """Latest summary + the stored messages after its range (only new rows are loaded).

        Readers outside the session's lane (the admin UI) pass `use_cache=False`: the cache
        belongs to the turn in progress. `read` is what the turn's claim already read (for
        `known` at that time); used when the cache has not changed since."""
        if not use_cache:
            summary, _after, rows = await self.store.summary_and_history(session_id)
            return SessionView(
                None if is_reset(summary) else summary,
                [*await self._pinned(session_id, summary),
                 *(m for m in rows if m.meta.get("status") not in HIDDEN_STATUSES)],
            )
        known = self.known(session_id)
        cached = self._histories.pop(session_id, None)
        if read is not None and read.known == known:
            summary, after, fresh = read.summary, read.after, read.messages
        else:
            summary, after, fresh = await self.store.summary_and_history(session_id, known)
        if cached is None or cached.after_seq != after:
            cached = _Cached(after, await self._pinned(session_id, summary))
        cached.messages.extend(m for m in fresh if m.meta.get("status") not in HIDDEN_STATUSES)
        self._histories[session_id] = cached  # re-inserted last: most recently used
        while len(self._histories) > self.sessions:
            self._histories.pop(next(iter(self._histories)))
        return SessionView(None if is_reset(summary) else summary, cached.messages)

    async def _pinned(self, session_id: int, summary: CompactionRow | None) -> list[Message]:
        """The messages a summary pins (sent right after it: the ask of the turn it cut
        into), read once per summary."""
        seqs = pinned_seqs(summary)
        return await self.store.messages_at(session_id, seqs) if seqs else []

    def known(self, session_id: int) -> tuple[int, int] | None:
        """What the cached history holds: (the seq it starts after, its last seq)."""
        cached = self._histories.get(session_id)
        if cached is None:
            return None
        last = cached.messages[-1].seq if cached.messages else None
        # A pinned message alone (its seq inside the covered range) is not what was read last.
        return (cached.after_seq, max(last or 0, cached.after_seq))

    def append(self, session_id: int, rows: Iterable[MessageRow]) -> None:
        """Add a turn's freshly stored rows (a tool round) to the cached history."""
        cached = self._histories.get(session_id)
        if cached is not None:
            cached.messages.extend(row_to_message(r) for r in rows)

    def forget(self, session_id: int) -> None:
        """Drop a session's cached history: its summary or range moved."""
        self._histories.pop(session_id, None)

    def remember_counts(self, session_id: int, counted: Sequence[Message]) -> dict[int, int]:
        """Update the cached history with fresh counts; return {message id: tokens} to store."""
        cached = self._histories.get(session_id)
        if cached is not None:
            history = cached.messages
            for m in counted:
                if m.seq is None or m.tokens is None:
                    continue
                i = bisect.bisect_left(history, m.seq, key=lambda h: h.seq or 0)
                if i < len(history) and history[i].seq == m.seq and history[i].tokens is None:
                    history[i] = history[i].with_tokens(m.tokens)
        return {
            int(m.meta["id"]): m.tokens
            for m in counted
            if m.meta.get("id") is not None and m.tokens is not None
        }
