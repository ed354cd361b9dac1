"""The default context engine: limits, pruning, budget and overflow tiers (pure)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from context.budget import BudgetSettings, Tier, make_budget
from context.engine import (
    ContextEngine,
    ContextPlan,
    ContextSettings,
    DefaultContextEngine,
    FullHistoryEngine,
    PlanFacts,
    TurnContext,
    drop_orphaned_tool_messages,
)
from context.history import LimitResolution
from context.tokens import estimate_counter
from context.types import Message, ToolCall
from context.window import WindowResolution

ENGINE = DefaultContextEngine()
COUNTER = estimate_counter()


def ctx_settings(window: int = 100_000, limit: int = 0, ratio: float = 1.0) -> ContextSettings:
    return ContextSettings(
        window=WindowResolution(tokens=window, source="test"),
        counter=COUNTER,
        history_limit=LimitResolution(limit, "[test] history_limit"),
        budget=BudgetSettings(reserve_tokens=1_000, max_output_tokens=500),
        calibration_ratio=ratio,
    )


def conversation(turns: int, tokens: int = 100, with_tools: bool = False) -> list[Message]:
    out: list[Message] = []
    seq = 0
    for i in range(turns):
        seq += 1
        out.append(Message(role="user", content=f"question {i}", seq=seq, tokens=tokens))
        if with_tools and i % 2 == 0:
            call = ToolCall(id=f"c{i}", name="lookup", arguments="{}")
            seq += 1
            out.append(Message(role="assistant", tool_calls=(call,), seq=seq, tokens=tokens))
            seq += 1
            out.append(
                Message(role="tool", content="result", tool_call_id=f"c{i}", seq=seq, tokens=tokens)
            )
        seq += 1
        out.append(Message(role="assistant", content=f"answer {i}", seq=seq, tokens=tokens))
    return out


def assemble(
    history: list[Message], new: str = "now?", **kw: object
) -> tuple[list[Message], ContextPlan]:
    turn = TurnContext(
        session_key="k",
        system_prompt="You are terse.",
        history=history,
        incoming=[Message(role="user", content=new, seq=10_000)],
        settings=ctx_settings(**kw),  # type: ignore[arg-type]
    )
    plan = ENGINE.assemble(turn)
    return plan.messages, plan


def facts(plan: ContextPlan) -> PlanFacts:
    assert plan.facts is not None
    return plan.facts


def prompt_tokens(plan: ContextPlan) -> int:
    prompt = facts(plan).tokens.prompt
    assert prompt is not None
    return prompt


def test_everything_fits() -> None:
    history = conversation(5)
    messages, plan = assemble(history)
    assert [m.text for m in messages[1:]] == [m.text for m in history] + ["now?"]
    assert plan.tier is Tier.FITS
    assert facts(plan).history_limit_source == "[test] history_limit"


def test_history_limit_keeps_last_n_turns_and_the_current_message() -> None:
    messages, plan = assemble(conversation(10), limit=3)
    users = [m.text for m in messages if m.role == "user"]
    assert users == ["question 7", "question 8", "question 9", "now?"]
    assert any("history limit" in n for n in plan.notes)


def test_limit_never_orphans_tool_calls() -> None:
    messages, _ = assemble(conversation(9, with_tools=True), limit=2)
    assert drop_orphaned_tool_messages(messages) == messages


def test_small_overflow_drops_least_important_turns() -> None:
    # usable = 6,000 - 1,000 = 5,000; 26 turns x 2 x 100 = 5,200 + prompt: ~5 % over
    history = conversation(25)
    messages, plan = assemble(history, window=6_000)
    assert plan.tier is Tier.DROP_OLDEST
    assert prompt_tokens(plan) <= 5_000
    assert messages[-1].text == "now?"
    assert facts(plan).dropped_turns


def test_large_overflow_is_a_compaction_tier_that_drops_oldest_for_now() -> None:
    messages, plan = assemble(conversation(100), window=6_000)
    assert plan.tier is Tier.COMPACT_THEN_DROP
    assert plan.wants_compaction
    kept_users = [m.text for m in messages if m.role == "user"]
    assert kept_users[-2:] == ["question 99", "now?"], "newest turns survive"
    assert prompt_tokens(plan) <= 5_000


def test_calibration_ratio_scales_the_total() -> None:
    _, plain = assemble(conversation(20))
    _, scaled = assemble(conversation(20), ratio=1.5)
    assert prompt_tokens(scaled) == round(
        prompt_tokens(plain) * 1.5
    )


def test_old_tool_results_are_pruned_oldest_first_when_over_their_share() -> None:
    big = "x" * 40_000  # about 6,000 tokens each; 12 of them exceed the 30 % share
    history: list[Message] = []
    for i in range(12):
        call = ToolCall(id=f"c{i}", name="cat", arguments="{}")
        history += [
            Message(role="user", content=f"read {i}"),
            Message(role="assistant", tool_calls=(call,)),
            Message(role="tool", content=big, tool_call_id=f"c{i}"),
            Message(role="assistant", content="done"),
        ]
    messages, plan = assemble(history, window=200_000)
    tools = [m for m in messages if m.role == "tool"]
    assert len(tools) == 12, "results are pruned, never removed"
    whole = [m.text == big for m in tools]
    assert whole[-3:] == [True, True, True], "the three most recent stay whole"
    assert not all(whole) and whole == sorted(whole), "the oldest are pruned first"
    assert any("trimmed" in m.text for m in tools)
    usable = make_budget(200_000, ctx_settings().budget).usable
    assert sum(COUNTER.count_message(m) for m in tools) <= usable * 0.3
    assert facts(plan).pruned_tool_results == whole.count(False)


def test_a_message_larger_than_the_window_is_refused_clearly() -> None:
    _, plan = assemble([], new="word " * 40_000, window=16_000)
    assert plan.error and "smaller parts" in plan.error
    assert plan.messages == []


def test_counts_are_computed_once_and_reported_for_caching() -> None:
    history = [Message(role="user", content="hello", seq=1), Message(role="assistant", content="hi", seq=2)]
    _, plan = assemble(history)
    assert {m.seq for m in plan.counted} == {1, 2, 10_000}
    assert all(m.tokens for m in plan.counted)


def test_full_history_engine_sends_everything() -> None:
    history = conversation(50)
    plan = FullHistoryEngine().assemble(
        TurnContext("k", "sys", history, [Message(role="user", content="x")])
    )
    assert len(plan.messages) == 1 + len(history) + 1


# -- properties ---------------------------------------------------------------------------


@st.composite
def transcripts(draw: st.DrawFn) -> list[Message]:
    n_turns = draw(st.integers(0, 60))
    out: list[Message] = []
    seq = 0
    for t in range(n_turns):
        seq += 1
        out.append(Message(role="user", content=f"u{t}", seq=seq, tokens=draw(st.integers(1, 3_000))))
        for r in range(draw(st.integers(0, 3))):
            ids = [f"t{t}r{r}c{c}" for c in range(draw(st.integers(1, 2)))]
            seq += 1
            calls = tuple(ToolCall(id=i, name="f") for i in ids)
            out.append(Message(role="assistant", tool_calls=calls, seq=seq, tokens=draw(st.integers(1, 500))))
            for i in ids:
                seq += 1
                out.append(
                    Message(role="tool", content="r", tool_call_id=i, seq=seq,
                            tokens=draw(st.integers(1, 4_000)))
                )
        seq += 1
        out.append(Message(role="assistant", content=f"a{t}", seq=seq, tokens=draw(st.integers(1, 2_000))))
    return out


@settings(max_examples=150, deadline=None)
@given(
    history=transcripts(),
    window=st.integers(16_000, 200_000),
    limit=st.integers(0, 30),
    ratio=st.floats(0.5, 2.0),
)
def test_properties_budget_pairs_latest(
    history: list[Message], window: int, limit: int, ratio: float
) -> None:
    s = ctx_settings(window=window, limit=limit, ratio=ratio)
    plan = ENGINE.assemble(
        TurnContext("k", "system", history, [Message(role="user", content="latest ask")], settings=s)
    )
    usable = make_budget(window, s.budget).usable
    assert plan.error is None
    # 1. never over window - reserve
    assert prompt_tokens(plan) <= usable
    # 2. tool calls and results stay paired
    assert drop_orphaned_tool_messages(plan.messages) == plan.messages
    calls = {c.id for m in plan.messages for c in m.tool_calls}
    results = {m.tool_call_id for m in plan.messages if m.role == "tool"}
    assert calls == results
    # 3. the latest user message is always there, last
    assert plan.messages[-1].text == "latest ask"
    # 4. what is kept is a suffix of whole turns, in order
    kept_seqs = [m.seq for m in plan.messages if m.seq is not None]
    assert kept_seqs == sorted(kept_seqs)


# -- the plan's facts and the engine's policies ------------------------------------------------


def test_facts_dict_is_the_explain_json_in_its_order() -> None:
    history = conversation(25)
    _, plan = assemble(history, window=6_000)
    data = plan.facts_dict()
    assert list(data) == [
        "engine", "model", "window", "window_source", "window_warning", "counter",
        "counter_exact", "calibration_ratio", "history_limit", "history_limit_source",
        "messages_before_limit", "budget", "tokens", "flush_threshold", "compaction_threshold",
        "to_flush", "to_compaction", "tier", "pruned_tool_results", "dropped_turns",
    ]
    assert list(data["tokens"]) == [
        "local_total", "calibrated_total", "system", "tools", "summary", "history", "incoming",
        "sent_local", "prompt", "tool_results",
    ]
    assert data["tier"] == "drop-oldest" and isinstance(data["dropped_turns"], list)
    assert data["budget"][0] == {"name": "window", "tokens": 6_000, "why": "effective context window"}
    assert data["to_flush"] == data["flush_threshold"] - data["tokens"]["calibrated_total"]


def test_a_refused_plan_has_totals_but_no_sent_parts() -> None:
    _, plan = assemble([], new="word " * 40_000, window=16_000)
    data = plan.facts_dict()
    assert list(data["tokens"]) == ["local_total", "calibrated_total"]
    assert "dropped_turns" not in data
    assert plan.tokens is not None and plan.tokens.sent_local is None


def test_the_flush_is_due_at_its_threshold_or_with_compaction() -> None:
    _, roomy = assemble(conversation(5))
    assert not roomy.wants_flush
    budget = BudgetSettings(reserve_tokens=1_000, max_output_tokens=500, flush_soft_tokens=4_000)
    near = ENGINE.assemble(
        TurnContext(
            "k", "sys", conversation(12), [Message(role="user", content="now?")],
            settings=ContextSettings(
                window=WindowResolution(tokens=6_000, source="test"), counter=COUNTER,
                budget=budget,
            ),
        )
    )
    assert near.tier is Tier.FITS and facts(near).to_flush <= 0 and near.wants_flush
    _, over = assemble(conversation(100), window=6_000)
    assert over.wants_compaction and over.wants_flush


def test_the_full_history_engine_keeps_no_facts_and_never_compacts() -> None:
    engine = FullHistoryEngine()
    plan = engine.assemble(TurnContext("k", "sys", conversation(3), []))
    assert plan.facts is None and plan.tokens is None and plan.facts_dict() == {}
    assert not plan.wants_flush
    assert engine.compaction_threshold(ctx_settings()) is None


def test_both_engines_implement_the_protocol() -> None:
    assert isinstance(ENGINE, ContextEngine)
    assert isinstance(FullHistoryEngine(), ContextEngine)


def test_compaction_threshold_is_the_budgets() -> None:
    s = ctx_settings(window=50_000)
    assert ENGINE.compaction_threshold(s) == make_budget(50_000, s.budget).compact_at


def test_tool_results_are_capped_to_a_share_of_the_window() -> None:
    s = replace(ctx_settings(window=10_000), tool_result_share=0.5)
    for engine in (ENGINE, FullHistoryEngine()):
        limit = engine.tool_result_limit(s)
        assert limit == 10_000 * 0.5 * 4
        capped = engine.cap_tool_result("line\n" * 10_000, limit, "artifacts/a.txt")
        assert len(capped) <= limit and "full output saved to artifacts/a.txt" in capped
        assert "full output not saved" in engine.cap_tool_result("x" * 50_000, limit, None)


def test_archive_identifiers_include_custom_patterns_and_mark_secrets() -> None:
    key = "sk-" + "proj-" + "Q7fZ2kLm9XwR4tYp8VbN3cHd6JgS1aEu5"
    text = f"deploy TICKET-42 to db01.internal.example.com with key {key}"
    found = ENGINE.identifiers(text, [r"TICKET-\d+"])
    values = {i.value for i in found}
    assert "TICKET-42" in values and "db01.internal.example.com" in values
    secrets = [i for i in found if i.secret]
    assert secrets and all(key not in i.value for i in found), "a secret only as its marker"
    assert FullHistoryEngine().identifiers(text, [r"TICKET-\d+"]) == found
