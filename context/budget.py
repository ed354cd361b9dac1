"""Token budget: one effective reserve for every trigger, budget shares, and overflow tiers.

Every trigger (memory flush, compaction, overflow handling) compares the same token total from
the one token authority against thresholds derived here, so two counters can never disagree
about whether a session is full.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class BudgetSettings:
    """Knobs from `[context]` (and `[memory] flush_soft_tokens`)."""

    reserve_tokens: int = 20_000
    """Floor of the reserve kept free for the reply and the next messages (20k by default)."""
    max_output_tokens: int = 4_096
    flush_soft_tokens: int = 4_000
    # The design seed's shares of the usable budget.
    system_share: float = 0.05
    history_share: float = 0.60
    tool_results_share: float = 0.25
    summary_share: float = 0.10


@dataclass(frozen=True, slots=True)
class Reserve:
    tokens: int
    reason: str


def effective_reserve(window: int, settings: BudgetSettings) -> Reserve:
    """The one reserve: max(reserve floor, max output), at most a quarter of the window.

    The cap keeps small windows usable: a 20k floor would leave nothing of a 16k window.
    """
    wanted = max(settings.reserve_tokens, settings.max_output_tokens)
    cap = window // 4
    if wanted > cap:
        return Reserve(cap, f"a quarter of the {window:,}-token window (floor {wanted:,} is larger)")
    if settings.reserve_tokens >= settings.max_output_tokens:
        return Reserve(wanted, f"[context] reserve_tokens = {settings.reserve_tokens:,}")
    return Reserve(wanted, f"[context] max_output_tokens = {settings.max_output_tokens:,}")


class Tier(StrEnum):
    """What to do when the prompt is over budget (by how far over the usable tokens it is)."""

    FITS = "fits"
    DROP_OLDEST = "drop-oldest"  # <= 5 % over: drop the oldest whole turns
    COMPACT = "compact"  # 5-20 % over: compaction
    COMPACT_THEN_DROP = "compact-then-drop"  # > 20 % over: compaction, then drop what remains


@dataclass(frozen=True, slots=True)
class Budget:
    window: int
    reserve: Reserve
    settings: BudgetSettings

    @property
    def usable(self) -> int:
        """Tokens a prompt may use: window - reserve. The compaction threshold."""
        return self.window - self.reserve.tokens

    @property
    def compact_at(self) -> int:
        return self.usable

    @property
    def flush_at(self) -> int:
        """The memory-flush threshold: compaction threshold - `flush_soft_tokens`."""
        return max(0, self.usable - self.settings.flush_soft_tokens)

    @property
    def system_cap(self) -> int:
        return int(self.usable * self.settings.system_share)

    @property
    def tool_results_cap(self) -> int:
        return int(self.usable * self.settings.tool_results_share)

    @property
    def summary_cap(self) -> int:
        return int(self.usable * self.settings.summary_share)

    @property
    def history_cap(self) -> int:
        """What the turns kept verbatim may use: compaction keeps fewer recent turns, and the
        importance score picks what to drop, to hold them to it."""
        return int(self.usable * self.settings.history_share)

    def tier(self, tokens: int) -> Tier:
        if tokens <= self.usable:
            return Tier.FITS
        over = (tokens - self.usable) / self.usable
        if over <= 0.05:
            return Tier.DROP_OLDEST
        if over <= 0.20:
            return Tier.COMPACT
        return Tier.COMPACT_THEN_DROP

    def table(self) -> list[tuple[str, int, str]]:
        """Rows (name, tokens, meaning) for `gatehouse context explain`."""
        return [
            ("window", self.window, "effective context window"),
            ("reserve", self.reserve.tokens, self.reserve.reason),
            ("usable (compaction threshold)", self.usable, "window - reserve"),
            ("memory flush threshold", self.flush_at, "usable - flush_soft_tokens"),
            ("system prompt share", self.system_cap, f"{self.settings.system_share:.0%} of usable"),
            (
                "summary share",
                self.summary_cap,
                f"{self.settings.summary_share:.0%} of usable; the most a summary may take",
            ),
            (
                "tool results share",
                self.tool_results_cap,
                f"{self.settings.tool_results_share:.0%} of usable; older results trimmed above",
            ),
            (
                "history share",
                self.history_cap,
                f"{self.settings.history_share:.0%} of usable; verbatim turns kept by compaction",
            ),
            ("output", self.settings.max_output_tokens, "max_output_tokens (inside the reserve)"),
        ]


def make_budget(window: int, settings: BudgetSettings) -> Budget:
    return Budget(window=window, reserve=effective_reserve(window, settings), settings=settings)
