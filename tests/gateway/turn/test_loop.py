"""A turn's tool-loop limits and its anti-thrash (gateway/turn/loop.py), without a gateway."""

from __future__ import annotations

from context.budget import make_budget
from context.engine import ContextPlan, PlanTokens, default_settings
from context.plan import PlanFacts
from gateway.turn.loop import RETRY_GROWTH, ToolLoop

SETTINGS = default_settings(32_000)
USABLE = make_budget(32_000, SETTINGS.budget).usable


def plan(total: int) -> ContextPlan:
    facts = PlanFacts(
        engine="default", model="m", window=32_000, window_source="test", window_warning=None,
        counter="c", counter_exact=True, calibration_ratio=1.0, history_limit=0,
        history_limit_source="test", messages_before_limit=0, budget=(),
        tokens=PlanTokens(total, total), flush_threshold=0, compaction_threshold=USABLE,
        to_flush=0, to_compaction=0, tier=make_budget(32_000, SETTINGS.budget).tier(total),
    )
    return ContextPlan([], facts=facts)


def test_a_compaction_that_freed_nothing_waits_for_the_prompt_to_grow() -> None:
    loop = ToolLoop(60, SETTINGS)
    assert loop.may_compact(plan(USABLE + 100))
    loop.compacted(plan(USABLE + 100), None)  # nothing to compact: freed nothing
    assert not loop.may_compact(plan(USABLE + 200))
    grown = USABLE + 100 + int(USABLE * RETRY_GROWTH)
    assert loop.may_compact(plan(grown))


def test_a_compaction_that_freed_tokens_lets_the_next_one_run() -> None:
    from context.compaction import CompactionResult
    from context.quality import audit_summary

    loop = ToolLoop(60, SETTINGS)
    loop.compacted(plan(USABLE + 100), None)
    report = audit_summary("s", identifiers=[], latest_ask=None, source_texts=[],
                           tokens_before=30_000, tokens_after=9_000)
    freed = CompactionResult(
        summary="s", first_seq=1, last_seq=5, kept=[], tokens_before=30_000, tokens_after=9_000,
        identifiers=[], quality=report,
    )
    loop.compacted(plan(USABLE + 150), freed)
    assert loop.may_compact(plan(USABLE + 160))


def test_calls_past_the_cap_are_not_run_and_the_reply_says_so() -> None:
    loop = ToolLoop(60, SETTINGS)
    answers = [loop.too_many(i, 3) for i in range(5)]
    assert answers[:3] == [None, None, None]
    assert all(a is not None and "max_tool_calls_per_round" in a for a in answers[3:])
    assert loop.with_notes("Done.") == (
        "Done.\n\n(2 tool calls not run: more than 3 in one reply, [llm] max_tool_calls_per_round.)"
    )
    assert ToolLoop(60, SETTINGS).with_notes("Done.") == "Done."


def test_the_wall_clock_budget() -> None:
    loop = ToolLoop(0.0, SETTINGS)
    assert loop.out_of_time()
    assert "[llm] max_turn_seconds = 0" in loop.time_limit_reply(12)
    assert not ToolLoop(3_600, SETTINGS).out_of_time()
