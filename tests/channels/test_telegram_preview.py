"""Streamed previews on Telegram: real PTB against the fake Bot API, the fake model streaming."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from channels.base import InboundMessage, InboundResult, OutboundMessage
from channels.formatting import TELEGRAM_LIMIT
from channels.telegram import TelegramChannel, markdown_to_telegram_html
from gateway.app import Gateway
from gateway.config import Config, TelegramSettings
from tests.channels.previews import (
    CHUNK_DELAY,
    StartGateway,
    assert_spaced,
    gateways,
    long_reply,
    preview_settings,
    streamed_reply,
)
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI, error, reply, tool_call
from tests.fakes.telegram_server import Call, FakeTelegram

USER = 7



@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


@pytest.fixture
async def start_gateway(
    fake_llm: FakeOpenAI, make_config: MakeConfig, tg: FakeTelegram
) -> AsyncIterator[StartGateway]:
    """Start a gateway with a Telegram channel; keyword arguments go to [channels.telegram]."""
    connection = {"token": tg.token, "base_url": tg.base_url}

    def build(config: Config) -> TelegramChannel:
        return TelegramChannel(config.channels.telegram)

    async with gateways(fake_llm, make_config, "telegram", connection, build) as start:
        yield start


def _outbound(tg: FakeTelegram) -> list[Call]:
    return [c for c in tg.calls if c.method in ("sendMessage", "editMessageText")]


def _is_html(params: dict[str, Any]) -> bool:
    return params.get("parse_mode") == "HTML"


async def test_streamed_reply_is_one_preview_edited_then_formatted(
    start_gateway: StartGateway, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    gateway = await start_gateway(**preview_settings())
    answer = streamed_reply()
    fake_llm.script(reply(answer))
    question = tg.private_message(USER, "tell me")
    await tg.wait_for_call("editMessageText", where=_is_html)
    await gateway.lanes.join()

    # [llm] stream is off in this config: a turn with a preview streams anyway.
    assert fake_llm.requests[-1]["stream"] is True
    calls = _outbound(tg)
    preview, *edits, final = calls
    assert preview.method == "sendMessage"
    assert preview.params.get("parse_mode") is None  # plain while streaming
    assert preview.params["reply_parameters"]["message_id"] == question["message"]["message_id"]
    assert len(edits) >= 1
    assert all(e.method == "editMessageText" and e.params.get("parse_mode") is None for e in edits)
    assert_spaced([c.at for c in [preview, *edits]])
    shown = [preview.params["text"], *(e.params["text"] for e in edits)]
    assert all(answer.startswith(text) for text in shown)  # the text so far, raw Markdown
    assert len(set(shown)) == len(shown)  # every edit shows something new

    assert final.method == "editMessageText" and _is_html(final.params)
    message_id = preview_id = int(final.params["message_id"])
    assert all(int(e.params["message_id"]) == preview_id for e in edits)
    assert final.params["text"] == markdown_to_telegram_html(answer)
    assert tg.bot_messages[(USER, message_id)]["text"] == markdown_to_telegram_html(answer)


async def test_long_reply_edits_the_preview_into_chunk_one_and_sends_the_rest(
    start_gateway: StartGateway, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    gateway = await start_gateway(**preview_settings())
    answer = long_reply(TELEGRAM_LIMIT + 1_500)
    fake_llm.chunk_delay = 0.01
    fake_llm.script(reply(answer))
    tg.private_message(USER, "a long one please")
    await tg.wait_for_call("editMessageText", where=_is_html)
    await tg.wait_for_call("sendMessage", n=2)
    await gateway.lanes.join()

    _preview, *rest = _outbound(tg)
    finals = [c for c in rest if _is_html(c.params)]
    assert [c.method for c in finals] == ["editMessageText", "sendMessage"]
    first, second = (c.params["text"] for c in finals)
    assert len(first) <= TELEGRAM_LIMIT and len(second) <= TELEGRAM_LIMIT
    assert first.startswith("<b>Long</b> answer: w000-")
    assert answer.endswith(second.rsplit(" ", 1)[-1])
    assert "reply_parameters" not in finals[1].params  # only the first chunk is the reply
    plain = [c.params["text"] for c in rest if not _is_html(c.params)]
    assert all(len(text) <= TELEGRAM_LIMIT for text in plain)  # a preview fits one message


async def test_preview_off_is_a_single_send(
    start_gateway: StartGateway, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    gateway = await start_gateway(llm={"stream": True}, dm_policy="open")
    answer = streamed_reply(20)
    fake_llm.script(reply(answer))
    tg.private_message(USER, "no preview please")
    [sent] = await tg.wait_for_call("sendMessage")
    await gateway.lanes.join()

    assert fake_llm.requests[-1]["stream"] is True
    assert [c.method for c in _outbound(tg)] == ["sendMessage"]
    assert sent["parse_mode"] == "HTML"
    assert sent["text"] == markdown_to_telegram_html(answer)


async def test_a_deleted_preview_does_not_lose_the_reply(
    start_gateway: StartGateway, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    gateway = await start_gateway(**preview_settings())
    answer = streamed_reply()
    fake_llm.script(reply(answer))
    tg.private_message(USER, "tell me")
    [preview] = await tg.wait_for_call("sendMessage")
    [(chat_id, preview_id)] = tg.bot_messages
    tg.forget_message(chat_id, preview_id)  # the user deleted the preview

    [final] = await tg.wait_for_call("sendMessage", where=_is_html)
    await gateway.lanes.join()
    assert final["text"] == markdown_to_telegram_html(answer)
    assert final["reply_parameters"] == preview["reply_parameters"]
    # The failed edits stopped after PreviewStream.max_failures; the final edit was tried once.
    assert 1 <= len(tg.calls_to("editMessageText")) <= 4


async def test_tool_round_then_answer_replaces_the_preview(
    start_gateway: StartGateway, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    gateway = await start_gateway(**preview_settings())
    thinking = "Let me check the clock for you before I answer that."
    answer = streamed_reply(20)
    fake_llm.script(tool_call("current_time", {"timezone": "UTC"}, content=thinking), reply(answer))
    tg.private_message(USER, "what time is it?")
    [final] = await tg.wait_for_call("editMessageText", where=_is_html)
    await gateway.lanes.join()

    assert final["text"] == markdown_to_telegram_html(answer)
    [preview] = tg.calls_to("sendMessage")
    assert thinking.startswith(preview["text"])
    shown = [p["text"] for p in tg.calls_to("editMessageText") if not _is_html(p)]
    assert shown and answer.startswith(shown[-1])  # the second call's text replaced the first


async def test_error_notice_replaces_the_preview(
    start_gateway: StartGateway, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    gateway = await start_gateway(**preview_settings())
    thinking = "Let me check the clock for you before I answer that."
    fake_llm.script(tool_call("current_time", {"timezone": "UTC"}, content=thinking), error(400))
    tg.private_message(USER, "what time is it?")
    await tg.wait_for_call("sendMessage")
    await gateway.lanes.join()

    [preview] = tg.calls_to("sendMessage")
    final = tg.calls_to("editMessageText")[-1]
    assert "rejected the request (400)" in final["text"]
    assert tg.bot_messages[(USER, int(final["message_id"]))]["text"] == final["text"]
    assert thinking.startswith(preview["text"])


# -- the adapter's preview calls on their own ---------------------------------------------------


@pytest.fixture
async def channel(tg: FakeTelegram) -> AsyncIterator[TelegramChannel]:
    async def ignore(message: InboundMessage) -> InboundResult:
        return InboundResult(session_key=None, accepted=False)

    ch = TelegramChannel(TelegramSettings(enabled=True, token=tg.token, base_url=tg.base_url))
    await ch.start(ignore)
    try:
        yield ch
    finally:
        await ch.stop()


def _message(text: str, **extra: Any) -> OutboundMessage:
    return OutboundMessage(platform="telegram", chat_id=str(USER), text=text, session_key="k", **extra)


@pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")  # PTB's own warning
async def test_a_rate_limited_edit_is_waited_out(tg: FakeTelegram, channel: TelegramChannel) -> None:
    channel.max_retry_wait = 0.01  # Telegram asks for 30 s; the cap keeps the test short
    preview_id = await channel.send_preview(_message("**half** written"))
    tg.rate_limit("editMessageText", retry_after=30)
    await channel.edit(str(USER), preview_id, "**half** written, more")
    edits = tg.calls_to("editMessageText")
    assert [e["text"] for e in edits] == ["**half** written, more"] * 2
    assert tg.bot_messages[(USER, int(preview_id))]["text"] == "**half** written, more"


async def test_the_same_text_again_is_not_an_error(
    tg: FakeTelegram, channel: TelegramChannel
) -> None:
    preview_id = await channel.send_preview(_message("unchanged"))
    await channel.edit(str(USER), preview_id, "unchanged")  # Telegram: "message is not modified"
    assert len(tg.calls_to("editMessageText")) == 1
    # The final reply renders to the same visible text and no tags: not modified, and done.
    await channel.send(_message("unchanged", preview_id=preview_id))
    assert [e.get("parse_mode") for e in tg.calls_to("editMessageText")] == [None, "HTML"]
    assert len(tg.calls_to("sendMessage")) == 1  # not mistaken for a failed edit


async def test_html_refused_in_the_final_edit_falls_back_to_plain(
    tg: FakeTelegram, channel: TelegramChannel
) -> None:
    preview_id = await channel.send_preview(_message("**x** &"))
    tg.fail_next["editMessageText"] = (400, "Bad Request: can't parse entities: unsupported tag")
    await channel.send(_message("**x** & y", preview_id=preview_id))
    html_edit, plain_edit = tg.calls_to("editMessageText")
    assert html_edit["parse_mode"] == "HTML"
    assert "parse_mode" not in plain_edit and plain_edit["text"] == "**x** & y"
    assert len(tg.calls_to("sendMessage")) == 1


async def test_a_reply_sent_after_a_restart_still_replaces_its_preview(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    fake_llm.chunk_delay = CHUNK_DELAY
    section = {"enabled": True, "token": tg.token, "base_url": tg.base_url, **preview_settings()}
    config = make_config(fake_llm, channels={"telegram": section})
    first = Gateway(config)
    first.add_channel(TelegramChannel(config.channels.telegram))
    first.delivery.retry_delays = ()
    await first.start()
    answer = streamed_reply()
    fake_llm.script(reply(answer))

    def refuse_after_the_preview(call: Call) -> None:
        if call.method in ("sendMessage", "editMessageText") and tg.calls_to("sendMessage"):
            tg.fail_next[call.method] = (500, "Internal Server Error")  # Telegram is down

    try:
        tg.on_call = refuse_after_the_preview
        tg.private_message(USER, "tell me")
        [preview] = await tg.wait_for_call("sendMessage")
        await first.lanes.join()  # the final edit and the fallback send were both refused
    finally:
        await first.stop(grace=2)
    [(chat_id, preview_id)] = tg.bot_messages
    tg.on_call = None
    sends = len(tg.calls_to("sendMessage"))

    again = Gateway(config)
    again.add_channel(TelegramChannel(config.channels.telegram))
    again.delivery.shared_grace = 0.0  # PostgreSQL: no other process could be sending it now
    await again.start()
    try:
        _refused, final = await tg.wait_for_call(
            "editMessageText", n=2, where=lambda p: _is_html(p) and p["message_id"] == preview_id
        )
        assert final["text"] == markdown_to_telegram_html(answer)
        assert len(tg.calls_to("sendMessage")) == sends  # the preview became the reply
        assert preview["chat_id"] == chat_id
        assert tg.bot_messages[(chat_id, preview_id)]["parse_mode"] == "HTML"
    finally:
        await again.stop(grace=2)
