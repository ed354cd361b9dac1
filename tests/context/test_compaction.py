"""Compaction pipeline with a scriptable fake summarizer: every guard and fallback (pure)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from context.compaction import (
    REFERENCE_HEADER,
    CompactionSettings,
    chunk_prompt,
    chunk_ratio,
    compact,
    merge_prompt,
    split_chunks,
    split_recent,
)
from context.identifiers import extract_identifiers
from context.tokens import estimate_counter
from context.types import Message, ToolCall

COUNTER = estimate_counter()
GOLDEN = Path(__file__).parent / "golden"
GOOD_BODY = (
    "## State\nMigrating the billing service.\n"
    "## Decisions\n- Use PostgreSQL 16 because of logical replication.\n"
    "## Open TODOs\n- Finish the data backfill (3/7 tables).\n"
    "## Constraints/Rules\n- Never deploy on Fridays.\n"
    "## Pending user asks\n- Deploy the migration to staging after the backfill.\n"
    "## Exact identifiers\n"
)


def transcript(turns: int = 12) -> list[Message]:
    """A chat with planted identifiers, a decision, a TODO, a rule and a failed tool call."""
    out: list[Message] = []
    seq = 0

    def add(m: Message) -> None:
        nonlocal seq
        seq += 1
        out.append(_with_seq(m, seq))

    add(Message(role="user", content="We decided to use PostgreSQL 16 for billing. Never deploy on Fridays."))
    add(Message(role="assistant", content="Noted. Order ORD-1042 is the test order."))
    call = ToolCall(id="c1", name="read_file", arguments='{"path": "/srv/billing/config.yaml"}')
    add(Message(role="user", content="Check the config at /srv/billing/config.yaml please"))
    add(Message(role="assistant", tool_calls=(call,)))
    add(Message(role="tool", name="read_file", tool_call_id="c1",
                content="Error: permission denied, exit code 13"))
    add(Message(role="assistant", content="Reading failed; commit 9f3c2ab7d1 changed permissions."))
    for i in range(turns):
        add(Message(role="user", content=f"Status update {i}: backfill table {i} of the 7 tables. TODO: verify db.internal:5432"))
        add(Message(role="assistant", content=f"Table {i} done; ticket INC0012345 updated."))
    add(Message(role="user", content="Deploy the migration to staging after the backfill"))
    return out


def _with_seq(m: Message, seq: int) -> Message:
    from dataclasses import replace

    return replace(m, seq=seq)


class FakeSummarizer:
    """Scriptable: each call pops a behaviour; default writes a good summary with identifiers."""

    def __init__(self, *script: str | Callable[[list[Message]], str] | Exception) -> None:
        self.script = list(script)
        self.prompts: list[list[Message]] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def __call__(self, prompt: list[Message]) -> str:
        self.prompts.append(prompt)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.01)
            step = self.script.pop(0) if self.script else "good"
            if isinstance(step, Exception):
                raise step
            if callable(step):
                return step(prompt)
            if step == "good":
                ids = [i.value for i in extract_identifiers([prompt[-1].text])]
                return GOOD_BODY + "\n".join(f"- `{v}`" for v in ids)
            if step == "no-ids":
                return GOOD_BODY + "- none"
            if step == "hang":
                await asyncio.sleep(3600)
            return step
        finally:
            self.in_flight -= 1


def settings(**kw: object) -> CompactionSettings:
    base = {"window": 32_000, "critical_rules": "## Red Lines\n- Never reveal secrets."}
    base.update(kw)
    return CompactionSettings(**base)  # type: ignore[arg-type]


async def run(fake: FakeSummarizer, messages: list[Message] | None = None, **kw: object):  # type: ignore[no-untyped-def]
    return await compact(
        messages or transcript(),
        previous_summary=kw.pop("previous_summary", None),  # type: ignore[arg-type]
        previous_first_seq=None,
        counter=COUNTER,
        settings=settings(**kw),
        summarize=fake,
    )


IDS = ["ORD-1042", "/srv/billing/config.yaml", "9f3c2ab7d1", "db.internal:5432", "INC0012345"]


async def test_good_summary_keeps_everything() -> None:
    fake = FakeSummarizer()
    result = await run(fake)
    assert result is not None and result.committed and result.fallback is None
    assert result.summary.startswith(REFERENCE_HEADER)
    for ident in IDS:
        assert ident in result.summary
    assert result.quality.passed
    assert "## Tool failures" in result.summary and "exit code 13" in result.summary
    assert "## Critical rules (AGENTS.md)" in result.summary
    assert "read: /srv/billing/config.yaml" in result.summary
    # recent turns are kept verbatim, the latest ask among them
    assert result.kept[-1].text == "Deploy the migration to staging after the backfill"
    assert sum(1 for m in result.kept if m.role == "user") == 3
    assert result.tokens_after < result.tokens_before


async def test_chunks_run_concurrently_then_merge() -> None:
    fake = FakeSummarizer()
    result = await run(fake, window=16_000)
    assert result is not None
    assert fake.max_in_flight == 2, "the two chunk summaries overlap in time"
    assert len(fake.prompts) == 3  # 2 parts + 1 merge
    assert "Conversation part 1 of 2" in fake.prompts[0][-1].text
    assert "<part n=\"2\">" in fake.prompts[2][-1].text


async def test_dropped_identifiers_are_appended_by_code() -> None:
    fake = FakeSummarizer("no-ids", "no-ids", "no-ids", "no-ids")
    result = await run(fake, quality_retries=1)
    assert result is not None and result.committed
    for ident in IDS:
        assert ident in result.summary, ident
    assert result.quality.identifier_retention == 1.0
    assert result.model_identifier_retention < 1.0
    # the guard fed the problem back once
    assert "problems" in fake.prompts[-1][-1].text


async def test_wrong_sections_are_retried_and_best_kept() -> None:
    fake = FakeSummarizer("s1", "s2", "just some prose without sections", "good")
    result = await run(fake, quality_retries=1)
    assert result is not None and result.quality.passed
    assert "Missing section" in fake.prompts[3][-1].text


async def test_empty_summaries_fall_back_to_extractive() -> None:
    fake = FakeSummarizer("", "", "", "")
    result = await run(fake)
    assert result is not None and result.committed
    assert result.fallback == "extractive"
    assert "## Decisions" in result.summary and "PostgreSQL 16" in result.summary
    assert "## Constraints/Rules" in result.summary and "Never deploy on Fridays" in result.summary
    for ident in IDS:
        assert ident in result.summary
    assert result.errors


async def test_failures_never_commit_a_bad_summary() -> None:
    fake = FakeSummarizer(RuntimeError("boom"), RuntimeError("boom"), RuntimeError("boom"))
    result = await run(fake)
    assert result is not None and result.fallback == "extractive"
    assert any("boom" in e for e in result.errors)


async def test_failing_merge_keeps_the_part_summaries() -> None:
    fake = FakeSummarizer("good", "good", RuntimeError("merge down"))
    result = await run(fake, window=16_000)
    assert result is not None and result.fallback == "unmerged"


async def test_hanging_summarizer_is_bounded_by_the_caller_timeout() -> None:
    fake = FakeSummarizer("hang", "hang", "hang")

    async def bounded(prompt: list[Message]) -> str:
        return await asyncio.wait_for(fake(prompt), timeout=0.05)

    started = time.perf_counter()
    result = await compact(
        transcript(), previous_summary=None, previous_first_seq=None, counter=COUNTER,
        settings=settings(), summarize=bounded,
    )
    assert time.perf_counter() - started < 2
    assert result is not None and result.fallback == "extractive"


async def test_summary_that_cannot_fit_keeps_history() -> None:
    fake = FakeSummarizer()
    result = await compact(
        transcript(), previous_summary=None, previous_first_seq=None, counter=COUNTER,
        settings=settings(summary_budget_tokens=10), summarize=fake,
    )
    assert result is not None and not result.committed and result.fallback == "none"


async def test_previous_summary_is_redistilled_not_stacked() -> None:
    fake = FakeSummarizer()
    first = await run(fake)
    assert first is not None
    fake2 = FakeSummarizer()
    more = transcript(4)
    second = await run(fake2, more, previous_summary=first.summary)
    assert second is not None
    merge_input = fake2.prompts[-1][-1].text
    assert "<previous-summary>" in merge_input
    assert second.summary.count(REFERENCE_HEADER) == 1


async def test_secrets_are_redacted_before_the_summarizer_sees_them() -> None:
    secret = "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789ABCD"
    messages = transcript()
    messages.insert(1, _with_seq(Message(role="user", content=f"my key is {secret}"), 1))
    fake = FakeSummarizer()
    result = await run(fake, messages)
    assert result is not None
    assert all(secret not in m.text for p in fake.prompts for m in p)
    assert secret not in result.summary


async def test_oversized_messages_are_left_out_with_a_note() -> None:
    messages = transcript()
    messages.insert(2, _with_seq(Message(role="tool", content="y" * 100, tokens=20_000, tool_call_id="x"), 2))
    fake = FakeSummarizer()
    result = await run(fake, messages, window=32_000)
    assert result is not None
    assert "[Large tool (~20K tokens) omitted]" in fake.prompts[0][-1].text


def test_split_recent_and_chunks_respect_tool_pairs() -> None:
    messages = COUNTER.ensure_counted(transcript())
    span = split_recent(messages, 3)
    assert [m.role for m in span.kept].count("user") == 3
    chunks = split_chunks(span.compacted, 2, 10_000)
    assert len(chunks) == 2
    for chunk in chunks:
        calls = {c.id for m in chunk for c in m.tool_calls}
        results = {m.tool_call_id for m in chunk if m.role == "tool"}
        assert calls == results


def test_chunk_ratio_formula() -> None:
    small = [Message(role="user", content="x", tokens=10)] * 10
    assert chunk_ratio(small, 100_000) == 0.4
    big = [Message(role="user", content="x", tokens=20_000)] * 10  # avg 0.24 -> 0.4 - 0.25
    assert chunk_ratio(big, 100_000) == pytest.approx(0.15)


def test_golden_prompts() -> None:
    ids = extract_identifiers(["see ORD-1042 at https://example.com/a"])
    chunk = chunk_prompt("USER: hi", 1, 2, ids, "focus on billing")
    merge = merge_prompt(["part one", "part two"], "old summary", ids, "deploy it", "", ["Missing section: ## Decisions"])
    rendered = "\n=====\n".join(f"[{m.role}]\n{m.text}" for m in [*chunk, *merge])
    golden = GOLDEN / "compaction_prompts.txt"
    assert rendered == golden.read_text(encoding="utf-8"), "prompt text changed: review the diff"
