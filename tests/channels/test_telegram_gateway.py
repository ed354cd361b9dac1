"""The Telegram channel inside a real Gateway: fake Bot API + fake OpenAI, real PTB and store."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from channels.base import OutboundMessage
from channels.telegram import TelegramChannel
from gateway.app import Gateway
from gateway.store import Store
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI, reply
from tests.fakes.telegram_server import FakeTelegram, entity

GROUP = -1001234567890


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


@pytest.fixture
async def gateway(
    fake_llm: FakeOpenAI, make_config: MakeConfig, tg: FakeTelegram
) -> AsyncIterator[Gateway]:
    config = make_config(
        fake_llm,
        channels={"telegram": {"enabled": True, "token": tg.token, "base_url": tg.base_url}},
    )
    gw = Gateway(config)
    gw.add_channel(TelegramChannel(config.channels.telegram))
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop(grace=2)


def open_dms(tg: FakeTelegram) -> dict[str, Any]:
    """The channels section of a gateway that answers anyone's DMs on the fake."""
    return {
        "telegram": {
            "enabled": True, "token": tg.token, "base_url": tg.base_url, "dm_policy": "open"
        }
    }


def _to(chat_id: int) -> Callable[[dict[str, Any]], bool]:
    return lambda params: params.get("chat_id") == chat_id


async def test_pairing_then_answer(
    gateway: Gateway, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    tg.private_message(7, "hello, who are you?")
    [pairing] = await tg.wait_for_call("sendMessage", where=_to(7))
    match = re.search(r"pairing code is (\w+)", pairing["text"])
    assert match, pairing["text"]
    assert fake_llm.requests == []  # nothing reaches the model before approval

    assert await gateway.store.decide_pairing(match.group(1), "approved") is not None
    question = tg.private_message(7, "what is 2+2?")
    sent = await tg.wait_for_call("sendMessage", n=2, where=_to(7))
    answer = sent[1]
    assert answer["parse_mode"] == "HTML"
    assert answer["text"] == "echo: what is 2+2?"
    assert answer["reply_parameters"]["message_id"] == question["message"]["message_id"]
    assert len(fake_llm.requests) == 1


async def test_group_mention_answered_unmentioned_not(
    gateway: Gateway, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    tg.group_message(GROUP, 7, "just chatting among ourselves")
    text = "@gatehouse_bot say hi"
    tg.group_message(GROUP, 8, text, entities=[entity(text, "@gatehouse_bot")])
    [reply] = await tg.wait_for_call("sendMessage", where=_to(GROUP))
    assert "say hi" in reply["text"]
    assert "@gatehouse_bot" not in reply["text"]
    await asyncio.sleep(0.3)  # give a wrong second answer the chance to show up
    assert len(tg.calls_to("sendMessage")) == 1
    assert len(fake_llm.requests) == 1


async def test_redelivered_update_is_answered_once(
    gateway: Gateway, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    text = "@gatehouse_bot count me once"
    update = tg.group_message(GROUP, 7, text, entities=[entity(text, "@gatehouse_bot")])
    # Telegram delivers the same message again (e.g. after a crash before confirmation).
    tg.queue_update({**update, "update_id": update["update_id"] + 1000})
    await tg.wait_for_call("sendMessage", where=_to(GROUP))
    last = update["update_id"] + 1000
    await tg.wait_for_call("getUpdates", where=lambda p: int(p.get("offset") or 0) > last)
    await asyncio.sleep(0.3)
    assert len(tg.calls_to("sendMessage")) == 1
    assert len(fake_llm.requests) == 1


async def test_typing_shows_for_a_slow_turn_only(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    config = make_config(
        fake_llm,
        gateway={"typing_delay_ms": 100},
        channels=open_dms(tg),
    )
    gw = Gateway(config)
    gw.add_channel(TelegramChannel(config.channels.telegram))
    await gw.start()
    try:
        tg.private_message(7, "quick one")
        await tg.wait_for_call("sendMessage", where=_to(7))
        assert tg.calls_to("sendChatAction") == []  # answered within the delay: no flash

        fake_llm.latency = 0.6
        tg.private_message(7, "slow one")
        await tg.wait_for_call("sendMessage", n=2, where=_to(7))
        [action] = tg.calls_to("sendChatAction")
        assert action["chat_id"] == 7 and action["action"] == "typing"
        await asyncio.sleep(0.2)
        assert len(tg.calls_to("sendChatAction")) == 1  # stopped with the turn
    finally:
        await gw.stop(grace=2)


async def test_a_reply_telegram_refused_stays_in_the_outbox_and_is_sent_again(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    config = make_config(
        fake_llm,
        gateway={"pending_sweep_seconds": 0.1},  # PostgreSQL: the sweep is what tries again
        channels=open_dms(tg),
    )
    gw = Gateway(config)
    gw.add_channel(TelegramChannel(config.channels.telegram))
    gw.delivery.retry_delays = (0.05, 0.05)
    gw.delivery.shared_grace = 0.3
    await gw.start()
    try:
        tg.fail_next["sendMessage"] = (500, "Internal Server Error")
        tg.private_message(7, "are you there?")
        failed, resent = await tg.wait_for_call("sendMessage", n=2, where=_to(7))
        assert failed["text"] == resent["text"] == "echo: are you there?"
        await asyncio.sleep(0.5)
        assert len(tg.calls_to("sendMessage")) == 2  # sent once it worked, then never again
        assert len(fake_llm.requests) == 1  # the turn ran once; only the delivery was repeated
    finally:
        await gw.stop(grace=2)
    assert await _undelivered(config.database_url) == []


async def test_a_reply_still_refused_waits_in_the_outbox_for_the_next_start(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    config = make_config(
        fake_llm,
        channels=open_dms(tg),
    )
    gw = Gateway(config)
    gw.add_channel(TelegramChannel(config.channels.telegram))
    gw.delivery.retry_delays = ()
    await gw.start()
    try:
        tg.fail_next["sendMessage"] = (403, "Forbidden: bot was blocked by the user")
        tg.private_message(7, "hello?")
        await tg.wait_for_call("sendMessage", where=_to(7))
        await asyncio.sleep(0.2)
    finally:
        await gw.stop(grace=2)
    [waiting] = await _undelivered(config.database_url)
    assert waiting.text == "echo: hello?" and waiting.chat_id == "7"

    again = Gateway(config)
    again.add_channel(TelegramChannel(config.channels.telegram))
    again.delivery.shared_grace = 0.0  # PostgreSQL: no other process could be sending it now
    await again.start()
    try:
        _refused, sent = await tg.wait_for_call("sendMessage", n=2, where=_to(7))
        assert sent["text"] == "echo: hello?"
    finally:
        await again.stop(grace=2)
    assert await _undelivered(config.database_url) == []
    assert len(fake_llm.requests) == 1


def _long_reply(parts: int) -> str:
    """Markdown that Telegram needs `parts` messages for (paragraphs of ~3,000 characters)."""
    return "\n\n".join(f"Part {n}: " + "word " * 600 for n in range(1, parts + 1))


async def test_a_reply_that_failed_halfway_is_completed_not_repeated(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    config = make_config(
        fake_llm,
        gateway={"pending_sweep_seconds": 0.1},
        channels=open_dms(tg),
    )
    gw = Gateway(config)
    gw.add_channel(TelegramChannel(config.channels.telegram))
    gw.delivery.retry_delays = (0.05,)
    gw.delivery.shared_grace = 0.3
    seen = 0

    def refuse_the_second(call: Any) -> None:
        nonlocal seen
        if call.method == "sendMessage":
            seen += 1
            if seen == 2:  # the second chunk of the reply
                tg.fail_next["sendMessage"] = (502, "Bad Gateway")

    tg.on_call = refuse_the_second
    fake_llm.script(reply(_long_reply(3)))
    await gw.start()
    try:
        tg.private_message(7, "tell me everything")
        calls = await tg.wait_for_call("sendMessage", n=4, where=_to(7))
        await asyncio.sleep(0.5)
        assert len(tg.calls_to("sendMessage")) == 4  # 1, 2 (refused), 2, 3: nothing twice
        texts = [c["text"] for c in calls]
        assert texts[1] == texts[2]
        starts = [t.split(":")[0] for t in (texts[0], texts[2], texts[3])]
        assert starts == ["Part 1", "Part 2", "Part 3"]
        assert calls[0].get("reply_parameters") or calls[0].get("reply_to_message_id")
        assert not (calls[2].get("reply_parameters") or calls[2].get("reply_to_message_id"))
    finally:
        await gw.stop(grace=2)
    assert await _undelivered(config.database_url) == []


async def test_a_reply_refused_every_time_is_given_up_and_kept_for_the_operator(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config(
        fake_llm,
        gateway={"pending_sweep_seconds": 0.1, "delivery_attempts": 3},
        channels=open_dms(tg),
    )
    gw = Gateway(config)
    gw.add_channel(TelegramChannel(config.channels.telegram))
    gw.delivery.retry_delays = (0.05, 0.05, 0.05, 0.05)
    gw.delivery.shared_grace = 0.2
    refusing = True

    def refuse(call: Any) -> None:
        if call.method == "sendMessage" and refusing:
            tg.fail_next["sendMessage"] = (403, "Forbidden: bot was blocked by the user")

    tg.on_call = refuse
    store = Store(config.database_url)  # what `gatehouse outbox` opens beside the gateway
    await gw.start()
    await store.init()
    try:
        tg.private_message(7, "hello?")
        await tg.wait_for_call("sendMessage", n=3, where=_to(7), timeout=10)
        await asyncio.sleep(1.0)
        assert len(tg.calls_to("sendMessage")) == 3  # then given up: no fourth try
        [row] = await store.outbox()
        assert row.attempts == 3 and row.given_up_at is not None
        assert row.last_error is not None and "blocked by the user" in row.last_error
        assert await store.undelivered() == []  # not sent by itself on the next start
        # Each refusal was one line with the platform's words, not a traceback.
        failures = [r for r in caplog.records if r.getMessage().startswith("delivery failed")]
        assert len(failures) == 3
        assert all(r.exc_info is None and "blocked by the user" in r.getMessage()
                   for r in failures)

        refusing = False  # the user unblocked the bot; the operator retries the reply
        assert await store.retry_outbox() == 1
        *_refused, sent = await tg.wait_for_call("sendMessage", n=4, where=_to(7), timeout=10)
        assert sent["text"] == "echo: hello?"  # sent by the running gateway, within its sweep
        await asyncio.sleep(0.5)
        assert len(tg.calls_to("sendMessage")) == 4
    finally:
        await gw.stop(grace=2)
        await store.close()
    assert await _undelivered(config.database_url) == []
    assert len(fake_llm.requests) == 1


async def _undelivered(database_url: str) -> list[OutboundMessage]:
    store = Store(database_url)
    await store.init()
    try:
        return [message for _id, message in await store.undelivered()]
    finally:
        await store.close()
