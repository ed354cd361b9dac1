"""The tool round is a unit (pure): one ask followed by hundreds of tool rounds is budgeted,
cut and compacted at round boundaries, with its ask pinned verbatim whatever its position."""

from __future__ import annotations

from dataclasses import replace

import pytest

from context.budget import BudgetSettings, Tier, make_budget
from context.compaction import (
    CompactionSettings,
    body_room,
    fit_summary,
    render_transcript,
    shrink_body,
)
from context.engine import ContextSettings, DefaultContextEngine, TurnContext
from context.quality import find_sections
from context.rounds import ask_of, split_units
from context.salience import rank_identifiers
from context.tokens import estimate_counter
from context.types import Message, ToolCall
from context.window import WindowResolution
from tests.fakes.tool_loops import agent_run

COUNTER = estimate_counter()
RED_LINES = "## Red Lines\n- Never force-push."


def settings(window: int) -> ContextSettings:
    return ContextSettings(
        window=WindowResolution(tokens=window, source="test"),
        counter=COUNTER,
        budget=BudgetSettings(),
        compaction=CompactionSettings(window=window, critical_rules=RED_LINES),
    )


def turn_of(messages: list[Message], window: int, *, live: bool = True) -> TurnContext:
    """The run as the turn in progress (`live`: its messages are the turn's own) or as
    history before a new turn."""
    counted = COUNTER.ensure_counted(messages)
    return TurnContext(
        session_key="k",
        system_prompt=f"You are a coding agent.\n\n{RED_LINES}",
        history=[] if live else counted,
        incoming=counted if live else [],
        settings=settings(window),
    )


def orphans(messages: list[Message]) -> list[str]:
    calls = {c.id for m in messages for c in m.tool_calls}
    results = {m.tool_call_id for m in messages if m.role == "tool"}
    return sorted((calls ^ results) - {None})  # type: ignore[arg-type]


async def fake_summary(prompt: list[Message]) -> str:
    return (
        "## Decisions\n- keep going\n## Open TODOs\n- fix the build\n"
        "## Constraints/Rules\n- no force-push\n## Pending user asks\n- fix the nightly build"
    )


def test_a_round_is_its_call_and_every_result() -> None:
    run = agent_run(6)
    units = split_units(run.messages)
    assert [u.kind for u in units] == ["ask", *["round"] * 6]
    for u in units[1:]:
        calls = {c.id for c in u.messages[0].tool_calls}
        assert {m.tool_call_id for m in u.messages[1:]} == calls
    assert ask_of(run.messages, len(run.messages) - 1) == [0]


@pytest.mark.parametrize("window", [16_384, 32_000, 128_000])
def test_a_turn_larger_than_the_window_keeps_its_ask_and_newest_rounds(window: int) -> None:
    run = agent_run(500)
    plan = DefaultContextEngine().assemble(turn_of(run.messages, window))
    usable = make_budget(window, BudgetSettings()).usable
    assert plan.error is None
    assert plan.wants_compaction and plan.tier is Tier.COMPACT_THEN_DROP
    assert plan.tokens is not None and (plan.tokens.prompt or 0) <= usable
    sent = plan.messages
    assert sent[1].role == "user" and sent[1].text == run.ask
    assert not orphans(sent)
    newest = run.round_messages(run.rounds - 1)
    assert sent[-len(newest):][0].tool_calls == newest[0].tool_calls, "the newest round is sent"
    assert plan.left_out and plan.left_out_through is not None  # archived by the runner


def test_a_cut_inside_an_older_turn_pins_that_turns_ask() -> None:
    run = agent_run(300)
    later = [Message(role="assistant", content="Done."), Message(role="user", content="thanks")]
    messages = [*run.messages, *(replace(m, seq=len(run.messages) + i + 1)
                                 for i, m in enumerate(later))]
    history = COUNTER.ensure_counted(messages[:-1])
    turn = TurnContext(
        session_key="k", system_prompt="sys", history=history,
        incoming=COUNTER.ensure_counted(messages[-1:]), settings=settings(32_000),
    )
    plan = DefaultContextEngine().assemble(turn)
    texts = [m.text for m in plan.messages]
    assert run.ask in texts and texts[-1] == "thanks"
    assert texts.index(run.ask) == 1, "the old turn's ask leads what is kept of it"
    assert not orphans(plan.messages)


@pytest.mark.parametrize("window", [16_384, 32_000, 128_000])
async def test_compaction_inside_one_turn_pins_the_ask(window: int) -> None:
    run = agent_run(200)
    engine = DefaultContextEngine()
    result = await engine.compact(turn_of(run.messages, window), fake_summary)
    assert result is not None and result.committed, result and result.notes
    assert result.pinned_seqs == (1,)
    assert result.kept[0].text == run.ask
    assert result.last_seq is not None and result.last_seq < len(run.messages)
    kept_rounds = [m for m in result.kept if m.tool_calls]
    assert kept_rounds and kept_rounds[-1].seq == run.round_messages(run.rounds - 1)[0].seq
    assert any("ask pinned" in n for n in result.notes)
    usable = make_budget(window, BudgetSettings()).usable
    assert result.tokens_after <= usable
    prompt = list(result.prompt)
    assert prompt[0].role == "system" and RED_LINES in prompt[0].text
    assert [m.text for m in prompt].count(run.ask) == 1 and not orphans(prompt)
    # every failure of a compacted round up to the budget is in the summary, with its code
    failures = find_sections(result.summary).get("## Tool failures") or result.summary
    compacted_failures = [f for f in run.failures if f.round < run.rounds - len(kept_rounds)]
    assert f"exit code {compacted_failures[-1].exit_code}" in failures


async def test_recent_turns_zero_still_keeps_the_ask() -> None:
    run = agent_run(80)
    turn = turn_of(run.messages, 16_384)
    assert turn.settings is not None and turn.settings.compaction is not None
    turn = replace(turn, settings=replace(
        turn.settings, compaction=replace(turn.settings.compaction, recent_turns=0)
    ))
    result = await DefaultContextEngine().compact(turn, fake_summary)
    assert result is not None and result.committed
    assert result.kept[0].text == run.ask and result.pinned_seqs == (1,)


def test_a_body_a_little_over_its_room_is_cut_not_replaced() -> None:
    body = "## State\n- loop\n\n## Decisions\n" + "\n".join(
        f"- decision {i} about the retry budget of worker {i}" for i in range(60)
    ) + "\n\n## Pending user asks\n- fix the nightly build"
    room = COUNTER.count_text(body) - 40
    cut = shrink_body(body, room, COUNTER)
    assert cut is not None and COUNTER.count_text(cut) <= room
    assert "- decision 0 " in cut and "fix the nightly build" in cut and "## State" not in cut


def test_the_identifier_section_fills_what_a_short_body_leaves() -> None:
    run = agent_run(120)
    ranked = rank_identifiers(COUNTER.ensure_counted(run.messages))
    short = fit_summary("## Decisions\n- none", ranked, [], budget_tokens=3_000,
                        max_chars=16_000, counter=COUNTER)
    long = fit_summary("## Decisions\n" + "- words words words\n" * 60, ranked, [],
                       budget_tokens=3_000, max_chars=16_000, counter=COUNTER)
    assert short is not None and long is not None
    assert COUNTER.count_text(short.text) <= 3_000
    assert len(short.listed) > len(long.listed), "a short body leaves more to identifiers"
    assert COUNTER.count_text(short.text) > 0.9 * 3_000, "filled up to the budget"


def test_the_room_a_summarizer_is_told_is_what_fit_summary_leaves_it() -> None:
    run = agent_run(60)
    ranked = rank_identifiers(COUNTER.ensure_counted(run.messages))
    room = body_room(1_200, [("rules", RED_LINES)], len(ranked), COUNTER)
    body = shrink_body("## Decisions\n" + "\n".join(f"- item {i} " * 3 for i in range(400)),
                       room, COUNTER)
    assert body is not None
    fitted = fit_summary(body, ranked, [("rules", RED_LINES)], budget_tokens=1_200,
                         max_chars=16_000, counter=COUNTER)
    assert fitted is not None and COUNTER.count_text(fitted.text) <= 1_200


async def test_a_model_summary_just_over_its_budget_is_used_at_16k() -> None:
    """The reported case: "needs 1,177 tokens, more than the 1,200 available; used the
    extractive summary". The model's body is cut at whole lines instead."""
    run = agent_run(150)

    async def wordy(prompt: list[Message]) -> str:
        items = "\n".join(f"- step {i}: checked the retry budget and the fixtures" for i in range(90))
        return f"## Decisions\n{items}\n## Open TODOs\n- fix\n## Constraints/Rules\n- none\n" \
               f"## Pending user asks\n- {run.ask}"

    result = await DefaultContextEngine().compact(turn_of(run.messages, 16_384), wordy)
    assert result is not None and result.committed
    assert result.fallback is None, result.notes
    assert any("cut to" in n for n in result.notes), result.notes


async def test_a_summarizer_is_told_the_length_it_gets() -> None:
    seen: list[str] = []

    async def record(prompt: list[Message]) -> str:
        seen.append(prompt[-1].text)
        return await fake_summary(prompt)

    await DefaultContextEngine().compact(turn_of(agent_run(150).messages, 16_384), record)
    assert seen and all("Length: the summary gets at most" in s for s in seen[-1:])


def test_a_reply_of_many_identical_results_is_rendered_once() -> None:
    call = Message(role="assistant", tool_calls=tuple(
        ToolCall(f"c{i}", "noop") for i in range(500)
    ), seq=1)
    results = [Message(role="tool", content="Not run: too many", tool_call_id=f"c{i}", seq=i + 2)
               for i in range(500)]
    text, _omitted = render_transcript(COUNTER.ensure_counted([call, *results]), 16_384)
    assert text.count("Not run: too many") == 2
    assert "[498 more tool results with the same text]" in text


def test_every_planted_identifier_and_failure_is_in_the_run() -> None:
    for zh in (False, True):
        run = agent_run(200, zh=zh)
        text = "\n".join([m.text for m in run.messages]
                         + [c.arguments for m in run.messages for c in m.tool_calls])
        assert len(set(run.identifiers)) == run.rounds
        assert all(i in text for i in run.identifiers)
        assert len(run.failures) >= 20
        for f in run.failures:
            assert f"{f.exit_code}" in run.round_messages(f.round)[1].text
