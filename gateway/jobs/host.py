"""What scheduled jobs need from the process that runs them, as small Protocols.

jobs/ sits below turn/ and app: a fired reminder or a maintenance sweep must not reach into the
runner or the Gateway's wiring. The few operations they need are named here for what they do;
the Gateway (app.py) satisfies both Protocols structurally, delegating to its runner, lanes
and delivery log. Tests can run a job against a small fake host.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # a protocol: its types only (`jobs list` loads the scheduler, not these)
    from channels.base import OutboundMessage
    from context.compaction import CompactionResult
    from context.types import Message
    from gateway.config import Config
    from gateway.store import CompactionRow, SessionRow, Store
    from memory.index import RefreshStats


@dataclass(frozen=True, slots=True)
class PromptSize:
    """A session's prompt as a turn would count it, and the size that triggers compaction."""

    tokens: int
    compaction_threshold: int


class SessionHost(Protocol):
    """What every job needs: the config, the store, and a session's lane."""

    @property
    def config(self) -> Config: ...

    @property
    def store(self) -> Store: ...

    def hold_lane(self, session_key: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Own the session's lane without a turn, so a job's writes never race one."""
        ...

    async def reset_session(
        self, session_key: str, why: str, *, flush: bool = True
    ) -> CompactionRow | None:
        """Start a fresh context (nothing deleted); None if there was nothing to reset.
        The caller holds the session's lane."""
        ...


class JobHost(SessionHost, Protocol):
    """What a fired reminder or cron job needs."""

    async def run_turn_now(self, session_key: str) -> None:
        """Run one turn for the session and wait for it; raises `LanesClosedError` when the
        process is shutting down (the stored message is answered at the next start)."""
        ...

    def count_tokens(self, message: Message) -> int:
        """The message's size by the same count a turn uses, so stored history stays exact."""
        ...

    async def deliver_stored(self, outbox_id: int, message: OutboundMessage) -> None:
        """Send a message already in the outbox (a failed send is tried again)."""
        ...


class MaintenanceHost(SessionHost, Protocol):
    """What the maintenance sweeps need."""

    def compaction_blocked(self, session: SessionRow) -> str | None:
        """Why automatic compaction may not run for the session now (anti-thrash), or None."""
        ...

    async def prompt_size(self, session: SessionRow) -> PromptSize | None:
        """The session's prompt, counted as a turn would count it, against its compaction
        threshold; None when there is no history or no threshold."""
        ...

    async def compact_idle(self, session_key: str) -> CompactionResult | None:
        """Compact a quiet session (the memory flush runs first). The caller holds the lane."""
        ...

    async def refresh_memory_index(self) -> RefreshStats:
        """Re-read the memory notes, so hand edits are searchable."""
        ...
