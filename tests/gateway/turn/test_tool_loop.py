"""Long agent work through a real gateway: one ask, then hundreds of tool rounds in one turn.

A scripted fake model keeps calling the run's tools (tests/fakes/tool_loops.py: build-fixing
rounds with 1-50 KB outputs, failing commands with exit codes, a planted identifier a round)
for 300 rounds, then answers. The turn compacts its earlier rounds as often as it needs to;
every prompt of the turn (every chat request the model received):

- fits the usable budget, counted with tiktoken;
- carries the ask verbatim and AGENTS.md's red lines;
- leaves no tool call without its result, nor a result without its call;

and at the end every planted identifier and failure is in the last prompt or returned by one
`history_search`, with the summarizer good or hanging.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from context.budget import BudgetSettings, make_budget
from gateway.model.tokenizer import load_counter
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI, fn, reply, tool_calls
from tests.fakes.tool_loops import (
    FINAL,
    SESSION_USER,
    LiveResult,
    agent_run,
    loop_model,
    loop_tools,
    prompt_problems,
    request_tokens,
    run_live,
    where_failure,
    where_identifier,
)
from tests.fakes.transcripts import (
    AGENTS_MD,
    RED_LINES,
    is_flush_request,
    is_summary_request,
    promise_sections,
    prompt_text,
)

ROUNDS = 300


def loop_config(make_config: MakeConfig, fake: FakeOpenAI, window: int, kind: str) -> Any:
    sections = promise_sections(window, 1.0 if kind == "hanging" else 30.0)
    sections["llm"]["max_tool_rounds"] = 1_000
    return make_config(fake, **sections)


def broken(run: Any, result: LiveResult) -> list[str]:
    """Every part of the promise the turn broke, for one failure message."""
    problems = prompt_problems(
        result.chats, run.ask, result.usable, load_counter("gpt-4o"), RED_LINES.splitlines()[0]
    )
    text = prompt_text(result.final_prompt)
    lost = [i for i in run.identifiers if where_identifier(i, text, result.searches) == "lost"]
    if lost:
        problems.append(f"{len(lost)} identifiers lost: {lost[:5]}")
    failures = [f for f in run.failures if where_failure(run, f, text, result.searches) == "lost"]
    if failures:
        problems.append(f"{len(failures)} failures lost: {failures[:3]}")
    return problems


@pytest.mark.parametrize(("window", "kind"), [(16_000, "hanging"), (32_000, "good")])
async def test_a_300_round_turn_compacts_as_it_goes_and_forgets_nothing(
    make_config: MakeConfig, window: int, kind: str
) -> None:
    run = agent_run(ROUNDS)
    async with FakeOpenAI() as fake:
        config = loop_config(make_config, fake, window, kind)
        result = await run_live(config, fake, run, kind, queries=run.identifiers,
                                agents_md=AGENTS_MD)
    assert result.reply == [FINAL]
    assert len(result.chats) == ROUNDS + 1
    assert result.compactions >= 2, "a turn compacts as many times as it needs"
    assert broken(run, result) == []


async def test_a_reply_with_ten_thousand_calls_is_capped_and_the_session_goes_on(
    make_config: MakeConfig,
) -> None:
    """10,000 calls in one reply: the first `max_tool_calls_per_round` run, the rest are
    answered "not run", the reply says so, and the next message is answered as usual."""
    from tests.conftest import started

    async with FakeOpenAI() as fake:
        config = make_config(fake, **promise_sections(16_000, 30.0))
        async with started(config) as rg:
            rg.webchat.reply_timeout = 60  # the limit under test is the assertion below
            calls = [("memory_search", {"query": f"q{i}"}) for i in range(10_000)]
            fake.default = chat_script(tool_calls(*calls), reply("Looked it up."),
                                       reply("Still here."))
            began = time.perf_counter()
            answer = await rg.webchat.submit(SESSION_USER, "look everything up")
            seconds = time.perf_counter() - began
            assert answer.replies and answer.replies[-1].startswith("Looked it up."), answer
            assert "9,968 tool calls not run" in answer.replies[-1]
            assert "max_tool_calls_per_round" in answer.replies[-1]
            assert seconds < 30, seconds  # it took minutes when every call ran
            prompt = fake.requests[-1]["messages"]
            assert any(m.get("content") == "look everything up" for m in prompt)
            assert (await rg.webchat.submit(SESSION_USER, "are you there?")).replies == [
                "Still here."
            ]
            stored = await rg.gateway.store.get_session(
                f"agent:main:webchat:direct:{SESSION_USER}"
            )
            assert stored is not None and stored.id is not None
            history = await rg.gateway.store.history(stored.id)
            results = [m for m in history if m.role == "tool"]
            assert len(results) == 10_000, "every call keeps its result"
            assert sum(1 for m in results if m.text.startswith("Not run: too many calls")) == 9_968


async def test_a_turn_stops_at_its_wall_clock_budget_and_says_so(make_config: MakeConfig) -> None:
    async with FakeOpenAI() as fake:
        config = make_config(fake, llm={"max_turn_seconds": 1.0, "max_tool_rounds": 500})
        from tests.conftest import started

        async with started(config) as rg:
            fake.default = lambda body: tool_call_after(0.3)
            answer = await rg.webchat.submit(SESSION_USER, "keep searching")
    assert answer.replies and "max_turn_seconds" in answer.replies[-1], answer
    rounds = sum(1 for r in fake.requests if r.get("tools"))
    assert 2 <= rounds <= 8, rounds


def chat_script(*steps: Any) -> Any:
    """A fake model's `default`: chat requests get `steps` in order (then "ok"); summary
    requests a short summary, the memory flush NO_REPLY."""
    from tests.fakes.transcripts import is_flush_request, is_summary_request

    left = list(steps)

    def answer(body: dict[str, Any]) -> Any:
        if is_flush_request(body):
            return reply("NO_REPLY")
        if is_summary_request(body):
            return reply("## Decisions\n- none\n## Open TODOs\n- none\n## Constraints/Rules\n"
                         "- none\n## Pending user asks\n- look everything up")
        return left.pop(0) if left else reply("ok")

    return answer


def tool_call_after(delay: float) -> Any:
    """A step that answers with a tool call after `delay` seconds (a slow model)."""
    import asyncio

    from tests.fakes import fn, tool_call

    async def slow(_body: dict[str, Any]) -> Any:
        await asyncio.sleep(delay)
        return tool_call("memory_search", {"query": "x"})

    return fn(slow)


async def test_the_round_limit_stops_the_loop_with_a_reply_naming_it(
    make_config: MakeConfig,
) -> None:
    from tests.conftest import started
    from tests.fakes import tool_call

    async with FakeOpenAI(default=lambda body: tool_call("memory_search", {"query": "x"})) as fake:
        config = make_config(fake, llm={"max_tool_rounds": 5})
        async with started(config) as rg:
            answer = await rg.webchat.submit(SESSION_USER, "search forever")
    assert answer.replies and "[llm] max_tool_rounds" in answer.replies[-1]
    assert "5 rounds" in answer.replies[-1]
    assert json.dumps(answer.replies)


async def test_an_overflow_names_the_round_that_overflowed(make_config: MakeConfig) -> None:
    """The provider refuses the prompt after a large tool round: the error names the tool
    results of that round, not "the new message"."""
    from tests.conftest import started
    from tests.fakes import context_overflow, tool_call

    async with FakeOpenAI() as fake:
        config = make_config(fake, context={"overflow_retries": 0})
        async with started(config) as rg:
            (config.workspace / "memory").mkdir(parents=True, exist_ok=True)
            (config.workspace / "memory" / "big.md").write_text("row\n" * 20_000)
            fake.script(tool_call("memory_get", {"path": "memory/big.md"}),
                        context_overflow(8_192, 30_000))
            [answer] = await rg.ask("read the big file")
    assert "no longer fits model" in answer
    assert "the largest part is the tool results of the round at seq 2-3 (memory_get" in answer, (
        answer
    )


async def test_compact_sent_during_a_tool_loop_compacts_at_the_next_round(
    make_config: MakeConfig,
) -> None:
    """`/compact` waits for no turn of its own while a long loop runs: it is answered at the
    loop's next round boundary, and the loop goes on after it with its ask pinned."""
    import asyncio

    from tests.conftest import started

    run = agent_run(40)
    async with FakeOpenAI() as fake:
        config = make_config(fake, **promise_sections(128_000, 30.0))
        async with started(config) as rg:
            for tool in loop_tools(run):
                rg.gateway.tools.register(tool)
            model = loop_model(run, "good")

            async def slow(body: dict[str, Any]) -> Any:
                await asyncio.sleep(0.05)
                return model(body)

            fake.default = lambda body: fn(slow)
            loop = asyncio.create_task(rg.webchat.submit(SESSION_USER, run.ask))
            await asyncio.sleep(0.6)
            compacted = await asyncio.wait_for(rg.webchat.submit(SESSION_USER, "/compact"), 30)
            assert not loop.done(), "answered while the loop still runs"
            answer = await asyncio.wait_for(loop, 60)
            key = f"agent:main:webchat:direct:{SESSION_USER}"
            session = await rg.gateway.store.get_session(key)
            assert session is not None and session.id is not None
            rows = await rg.gateway.store.compactions(session.id)
    assert compacted.replies and compacted.replies[0].startswith("Compacted the conversation")
    assert answer.replies == [FINAL]
    assert [r.quality.get("reason") for r in rows] == ["command"]
    assert rows[0].quality.get("pinned_seqs"), "the ask stays pinned after the summary"
    later = [r for r in fake.requests if r.get("tools")][-1]["messages"]
    assert any(m["role"] == "user" and m.get("content") == run.ask for m in later)
    assert later[1]["content"].startswith("[Summary of earlier conversation")


async def test_with_compaction_paused_a_long_loop_is_cut_at_rounds_and_archived(
    make_config: MakeConfig,
) -> None:
    """Automatic compaction paused (after ineffective ones): the loop's prompts are cut at round
    boundaries instead, with the ask pinned, and every round a prompt leaves out is archived
    the first time, so each identifier is still in the prompt or one lookup away."""
    from sqlmodel import col, update

    from gateway.store.models import SessionRow
    from tests.conftest import started

    run = agent_run(120)
    key = f"agent:main:webchat:direct:{SESSION_USER}"
    async with FakeOpenAI() as fake:
        config = loop_config(make_config, fake, 16_000, "good")
        config.workspace.mkdir(parents=True, exist_ok=True)
        (config.workspace / "AGENTS.md").write_text(AGENTS_MD, encoding="utf-8")
        async with started(config) as rg:
            for tool in loop_tools(run):
                rg.gateway.tools.register(tool)
            fake.script(reply("hello"))
            assert (await rg.webchat.submit(SESSION_USER, "hi")).replies == ["hello"]
            stmt = update(SessionRow).where(col(SessionRow.key) == key)
            await rg.gateway.store.database.write(
                lambda db: db.exec(stmt.values(ineffective_compactions=9))  # type: ignore[call-overload]
            )
            # The provider reports the prompt's true size (tiktoken): the gateway's calibrated
            # budget then holds exactly by that count, every round of the cut.
            counter = load_counter("gpt-4o")
            fake.default = loop_model(
                run, "good", prompt_tokens=lambda body: request_tokens(body, counter)
            )
            before = len(fake.requests)
            answer = await rg.webchat.submit(SESSION_USER, run.ask)
            chats = [r for r in fake.requests[before:]
                     if not is_flush_request(r) and not is_summary_request(r)]
            session = await rg.gateway.store.get_session(key)
            assert session is not None and session.id is not None
            assert await rg.gateway.store.compactions(session.id) == [], "none ran"
            from gateway.tools.registry import ToolContext

            searches = {}
            for query in run.identifiers:
                found = await rg.gateway.tools.call(
                    "history_search", json.dumps({"query": query, "limit": 5}),
                    ToolContext(session_key=key),
                )
                searches[query] = found.content
    assert answer.replies == [FINAL]
    usable = make_budget(16_000, BudgetSettings()).usable
    problems = prompt_problems(
        chats, run.ask, usable, load_counter("gpt-4o"), RED_LINES.splitlines()[0]
    )
    assert problems == [], problems[:5]
    assert "history_search" in json.dumps(chats[-1]["tools"]), "offered once rounds are archived"
    text = prompt_text(chats[-1]["messages"])
    lost = [i for i in run.identifiers if where_identifier(i, text, searches) == "lost"]
    assert lost == []
