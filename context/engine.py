"""The ContextEngine protocol, the default engine, and the full-history engine.

The runner owns all I/O: it loads the session, resolves the window, the counter and the history
limit, and hands the engine messages and settings; the engine returns a plan (the prompt, and
the facts that explain it). Every context policy the runner applies — when to flush and compact,
how large a tool result may be, which identifiers an archived message is found by — is asked of
the engine, so an engine can change it. Engines are chosen by name through the
`gatehouse.context_engines` entry points (`[context] engine = "default"`).

The default engine's work per turn is proportional to what the prompt can hold, not to the
session's length: it walks the history backwards from the newest message and stops once the
history limit or the budget is reached, using token counts cached on each message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol, runtime_checkable

from context.budget import Budget, Tier, make_budget
from context.compaction import (
    CompactionResult,
    CompactionSettings,
    Span,
    SummaryCall,
    split_recent,
)
from context.compaction import compact as run_compaction
from context.history import choose_turns_to_drop, split_turns
from context.identifiers import extract_identifiers
from context.plan import BudgetLine as BudgetLine
from context.plan import ContextPlan as ContextPlan
from context.plan import ContextSettings as ContextSettings
from context.plan import PlanFacts as PlanFacts
from context.plan import PlanTokens as PlanTokens
from context.plan import TurnContext as TurnContext
from context.plan import default_settings as default_settings
from context.pruning import (
    cap_tool_output,
    clear_old_results,
    soft_trim_old_results,
    tool_result_cap_chars,
)
from context.quality import IDEAL_COMPRESSION
from context.rounds import ask_of, split_units
from context.tokens import TokenCounter
from context.types import Identifier, Message


@runtime_checkable
class ContextEngine(Protocol):
    """Plans each prompt and compacts a session; the runner does the I/O around it."""

    name: str

    def assemble(self, turn: TurnContext) -> ContextPlan: ...

    async def compact(
        self, turn: TurnContext, summarize: SummaryCall, instructions: str = ""
    ) -> CompactionResult | None: ...

    def compaction_threshold(self, settings: ContextSettings) -> int | None:
        """The calibrated prompt size compaction aims to stay under (None: never compacts);
        an automatic compaction that ends above it counts as ineffective."""
        ...

    def tool_result_limit(self, settings: ContextSettings) -> int:
        """The most characters one tool result keeps when it is stored and sent."""
        ...

    def cap_tool_result(self, text: str, limit: int, artifact: str | None) -> str:
        """`text` cut to `limit` characters; `artifact` is where the runner saved it whole
        (None: it could not)."""
        ...

    def identifiers(self, text: str, custom_patterns: Sequence[str] = ()) -> list[Identifier]:
        """The identifiers an archived message is found again by (secrets as their markers)."""
        ...


def capped_tool_result(text: str, limit: int, artifact: str | None) -> str:
    """The live tool-result cap both built-in engines apply (`context.pruning`)."""
    return cap_tool_output(text, limit, artifact=artifact).text


def tool_result_chars(settings: ContextSettings) -> int:
    """`tool_result_share` of the window, in characters: the built-in engines' per-result cap."""
    return tool_result_cap_chars(settings.window.tokens, share=settings.tool_result_share)


def archive_identifiers(text: str, custom_patterns: Sequence[str] = ()) -> list[Identifier]:
    """Every identifier in `text` under the strict policy plus the custom patterns."""
    return extract_identifiers([text], custom_patterns=custom_patterns)


def drop_orphaned_tool_messages(messages: Sequence[Message]) -> list[Message]:
    """Keep tool calls and their results together: providers reject either one alone.

    An assistant message whose tool calls lack results (a turn cut short) keeps its text but
    loses the calls; a tool result whose call is not in the prompt is left out.
    """
    answered: set[str] = {m.tool_call_id for m in messages if m.role == "tool" and m.tool_call_id}
    offered: set[str] = set()
    out: list[Message] = []
    for m in messages:
        if m.role == "assistant" and m.tool_calls:
            if all(tc.id in answered for tc in m.tool_calls):
                offered.update(tc.id for tc in m.tool_calls)
                out.append(m)
            elif m.text:
                out.append(replace(m, tool_calls=(), tokens=None))
        elif m.role == "tool":
            if m.tool_call_id in offered:
                out.append(m)
        else:
            out.append(m)
    return out


def _pin_asks(span: Span, asks: set[int]) -> Span:
    """`span` with the messages in `asks` (ids: this turn's user messages) kept, never
    compacted: whatever `recent_turns` says, the ask a turn answers stays in its prompt."""
    pinned = [m for m in span.compacted if id(m) in asks]
    if not pinned:
        return span
    return Span([m for m in span.compacted if id(m) not in asks], [*pinned, *span.kept])


def summary_message(summary: str) -> Message:
    return Message(role="system", content=summary)


class BuiltinEngine:
    """What both built-in engines do alike: the tool-result cap and the archive's identifiers."""

    def tool_result_limit(self, settings: ContextSettings) -> int:
        return tool_result_chars(settings)

    def cap_tool_result(self, text: str, limit: int, artifact: str | None) -> str:
        return capped_tool_result(text, limit, artifact)

    def identifiers(self, text: str, custom_patterns: Sequence[str] = ()) -> list[Identifier]:
        return archive_identifiers(text, custom_patterns)


class FullHistoryEngine(BuiltinEngine):
    """Sends the system prompt, the whole history and the new messages. No limits, no compaction."""

    name = "full-history"

    def assemble(self, turn: TurnContext) -> ContextPlan:
        system = Message(role="system", content=turn.system_prompt)
        head = [summary_message(turn.summary)] if turn.summary else []
        if turn.refresh:
            head.append(Message(role="system", content=turn.refresh))
        body = drop_orphaned_tool_messages([*head, *turn.history, *turn.incoming])
        return ContextPlan(messages=[system, *body], notes=("full history",))

    async def compact(
        self, turn: TurnContext, summarize: SummaryCall, instructions: str = ""
    ) -> CompactionResult | None:
        return None

    def compaction_threshold(self, settings: ContextSettings) -> int | None:
        return None


MIN_SUMMARY_TOKENS = 400
"""A summary smaller than this (or the summary share, if smaller) is not worth a compaction."""
SUMMARY_MARGIN = 16
"""Tokens kept free beside the summary: its message framing, rounding of the calibration."""
PRUNE_CACHE_SIZE = 4_096
SYSTEM_COUNTS_KEPT = 64
TRIMMED_RESULT_TOKENS = 1_000
"""About what a soft-trimmed result costs (1,500 + 1,500 chars): below this room, clear."""
DROP_BLOCK_SHARE = 0.10
"""`small_overflow = "drop-blocks"`: turns are dropped in blocks of this share of the usable
tokens, twice the 5 % the small-overflow tier spans, so one block lasts until compaction."""


def _history_start(history: Sequence[Message], limit: int) -> int:
    """Index of the first message of the last `limit` user turns (0 = unlimited): O(kept)."""
    if limit <= 0:
        return 0
    seen = 0
    for i in range(len(history) - 1, -1, -1):
        if history[i].role == "user":
            seen += 1
            if seen == limit:
                return i
    return 0


def _tokens(m: Message, counter: TokenCounter) -> int:
    return m.tokens if m.tokens is not None else counter.count_message(m)


class DefaultContextEngine(BuiltinEngine):
    """History limit -> tool-result pruning -> budget check -> overflow tier.

    When the plan's tier asks for compaction, the runner calls `compact` and assembles again;
    if compaction is not possible (cool-down, failure) the tier drops the oldest whole turns,
    and the plan says so.
    """

    name = "default"

    def __init__(self) -> None:
        self._prune_cache: dict[tuple[object, ...], Message] = {}
        # The system prompt is built anew each turn but rarely changes: {(counter, text): tokens}.
        self._system_counts: dict[tuple[str, bool, str], int] = {}

    def assemble(self, turn: TurnContext) -> ContextPlan:
        settings = turn.settings or default_settings()
        counter = settings.counter
        budget = make_budget(settings.window.tokens, settings.budget)
        ratio = settings.calibration_ratio
        notes: list[str] = []
        counted: list[Message] = []

        def count(m: Message) -> Message:
            if m.tokens is None:
                m = m.with_tokens(counter.count_message(m))
                if m.seq is not None:
                    counted.append(m)
            return m

        system = self._system_message(turn.system_prompt, counter)
        head = [count(summary_message(turn.summary))] if turn.summary else []
        if turn.refresh:
            head.append(count(Message(role="system", content=turn.refresh)))
        incoming = [count(m) for m in turn.incoming]
        fixed = system.tokens or 0
        fixed += sum(m.tokens or 0 for m in head) + settings.tools_tokens
        # This turn's ask (its user messages) is sent whatever the budget; its tool rounds are
        # budgeted like the history before them, newest first, and cut at round boundaries.
        ask_tokens = sum(m.tokens or 0 for m in incoming if m.role == "user")

        # 1. History limit, in user turns.
        history = turn.history
        n_hist = len(history)
        start = _history_start(history, settings.history_limit.limit)

        if start:
            notes.append(
                f"history limit: {settings.history_limit.describe()}; "
                f"{start} older messages not sent"
            )

        # 2. Walk back from the newest message (this turn's rounds, then the history) until
        #    well past what could ever fit. Old tool results of the history beyond the newest
        #    `keep_recent` are soft-trimmed, then cleared, once they together exceed their
        #    share; their pruned size is what counts. This turn's results are sent as stored
        #    (capped when they arrived), so the prompt keeps its prefix from round to round;
        #    when they outgrow the budget, the oldest rounds are cut (and compacted).
        ceiling = int(budget.usable * 1.21 / ratio) + 1  # just past the last tier boundary
        room = ceiling - fixed - ask_tokens
        fit_room = int(budget.usable / ratio) - fixed - ask_tokens
        keep_recent = settings.keep_recent_tool_results
        tool_cap = budget.tool_results_cap
        pos = n_hist + len(incoming)
        acc = tool_acc = tools_seen = 0
        trimmed_n = cleared_n = 0
        fit_count: int | None = None  # how many of the newest messages fit the budget
        fit_acc = 0
        walked: list[Message] = []  # newest first, as sent (pruned results pruned)
        pruned_at: list[int] = []  # indexes into `walked`
        # This turn's rounds come first among the walked: how many, their tokens, their places
        # in `incoming`; walked[i] for i >= turn_n is history[n_hist - 1 - (i - turn_n)].
        turn_n = turn_acc = 0
        turn_places: list[int] = []
        while pos > start and acc <= room:
            pos -= 1
            in_turn = pos >= n_hist
            if in_turn:
                m = incoming[pos - n_hist]
                if m.role == "user":
                    continue
            else:
                m = history[pos]
                if m.tokens is None:
                    m = count(m)
                if m.role == "tool":
                    tools_seen += 1
                    tokens_m = m.tokens or 0
                    # Past the newest `keep_recent`, over the share; or one result larger than
                    # the whole share (an imported session's 50 KB log), which no prompt can
                    # carry.
                    if tokens_m > tool_cap or (
                        tools_seen > keep_recent and tool_acc + tokens_m > tool_cap
                    ):
                        trimmed = m
                        if tool_acc + TRIMMED_RESULT_TOKENS <= tool_cap:
                            trimmed = self._pruned(m, "trim", counter)
                        if trimmed is not m and tool_acc + (trimmed.tokens or 0) <= tool_cap:
                            m = trimmed
                            trimmed_n += 1
                        else:
                            m = self._pruned(m, "clear", counter)
                            cleared_n += 1
                        pruned_at.append(len(walked))
                    tool_acc += m.tokens or 0
            tokens = m.tokens or 0
            if fit_count is None and acc + tokens > fit_room:
                fit_count, fit_acc = len(walked), acc
            acc += tokens
            walked.append(m)
            if in_turn:
                turn_n, turn_acc = turn_n + 1, acc
                turn_places.append(pos - n_hist)
        truncated_walk = pos > start
        pruned = trimmed_n + cleared_n
        if pruned:
            notes.append(
                f"old tool results over their {tool_cap:,}-token share: "
                f"{trimmed_n} trimmed, {cleared_n} cleared"
            )
        local_total = fixed + acc + ask_tokens
        total = round(local_total * ratio)
        tier = Tier.COMPACT_THEN_DROP if truncated_walk else budget.tier(total)

        if round((fixed + ask_tokens) * ratio) > budget.usable:
            error = (
                f"The new message needs {ask_tokens:,} tokens; with the system prompt that "
                f"is more than the {budget.usable:,} tokens usable of model "
                f"{turn.model or settings.window.model!r}'s {budget.window:,}-token window "
                f"({settings.window.source}). Please send it in smaller parts."
            )
            facts = self._facts(
                settings, budget, turn, start, PlanTokens(local_total, total), tier, pruned
            )
            return ContextPlan([], tuple(notes), facts, tier, error, tuple(counted))

        def cut_to_fit() -> tuple[int, list[int], int]:
            """How many of the newest walked messages fit, cut before a message that is no
            tool result (a round is stored whole, its results right after its call), their
            tokens, and the ask pinned with them when the cut falls inside an older turn."""
            cut, kept = (fit_count, fit_acc) if fit_count is not None else (len(walked), acc)
            while True:
                while cut > 0 and walked[cut - 1].role == "tool":
                    cut -= 1
                    kept -= walked[cut].tokens or 0
                if cut == 0:
                    return 0, [], 0
                if cut <= turn_n or walked[cut - 1].role == "user":
                    return cut, [], kept
                pins = ask_of(history, n_hist - cut + turn_n)
                if kept + sum(count(history[p]).tokens or 0 for p in pins) <= fit_room:
                    return cut, pins, kept
                cut -= 1
                kept -= walked[cut].tokens or 0

        def cut_note(cut: int, pins: Sequence[int]) -> list[str]:
            left = len(walked) - cut + (pos - start) - len(pins)
            kept_ask = f"; the ask at seq {history[pins[0]].seq} kept" if pins else ""
            return [f"{left} oldest messages (whole rounds) not sent{kept_ask}"]

        # 3. Overflow tiers. The compaction tiers are cut to fit (the runner compacts and
        #    assembles again); a small overflow drops the least important turns of the history
        #    (what is sent when `small_overflow = "compact"` cannot compact), or a block of the
        #    oldest, and cuts at rounds when the turns left cannot make it fit.
        pins: list[int] = []
        cut = len(walked)
        kept_tokens = acc
        dropped: set[int] | None = None  # DROP_OLDEST: indexes of `walked` its turns drop
        dropped_desc: list[str] = []
        if tier in (Tier.COMPACT, Tier.COMPACT_THEN_DROP):
            cut, pins, kept_tokens = cut_to_fit()
            dropped_desc = cut_note(cut, pins)
        elif tier is Tier.DROP_OLDEST:
            older = walked[turn_n:][::-1]
            rest = fixed + ask_tokens + turn_acc
            if settings.small_overflow == "drop-blocks":
                left, dropped_desc = self._drop_block(older, budget.usable, rest, ratio)
            else:
                left, dropped_desc = self._drop_to_fit(older, budget.usable, rest, ratio, tier)
            left_tokens = sum(m.tokens or 0 for m in left)
            if round((rest + left_tokens) * ratio) <= budget.usable:
                stays = {id(m) for m in left}
                dropped = {i for i in range(turn_n, len(walked)) if id(walked[i]) not in stays}
                kept_tokens = turn_acc + left_tokens
            else:
                cut, pins, kept_tokens = cut_to_fit()
                dropped_desc = cut_note(cut, pins)
        if tier is not Tier.FITS:
            notes.append(
                f"over budget ({tier.value}): {'; '.join(dropped_desc) or 'nothing'} dropped"
                + (" to fit (compaction tier)" if tier is not Tier.DROP_OLDEST else "")
                + (
                    " if compaction cannot run (small_overflow = compact: it runs first)"
                    if tier is Tier.DROP_OLDEST and settings.small_overflow == "compact"
                    else ""
                )
            )
        # The prompt in order: the pinned ask of a turn cut into, the kept messages oldest
        # first, this turn's ask at its place among its rounds.
        pinned = [count(history[p]) for p in pins]
        if dropped is None:
            older = walked[turn_n:cut][::-1]
        else:
            older = [walked[i] for i in range(len(walked) - 1, turn_n - 1, -1) if i not in dropped]
        # This turn: its rounds kept and its ask (and any message it took in) at their places.
        rounds = sorted(zip(turn_places[: min(cut, turn_n)], walked[: min(cut, turn_n)],
                            strict=True))
        asks = [(j, m) for j, m in enumerate(incoming) if m.role == "user"]
        this_turn = [m for _j, m in sorted([*rounds, *asks], key=lambda x: x[0])]
        ordered = [*pinned, *older, *this_turn]
        turn_kept = turn_acc if cut >= turn_n else kept_tokens
        history_tokens = kept_tokens - turn_kept + sum(m.tokens or 0 for m in pinned)
        incoming_tokens = ask_tokens + turn_kept
        # What the budget kept out, or sent pruned, for the runner to archive.
        left_out = tuple(m.seq for m in walked[cut:] if m.seq is not None)
        if dropped:
            left_out += tuple(s for i in dropped if (s := walked[i].seq) is not None)
        if pruned_at:
            left_out += tuple(s for i in pruned_at if i < cut and (s := walked[i].seq) is not None)
        unwalked = (history[pos - 1] if pos <= n_hist else incoming[pos - 1 - n_hist]) if (
            truncated_walk
        ) else None
        left_out_through = unwalked.seq if unwalked is not None else None
        sent_local = fixed + history_tokens + incoming_tokens
        plan_tokens = PlanTokens(
            local_total,
            total,
            system=system.tokens or 0,
            tools=settings.tools_tokens,
            summary=sum(m.tokens or 0 for m in head),
            history=history_tokens,
            incoming=incoming_tokens,
            sent_local=sent_local,
            prompt=round(sent_local * ratio),
            tool_results=sum(m.tokens or 0 for m in ordered if m.role == "tool"),
        )
        facts = self._facts(
            settings, budget, turn, start, plan_tokens, tier, pruned, tuple(dropped_desc)
        )
        body = drop_orphaned_tool_messages([*head, *ordered])
        return ContextPlan(
            [system, *body], tuple(notes), facts, tier, None, tuple(counted),
            compact_early=settings.small_overflow == "compact",
            left_out=left_out, left_out_through=left_out_through,
        )

    def _pruned(self, m: Message, mode: str, counter: TokenCounter) -> Message:
        """A tool result soft-trimmed or cleared, memoized: old results are pruned the same way
        every turn, so each is scanned, counted and copied once, not once per turn."""
        # One engine serves every session and seqs repeat across sessions, so the key holds the
        # content too (a str caches its hash: cheap even for large results).
        key = (mode, counter.name, m.seq, m.tool_call_id, m.text)
        hit = self._prune_cache.get(key)
        if hit is not None:
            return hit
        if mode == "trim":
            result = soft_trim_old_results([m], keep_recent=0)
            if not result.count:
                return m
            pruned = result.messages[0]
        else:
            pruned = clear_old_results([m], keep_recent=0).messages[0]
        pruned = pruned.with_tokens(counter.count_message(pruned))
        if len(self._prune_cache) >= PRUNE_CACHE_SIZE:
            self._prune_cache.pop(next(iter(self._prune_cache)))
        self._prune_cache[key] = pruned
        return pruned

    def _drop_to_fit(
        self, kept: list[Message], usable: int, fixed: int, ratio: float, tier: Tier
    ) -> tuple[list[Message], list[str]]:
        """Drop whole turns, least important first (every tier), never the newest one."""
        turns = split_turns(kept)
        need = round((fixed + sum(m.tokens or 0 for m in kept)) * ratio) - usable
        to_free = int(need / ratio) + 1
        order = choose_turns_to_drop(turns, to_free, protect_last=1)
        drop: set[int] = set()
        freed = 0
        for index in order:
            if freed >= to_free:
                break
            drop.add(index)
            freed += sum(m.tokens or 0 for m in turns[index].messages)
        if freed < to_free:  # the importance order protected too much: fall back to oldest
            for index in range(len(turns)):
                if freed >= to_free:
                    break
                if index not in drop:
                    drop.add(index)
                    freed += sum(m.tokens or 0 for m in turns[index].messages)
        described = [
            f"seq {t.first_seq}-{t.last_seq}" for i, t in enumerate(turns) if i in drop
        ]
        out = [m for i, t in enumerate(turns) if i not in drop for m in t.messages]
        return out, described

    def _drop_block(
        self, kept: list[Message], usable: int, fixed: int, ratio: float
    ) -> tuple[list[Message], list[str]]:
        """Drop the oldest whole turns, a block at a time (`small_overflow = "drop-blocks"`).

        What must be freed is rounded up to a whole number of blocks (a tenth of the usable
        tokens), and the oldest turns go until that much is freed: from one turn to the next
        the same turns go, so the prompt keeps its prefix until the overflow outgrows the block
        (providers cache a prompt's unchanged prefix). Never the newest turn.
        """
        turns = split_turns(kept)
        need = round((fixed + sum(m.tokens or 0 for m in kept)) * ratio) - usable
        block = max(1, int(usable * DROP_BLOCK_SHARE / ratio))
        to_free = -(-(int(need / ratio) + 1) // block) * block
        freed = dropped = 0
        while dropped < len(turns) - 1 and freed < to_free:
            freed += sum(m.tokens or 0 for m in turns[dropped].messages)
            dropped += 1
        described = [f"seq {t.first_seq}-{t.last_seq}" for t in turns[:dropped]]
        return [m for t in turns[dropped:] for m in t.messages], described

    def _system_message(self, text: str, counter: TokenCounter) -> Message:
        """The system prompt, counted once per distinct text (it is hundreds of tokens)."""
        key = (counter.name, counter.exact, text)
        tokens = self._system_counts.get(key)
        if tokens is None:
            if len(self._system_counts) >= SYSTEM_COUNTS_KEPT:
                self._system_counts.clear()
            tokens = self._system_counts[key] = counter.count_message(
                Message(role="system", content=text)
            )
        return Message(role="system", content=text, tokens=tokens)

    def _facts(
        self,
        settings: ContextSettings,
        budget: Budget,
        turn: TurnContext,
        start: int,
        tokens: PlanTokens,
        tier: Tier,
        pruned: int,
        dropped: tuple[str, ...] | None = None,
    ) -> PlanFacts:
        total = tokens.calibrated_total
        return PlanFacts(
            engine=self.name,
            model=turn.model or settings.window.model,
            window=settings.window.tokens,
            window_source=settings.window.source,
            window_warning=settings.window.warning,
            counter=settings.counter.name,
            counter_exact=settings.counter.exact,
            calibration_ratio=round(settings.calibration_ratio, 4),
            history_limit=settings.history_limit.limit,
            history_limit_source=settings.history_limit.source,
            messages_before_limit=start,
            budget=tuple(BudgetLine(n, t, w) for n, t, w in budget.table()),
            tokens=tokens,
            flush_threshold=budget.flush_at,
            compaction_threshold=budget.compact_at,
            to_flush=budget.flush_at - total,
            to_compaction=budget.compact_at - total,
            tier=tier,
            pruned_tool_results=pruned,
            dropped_turns=dropped,
        )

    def compaction_threshold(self, settings: ContextSettings) -> int | None:
        return make_budget(settings.window.tokens, settings.budget).compact_at

    @staticmethod
    def _round_span(
        turn_span: Span, target: int, measure: Callable[[Span], tuple[bool, int, int]],
        most: int | None = None,
    ) -> tuple[Span, tuple[bool, int, int], int, int] | None:
        """`turn_span` (the last turn kept whole) with the turn cut at its rounds: its ask and
        as many of its newest rounds as `target` tokens hold, at most `most` (fewer until the
        prompt fits with a summary). With the measure of the span, how many rounds are kept
        and compacted; None when the turn holds nothing but its ask."""
        units = split_units(turn_span.kept)
        ask = units[0].messages if units and units[0].kind == "ask" else ()
        body = units[1:] if ask else units
        if not body:
            return None
        room = target - sum(m.tokens or 0 for m in ask)
        keep = 0
        for unit in reversed(body):
            if room - unit.tokens < 0:
                break
            room -= unit.tokens
            keep += 1
        keep = min(keep, len(body) - 1)  # at least one round compacted, or nothing changes
        if most is not None:
            keep = min(keep, most)
        while True:
            older, newer = body[: len(body) - keep], body[len(body) - keep :]
            span = Span(
                [*turn_span.compacted, *(m for u in older for m in u.messages)],
                [*ask, *(m for u in newer for m in u.messages)],
            )
            measured = measure(span)
            if measured[0] or keep == 0:
                rounds = sum(1 for u in newer if u.kind == "round")
                return span, measured, rounds, sum(1 for u in older if u.kind == "round")
            keep -= 1

    async def compact(
        self, turn: TurnContext, summarize: SummaryCall, instructions: str = ""
    ) -> CompactionResult | None:
        """Summarize everything but the recent turns (see `context.compaction`), sized so that
        the next live prompt fits.

        Turns outside the history limit are neither sent nor summarized (nor is a previous
        summary, which covers turns older still). The recent turns kept verbatim shrink from
        `recent_turns` towards one while they would leave the summary less than its share. The
        summary's budget is what the live prompt — system prompt with the red lines, tool
        schemas, refresh block, kept turns as `assemble` sends them — leaves, at most the
        summary share. The result carries that prompt; a result that would not make it smaller
        is returned uncommitted.
        """
        settings = turn.settings or default_settings()
        counter = settings.counter
        budget = make_budget(settings.window.tokens, settings.budget)
        ratio = settings.calibration_ratio
        base = settings.compaction or CompactionSettings(window=settings.window.tokens)
        notes: list[str] = []
        history = list(turn.history)
        start = _history_start(history, settings.history_limit.limit)
        previous, previous_first = turn.summary, turn.summary_first_seq
        if start:
            history = history[start:]
            notes.append(
                f"history limit ({settings.history_limit.describe()}): {start} older messages "
                "are neither sent nor summarized"
            )
            if previous:
                previous, previous_first = None, None
                notes.append("the previous summary covers turns outside the history limit: dropped")
        messages = counter.ensure_counted([*history, *turn.incoming])
        incoming_seqs = {id(m) for m in messages[len(history):]}
        refresh = turn.compaction_refresh if turn.compaction_refresh is not None else turn.refresh
        usable_local = int(budget.usable / ratio)
        summary_cap = int(budget.summary_cap / ratio)
        history_cap = int(budget.history_cap / ratio)
        floor = min(summary_cap, MIN_SUMMARY_TOKENS)

        def live(summary: str | None, kept: Sequence[Message]) -> ContextPlan:
            kept_history = [m for m in kept if id(m) not in incoming_seqs]
            kept_incoming = [m for m in kept if id(m) in incoming_seqs]
            return self.assemble(
                replace(
                    turn, history=kept_history, incoming=kept_incoming, summary=summary,
                    refresh=refresh, summary_first_seq=None,
                )
            )

        def measure(span: Span) -> tuple[bool, int, int]:
            """Whether the prompt with `span.kept` fits with room for a summary; the kept
            messages' tokens; the room left for the summary."""
            plan = live(None, span.kept)
            tokens = plan.tokens
            sent = usable_local
            system_sent = 0
            if tokens is not None:
                sent = tokens.sent_local if tokens.sent_local is not None else usable_local
                system_sent = tokens.system or 0
            room = usable_local - sent - SUMMARY_MARGIN
            fits = plan.tier is Tier.FITS and room >= floor
            return fits, sent - system_sent - settings.tools_tokens, room

        # How many recent turns to keep verbatim: the configured number, fewer when they would
        # crowd out the summary or exceed the history share.
        recent = max(0, base.recent_turns)
        while True:
            span = split_recent(messages, recent)
            fits, kept_tokens, room = measure(span)
            if recent <= 1 or (fits and (kept_tokens <= history_cap or room >= summary_cap)):
                break
            recent -= 1
        if recent != base.recent_turns:
            notes.append(
                f"kept {recent} recent turn(s) verbatim instead of {base.recent_turns}: the "
                "others would leave the summary too little room"
            )
        last = span if recent == 1 else split_recent(messages, 1)
        whole_turn = sum(m.tokens or 0 for m in last.kept)  # as stored: before any pruning
        running = any(m.tool_calls for m in turn.incoming)
        if not fits or whole_turn > history_cap or (running and not span.compacted):
            # The last turn alone is larger than its share (one ask, a long tool loop), or a
            # compaction is asked for in the middle of its tool loop: its ask stays pinned,
            # its newest rounds verbatim (then no more than `recent_turns` of them), and the
            # rounds before them compacted. Rounds kept verbatim get half the history share,
            # and no more than the tool results' share: sent as they are, never pruned, with
            # room for the loop to go on.
            target = min(history_cap // 2, int(budget.tool_results_cap / ratio))
            most = None if not fits or whole_turn > history_cap else max(1, base.recent_turns)
            rounds = self._round_span(last, target, measure, most)
            if rounds is not None:
                span, (fits, kept_tokens, room), kept_rounds, compacted_rounds = rounds
                notes.append(
                    f"the last turn is larger than the {budget.history_cap:,}-token history "
                    f"share: its ask pinned, its newest {kept_rounds} round(s) kept verbatim, "
                    f"{compacted_rounds} earlier round(s) compacted"
                )
        span = _pin_asks(span, {id(m) for m in messages[len(history):] if m.role == "user"})
        summary_budget = min(summary_cap, room)
        knobs = replace(
            base,
            window=settings.window.tokens,
            recent_turns=recent,
            instructions=instructions or base.instructions,
            summary_budget_tokens=max(0, summary_budget),
        )
        result = await run_compaction(
            messages,
            previous_summary=previous,
            previous_first_seq=previous_first,
            counter=counter,
            settings=knobs,
            summarize=summarize,
            span=span,
        )
        if result is None:
            return None
        system_tokens = self._system_message(turn.system_prompt, counter).tokens or 0
        refresh_tokens = (
            counter.count_message(Message(role="system", content=refresh)) if refresh else 0
        )
        previous_tokens = counter.count_message(summary_message(turn.summary)) if turn.summary else 0
        whole = sum(m.tokens or 0 for m in counter.ensure_counted([*turn.history, *turn.incoming]))
        tokens_before = round(
            (system_tokens + settings.tools_tokens + previous_tokens + whole
             + (refresh_tokens if turn.refresh else 0)) * ratio
        )
        notes.extend(result.notes)
        if not result.committed:
            return replace(result, tokens_before=tokens_before, tokens_after=tokens_before,
                           notes=tuple(notes))
        plan = live(result.summary, result.kept)
        tokens_after = (plan.tokens.prompt or 0) if plan.tokens is not None else 0
        refused: str | None = None
        if plan.tier is not Tier.FITS or plan.error:
            refused = (
                f"the compacted prompt needs {tokens_after:,} tokens, more than the "
                f"{budget.usable:,} usable; history kept, not compacted"
            )
        elif tokens_after >= tokens_before:
            refused = (
                f"the compacted prompt ({tokens_after:,} tokens) would not be smaller than the "
                f"current one ({tokens_before:,}); history kept, not compacted"
            )
        if refused is not None:
            notes.append(refused)
            return replace(
                result, summary="", first_seq=None, last_seq=None, kept=list(messages),
                tokens_before=tokens_before, tokens_after=tokens_before, fallback="none",
                quality=replace(result.quality, fallback="none"), notes=tuple(notes),
            )
        ratio_after = tokens_after / tokens_before if tokens_before else 1.0
        quality = replace(
            result.quality,
            compression_ratio=ratio_after,
            tokens_saved=tokens_before - tokens_after,
            in_ideal_range=IDEAL_COMPRESSION[0] <= ratio_after <= IDEAL_COMPRESSION[1],
        )
        return replace(
            result, tokens_before=tokens_before, tokens_after=tokens_after, quality=quality,
            prompt=tuple(plan.messages), notes=tuple(notes),
        )
