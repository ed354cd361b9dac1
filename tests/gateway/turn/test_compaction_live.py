"""Compaction on the live path: real SDK, fake OpenAI server, real SQLite store."""

from __future__ import annotations

from typing import Any

from context.compaction import REFERENCE_HEADER
from gateway.app import Gateway
from gateway.operations import show_session, uncompact_session
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import FakeOpenAI, context_overflow, echo, reply
from tests.helpers.llm_scripts import FILLER, KEY, is_summary_request, summarizer_and_echo


async def start(make_config: MakeConfig, fake: FakeOpenAI, **extra: Any) -> RunningGateway:
    config = make_config(
        fake,
        models=extra.pop("models", {"fake-model": {"context_window": 16_000}}),
        context={"recent_turns": 2, **extra.pop("context", {})},
        **extra,
    )
    gateway = Gateway(config)
    rg = RunningGateway(gateway)
    await gateway.start()
    return rg


def chat_requests(fake: FakeOpenAI) -> list[dict[str, Any]]:
    return [b for b in fake.requests if not is_summary_request(b)]


async def test_long_chat_triggers_compaction_and_the_next_call_carries_it(
    make_config: MakeConfig,
) -> None:
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        rg = await start(make_config, fake)
        try:
            await rg.ask("Remember ticket ORD-1042 and host db.internal:5432. " + FILLER)
            for i in range(6):
                await rg.ask(f"message {i} " + FILLER)
            await rg.ask("what is the status of ORD-1042?")
            assert any(is_summary_request(b) for b in fake.requests), "compaction ran"
            last = chat_requests(fake)[-1]["messages"]
            systems = [m["content"] for m in last if m["role"] == "system"]
            summary = next(s for s in systems if s.startswith(REFERENCE_HEADER))
            assert "ORD-1042" in summary and "db.internal:5432" in summary
            assert "Never reveal secrets" in summary, "AGENTS.md red lines ride along"
            assert last[-1]["content"] == "what is the status of ORD-1042?"
            users = [m["content"] for m in last if m["role"] == "user"]
            assert len(users) >= 2, "recent turns are kept verbatim"
            shown = await show_session(rg.gateway.config, KEY, show_all=True)
            assert shown is not None
            assert shown.messages[0].message.text.startswith("Remember ticket ORD-1042")
            assert shown.messages[0].compacted is True
            assert shown.compactions[0].quality["identifier_retention"] == 1.0
        finally:
            await rg.gateway.stop()


async def test_compact_command_and_uncompact(make_config: MakeConfig) -> None:
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        rg = await start(make_config, fake, models={"fake-model": {"context_window": 100_000}})
        try:
            for i in range(5):
                await rg.ask(f"note {i}: ORD-{2000 + i} " + FILLER)
            [answer] = await rg.ask("/compact keep the order numbers")
            assert answer.startswith("Compacted the conversation")
            merge = [b for b in fake.requests if is_summary_request(b)][-1]
            assert "keep the order numbers" in merge["messages"][-1]["content"]
            shown = await show_session(rg.gateway.config, KEY)
            assert shown is not None and shown.summary
            assert all(m["content"] != "/compact keep the order numbers" for m in
                       chat_requests(fake)[-1]["messages"])
            await rg.ask("after compaction")
            sent = chat_requests(fake)[-1]["messages"]
            assert any((m["content"] or "").startswith(REFERENCE_HEADER) for m in sent)
        finally:
            await rg.gateway.stop()
        undone = await uncompact_session(rg.gateway.config, KEY)
        assert undone.undone is not None
        shown = await show_session(rg.gateway.config, KEY)
        assert shown is not None and shown.summary is None
        assert shown.messages[0].message.text.startswith("note 0: ORD-2000 word0")


async def test_compact_that_would_not_shrink_the_prompt_is_refused(make_config: MakeConfig) -> None:
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        rg = await start(make_config, fake, models={"fake-model": {"context_window": 100_000}})
        try:
            for i in range(4):
                await rg.ask(f"note {i}")
            [answer] = await rg.ask("/compact")
            assert answer.startswith("Not compacted: the compacted prompt")
            assert "would not be smaller" in answer
            shown = await show_session(rg.gateway.config, KEY)
            assert shown is not None and shown.summary is None
            assert shown.messages[0].message.content == "note 0"
        finally:
            await rg.gateway.stop()


async def test_provider_overflow_compacts_and_retries(make_config: MakeConfig) -> None:
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        rg = await start(make_config, fake, models={"fake-model": {"context_window": 100_000}})
        try:
            for i in range(5):
                await rg.ask(f"fact {i} " + FILLER)
            fake.script(context_overflow(8192, 9000))
            [answer] = await rg.ask("and now?")
            assert answer == "echo: and now?"
            assert any(is_summary_request(b) for b in fake.requests)
        finally:
            await rg.gateway.stop()


async def test_overflow_that_never_clears_is_explained(make_config: MakeConfig) -> None:
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        rg = await start(
            make_config, fake, models={"fake-model": {"context_window": 100_000}},
            context={"overflow_retries": 1},
        )
        try:
            for i in range(5):
                await rg.ask(f"fact {i}")

            def always_overflow(body: dict[str, Any]) -> Any:
                return summarizer_and_echo(body) if is_summary_request(body) else context_overflow()

            fake.default = always_overflow
            [answer] = await rg.ask("and now?")
            assert "no longer fits model 'fake-model'" in answer
            assert "100,000-token window" in answer
        finally:
            await rg.gateway.stop()


async def test_failed_summarizer_falls_back_and_cools_down(make_config: MakeConfig) -> None:
    def broken(body: dict[str, Any]) -> Any:
        return reply("") if is_summary_request(body) else echo(body)

    async with FakeOpenAI(default=broken) as fake:
        rg = await start(make_config, fake)
        try:
            for i in range(8):
                await rg.ask(f"We decided plan {i}. " + FILLER)
            session = await rg.gateway.store.get_session(KEY)
            assert session is not None and session.id is not None
            rows = await rg.gateway.store.compactions(session.id)
            assert rows and rows[0].quality["fallback"] == "extractive"
            assert session.compaction_cooldown_until is not None
        finally:
            await rg.gateway.stop()
