"""The small-overflow tier (at most 5 % over the usable tokens) and the prompt cache: compact at
once (default), drop the oldest turns a block at a time, or drop the least important turns anew
each turn (`[context] small_overflow`)."""

from __future__ import annotations

import itertools

from context.budget import BudgetSettings, Tier
from context.engine import ContextPlan, ContextSettings, DefaultContextEngine, TurnContext
from context.plan import SmallOverflow
from context.tokens import estimate_counter
from context.types import Message
from context.window import WindowResolution

ENGINE = DefaultContextEngine()


def history(turns: int, tokens: int = 20) -> list[Message]:
    out: list[Message] = []
    for i in range(turns):
        out.append(Message(role="user", content=f"question {i}", seq=2 * i + 1, tokens=tokens))
        out.append(Message(role="assistant", content=f"answer {i}", seq=2 * i + 2, tokens=tokens))
    return out


def plan(turns: int, mode: SmallOverflow) -> ContextPlan:
    """`turns` turns of 40 tokens against 5,000 usable tokens: the 5 % band spans ~6 turns."""
    settings = ContextSettings(
        window=WindowResolution(tokens=6_000, source="test"),
        counter=estimate_counter(),
        budget=BudgetSettings(reserve_tokens=1_000, max_output_tokens=500),
        small_overflow=mode,
    )
    return ENGINE.assemble(
        TurnContext(
            "k", "sys", history(turns),
            [Message(role="user", content="now?", seq=10_000, tokens=20)], settings=settings,
        )
    )


def first_sent(p: ContextPlan) -> str:
    return p.messages[1].text


def band() -> range:
    """The turn counts whose prompt is in the small-overflow tier."""
    return range(
        next(n for n in range(100, 200) if plan(n, "compact").tier is Tier.DROP_OLDEST),
        next(n for n in range(100, 200) if plan(n, "compact").tier is Tier.COMPACT),
    )


def test_the_band_spans_several_turns() -> None:
    assert len(band()) >= 4


def test_compact_mode_compacts_at_the_first_overflow_and_keeps_a_fitting_fallback() -> None:
    for n in band():
        p = plan(n, "compact")
        assert p.tier is Tier.DROP_OLDEST and p.wants_compaction and p.wants_flush
        assert p.tokens is not None and (p.tokens.prompt or 0) <= 5_000
    assert not plan(band().start - 1, "compact").wants_compaction


def test_drop_turns_mode_drops_anew_each_turn_without_compacting() -> None:
    plans = [plan(n, "drop-turns") for n in band()]
    assert not any(p.wants_compaction for p in plans)
    assert all(p.tokens is not None and (p.tokens.prompt or 0) <= 5_000 for p in plans)


def test_drop_blocks_drops_the_same_oldest_turns_across_the_band() -> None:
    plans = [plan(n, "drop-blocks") for n in band()]
    assert not any(p.wants_compaction for p in plans)
    assert all(p.tokens is not None and (p.tokens.prompt or 0) <= 5_000 for p in plans)
    # The oldest turns go, the same ones every turn: each prompt extends the previous one.
    assert {first_sent(p) for p in plans} == {first_sent(plans[0])}
    assert first_sent(plans[0]).startswith("question ") and first_sent(plans[0]) != "question 0"
    for before, after in itertools.pairwise(plans):
        assert after.messages[: len(before.messages) - 1] == before.messages[:-1]
    assert plans[0].facts is not None and plans[0].facts.dropped_turns
