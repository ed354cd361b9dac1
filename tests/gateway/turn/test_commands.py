"""The chat commands (`/status`, `/context`, `/new`, `/reset`, `/compact`, `/help`) through a real
Gateway: webchat and console channels, the real openai SDK against the fake server, SQLite."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from channels.base import InboundMessage
from channels.commands import CHAT_COMMANDS, parse_command
from gateway.app import Gateway
from gateway.operations import session_explanation, show_session, uncompact_session
from gateway.operations.chat import meter
from gateway.turn.history import COMMAND_STATUS
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import FakeOpenAI, Reply, last_user_text
from tests.helpers.llm_scripts import FILLER, KEY, is_summary_request, summarizer_and_echo


async def start(make_config: MakeConfig, fake: FakeOpenAI, **extra: Any) -> RunningGateway:
    config = make_config(
        fake,
        models=extra.pop("models", {"fake-model": {"context_window": 100_000}}),
        context={"recent_turns": 2, **extra.pop("context", {})},
        **extra,
    )
    gateway = Gateway(config)
    rg = RunningGateway(gateway)
    await gateway.start()
    return rg


def chats(fake: FakeOpenAI) -> list[dict[str, Any]]:
    return [b for b in fake.requests if not is_summary_request(b)]


def number(text: str, pattern: str) -> int:
    found = re.search(pattern, text)
    assert found is not None, f"{pattern!r} not in {text!r}"
    return int(found[1].replace(",", ""))


def test_parsing() -> None:
    assert [c.name for c in CHAT_COMMANDS] == ["status", "context", "new", "compact", "help"]
    for text, name, arg in [
        ("/status", "status", ""), ("  /context ", "context", ""), ("/new", "new", ""),
        ("/reset", "new", ""), ("/RESET", "new", ""), ("/help", "help", ""),
        ("/compact keep ORD-1", "compact", "keep ORD-1"), ("/compact\nfocus", "compact", "focus"),
        ("/status please", "status", ""),
    ]:
        found = parse_command(text)
        assert found is not None and (found[0].name, found[1]) == (name, arg), text
    for text in ["/statuses", "please /new", "/", "status", "/unknown", "/new-topic"]:
        assert parse_command(text) is None, text
    assert parse_command([{"type": "text", "text": "/new"}]) is None
    assert meter(41, 100) == "▓▓▓▓░░░░░░ 41%"
    assert meter(1, 1000) == "▓░░░░░░░░░ 0%"
    assert meter(0, 100) == "░░░░░░░░░░ 0%"
    assert meter(250, 100).startswith("▓" * 10)


async def test_help_on_webchat_and_console_without_the_model(make_config: MakeConfig) -> None:
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        rg = await start(make_config, fake)
        try:
            [web] = await rg.ask("/help")
            _key, [console] = await rg.console.ask("/help")
            for answer in (web, console):
                for c in CHAT_COMMANDS:
                    assert f"/{c.name}" in answer
                assert "/reset" in answer
            assert fake.requests == [], "a command never calls the model"
            shown = await show_session(rg.gateway.config, KEY, show_all=True)
            assert shown is not None
            statuses = [(m.message.role, m.status) for m in shown.messages]
            assert statuses == [("user", COMMAND_STATUS), ("assistant", COMMAND_STATUS)], (
                "stored like every message, and hidden from the model"
            )
        finally:
            await rg.gateway.stop()


async def test_status_reads_the_numbers_context_explain_prints(make_config: MakeConfig) -> None:
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        rg = await start(make_config, fake, context={"history_limit": 7})
        try:
            for i in range(3):
                await rg.ask(f"note {i}: ORD-{100 + i} " + FILLER)
            [status] = await rg.ask("/status")
            facts = await session_explanation(rg.gateway, KEY, fetch_metadata=False)
            assert facts is not None and facts.plan is not None
            plan = facts.plan
            assert f"Model: `{plan.model}`, window {plan.window:,} tokens" in status
            assert plan.window_source in status
            used, usable = plan.tokens.calibrated_total, plan.compaction_threshold
            assert f"{meter(used, usable)}: {used:,} of {usable:,} usable tokens" in status
            assert f"History limit: last 7 user turns ({plan.history_limit_source})" in status
            assert "[context] history_limit" in plan.history_limit_source
            assert number(status, r"memory flush in ([\d,]+) tokens") == plan.to_flush
            assert f"then compaction at {usable:,}" in status
            assert "Last compaction: none yet" in status
            # Stored before its own answer was: one message fewer than now.
            assert f"Messages: {facts.stored_messages - 1:,} stored, " in status
            assert f"{facts.messages_in_prompt:,} in the next prompt" in status
            assert facts.prompt_cache is not None
            assert f"Prompt cache: {facts.prompt_cache.describe()}" in status
            assert len(chats(fake)) == 3, "the command did not reach the model"

            [compacted] = await rg.ask("/compact")
            assert compacted.startswith("Compacted the conversation")
            [status] = await rg.ask("/status")
            facts = await session_explanation(rg.gateway, KEY, fetch_metadata=False)
            assert facts is not None and facts.last_compaction is not None
            last = facts.last_compaction
            assert (
                f"Last compaction: messages {last.first_seq}–{last.last_seq}, "
                f"{last.tokens_before:,} → {last.tokens_after:,} tokens; quality" in status
            )
            assert "sections 5/5" in status
        finally:
            await rg.gateway.stop()


async def test_context_shows_each_part_against_its_share(make_config: MakeConfig) -> None:
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        rg = await start(make_config, fake)
        try:
            await rg.ask("hello " + FILLER)
            _key, [answer] = await rg.console.ask("/context")
            console_key = "agent:main:console:direct:tester"
            facts = await session_explanation(rg.gateway, console_key, fetch_metadata=False)
            assert facts is not None and facts.plan is not None
            assert "nothing" not in answer
            [answer] = await rg.ask("/context")
            facts = await session_explanation(rg.gateway, KEY, fetch_metadata=False)
            assert facts is not None and facts.plan is not None
            t, caps = facts.plan.tokens, {b.name: b.tokens for b in facts.plan.budget}
            assert number(answer, r"Next prompt: ([\d,]+) tokens") == t.prompt
            assert f"of {facts.plan.compaction_threshold:,} usable" in answer
            for part, value, cap in [
                ("system", t.system, caps["system prompt share"]),
                ("summary", t.summary, caps["summary share"]),
                ("history", t.history, caps["history share"]),
                ("tool results", t.tool_results, caps["tool results share"]),
            ]:
                line = next(x for x in answer.splitlines() if x.startswith(f"- {part}:"))
                assert line.startswith(f"- {part}: {value or 0:,} of {cap:,} ("), line
                assert meter(value or 0, cap) in line
            assert (t.history or 0) > 1_000, "the earlier message is in the history"
            assert f"- tool schemas: {t.tools or 0:,} tokens" in answer
        finally:
            await rg.gateway.stop()


async def test_new_starts_a_fresh_context_and_uncompact_undoes_it(
    make_config: MakeConfig,
) -> None:
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        rg = await start(make_config, fake)
        try:
            await rg.ask("remember ORD-5150")
            await rg.ask("and host db01")
            [answer] = await rg.ask("/new")
            assert answer.startswith("Started a fresh context: the 4 earlier messages")
            assert f"gatehouse sessions uncompact {KEY}" in answer
            [again] = await rg.ask("/reset")
            assert again.startswith("Already a fresh context")
            await rg.ask("what did I ask you to remember?")
            sent = chats(fake)[-1]["messages"]
            assert [m["role"] for m in sent] == ["system", "user"]
            assert "ORD-5150" not in str(sent), "nothing before /new is sent"
            shown = await show_session(rg.gateway.config, KEY, show_all=True)
            assert shown is not None
            assert shown.messages[0].message.content == "remember ORD-5150", "nothing deleted"
            assert shown.messages[0].compacted

            undone = await uncompact_session(rg.gateway.config, KEY)  # what the CLI runs
            assert undone.undone is not None
            await rg.ask("and now?")
            sent = chats(fake)[-1]["messages"]
            users = [m["content"] for m in sent if m["role"] == "user"]
            assert users[:2] == ["remember ORD-5150", "and host db01"]
            assert users[-1] == "and now?"
            assert not any(str(u).startswith("/") for u in users), "commands stay hidden"
        finally:
            await rg.gateway.stop()


async def test_a_status_with_nothing_said_yet(make_config: MakeConfig) -> None:
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        rg = await start(make_config, fake)
        try:
            [new] = await rg.ask("/new")
            assert new.startswith("Already a fresh context")
            [status] = await rg.ask("/status")
            assert "Last compaction: none yet" in status
            assert fake.requests == []
        finally:
            await rg.gateway.stop()


async def test_messages_collected_around_a_new_in_one_turn(make_config: MakeConfig) -> None:
    """Sent while the agent was busy: what came before `/new` is answered first, in the context
    it was sent in (its turn stops before the `/new`), the commands run in order, what came
    after is answered in the fresh context, and the `/new` says what was answered first."""
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        rg = await start(make_config, fake)
        try:
            await rg.ask("old topic ORD-1")
            async with rg.gateway.hold_lane(KEY):  # the agent is busy: these wait together
                for i, text in enumerate(["forget this", "/status", "/new", "fresh question"]):
                    await rg.gateway.handle_inbound(InboundMessage(
                        platform="webchat", chat_type="direct", chat_id="tester",
                        sender_id="tester", text=text, platform_message_id=f"m{i}",
                    ))
            await rg.gateway.lanes.join()
            before, after = chats(fake)[-2:]
            assert [m["content"] for m in before["messages"] if m["role"] == "user"] == [
                "old topic ORD-1", "forget this",
            ], "answered in the context it was sent in"
            assert [m["content"] for m in after["messages"] if m["role"] != "system"] == [
                "fresh question"
            ]
            shown = await show_session(rg.gateway.config, KEY, show_all=True)
            assert shown is not None
            replies = [m for m in shown.messages if m.message.role == "assistant"][-2:]
            status, answer = replies[0].message.text.split("\n\n")
            assert status.startswith("Model: ") and answer == "echo: forget this"
            new, answer = replies[1].message.text.split("\n\n")
            assert new.startswith(
                "Your message sent before /new was answered first, in the earlier context. "
                "Started a fresh context: the 4 earlier messages"
            ), new
            assert answer == "echo: fresh question"
            assert [m.status for m in replies] == [None, None], "replies the model's answer is in"
            session = await rg.gateway.store.get_session(KEY)
            assert session is not None and session.id is not None
            assert not await rg.gateway.store.has_pending(session.id)
        finally:
            await rg.gateway.stop()


@pytest.mark.parametrize("mode", ["collect", "followup", "steer", "interrupt"])
async def test_a_new_among_ten_concurrent_messages_leaves_none_unanswered(
    make_config: MakeConfig, mode: str
) -> None:
    """Ten messages at once, the sixth a `/new`, while the agent answers an earlier one: every
    other message reaches the model (answered before or after the boundary, never marked handled
    without it), every request gets its reply, and in the modes that collect, the `/new` says
    that the four before it were answered first."""
    first_call = asyncio.Event()

    async def answer(body: dict[str, Any]) -> Reply:
        if last_user_text(body) == "m0":
            first_call.set()
            await asyncio.sleep(0.5)  # busy: the other nine arrive meanwhile
        asked: list[str] = []
        for m in body["messages"]:
            if m["role"] == "assistant":
                asked = []
            elif m["role"] == "user":
                asked.append(str(m["content"]))
        return Reply("answered " + " ".join(asked))

    async with FakeOpenAI(default=answer) as fake:
        rg = await start(make_config, fake, gateway={"queue_mode": mode})
        try:
            texts = [f"m{i}" for i in range(10)]
            texts[5] = "/new"
            first = asyncio.create_task(rg.webchat.submit("tester", texts[0], "id0"))
            async with asyncio.timeout(10):
                await first_call.wait()
            rest = await asyncio.gather(*(
                rg.webchat.submit("tester", text, f"id{i}")
                for i, text in enumerate(texts[1:], start=1)
            ))
            replies = [await first, *rest]
            assert all(r.accepted and r.replies and r.replies[0] for r in replies), replies
            seen = {
                str(m["content"]) for body in chats(fake) for m in body["messages"]
                if m["role"] == "user"
            }
            assert set(texts) - {"/new"} <= seen, "every message reached the model"
            session = await rg.gateway.store.get_session(KEY)
            assert session is not None and session.id is not None
            assert not await rg.gateway.store.has_pending(session.id)
            [new] = replies[5].replies
            if mode in ("collect", "steer"):
                assert new.startswith(
                    "Your 4 messages sent before /new were answered first, in the earlier "
                    "context. Started a fresh context"
                ), new
            later = chats(fake)[-1]["messages"]
            assert "m4" not in str(later) and "m9" in str(later), "the later ones: fresh context"
        finally:
            await rg.gateway.stop()
