"""The limits of one turn's tool loop, and what the runner archived outside compactions.

Real agent work is one ask followed by hundreds of tool rounds, so a turn may run long: it is
bounded by `[llm] max_tool_rounds` (model calls with tool calls), `max_tool_calls_per_round`
(calls run from one reply; the rest get a "not run" result, so every call keeps its result)
and `max_turn_seconds` (wall clock, checked after each round). Each limit that stops or trims
the work says so in the reply. Compaction inside the loop is anti-thrashed: one that freed
nothing is not tried again until the prompt has grown by a tenth of the usable budget.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from context.budget import make_budget
from context.compaction import CompactionResult
from context.engine import ContextPlan, ContextSettings

TOO_MANY_CALLS = (
    "Not run: too many calls in one reply (at most {cap} are run: [llm] "
    "max_tool_calls_per_round). Ask again for what is still needed."
)
RETRY_GROWTH = 0.10
"""After a compaction that freed nothing, the share of the usable budget the prompt must grow
by before the loop compacts again."""


class ToolLoop:
    """One turn's progress against its limits."""

    def __init__(self, max_seconds: float, settings: ContextSettings) -> None:
        self.max_seconds = max_seconds
        self.started = time.monotonic()
        self.usable = make_budget(settings.window.tokens, settings.budget).usable
        self.not_run = 0
        """Tool calls answered "not run" for being over the per-reply cap."""
        self.cap = 0
        self._stalled_at: int | None = None

    def may_compact(self, plan: ContextPlan) -> bool:
        """Whether to compact for `plan` (not when the last try freed nothing and the prompt
        has barely grown since)."""
        if self._stalled_at is None:
            return True
        return _total(plan) >= self._stalled_at + int(self.usable * RETRY_GROWTH)

    def compacted(self, plan: ContextPlan, result: CompactionResult | None) -> None:
        freed = (
            result is not None and result.committed and result.tokens_after < result.tokens_before
        )
        self._stalled_at = None if freed else _total(plan)

    def too_many(self, index: int, cap: int) -> str | None:
        """The result of call `index` of a reply when it is over `cap`, else None (run it)."""
        if index < cap:
            return None
        self.not_run += 1
        self.cap = cap
        return TOO_MANY_CALLS.format(cap=cap)

    def out_of_time(self) -> bool:
        return time.monotonic() - self.started >= self.max_seconds

    def time_limit_reply(self, rounds: int) -> str:
        minutes = (time.monotonic() - self.started) / 60
        return (
            f"I stopped after {rounds:,} rounds of tool calls and {minutes:.0f} min without "
            f"finishing (the turn's time limit, [llm] max_turn_seconds = "
            f"{self.max_seconds:,.0f}). Ask me to continue, or raise it."
        )

    def with_notes(self, reply: str) -> str:
        """`reply`, saying which limit trimmed the work."""
        if not self.not_run:
            return reply
        return (
            f"{reply}\n\n({self.not_run:,} tool call{'s' if self.not_run != 1 else ''} not "
            f"run: more than {self.cap:,} in one reply, [llm] max_tool_calls_per_round.)"
        )


def _total(plan: ContextPlan) -> int:
    return plan.tokens.calibrated_total if plan.tokens is not None else 0


class ArchivedSeqs:
    """The seqs of each session this process archived outside compactions, for the most
    recently used sessions (archiving is idempotent: after a restart they are archived once
    more)."""

    def __init__(self, sessions: int = 256) -> None:
        self.sessions = sessions
        self._seqs: OrderedDict[str, set[int]] = OrderedDict()

    def seqs(self, session_key: str) -> set[int]:
        found = self._seqs.pop(session_key, None)
        if found is None:
            found = set()
        self._seqs[session_key] = found
        while len(self._seqs) > self.sessions:
            self._seqs.popitem(last=False)
        return found

    def holds(self, session_key: str) -> bool:
        """Whether anything of the session is archived (its lookup tool is then offered)."""
        return bool(self._seqs.get(session_key))
