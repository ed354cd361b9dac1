"""Chat commands and compaction notices on Telegram: the real python-telegram-bot against the
fake Bot API, inside a real Gateway (fake OpenAI, SQLite)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from channels.commands import CHAT_COMMANDS
from channels.telegram import TelegramChannel
from gateway.app import Gateway
from gateway.turn.notices import COMPACTING
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram, entity
from tests.helpers.llm_scripts import FILLER, is_summary_request, summarizer_and_echo

GROUP = -1001234567890


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


@pytest.fixture
async def llm() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        yield fake


@pytest.fixture
async def gateway(
    llm: FakeOpenAI, make_config: MakeConfig, tg: FakeTelegram
) -> AsyncIterator[Gateway]:
    config = make_config(
        llm,
        models={"fake-model": {"context_window": 16_000}},
        context={"recent_turns": 2},
        channels={"telegram": {
            "enabled": True, "token": tg.token, "base_url": tg.base_url, "dm_policy": "open",
            "group_allowlist": [str(GROUP)],
        }},
    )
    gw = Gateway(config)
    gw.add_channel(TelegramChannel(config.channels.telegram))
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop(grace=2)


def _to(chat_id: int) -> Callable[[dict[str, Any]], bool]:
    return lambda params: params.get("chat_id") == chat_id


async def test_the_command_menu_is_set_at_start(gateway: Gateway, tg: FakeTelegram) -> None:
    [call] = await tg.wait_for_call("setMyCommands")
    assert call["commands"] == [
        {"command": c.name, "description": c.description} for c in CHAT_COMMANDS
    ]


async def test_commands_typed_in_a_dm_and_a_group_are_answered_without_the_model(
    gateway: Gateway, tg: FakeTelegram, llm: FakeOpenAI
) -> None:
    asked = tg.private_message(7, "/status")
    [status] = await tg.wait_for_call("sendMessage", where=_to(7))
    assert "Model:" in status["text"] and "Context:" in status["text"]
    assert "▓" in status["text"] or "░" in status["text"]
    assert status["reply_parameters"]["message_id"] == asked["message"]["message_id"]

    tg.group_message(GROUP, 9, "just chatting, not to the bot")  # stored as context
    handle = f"@{tg.bot_username}"
    text = f"/help{handle}"
    tg.group_message(GROUP, 8, text, entities=[entity(text, text, "bot_command")])
    [help_] = await tg.wait_for_call("sendMessage", where=_to(GROUP))
    assert all(f"/{c.name}" in help_["text"] for c in CHAT_COMMANDS)
    assert llm.requests == [], "neither the commands nor the chatter they brought along"


async def test_a_compaction_is_announced_in_the_chat(
    gateway: Gateway, tg: FakeTelegram, llm: FakeOpenAI
) -> None:
    for i in range(8):
        tg.private_message(7, f"message {i} ORD-{i} " + FILLER)
        await tg.wait_for_call("sendMessage", n=i + 1, where=lambda p: p.get("chat_id") == 7
                               and str(p.get("text", "")).startswith("echo:"))
        if any(is_summary_request(b) for b in llm.requests):
            break
    else:
        raise AssertionError("no compaction")
    texts = [p["text"] for p in tg.calls_to("sendMessage") if p.get("chat_id") == 7]
    started = texts.index(COMPACTING)
    assert texts[started + 1].startswith("Compacted ") and "quality" in texts[started + 1]
    assert texts[started + 2].startswith("echo: message"), "then the reply"
    notices = [p for p in tg.calls_to("sendMessage") if p.get("text") == COMPACTING]
    assert "reply_parameters" not in notices[0], "a notice answers no message"
