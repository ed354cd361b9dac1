"""A one-ask agent run through every path that is not a live turn: `sessions import` then
`sessions compact` (the operations both commands run), with the summarizer good, lossy,
empty, failing or hanging, at 16k, 32k and 128k. After the compaction the next prompt fits,
holds the ask verbatim once, and every planted identifier and failure is in it or one
`history_search` away; the session's next live turn sends the same ask, pinned after the
summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from context.types import Message
from gateway.app import Gateway
from gateway.operations import import_messages
from gateway.operations.compaction import compact
from gateway.tools.registry import ToolContext
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.fakes.tool_loops import agent_run, loop_model, where_failure, where_identifier
from tests.fakes.transcripts import AGENTS_MD, RED_LINES, promise_sections


def no_orphans(messages: list[Message]) -> bool:
    calls = {c.id for m in messages for c in m.tool_calls}
    return calls == {m.tool_call_id for m in messages if m.role == "tool"}


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
    path = tmp_path / "agent-run.jsonl"
    path.write_text(run.jsonl("You are a coding agent."), encoding="utf-8")
    async with FakeOpenAI() as fake:
        fake.default = loop_model(run, kind)
        config = make_config(fake, **promise_sections(window, 1.0 if kind == "hanging" else 30.0))
        config.workspace.mkdir(parents=True, exist_ok=True)
        (config.workspace / "AGENTS.md").write_text(AGENTS_MD, encoding="utf-8")
        gateway = Gateway(config)
        await gateway.start()
        try:
            key = "agent:main:import:direct:agent-run"
            await import_messages(gateway, path, key)
            outcome = await compact(gateway, key)
            assert outcome.committed, outcome.message
            report = outcome.report
            assert report is not None and report.tokens_after < report.tokens_before
            session = await gateway.store.get_session(key)
            assert session is not None and session.id is not None
            view = await gateway.runner.view(session.id, use_cache=False)
            assert view.history[0].text == run.ask, "the ask is pinned after the summary"
            settings = gateway.runner.settings_for(session, None)
            turn = gateway.runner.turn_context(key, view, 1 << 62, settings)
            plan = gateway.engine.assemble(turn)
            assert plan.tokens is not None and plan.error is None
            assert (plan.tokens.prompt or 0) <= report.tokens_after + 64
            prompt = plan.messages
            assert RED_LINES.splitlines()[0] in prompt[0].text
            assert [m.text for m in prompt].count(run.ask) == 1
            assert no_orphans(prompt)
            ctx = ToolContext(session_key=key)
            searches = {}
            for query in run.identifiers:
                found = await gateway.tools.call(
                    "history_search", json.dumps({"query": query, "limit": 5}), ctx
                )
                searches[query] = found.content
        finally:
            await gateway.stop()
    text = "\n".join([m.text for m in prompt] + [c.arguments for m in prompt for c in m.tool_calls])
    lost = [i for i in run.identifiers if where_identifier(i, text, searches) == "lost"]
    assert lost == [], f"{len(lost)} of {len(run.identifiers)} identifiers lost"
    failures = [f for f in run.failures if where_failure(run, f, text, searches) == "lost"]
    assert failures == []
