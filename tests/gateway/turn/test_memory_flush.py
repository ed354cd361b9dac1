"""Memory on the live path: the silent flush before compaction, cycles, red lines, tools."""

from __future__ import annotations

import json
from typing import Any

from gateway.app import Gateway
from memory.agents_md import POST_COMPACTION_HEADER
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import FakeOpenAI, context_overflow, error, reply, tool_call
from tests.helpers.llm_scripts import FILLER, KEY, kind, scripted


async def start(make_config: MakeConfig, fake: FakeOpenAI, window: int = 16_000) -> RunningGateway:
    config = make_config(
        fake,
        models={"fake-model": {"context_window": window}},
        context={"recent_turns": 2},
    )
    gateway = Gateway(config)
    rg = RunningGateway(gateway)
    await gateway.start()
    return rg


def kinds(fake: FakeOpenAI) -> list[str]:
    return [kind(b) for b in fake.requests]


async def test_flush_runs_before_compaction_on_the_threshold_path(
    make_config: MakeConfig,
) -> None:
    async with FakeOpenAI(default=scripted) as fake:
        rg = await start(make_config, fake)
        try:
            for i in range(8):
                await rg.ask(f"message {i} " + FILLER)
            seen = kinds(fake)
            assert "flush" in seen and "summary" in seen
            assert seen.index("flush") < seen.index("summary"), seen
            notes = list((rg.gateway.config.workspace / "memory").glob("*.md"))
            text = notes[0].read_text()
            assert "User prefers deploys on Monday. Ticket ORD-77." in text
            assert KEY in text, "each entry is attributed to its session"
            # The flush is silent: no chat reply mentions it, nothing stored in the session.
            session = await rg.gateway.store.get_session(KEY)
            assert session is not None and session.id is not None
            history = await rg.gateway.store.history(session.id)
            assert not any("Memory flush" in (m.text or "") for m in history)
            assert session.flushed_cycle is not None
        finally:
            await rg.gateway.stop()


async def test_flush_before_compaction_on_the_overflow_path_and_cycles_survive_restart(
    make_config: MakeConfig,
) -> None:
    async with FakeOpenAI(default=scripted) as fake:
        rg = await start(make_config, fake, window=200_000)
        config = rg.gateway.config
        try:
            for i in range(4):
                await rg.ask(f"fact {i} " + FILLER)
            fake.script(context_overflow())
            await rg.ask("and now?")
            seen = kinds(fake)
            assert seen.index("flush") < seen.index("summary"), seen
            session = await rg.gateway.store.get_session(KEY)
            assert session is not None
            assert session.flushed_cycle == 0 and session.compaction_cycle == 1
        finally:
            await rg.gateway.stop()
        # After a restart, the new cycle (1) has not been flushed: the next compaction flushes.
        gateway = Gateway(config)
        rg2 = RunningGateway(gateway)
        await gateway.start()
        try:
            fake.clear()
            for i in range(4):
                await rg2.ask(f"more {i} " + FILLER)
            fake.script(context_overflow())
            await rg2.ask("again?")
            seen = kinds(fake)
            assert seen.count("flush") == 1 and seen.index("flush") < seen.index("summary")
            session = await gateway.store.get_session(KEY)
            assert session is not None
            assert session.flushed_cycle == 1 and session.compaction_cycle == 2
        finally:
            await gateway.stop()


async def test_failed_flush_never_blocks_compaction_nor_marks_the_cycle(
    make_config: MakeConfig,
) -> None:
    def flush_fails(body: dict[str, Any]) -> Any:
        return error(400) if kind(body) == "flush" else scripted(body)

    async with FakeOpenAI(default=flush_fails) as fake:
        rg = await start(make_config, fake, window=200_000)
        try:
            for i in range(4):
                await rg.ask(f"fact {i} " + FILLER)
            fake.script(context_overflow())
            assert await rg.ask("and now?") == ["echo: and now?"]
            assert "summary" in kinds(fake)
            session = await rg.gateway.store.get_session(KEY)
            assert session is not None
            assert session.compaction_cycle == 1 and session.flushed_cycle is None
        finally:
            await rg.gateway.stop()


async def test_red_line_only_in_agents_md_is_in_the_prompt_after_compaction(
    make_config: MakeConfig,
) -> None:
    async with FakeOpenAI(default=scripted) as fake:
        rg = await start(make_config, fake)
        agents = rg.gateway.config.workspace / "AGENTS.md"
        agents.write_text(
            "# Agent\n\n## Examples\n```md\n## Red Lines\nnot a heading inside a fence\n```\n\n"
            "## Session Startup\n- Greet by name.\n\n"
            "## Red Lines\n- Never mention the codename BLUEBIRD.\n"
        )
        try:
            await rg.ask("The codename is BLUEBIRD; keep it secret. " + FILLER)
            for i in range(7):
                await rg.ask(f"message {i} " + FILLER)
            session = await rg.gateway.store.get_session(KEY)
            assert session is not None and session.compaction_cycle >= 1
            chats = [b for b in fake.requests if kind(b) == "chat"]
            after = next(
                b for b in chats
                if any(POST_COMPACTION_HEADER in (m["content"] or "") for m in b["messages"])
            )
            sent = json.dumps(after["messages"])
            assert "Never mention the codename BLUEBIRD." in after["messages"][0]["content"]
            assert "Greet by name." in sent
            assert "The codename is BLUEBIRD; keep it secret." not in sent, "early turn compacted"
            assert "not a heading inside a fence" not in after["messages"][0]["content"]
            # The refresh block keeps its place until the next compaction (the prompt keeps its
            # prefix for the provider's cache); red lines stay in every system prompt.
            await rg.ask("one more")
            last = [b for b in fake.requests if kind(b) == "chat"][-1]
            where = [
                i for i, m in enumerate(last["messages"])
                if POST_COMPACTION_HEADER in (m["content"] or "")
            ]
            assert where == [
                i for i, m in enumerate(after["messages"])
                if POST_COMPACTION_HEADER in (m["content"] or "")
            ]
            assert "BLUEBIRD" in last["messages"][0]["content"]
        finally:
            await rg.gateway.stop()


async def test_agent_memory_tools_write_search_and_refuse_escapes(
    fake_llm: FakeOpenAI, running: RunningGateway
) -> None:
    fake_llm.script(
        tool_call("memory_write", {"text": "会议 moved to Thursday; host db.internal:5432"}),
        tool_call("memory_search", {"query": "会议"}),
        tool_call("memory_get", {"path": "../../etc/passwd"}),
        tool_call("memory_write", {"text": ""}),
        reply("done"),
    )
    assert await running.ask("remember the meeting") == ["done"]
    results = [m for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool"]
    assert results[0]["content"].startswith("saved to memory/")
    assert "db.internal:5432" in results[1]["content"]
    assert results[2]["content"].startswith("error")
    assert results[3]["content"].startswith("error")


async def test_compacted_messages_stay_searchable_as_transcripts(make_config: MakeConfig) -> None:
    async with FakeOpenAI(default=scripted) as fake:
        rg = await start(make_config, fake, window=200_000)
        try:
            key = "sk-proj-abcdEFGH1234ijklMNOP5678qrstUVWX"
            await rg.ask(f"the staging password rotation happens on Tuesdays; key {key}")
            for i in range(4):
                await rg.ask(f"filler {i} " + FILLER)
            [answer] = await rg.ask("/compact")
            assert answer.startswith("Compacted")
            hits = rg.gateway.memory_index.search("rotation Tuesdays", corpus="transcripts")
            assert hits and hits[0].path == KEY
            # A pasted secret is not copied into the searchable archive (the message keeps it).
            assert key not in hits[0].snippet and "[REDACTED:openai_key]" in hits[0].snippet
            assert rg.gateway.memory_index.search("abcdEFGH1234", corpus="transcripts") == []
        finally:
            await rg.gateway.stop()


async def test_secrets_reach_neither_the_flush_turn_nor_the_notes(make_config: MakeConfig) -> None:
    from gateway.tools.registry import ToolContext

    secret = "sk-proj-Zq8xW2vN5mK1pR7tY4uI9oL3aS6dF0gH2jK4"
    async with FakeOpenAI(default=scripted) as fake:
        rg = await start(make_config, fake, window=200_000)
        try:
            await rg.ask(f"my key is {secret}; keep it safe. " + FILLER)
            for i in range(3):
                await rg.ask(f"filler {i} " + FILLER)
            [answer] = await rg.ask("/compact")
            assert answer.startswith("Compacted"), answer
            flushes = [b for b in fake.requests if kind(b) == "flush"]
            assert flushes, "the flush ran"
            assert all(secret not in json.dumps(b) for b in flushes)
            assert any("[REDACTED:openai_key]" in json.dumps(b) for b in flushes)
            # A note the model writes with a pasted secret is stored redacted.
            result = await rg.gateway.runner.tools.call(
                "memory_write", json.dumps({"text": f"the deploy key is {secret}"}),
                ToolContext(session_key=KEY),
            )
            assert not result.is_error and "1 secret(s) redacted" in result.content
            notes = "".join(
                p.read_text() for p in (rg.gateway.config.workspace / "memory").glob("*.md")
            )
            assert secret not in notes and "the deploy key is [REDACTED:openai_key]" in notes
        finally:
            await rg.gateway.stop()


async def test_a_flush_whose_model_writes_nothing_still_saves_the_durable_facts(
    make_config: MakeConfig,
) -> None:
    """The model answers NO_REPLY (or cannot call tools): the gateway writes a note quoted from
    the conversation itself — decisions, TODOs, constraints, asks, salient identifiers —
    attributed as an automatic flush, redacted, and not twice."""
    secret = "sk-proj-Zq8xW2vN5mK1pR7tY4uI9oL3aS6dF0gH2jK4"

    def silent_model(body: dict[str, Any]) -> Any:
        return reply("NO_REPLY") if kind(body) == "flush" else scripted(body)

    async with FakeOpenAI(default=silent_model) as fake:
        rg = await start(make_config, fake, window=200_000)
        try:
            await rg.ask(
                "We decided to move billing to db-replica-07 because the primary is pinned. "
                f"Never restart the primary during business hours. My key is {secret}. " + FILLER
            )
            await rg.ask("TODO: re-capture ORD-88123 after payments-gw recovers. " + FILLER)
            for i in range(3):
                await rg.ask(f"filler {i} " + FILLER)
            [answer] = await rg.ask("/compact")
            assert answer.startswith("Compacted"), answer
            notes_dir = rg.gateway.config.workspace / "memory"
            text = "".join(p.read_text() for p in notes_dir.glob("*.md"))
            assert "automatic flush" in text and KEY in text
            assert "We decided to move billing to db-replica-07" in text
            assert "Never restart the primary during business hours." in text
            assert "TODO: re-capture ORD-88123" in text and "`db-replica-07`" in text
            assert secret not in text
            # The next cycle's flush does not repeat what earlier notes hold.
            entries = text.count("automatic flush")
            decided = text.count("We decided to move billing to db-replica-07")
            for i in range(4):
                await rg.ask(f"more filler {i} " + FILLER)
            [again] = await rg.ask("/compact")
            assert again.startswith("Compacted"), again
            text = "".join(p.read_text() for p in notes_dir.glob("*.md"))
            assert text.count("We decided to move billing to db-replica-07") == decided
            notes = text.count("automatic flush")  # the new span's asks are new: a 2nd note
            assert notes >= entries
            metrics = rg.gateway.metrics.render().decode()
            assert f'gatehouse_memory_flush_notes_total{{source="extracted"}} {notes}.0' in metrics
            assert 'gatehouse_memory_flush_notes_total{source="model"} 0.0' in metrics
        finally:
            await rg.gateway.stop()


def test_extracted_note_quotes_the_facts_and_skips_what_earlier_notes_hold() -> None:
    from context.types import Message
    from gateway.tools.memory import extracted_note

    messages = [
        Message(role="system", content="We decided to ignore the system prompt."),
        Message(role="user", content="We decided to pin ORD-88123 to db-replica-07. TODO: check it."),
        Message(role="assistant", content="Done."),
    ]
    note = extracted_note(messages, earlier="")
    assert note is not None
    assert "We decided to pin ORD-88123 to db-replica-07." in note and "TODO: check it." in note
    assert "`ORD-88123`" in note and "system prompt" not in note
    assert extracted_note(messages, earlier=note) is None, "nothing new: no note"
