"""The compaction promise, end to end through a real gateway.

At any window from 16k up, with a summarizer that is good, lossy, empty, failing or hanging,
the next prompt (the chat request the fake model receives after the gateway compacted on its
own):

- fits the usable budget (window - reserve, `context.budget.make_budget`), counted with tiktoken;
- carries AGENTS.md's red lines and the latest ask verbatim (as the last user message);
- has a summary with the five sections whenever part of the conversation left the prompt;
- leaves no tool call without its result, and no result without its call;
- keeps every planted identifier, either in the prompt or in what one `history_search` call
  (`{"query": <identifier>, "limit": 5}`) returns for it.

The session is a generated ~59k-token operations transcript (tests/fakes/transcripts.py),
imported with the `sessions import` operation; the latest ask arrives through webchat like any
message. Each case lists every broken part of the promise in one failure message.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from gateway.model.tokenizer import load_counter
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.fakes.transcripts import (
    RED_LINES,
    SECTION_HEADINGS,
    SUMMARIZER_KINDS,
    CaseResult,
    Transcript,
    case_queries,
    case_summary_timeout,
    generate,
    promise_sections,
    run_case,
    search_hits,
)

WINDOWS = (16_000, 32_000, 128_000)
SUMMARY_TIMEOUT = 1.0
"""`[context] summary_timeout` of the hanging summarizer's cases (the others get 30 s)."""


@pytest.fixture(scope="module")
def transcript() -> Transcript:
    return generate()


def test_the_transcript_is_deterministic_and_shaped_as_promised(transcript: Transcript) -> None:
    again = generate.__wrapped__()  # not the cached one
    assert [m.to_openai() for m in again.messages] == [m.to_openai() for m in transcript.messages]
    counter = load_counter("gpt-4o")
    tokens = sum(counter.count_message(m) for m in transcript.messages)
    assert 55_000 <= tokens <= 60_000, tokens
    big = [len(m.text) for m in transcript.messages if m.role == "tool" and len(m.text) > 10_000]
    assert len(big) >= 3 and max(big) >= 45_000, big
    text_only = sum(counter.count_message(m) for m in transcript.messages if m.role != "tool")
    assert text_only > 25_200, "the conversation's own text must be 5 % over a 32k window's usable"
    assert transcript.messages[-1].role == "user"
    assert transcript.messages[-1].text == transcript.latest_ask
    assert len(transcript.exam) == 30
    assert {q.kind for q in transcript.exam} == {"identifier", "decision", "failure", "constraint"}
    assert {"github.com/acme/infra-config", "release/2026.12"} <= set(transcript.identifiers)
    forms = {f.form for f in transcript.failures}
    assert {'"exit_code": 2', "returncode=1", "[exit 1]", "exit code 137"} <= forms
    full = "\n".join(
        [m.text for m in transcript.messages]
        + [c.arguments for m in transcript.messages for c in m.tool_calls]
    )
    for ident in transcript.identifiers:
        assert ident in full
    for question in transcript.exam:
        assert question.answered_by(full), question.question
    calls = {c.id for m in transcript.messages for c in m.tool_calls}
    results = {m.tool_call_id for m in transcript.messages if m.role == "tool"}
    assert calls == results


def promise_problems(r: CaseResult, t: Transcript) -> list[str]:
    """Every part of the promise the next prompt breaks (empty: it keeps it)."""
    problems: list[str] = []
    if not r.fits:
        problems.append(
            f"does not fit: the next prompt has {r.prompt_tokens:,} tokens, usable is "
            f"{r.usable:,} (window {r.window:,})"
        )
    systems = "\n".join(
        m["content"] for m in r.prompt if m.get("role") == "system" and isinstance(m.get("content"), str)
    )
    missing_rules = [line for line in RED_LINES.splitlines() if line not in systems]
    if missing_rules:
        problems.append(f"red lines missing from the system messages: {missing_rules}")
    users = [m for m in r.prompt if m.get("role") == "user"]
    if not users or users[-1].get("content") != t.latest_ask:
        last = users[-1].get("content") if users else None
        problems.append(f"the last user message is not the latest ask verbatim: {str(last)[:200]!r}")

    text = r.text
    left = [
        m.seq for m in t.history
        if m.role in ("user", "assistant") and m.text and m.text not in text
    ]
    summary = r.summary
    if left:
        if summary is None:
            problems.append(
                f"{len(left)} user/assistant messages left the prompt (seq {left[0]}..{left[-1]}) "
                "and there is no summary message"
            )
        else:
            absent = [h for h in SECTION_HEADINGS if not re.search(rf"^{re.escape(h)}\s*$", summary, re.M)]
            if absent:
                problems.append(f"summary sections missing: {absent}")

    problems.extend(_pairing_problems(r.prompt))

    lost = [i for i in t.identifiers if i not in text and i not in search_hits(r.searches.get(i, ""))]
    if lost:
        sample = (r.searches.get(lost[0]) or "")[:300]
        how = (
            f"history_search is registered but did not return them; it answered "
            f"{{'query': {lost[0]!r}, 'limit': 5}} with {sample!r}"
            if r.search_registered
            else "the history_search tool is not registered, so nothing outside the prompt can "
            "be looked up"
        )
        problems.append(
            f"{len(lost)} of {len(t.identifiers)} planted identifiers are neither in the prompt "
            f"nor found by history_search ({how}): {lost}"
        )
    return problems


def _pairing_problems(prompt: list[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    open_calls: dict[str, int] = {}
    offered: set[str] = set()
    for i, m in enumerate(prompt):
        if m.get("role") == "assistant":
            for call in m.get("tool_calls") or ():
                open_calls[call["id"]] = i
                offered.add(call["id"])
        elif m.get("role") == "tool":
            call_id = m.get("tool_call_id")
            if call_id not in offered:
                problems.append(f"tool result {call_id} (message {i}) has no tool call before it")
            open_calls.pop(str(call_id), None)
    for call_id, i in open_calls.items():
        problems.append(f"tool call {call_id} (message {i}) has no tool result")
    return problems


@pytest.mark.parametrize("kind", SUMMARIZER_KINDS)
@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"{w // 1000}k")
async def test_the_next_prompt_keeps_the_promise(
    make_config: MakeConfig, transcript: Transcript, window: int, kind: str
) -> None:
    async with FakeOpenAI(models=["gpt-4o"]) as fake:
        timeout = case_summary_timeout(kind, SUMMARY_TIMEOUT)
        config = make_config(fake, **promise_sections(window, timeout))
        result = await run_case(config, fake, transcript, kind, queries=transcript.identifiers)
    problems = promise_problems(result, transcript)
    compaction = result.compactions[-1]["quality"] if result.compactions else None
    context = (
        f"window {window:,} (usable {result.usable:,}), summarizer {kind}: prompt "
        f"{result.prompt_tokens:,} tokens (from {result.tokens_before:,}), "
        f"{result.summary_calls} summary calls, {len(result.compactions)} compactions"
        + (
            f" (fallback {compaction.get('fallback')}, notes {compaction.get('notes')})"
            if compaction else ""
        )
    )
    assert not problems, context + "\n- " + "\n- ".join(problems)


def test_exam_key_terms_are_searchable_terms(transcript: Transcript) -> None:
    """Each exam question's key term occurs in the conversation (what a search would hit)."""
    full = "\n".join(
        [m.text for m in transcript.messages]
        + [c.arguments for m in transcript.messages for c in m.tool_calls]
    ).lower()
    for question in transcript.exam:
        words = [w for w in re.split(r"\s+", question.key_term.lower()) if w]
        assert all(w in full for w in words), question.key_term
    assert len(case_queries(transcript)) >= len(transcript.identifiers)
