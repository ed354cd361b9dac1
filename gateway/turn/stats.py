"""What one turn did, for its stored record (the admin UI's token-pressure chart) and metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from context.compaction import CompactionResult
from context.engine import ContextPlan
from gateway.store import TurnRecordRow
from gateway.store.hot import build


@dataclass
class TurnStats:
    session_key: str
    messages_in: int
    tool_rounds: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    """Of `prompt_tokens` (the last call's), what the provider read from its prompt cache."""
    seconds: float = 0.0
    error: str | None = None
    compactions: list[CompactionResult] = field(default_factory=list)
    # {message id: tokens} counted this turn, stored with the turn's result (no extra write).
    token_counts: dict[int, int] = field(default_factory=dict)
    platform: str = ""
    local_prompt_tokens: int | None = None
    """The gateway's own count of the last prompt sent (the provider's is `prompt_tokens`)."""
    window: int | None = None
    compact_at: int | None = None
    flush_at: int | None = None

    def note_pressure(self, plan: ContextPlan) -> None:
        """Keep the token pressure of the prompt about to be sent, for the turn's record."""
        facts = plan.facts
        if facts is None:
            self.local_prompt_tokens = self.window = self.compact_at = self.flush_at = None
            return
        self.local_prompt_tokens = facts.tokens.prompt
        self.window = facts.window
        self.compact_at = facts.compaction_threshold
        self.flush_at = facts.flush_threshold

    def record(self) -> TurnRecordRow:
        """The stored form of these stats.

        Built without validation: the values are our own, already typed."""
        values = {name: getattr(self, name) for name in _KEPT_AS_IS}
        values.update(
            session_id=0,  # set by the store
            seconds=round(self.seconds, 3),
            compactions=len([c for c in self.compactions if c.committed]),
        )
        return build(TurnRecordRow, values)


_KEPT_AS_IS = (
    "prompt_tokens", "local_prompt_tokens", "completion_tokens", "cached_tokens", "window",
    "compact_at", "flush_at", "tool_rounds", "error",
)
"""The stats a turn record stores under the same name, unchanged."""
