"""What the context engine is given and what it returns (pure): the settings and turn
context the runner resolves, and the typed plan — the prompt, its tier, and the facts that
explain it — so `explain`, turn records and maintenance read fields, not a dict by key."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from context.budget import BudgetSettings, Tier
from context.compaction import CompactionSettings
from context.history import SYSTEM_SOURCE, LimitResolution
from context.tokens import TokenCounter, estimate_counter
from context.types import Message
from context.window import WindowResolution

SmallOverflow = Literal["compact", "drop-blocks", "drop-turns"]
"""What a prompt at most 5 % over the usable tokens leads to. Providers cache a prompt's
unchanged prefix, and dropping a turn shifts everything after it, so: "compact" (the default)
compacts at once — the break compaction would cause a few turns later anyway, and the only one
of the cycle; "drop-blocks" drops the oldest turns in blocks of a tenth of the usable tokens,
the same turns every turn until the overflow outgrows the block; "drop-turns" drops the least
important turns, as few as fit, anew each turn (every turn a new prefix). Whatever the
setting, while compaction cannot run (cool-down) the least important turns are dropped."""


@dataclass(frozen=True, slots=True)
class ContextSettings:
    """What the runner resolved for this session (each with its source)."""

    window: WindowResolution
    counter: TokenCounter
    history_limit: LimitResolution = field(
        default_factory=lambda: LimitResolution(0, SYSTEM_SOURCE)
    )
    budget: BudgetSettings = field(default_factory=BudgetSettings)
    calibration_ratio: float = 1.0
    """Provider-reported prompt tokens / locally counted tokens, from the last turns."""
    tools_tokens: int = 0
    """Tokens of the tool schemas sent with every call."""
    keep_recent_tool_results: int = 3
    tool_result_share: float = 0.3
    """The share of the window one tool result may use (`[context] tool_result_share`)."""
    compaction: CompactionSettings | None = None
    """Compaction knobs; its `window` is replaced by the resolved window."""
    small_overflow: SmallOverflow = "compact"
    """What the <= 5 % tier does (`[context] small_overflow`): see `SmallOverflow`."""


def default_settings(window_tokens: int = 200_000) -> ContextSettings:
    return ContextSettings(
        window=WindowResolution(tokens=window_tokens, source="default"),
        counter=estimate_counter(),
    )


@dataclass(frozen=True, slots=True)
class TurnContext:
    """Everything an engine may look at for one turn."""

    session_key: str
    system_prompt: str
    history: Sequence[Message]
    """The conversation before this turn, in order (after the latest summary's range)."""
    incoming: Sequence[Message]
    """This turn's new user messages (and the turn's tool rounds so far); always sent."""
    model: str = ""
    settings: ContextSettings | None = None
    summary: str | None = None
    """The latest compaction summary, when one covers the start of the history."""
    summary_first_seq: int | None = None
    refresh: str | None = None
    """The post-compaction refresh block (AGENTS.md sections), sent right after the summary."""
    compaction_refresh: str | None = None
    """The refresh block the calls after a new compaction will carry: `compact` sizes the
    summary so that the prompt with it fits, and returns that prompt."""


@dataclass(frozen=True, slots=True)
class PlanTokens:
    """What a plan's prompt costs, in tokens of the session's counter.

    The totals cover everything the history limit lets through, before any overflow tier; the
    parts (None when no prompt could be built) are what is actually sent.
    """

    local_total: int
    calibrated_total: int
    """`local_total` times the calibration ratio: what the thresholds are compared against."""
    system: int | None = None
    tools: int | None = None
    summary: int | None = None
    """The summary and the refresh block."""
    history: int | None = None
    incoming: int | None = None
    sent_local: int | None = None
    """The prompt sent, as counted locally (the provider's report calibrates against it)."""
    prompt: int | None = None
    """`sent_local` calibrated: the prompt's expected size at the provider."""
    tool_results: int | None = None
    """The tool results among `history` (they count in it too), against their own share."""

    def to_dict(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True, slots=True)
class BudgetLine:
    """One row of the budget table `gatehouse context explain` prints."""

    name: str
    tokens: int
    why: str


@dataclass(frozen=True, slots=True)
class PlanFacts:
    """Why a plan looks the way it does: the resolved settings, the budget and the counts."""

    engine: str
    model: str
    window: int
    window_source: str
    window_warning: str | None
    counter: str
    counter_exact: bool
    calibration_ratio: float
    history_limit: int
    history_limit_source: str
    messages_before_limit: int
    """Stored messages older than the history limit, not sent."""
    budget: tuple[BudgetLine, ...]
    tokens: PlanTokens
    flush_threshold: int
    compaction_threshold: int
    to_flush: int
    """Tokens until the memory flush is due (<= 0: due)."""
    to_compaction: int
    tier: Tier
    pruned_tool_results: int = 0
    dropped_turns: tuple[str, ...] | None = None
    """What the overflow tier left out; None when no prompt could be built."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (`gatehouse context explain`, the admin page): keys in this order."""
        out: dict[str, Any] = {
            "engine": self.engine,
            "model": self.model,
            "window": self.window,
            "window_source": self.window_source,
            "window_warning": self.window_warning,
            "counter": self.counter,
            "counter_exact": self.counter_exact,
            "calibration_ratio": self.calibration_ratio,
            "history_limit": self.history_limit,
            "history_limit_source": self.history_limit_source,
            "messages_before_limit": self.messages_before_limit,
            "budget": [asdict(line) for line in self.budget],
            "tokens": self.tokens.to_dict(),
            "flush_threshold": self.flush_threshold,
            "compaction_threshold": self.compaction_threshold,
            "to_flush": self.to_flush,
            "to_compaction": self.to_compaction,
            "tier": self.tier.value,
            "pruned_tool_results": self.pruned_tool_results,
        }
        if self.dropped_turns is not None:
            out["dropped_turns"] = list(self.dropped_turns)
        return out


@dataclass(frozen=True, slots=True)
class ContextPlan:
    """The prompt to send, and why it looks the way it does."""

    messages: list[Message]
    notes: tuple[str, ...] = ()
    facts: PlanFacts | None = None
    """None when the engine keeps no budget (full history)."""
    tier: Tier = Tier.FITS
    error: str | None = None
    """Set when no prompt can be built (e.g. the new message alone exceeds the window)."""
    counted: tuple[Message, ...] = ()
    """Stored messages whose token counts were computed this turn (for the runner to cache)."""
    compact_early: bool = False
    """The small overflow (`Tier.DROP_OLDEST`) compacts too (`small_overflow = "compact"`):
    `messages` is then what is sent only if compaction cannot run."""
    left_out: tuple[int, ...] = ()
    """Seqs of stored messages the budget kept out of `messages` or sent pruned (dropped
    rounds and turns, trimmed or cleared tool results): the runner archives them, so each is
    one `history_search` away although no summary covers it."""
    left_out_through: int | None = None
    """Every stored message from the history limit's start through this seq is left out too
    (the part of a long history the engine did not walk)."""

    @property
    def wants_compaction(self) -> bool:
        return self.tier in (Tier.COMPACT, Tier.COMPACT_THEN_DROP) or (
            self.compact_early and self.tier is Tier.DROP_OLDEST
        )

    @property
    def wants_flush(self) -> bool:
        """The memory flush is due before this prompt is sent: at its threshold, or when
        compaction is about to run."""
        return (self.facts is not None and self.facts.to_flush <= 0) or self.wants_compaction

    @property
    def tokens(self) -> PlanTokens | None:
        return self.facts.tokens if self.facts is not None else None

    def facts_dict(self) -> dict[str, Any]:
        """The facts as JSON-ready data ({} when the engine keeps none)."""
        return self.facts.to_dict() if self.facts is not None else {}
