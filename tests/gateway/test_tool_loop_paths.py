"""A one-ask agent run through every path that is not a live turn: `sessions import` then
`sessions compact` (the operations both commands run), with the summarizer good, lossy,
empty, failing or hanging, at 16k, 32k and 128k, in English and Chinese. After the compaction
the next prompt fits, holds the ask verbatim once (pinned after the summary), and every
planted identifier and failure is in it or one `history_search` away."""

from __future__ import annotations

from pathlib import Path

import pytest

from context.budget import BudgetSettings, make_budget
from gateway.model.tokenizer import load_counter
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.fakes.tool_loops import (
    agent_run,
    prompt_problems,
    run_import,
    where_failure,
    where_identifier,
)
from tests.fakes.transcripts import AGENTS_MD, RED_LINES, promise_sections, prompt_text

CASES = [
    (50, 16_000, "lossy", False),
    (200, 32_000, "failing", True),
    (200, 16_000, "empty", False),
    (500, 128_000, "good", False),
    (500, 16_000, "hanging", False),
]


@pytest.mark.parametrize(("rounds", "window", "kind", "zh"), CASES)
async def test_import_then_compact_keeps_the_ask_and_every_identifier(
    make_config: MakeConfig, tmp_path: Path, rounds: int, window: int, kind: str, zh: bool
) -> None:
    run = agent_run(rounds, zh=zh)
    async with FakeOpenAI() as fake:
        config = make_config(fake, **promise_sections(window, 1.0 if kind == "hanging" else 30.0))
        result = await run_import(config, fake, run, kind, tmp_path, queries=run.identifiers,
                                  agents_md=AGENTS_MD)
    assert result.committed, result.message
    assert [m.text for m in result.pinned] == [run.ask], "the ask is pinned after the summary"
    chat = {"messages": [m.to_openai() for m in result.prompt], "tools": result.tools}
    usable = make_budget(window, BudgetSettings()).usable
    assert prompt_problems(
        [chat], run.ask, usable, load_counter("gpt-4o"), RED_LINES.splitlines()[0]
    ) == []
    assert [m.text for m in result.prompt].count(run.ask) == 1
    text = prompt_text(chat["messages"])
    lost = [i for i in run.identifiers if where_identifier(i, text, result.searches) == "lost"]
    assert lost == [], f"{len(lost)} of {len(run.identifiers)} identifiers lost"
    failures = [f for f in run.failures if where_failure(run, f, text, result.searches) == "lost"]
    assert failures == []
