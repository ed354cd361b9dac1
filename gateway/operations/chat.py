"""What the chat commands `/status` and `/context` answer, from the facts `gatehouse context
explain` prints (`session_explanation`) and the trigger `gatehouse sessions list` shows (`next_trigger`):
a person in the chat and the operator at the terminal read the same numbers.

The Gateway hands `describe` to the runner (`TurnHooks.describe`); the commands themselves are
parsed and run in `gateway/turn/commands.py`. Plain text, one fact a line, a small meter for a
share: it reads the same on every platform, rendered or not.
"""

from __future__ import annotations

from typing import Any

from context.plan import PlanFacts
from gateway.app import Gateway
from gateway.operations.explain import Explanation, LastCompaction, session_explanation
from gateway.operations.sessions import next_trigger
from gateway.tools.memory import MemoryFlush
from gateway.turn.history import RESET_REASON

METER_CELLS = 10


def meter(used: int, of: int) -> str:
    """`▓▓▓▓░░░░░░ 41%`: `used` against `of` (full past 100 %)."""
    share = used / of if of > 0 else 0.0
    filled = min(METER_CELLS, max(0, round(share * METER_CELLS)))
    if used > 0 and filled == 0:
        filled = 1  # something is there: never an empty bar
    return f"{'▓' * filled}{'░' * (METER_CELLS - filled)} {share:.0%}"


async def describe(gateway: Gateway, session_key: str, name: str) -> str:
    """The answer to `/status` or `/context` in the session `session_key`."""
    facts = await session_explanation(gateway, session_key, fetch_metadata=False)
    if facts is None:
        return "No conversation here yet."
    if name == "context":
        return context_text(facts)
    session = await gateway.store.get_session(session_key)
    flush_due = session is not None and MemoryFlush.due(session)
    return status_text(facts, flush_due)


def status_text(e: Explanation, flush_due: bool) -> str:
    plan = e.plan
    lines = []
    if plan is None:
        lines.append(f"Context engine: full history ({e.messages_in_prompt:,} messages sent)")
    else:
        lines += [
            f"Model: `{plan.model}`, window {plan.window:,} tokens ({plan.window_source})",
            f"Context: {meter(plan.tokens.calibrated_total, plan.compaction_threshold)}: "
            f"{plan.tokens.calibrated_total:,} of {plan.compaction_threshold:,} usable tokens",
            f"History limit: {e.history_limit_text} ({plan.history_limit_source})",
            "Next: " + _next(plan, flush_due),
        ]
    lines.append(f"Last compaction: {_last(e.last_compaction)}")
    if e.automatic_compaction != "allowed":
        lines.append(f"Automatic compaction: {e.automatic_compaction}")
    lines.append(
        f"Messages: {e.stored_messages:,} stored, {e.messages_in_prompt:,} in the next prompt"
    )
    if e.prompt_cache is not None:
        lines.append(f"Prompt cache: {e.prompt_cache.describe()}")
    if plan is not None and plan.window_warning:
        lines.append(f"Warning: {plan.window_warning}")
    return "\n".join(lines)


def _next(plan: PlanFacts, flush_due: bool) -> str:
    tokens = plan.tokens.calibrated_total
    trigger = next_trigger(
        tokens, plan.flush_threshold, plan.compaction_threshold, flush_due
    )
    first = f"{trigger.name} in {trigger.to_go or 0:,} tokens (at {trigger.at:,})"
    if trigger.to_go == 0:
        first = f"{trigger.name} due with the next message (at {trigger.at:,})"
    if trigger.name == "compaction":
        return first
    return f"{first}, then compaction at {plan.compaction_threshold:,}"


def _last(last: LastCompaction | None) -> str:
    if last is None:
        return "none yet"
    q: dict[str, Any] = last.quality or {}
    span = f"messages {last.first_seq}–{last.last_seq}"
    if q.get("reason") == RESET_REASON:
        return f"a fresh start ({q.get('why') or 'reset'}), {span}"
    if "passed" not in q:
        return f"{span}, {last.tokens_before:,} → {last.tokens_after:,} tokens"
    problems = [str(p) for p in q.get("problems") or []]
    verdict = "quality ok" if q.get("passed") else (
        f"quality: {len(problems)} problem{'s' if len(problems) != 1 else ''}"
        + (f" ({problems[0]})" if problems else "")
    )
    sections = len(q.get("sections_present") or [])
    retention = float(q.get("identifier_retention") or 0.0)
    fallback = f", {q['fallback']} fallback" if q.get("fallback") else ""
    return (
        f"{span}, {last.tokens_before:,} → {last.tokens_after:,} tokens; {verdict} "
        f"(sections {sections}/5, identifiers {retention:.0%}{fallback})"
    )


# The budget rows each part of the prompt is held against (`context.budget.Budget.table`).
_SHARES = (
    ("system", "system prompt share"),
    ("summary", "summary share"),
    ("history", "history share"),
    ("tool results", "tool results share"),
)


def context_text(e: Explanation) -> str:
    plan = e.plan
    if plan is None:
        return (
            f"The full history is sent ({e.messages_in_prompt:,} messages): this context "
            "engine keeps no budget."
        )
    t = plan.tokens
    caps = {line.name: line for line in plan.budget}
    parts = {"system": t.system, "summary": t.summary, "history": t.history,
             "tool results": t.tool_results}
    prompt = t.prompt or 0
    lines = [
        f"Next prompt: {prompt:,} tokens of {plan.compaction_threshold:,} usable "
        f"({meter(prompt, plan.compaction_threshold)}), before your next message"
    ]
    for part, row in _SHARES:
        used = parts[part] or 0
        cap = caps.get(row)
        if cap is None:
            lines.append(f"- {part}: {used:,} tokens")
            continue
        share = cap.why.split(" of usable", 1)[0]
        lines.append(
            f"- {part}: {used:,} of {cap.tokens:,} ({share} share) {meter(used, cap.tokens)}"
        )
    lines.append(f"- tool schemas: {t.tools or 0:,} tokens, sent with every call")
    lines.append(
        f"Messages: {e.messages_in_prompt:,} sent ({e.messages_after_summary:,} after the "
        f"summary, history limit {e.history_limit_text}); tool results count in the history"
    )
    if plan.pruned_tool_results:
        lines.append(f"Trimmed tool results: {plan.pruned_tool_results:,}")
    return "\n".join(lines)
