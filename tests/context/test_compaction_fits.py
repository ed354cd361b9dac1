"""Compaction that always fits: the bounded identifier section and its archive line, carried-over
decisions, the extractive summary shrunk to its budget, the live prompt, the history limit before
compaction, and no compaction that would not shrink the prompt (pure)."""

from __future__ import annotations

import json
import random
import re
from dataclasses import replace

import pytest

from context.budget import BudgetSettings, make_budget
from context.compaction import (
    ARCHIVE_TOOL,
    CompactionSettings,
    Salient,
    carry_over,
    compact,
    extractive_summary,
    fit_summary,
)
from context.engine import ContextSettings, DefaultContextEngine, TurnContext
from context.history import LimitResolution
from context.quality import REQUIRED_SECTIONS, find_sections
from context.salience import rank_identifiers
from context.tokens import estimate_counter
from context.types import Message, ToolCall
from context.window import WindowResolution

COUNTER = estimate_counter()
RED_LINES = "## Red Lines\n- Never reveal secrets."
ASK = "Summarise where we are and deploy release/2026.12 to staging."


def heavy_transcript(turns: int = 24, rows: int = 600, seed: int = 5) -> list[Message]:
    """Decisions, TODOs and rules in prose; every fourth turn a bulk CSV tool output full of
    numbers and ids; one failure with an exit code in JSON."""
    rng = random.Random(seed)
    out: list[Message] = []

    def add(m: Message) -> None:
        out.append(replace(m, seq=len(out) + 1))

    for t in range(turns):
        add(Message(role="user", content=(
            f"Check ORD-{88000 + t} on github.com/acme/infra-config. We decided to use plan {t} "
            f"because canary {t} was stable. TODO: verify rollout step {t}."
        )))
        if t % 4 == 0:
            call = ToolCall(f"c{t}", "run_command", json.dumps({"cmd": f"export --batch B-{t}77"}))
            add(Message(role="assistant", tool_calls=(call,)))
            body = "\n".join(
                f"{rng.randint(100_000, 999_999)},{rng.getrandbits(36):09x},node-{t}.internal"
                for _ in range(rows)
            )
            if t == 8:
                body += '\n{"exit_code": 2, "stderr": "disk quota exceeded"}'
            add(Message(role="tool", name="run_command", tool_call_id=call.id, content=body))
        add(Message(role="assistant", content=f"Done with ORD-{88000 + t}. 数据库迁移 {t} 完成。"))
    add(Message(role="user", content=ASK))
    return out


async def good(prompt: list[Message]) -> str:
    text = prompt[-1].text
    decisions = sorted(set(re.findall(r"We decided to use plan \d+[^.]*\.", text)))
    todos = sorted(set(re.findall(r"TODO: verify rollout step \d+\.", text)))
    return (
        "## Decisions\n" + "\n".join(f"- {d}" for d in decisions)
        + "\n## Open TODOs\n" + "\n".join(f"- {t}" for t in todos)
        + "\n## Constraints/Rules\n- none\n## Pending user asks\n- " + ASK
        + "\n## Exact identifiers\n- `github.com/acme/infra-config`"
    )


async def lossy(prompt: list[Message]) -> str:
    lines = (await good(prompt)).splitlines()
    return "\n".join(line for i, line in enumerate(lines) if not line.startswith("- ") or i % 2)


async def empty(prompt: list[Message]) -> str:
    return ""


async def failing(prompt: list[Message]) -> str:
    raise RuntimeError("summarizer down")


SUMMARIZERS = {"good": good, "lossy": lossy, "empty": empty, "failing": failing}


def turn_for(messages: list[Message], window: int, **kw: object) -> TurnContext:
    settings = ContextSettings(
        window=WindowResolution(tokens=window, source="test"),
        counter=COUNTER,
        tools_tokens=300,
        compaction=CompactionSettings(window=window, critical_rules=RED_LINES),
        **kw,  # type: ignore[arg-type]
    )
    return TurnContext(
        session_key="s",
        system_prompt=f"You are terse.\n\n{RED_LINES}",
        history=messages[:-1],
        incoming=messages[-1:],
        model="m",
        settings=settings,
        compaction_refresh=f"[refresh]\n{RED_LINES}",
    )


@pytest.mark.parametrize("window", [16_000, 32_000, 128_000])
@pytest.mark.parametrize("kind", list(SUMMARIZERS))
async def test_every_compaction_fits_and_keeps_what_matters(window: int, kind: str) -> None:
    messages = COUNTER.ensure_counted(heavy_transcript())
    turn = turn_for(messages, window)
    result = await DefaultContextEngine().compact(turn, SUMMARIZERS[kind])
    assert result is not None and result.committed, result and result.notes
    usable = make_budget(window, BudgetSettings()).usable
    assert result.tokens_after <= usable and result.tokens_after < result.tokens_before
    prompt = list(result.prompt)
    assert prompt[0].role == "system" and RED_LINES in prompt[0].text
    assert prompt[-1].role == "user" and prompt[-1].text == ASK
    assert set(REQUIRED_SECTIONS) <= set(find_sections(result.summary))
    calls = {c.id for m in prompt for c in m.tool_calls}
    results = {m.tool_call_id for m in prompt if m.role == "tool"}
    assert calls == results
    # Every identifier is listed or archived with the seqs it appears in.
    listed = [r for r in result.ranked_identifiers if r.value in result.summary]
    assert result.identifiers_in_summary == len(listed)
    archived = [r for r in result.ranked_identifiers if r.value not in result.summary]
    if archived:
        assert f"{len(archived):,} more identifiers" in result.summary
        assert ARCHIVE_TOOL in result.summary
    assert all(r.seqs for r in archived)
    # The most salient identifiers (said by the user) come before bulk numbers.
    assert "github.com/acme/infra-config" in result.summary


@pytest.mark.parametrize("kind", ["good", "lossy"])
async def test_decisions_and_todos_survive_at_32k(kind: str) -> None:
    messages = COUNTER.ensure_counted(heavy_transcript())
    result = await DefaultContextEngine().compact(turn_for(messages, 32_000), SUMMARIZERS[kind])
    assert result is not None and result.committed
    text = "\n".join(m.text for m in result.prompt)
    for t in range(24):
        assert re.search(rf"plan {t}\b", text), f"decision {t}"
        assert re.search(rf"rollout step {t}\b", text), f"TODO {t}"


def test_the_identifier_section_fills_the_budget_salient_first() -> None:
    messages = heavy_transcript()
    ranked = rank_identifiers(messages)
    fitted = fit_summary(
        "## Decisions\n- plan A", ranked, [("rules", "## Critical rules\n- x")],
        budget_tokens=600, max_chars=16_000, counter=COUNTER,
    )
    assert fitted is not None
    assert COUNTER.count_text(fitted.text) <= 600
    assert len(fitted.listed) < len(ranked)
    assert fitted.listed[0].value == ranked[0].value
    assert f"{len(ranked) - len(fitted.listed):,} more identifiers" in fitted.text
    # A short body leaves the section more than its share: it fills what the rest leaves.
    section = find_sections(fitted.text)["## Exact identifiers"]
    assert 0.4 * 600 < COUNTER.count_text(section) <= 600


def test_suffix_sections_go_first_and_a_body_too_big_gives_none() -> None:
    suffix = [("recent", "## Recent turns\n" + "- x\n" * 300), ("rules", "## Critical rules\n- r")]
    fitted = fit_summary("## Decisions\n- d", [], suffix, budget_tokens=200, max_chars=16_000,
                         counter=COUNTER)
    assert fitted is not None and fitted.dropped == ("recent",)
    assert "## Critical rules" in fitted.text
    assert fit_summary("word " * 2_000, [], [], budget_tokens=200, max_chars=16_000,
                       counter=COUNTER) is None


def test_carry_over_adds_only_what_the_model_dropped() -> None:
    salient = Salient(
        decisions=("We decided to use plan 4 because canary 4 was stable.",
                   "We decided to use plan 5 because canary 5 was stable."),
        todos=("TODO: verify rollout step 5.",),
        constraints=(),
        asks=(),
    )
    summary = (
        "## Decisions\n- Plan 4 was chosen (we decided it since canary 4 was stable).\n"
        "## Open TODOs\n- none\n## Constraints/Rules\n- none\n"
        "## Pending user asks\n- deploy\n- step 5 of something else"
    )
    text, carried = carry_over(summary, salient)
    assert carried == 2
    decisions = find_sections(text)["## Decisions"]
    assert "plan 5" in decisions and decisions.count("plan 4") == 0  # kept in its own words
    assert find_sections(text)["## Open TODOs"] == "- (quoted) TODO: verify rollout step 5."


async def test_extractive_summary_shrinks_to_a_small_budget() -> None:
    messages = COUNTER.ensure_counted(heavy_transcript(turns=40))
    settings = CompactionSettings(window=16_000, summary_budget_tokens=500,
                                  critical_rules=RED_LINES)
    result = await compact(messages, previous_summary=None, previous_first_seq=None,
                           counter=COUNTER, settings=settings, summarize=failing)
    assert result is not None and result.committed and result.fallback == "extractive"
    assert COUNTER.count_text(result.summary) <= 500
    assert set(REQUIRED_SECTIONS) <= set(find_sections(result.summary))
    assert any("shrunk" in n for n in result.notes)
    full = extractive_summary(messages[:-10], None, ASK)
    assert COUNTER.count_text(full) > 500


async def test_history_limit_applies_before_compaction() -> None:
    messages = COUNTER.ensure_counted(heavy_transcript(turns=12, rows=10))
    seen: list[str] = []

    async def record(prompt: list[Message]) -> str:
        seen.append(prompt[-1].text)
        return await good(prompt)

    turn = turn_for(
        messages, 32_000, history_limit=LimitResolution(6, "[test] history_limit")
    )
    turn = replace(turn, summary="## Decisions\n- an old topic: plan ZEBRA", summary_first_seq=1)
    result = await DefaultContextEngine().compact(turn, record)
    assert result is not None
    assert any("neither sent nor summarized" in n for n in result.notes)
    assert all("ORD-88000" not in text and "ZEBRA" not in text for text in seen)
    assert "ORD-88000" not in result.summary and "ZEBRA" not in result.summary


async def test_a_compaction_that_would_not_shrink_the_prompt_is_refused() -> None:
    messages = COUNTER.ensure_counted([
        replace(m, seq=i + 1)
        for i, m in enumerate([
            Message(role="user", content="hi"), Message(role="assistant", content="hello"),
            Message(role="user", content="ok"), Message(role="assistant", content="fine"),
            Message(role="user", content="and?"), Message(role="assistant", content="yes"),
            Message(role="user", content="last"), Message(role="assistant", content="sure"),
            Message(role="user", content=ASK),
        ])
    ])
    result = await DefaultContextEngine().compact(turn_for(messages, 32_000), good)
    assert result is not None and not result.committed
    assert any("would not be smaller" in n for n in result.notes)
    assert result.tokens_after == result.tokens_before
