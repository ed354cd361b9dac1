"""A turn's record keeps the token pressure of the prompt it sent."""

from __future__ import annotations

from context.engine import DefaultContextEngine, FullHistoryEngine, TurnContext, default_settings
from context.types import Message
from gateway.turn.stats import TurnStats

TURN = TurnContext(
    "k", "sys", [], [Message(role="user", content="hi")], settings=default_settings(50_000)
)


def test_the_record_carries_the_plans_pressure() -> None:
    plan = DefaultContextEngine().assemble(TURN)
    assert plan.facts is not None
    stats = TurnStats("k", 1, seconds=1.23456)
    stats.note_pressure(plan)
    record = stats.record()
    assert record.local_prompt_tokens == plan.facts.tokens.prompt
    assert (record.window, record.compact_at, record.flush_at) == (
        50_000, plan.facts.compaction_threshold, plan.facts.flush_threshold
    )
    assert record.seconds == 1.235 and record.compactions == 0


def test_an_engine_without_a_budget_leaves_the_pressure_unknown() -> None:
    stats = TurnStats("k", 1)
    stats.note_pressure(DefaultContextEngine().assemble(TURN))
    stats.note_pressure(FullHistoryEngine().assemble(TURN))
    record = stats.record()
    assert (record.local_prompt_tokens, record.window, record.compact_at) == (None, None, None)
