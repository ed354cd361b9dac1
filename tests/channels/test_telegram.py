"""The Telegram adapter, driven through the real python-telegram-bot against a fake Bot API."""

from __future__ import annotations

import asyncio
import dataclasses
import html
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import test_utils, web
from telegram import Update, User

from channels.base import InboundMessage, InboundResult, OutboundMessage
from channels.formatting import TELEGRAM_LIMIT
from channels.settings import TelegramSettings
from channels.telegram import (
    SECRET_HEADER,
    WEBHOOK_PATH,
    TelegramChannel,
    markdown_to_telegram_html,
    to_inbound,
)
from tests.fakes.telegram_server import FakeTelegram, entity, html_problem

GROUP = -1001234567890


class Collector:
    """An `on_message` handler that records what it got; can be told to fail."""

    def __init__(self, fail: int = 0) -> None:
        self.fail = fail
        self.calls: list[InboundMessage] = []
        self._queue: asyncio.Queue[InboundMessage] = asyncio.Queue()

    async def __call__(self, message: InboundMessage) -> InboundResult:
        self.calls.append(message)
        if self.fail:
            self.fail -= 1
            raise RuntimeError("store is down")
        self._queue.put_nowait(message)
        return InboundResult(session_key="k", accepted=True)

    async def next(self, timeout: float = 5.0) -> InboundMessage:  # noqa: ASYNC109
        return await asyncio.wait_for(self._queue.get(), timeout)


def settings(fake: FakeTelegram, **extra: Any) -> TelegramSettings:
    return TelegramSettings(enabled=True, token=fake.token, base_url=fake.base_url, **extra)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


@pytest.fixture
async def collector() -> Collector:
    return Collector()


@pytest.fixture
async def channel(fake: FakeTelegram, collector: Collector) -> AsyncIterator[TelegramChannel]:
    ch = TelegramChannel(settings(fake))
    await ch.start(collector)
    yield ch
    await ch.stop()


# -- configuration and lifecycle --------------------------------------------------------------


def test_missing_token_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"channels\.telegram\.token"):
        TelegramChannel(TelegramSettings())


def test_webhook_mode_needs_url_and_secret() -> None:
    with pytest.raises(ValueError, match="webhook_url"):
        TelegramChannel(TelegramSettings(token="1:x", mode="webhook", webhook_secret="s"))
    with pytest.raises(ValueError, match="webhook_secret"):
        TelegramChannel(TelegramSettings(token="1:x", mode="webhook", webhook_url="https://x/y"))


def test_capabilities() -> None:
    caps = TelegramChannel.capabilities
    assert caps.max_message_chars == TELEGRAM_LIMIT == 4096
    assert caps.threads and caps.edits and caps.typing
    assert TelegramChannel.name == "telegram"


async def test_polling_start_knows_itself_and_long_polls(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    assert fake.calls_to("getMe")
    assert fake.calls_to("deleteWebhook")  # PTB's bootstrap: no webhook while polling
    [poll] = await fake.wait_for_call("getUpdates", where=lambda p: p.get("timeout", 0) > 0)
    assert poll["allowed_updates"] == ["message"]
    assert channel.me.id == fake.bot_id
    assert channel.me.username == fake.bot_username


async def test_stop_is_quick_with_a_long_poll_pending(fake: FakeTelegram) -> None:
    ch = TelegramChannel(settings(fake))
    await ch.start(Collector())
    await fake.wait_for_call("getUpdates", where=lambda p: p.get("timeout", 0) > 0)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await ch.stop()
    assert loop.time() - began < 1.0
    await ch.stop()  # idempotent


async def test_fake_releases_long_polls_when_it_stops() -> None:
    fake = FakeTelegram()
    await fake.start()
    url = f"{fake.base_url}/bot{fake.token}/getUpdates"
    async with aiohttp.ClientSession() as http:
        poll = asyncio.create_task(http.post(url, data={"timeout": "30"}))
        await fake.wait_for_call("getUpdates")
        loop = asyncio.get_running_loop()
        began = loop.time()
        await fake.stop()
        response = await poll
        assert (await response.json())["result"] == []
        assert loop.time() - began < 1.0


# -- normalization ------------------------------------------------------------------------------


async def test_direct_message(
    fake: FakeTelegram, channel: TelegramChannel, collector: Collector
) -> None:
    update = fake.private_message(7, "hello there", first_name="Ada")
    msg = await collector.next()
    assert msg.platform == "telegram"
    assert msg.chat_type == "direct"
    assert msg.chat_id == "7"
    assert msg.sender_id == "7"
    assert msg.sender_name == "Ada"
    assert msg.text == "hello there"
    assert msg.was_mentioned  # every DM addresses the bot
    assert msg.thread_id is None
    assert msg.reply_to is None
    assert msg.attachments == ()
    assert msg.platform_message_id == str(update["message"]["message_id"])
    assert msg.timestamp == update["message"]["date"]


async def test_a_malformed_name_is_no_name(
    fake: FakeTelegram, channel: TelegramChannel, collector: Collector
) -> None:
    # Found by the fuzzer: PTB keeps whatever the JSON held, so a list became the sender name.
    fake.private_message(7, "hello", first_name=["Ada", -1])
    msg = await collector.next()
    assert msg.sender_name == "user7"  # the username instead
    assert msg.text == "hello"


async def test_group_without_mention(
    fake: FakeTelegram, channel: TelegramChannel, collector: Collector
) -> None:
    fake.group_message(GROUP, 7, "just chatting")
    msg = await collector.next()
    assert msg.chat_type == "group"
    assert msg.chat_id == str(GROUP)
    assert msg.sender_id == "7"
    assert not msg.was_mentioned
    assert msg.text == "just chatting"


async def test_username_mention_is_stripped(
    fake: FakeTelegram, channel: TelegramChannel, collector: Collector
) -> None:
    text = "@gatehouse_bot hi"
    fake.group_message(GROUP, 7, text, entities=[entity(text, "@gatehouse_bot")])
    msg = await collector.next()
    assert msg.was_mentioned
    assert msg.text == "hi"


async def test_mention_of_someone_else_is_kept(
    fake: FakeTelegram, channel: TelegramChannel, collector: Collector
) -> None:
    text = "ask 🙂 @other_bot and @GateHouse_Bot, please"
    fake.group_message(
        GROUP,
        7,
        text,
        entities=[entity(text, "@other_bot"), entity(text, "@GateHouse_Bot")],
    )
    msg = await collector.next()
    assert msg.was_mentioned  # usernames are case-insensitive; offsets are UTF-16
    assert msg.text == "ask 🙂 @other_bot and , please"


async def test_text_mention_entity(
    fake: FakeTelegram, channel: TelegramChannel, collector: Collector
) -> None:
    text = "Gatehouse what time is it?"
    fake.group_message(
        GROUP,
        7,
        text,
        entities=[entity(text, "Gatehouse", "text_mention", user=fake.bot_user())],
    )
    msg = await collector.next()
    assert msg.was_mentioned
    assert msg.text == "what time is it?"


async def test_text_mention_of_another_user_is_not_a_mention(
    fake: FakeTelegram, channel: TelegramChannel, collector: Collector
) -> None:
    text = "Bob what time is it?"
    fake.group_message(
        GROUP, 7, text, entities=[entity(text, "Bob", "text_mention", user=fake.user(9))]
    )
    msg = await collector.next()
    assert not msg.was_mentioned
    assert msg.text == text


async def test_command_addressed_to_the_bot(
    fake: FakeTelegram, channel: TelegramChannel, collector: Collector
) -> None:
    text = "/help@gatehouse_bot now"
    fake.group_message(
        GROUP, 7, text, entities=[entity(text, "/help@gatehouse_bot", "bot_command")]
    )
    msg = await collector.next()
    assert msg.was_mentioned
    assert msg.text == "/help now"


async def test_reply_to_the_bot_is_a_mention(
    fake: FakeTelegram, channel: TelegramChannel, collector: Collector
) -> None:
    update = fake.group_message(GROUP, 7, "and why?", reply_to_bot=True)
    msg = await collector.next()
    assert msg.was_mentioned
    assert msg.reply_to == str(update["message"]["reply_to_message"]["message_id"])


async def test_reply_to_a_person_is_not_a_mention(
    fake: FakeTelegram, channel: TelegramChannel, collector: Collector
) -> None:
    fake.group_message(GROUP, 7, "agreed", reply_to=3)
    msg = await collector.next()
    assert not msg.was_mentioned
    assert msg.reply_to == "3"


async def test_forum_topic_sets_thread_id(
    fake: FakeTelegram, channel: TelegramChannel, collector: Collector
) -> None:
    fake.group_message(GROUP, 7, "in a topic", thread_id=55)
    msg = await collector.next()
    assert msg.chat_type == "group"
    assert msg.thread_id == "55"
    # A plain (non-topic) thread id is ignored: only is_topic_message marks a forum topic.
    fake.group_message(GROUP, 7, "not a topic", message_thread_id=56)
    assert (await collector.next()).thread_id is None


async def test_topic_root_is_not_a_reply(
    fake: FakeTelegram, channel: TelegramChannel, collector: Collector
) -> None:
    root = {
        "message_id": 55,
        "date": 0,
        "chat": {"id": GROUP, "type": "supergroup", "title": "t", "is_forum": True},
        "from": fake.user(7),
        "forum_topic_created": {"name": "Ideas", "icon_color": 7322096},
    }
    fake.group_message(GROUP, 7, "first post", thread_id=55, reply_to=root)
    msg = await collector.next()
    assert msg.thread_id == "55"
    assert msg.reply_to is None
    assert not msg.was_mentioned


async def test_own_edited_and_service_messages_are_ignored(
    fake: FakeTelegram, channel: TelegramChannel, collector: Collector
) -> None:
    fake.group_message(GROUP, fake.bot_id, "my own answer")
    fake.private_message(7, "fixed typo", edited=True)
    fake.group_message(GROUP, 7, None, new_chat_members=[fake.user(8)])
    fake.group_message(GROUP, 7, "the real one")
    msg = await collector.next()
    assert msg.text == "the real one"
    assert [m.text for m in collector.calls] == ["the real one"]


async def test_caption_and_attachments(
    fake: FakeTelegram, channel: TelegramChannel, collector: Collector
) -> None:
    photo = [
        {"file_id": "small", "file_unique_id": "s", "width": 90, "height": 90},
        {"file_id": "large", "file_unique_id": "l", "width": 1280, "height": 1280},
    ]
    caption = "@gatehouse_bot what is this?"
    fake.group_message(
        GROUP,
        7,
        None,
        caption=caption,
        photo=photo,
        entities=[entity(caption, "@gatehouse_bot")],
    )
    msg = await collector.next()
    assert msg.text == "what is this?"
    assert msg.was_mentioned
    assert msg.attachments == ({"type": "photo", "file_id": "large", "name": None},)

    doc = {"file_id": "doc1", "file_unique_id": "d1", "file_name": "report.pdf"}
    fake.private_message(7, None, document=doc)
    msg = await collector.next()
    assert msg.text == ""
    assert msg.attachments == ({"type": "document", "file_id": "doc1", "name": "report.pdf"},)
    assert fake.calls_to("getFile") == []  # never downloaded


# -- delivery guarantee (polling) -----------------------------------------------------------------


async def test_update_is_confirmed_only_after_the_handler_returned(fake: FakeTelegram) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(message: InboundMessage) -> InboundResult:
        entered.set()
        await release.wait()
        return InboundResult(session_key="k", accepted=True)

    ch = TelegramChannel(settings(fake))
    await ch.start(slow)
    try:
        update_id = fake.private_message(7, "persist me")["update_id"]

        def confirms(params: dict[str, Any]) -> bool:
            return bool(int(params.get("offset") or 0) > update_id)

        await asyncio.wait_for(entered.wait(), 5)
        with pytest.raises(TimeoutError):  # the poller is parked while the handler runs
            await fake.wait_for_call("getUpdates", where=confirms, timeout=0.3)
        release.set()
        await fake.wait_for_call("getUpdates", where=confirms)
    finally:
        release.set()
        await ch.stop()


async def test_failed_handler_means_redelivery(fake: FakeTelegram) -> None:
    collector = Collector(fail=1)
    ch = TelegramChannel(settings(fake))
    await ch.start(collector)
    try:
        update = fake.private_message(7, "try again")
        msg = await collector.next()  # PTB's retry loop backs off ~1 s, then refetches
        assert msg.platform_message_id == str(update["message"]["message_id"])
        assert [m.text for m in collector.calls] == ["try again", "try again"]
    finally:
        await ch.stop()


# -- outbound -----------------------------------------------------------------------------------


async def test_long_reply_is_chunked_in_thread(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    asked = fake.group_message(GROUP, 7, "explain", thread_id=55, enqueue=False)
    question_id = asked["message"]["message_id"]
    code = "```python\n" + "\n".join(f"print('line {i:04d}')" for i in range(300)) + "\n```"
    text = ("intro paragraph. " * 40 + "\n\n" + code + "\n\n" + "outro words. " * 400)[:10_000]
    assert len(text) == 10_000
    await channel.send(
        OutboundMessage(
            platform="telegram",
            chat_id=str(GROUP),
            text=text,
            session_key="k",
            thread_id="55",
            reply_to=str(question_id),
        )
    )
    sent = fake.calls_to("sendMessage")
    assert len(sent) >= 3
    for call in sent:
        assert len(call["text"]) <= 4096
        assert call["parse_mode"] == "HTML"
        assert html_problem(call["text"]) is None  # every chunk parses on its own
        assert call["text"].count("<pre>") == call["text"].count("</pre>")
        assert call["message_thread_id"] == 55
        assert call["chat_id"] == GROUP
    assert sent[0]["reply_parameters"]["message_id"] == question_id
    assert all("reply_parameters" not in call for call in sent[1:])
    assert "".join(c["text"] for c in sent).count("line 0299") == 1


async def test_reply_target_gone_sends_without_reply(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    await channel.send(
        OutboundMessage(
            platform="telegram", chat_id="7", text="late answer", session_key="k", reply_to="999"
        )
    )
    first, second = fake.calls_to("sendMessage")
    assert first["reply_parameters"]["message_id"] == 999
    assert "reply_parameters" not in second
    assert second["text"] == "late answer"


async def test_other_bad_requests_propagate(fake: FakeTelegram, channel: TelegramChannel) -> None:
    from telegram.error import BadRequest

    fake.fail_next["sendMessage"] = (400, "Bad Request: chat not found")
    with pytest.raises(BadRequest, match="Chat not found"):
        await channel.send(
            OutboundMessage(platform="telegram", chat_id="1", text="x", session_key="k")
        )


async def test_typing(fake: FakeTelegram, channel: TelegramChannel) -> None:
    await channel.typing(str(GROUP), "55")
    await channel.typing("7", None)
    topic, direct = fake.calls_to("sendChatAction")
    assert topic == {"chat_id": GROUP, "action": "typing", "message_thread_id": 55}
    assert direct == {"chat_id": 7, "action": "typing"}


# -- webhook mode -------------------------------------------------------------------------------


@pytest.fixture
async def webhook(
    fake: FakeTelegram, collector: Collector
) -> AsyncIterator[tuple[TelegramChannel, test_utils.TestClient[web.Request, web.Application]]]:
    ch = TelegramChannel(
        settings(
            fake,
            mode="webhook",
            webhook_url="https://bot.example.org/telegram/webhook",
            webhook_secret="s3cret-Token_1",
        )
    )
    await ch.start(collector)
    app = web.Application()
    ch.add_routes(app)
    client = test_utils.TestClient(test_utils.TestServer(app))
    await client.start_server()
    yield ch, client
    await client.close()
    await ch.stop()


async def test_webhook_start_sets_the_webhook(
    fake: FakeTelegram, webhook: tuple[TelegramChannel, Any]
) -> None:
    [call] = fake.calls_to("setWebhook")
    assert call["url"] == "https://bot.example.org/telegram/webhook"
    assert call["secret_token"] == "s3cret-Token_1"
    assert fake.calls_to("getUpdates") == []  # no updater in webhook mode


async def test_webhook_with_the_right_secret(
    fake: FakeTelegram, collector: Collector, webhook: tuple[TelegramChannel, Any]
) -> None:
    _, client = webhook
    update = fake.private_message(7, "via webhook", enqueue=False)
    response = await client.post(
        WEBHOOK_PATH, json=update, headers={SECRET_HEADER: "s3cret-Token_1"}
    )
    assert response.status == 200
    # 200 is answered only after the handler returned: the message is already there.
    [msg] = collector.calls
    assert msg.text == "via webhook"
    assert msg.chat_type == "direct"


async def test_webhook_answers_only_after_the_handler(fake: FakeTelegram) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(message: InboundMessage) -> InboundResult:
        entered.set()
        await release.wait()
        return InboundResult(session_key="k", accepted=True)

    ch = TelegramChannel(
        settings(fake, mode="webhook", webhook_url="https://x/telegram/webhook", webhook_secret="s")
    )
    await ch.start(slow)
    app = web.Application()
    ch.add_routes(app)
    async with test_utils.TestClient(test_utils.TestServer(app)) as client:
        update = fake.private_message(7, "slow", enqueue=False)
        post = asyncio.create_task(
            client.post(WEBHOOK_PATH, json=update, headers={SECRET_HEADER: "s"})
        )
        await asyncio.wait_for(entered.wait(), 5)
        assert not post.done()
        release.set()
        assert (await post).status == 200
    await ch.stop()


@pytest.mark.parametrize("headers", [{}, {SECRET_HEADER: "wrong"}, {SECRET_HEADER: ""}])
async def test_webhook_rejects_a_wrong_or_missing_secret(
    fake: FakeTelegram,
    collector: Collector,
    webhook: tuple[TelegramChannel, Any],
    headers: dict[str, str],
) -> None:
    _, client = webhook
    update = fake.private_message(7, "forged", enqueue=False)
    response = await client.post(WEBHOOK_PATH, json=update, headers=headers)
    assert response.status == 403
    assert collector.calls == []


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 50_000 + b"]" * 50_000,
        b'{"update_id": 5, "message": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        b'{"update_id": 6, "message": {"x": ' + b"[" * 300 + b"]" * 300 + b"}}",
        b'{"update_id": ' + b"9" * 5_000 + b"}",
        b"\xff\xfe{}",
    ],
    ids=["deep-array", "deep-update", "deep-but-parseable", "huge-integer", "not-utf-8"],
)
async def test_webhook_malformed_bodies_are_a_400_with_one_log_line(
    collector: Collector,
    webhook: tuple[TelegramChannel, Any],
    caplog: pytest.LogCaptureFixture,
    body: bytes,
) -> None:
    _, client = webhook
    caplog.set_level(logging.INFO)
    caplog.clear()
    response = await client.post(WEBHOOK_PATH, data=body, headers={SECRET_HEADER: "wrong"})
    assert response.status == 403, "the secret is checked before the body is read"
    response = await client.post(
        WEBHOOK_PATH, data=body,
        headers={SECRET_HEADER: "s3cret-Token_1", "Content-Type": "application/json"},
    )
    assert response.status == 400
    assert all(r.exc_info is None for r in caplog.records) and "Traceback" not in caplog.text
    lines = [r for r in caplog.records if r.levelno >= logging.INFO and r.name != "aiohttp.access"]
    assert len(lines) == 2, [r.getMessage()[:200] for r in lines]  # one per refused request
    assert collector.calls == []


async def test_webhook_handler_failure_asks_telegram_to_retry(
    fake: FakeTelegram, collector: Collector, webhook: tuple[TelegramChannel, Any]
) -> None:
    _, client = webhook
    collector.fail = 1
    update = fake.private_message(7, "retry me", enqueue=False)
    headers = {SECRET_HEADER: "s3cret-Token_1"}
    assert (await client.post(WEBHOOK_PATH, json=update, headers=headers)).status == 500
    assert (await client.post(WEBHOOK_PATH, json=update, headers=headers)).status == 200
    assert (await client.post(WEBHOOK_PATH, data=b"{not json", headers=headers)).status == 400
    assert (await client.post(WEBHOOK_PATH, json={"update_id": 1}, headers=headers)).status == 200


# -- Markdown -> Telegram HTML ------------------------------------------------------------------

HTML_GOLDENS = [
    (
        "a <script>alert(1)</script> & b",
        "a &lt;script&gt;alert(1)&lt;/script&gt; &amp; b",
    ),
    (
        "**bold** *it* _it_ ~~gone~~ `x<y && z`",
        "<b>bold</b> <i>it</i> <i>it</i> <s>gone</s> <code>x&lt;y &amp;&amp; z</code>",
    ),
    (
        "```python\nif a < b and c & d:\n    **not bold** <i>\n```",
        '<pre><code class="language-python">if a &lt; b and c &amp; d:\n'
        "    **not bold** &lt;i&gt;</code></pre>",
    ),
    ("```\nplain   spaced\n\n  kept\n```", "<pre><code>plain   spaced\n\n  kept</code></pre>"),
    (
        "see [the docs](https://example.com/a?x=1&y=2) now",
        'see <a href="https://example.com/a?x=1&amp;y=2">the docs</a> now',
    ),
    ("[bad](javascript:alert(1))", "[bad](javascript:alert(1))"),
    (
        "# Plan\n\n- one\n- **two**\n  - nested\n\n1. first\n2. second",
        "<b>Plan</b>\n\n• one\n• <b>two</b>\n  • nested\n\n1. first\n2. second",
    ),
    (
        "> wise **words**\n> > deeper\n\nafter",
        "<blockquote>wise <b>words</b>\n\ndeeper</blockquote>\n\nafter",
    ),
    ("line one\nline two", "line one\nline two"),
    ("2 * 3 * 4 and a_b_c", "2 * 3 * 4 and a_b_c"),
]


@pytest.mark.parametrize(("markdown", "expected"), HTML_GOLDENS)
def test_markdown_to_telegram_html(markdown: str, expected: str) -> None:
    rendered = markdown_to_telegram_html(markdown)
    assert rendered == expected
    assert html_problem(rendered) is None


async def test_send_uses_html_parse_mode(fake: FakeTelegram, channel: TelegramChannel) -> None:
    text = "**Hi** <there> & [site](https://example.com)\n\n```sh\necho '<x>'\n```"
    await channel.send(
        OutboundMessage(platform="telegram", chat_id="7", text=text, session_key="k")
    )
    [call] = fake.calls_to("sendMessage")
    assert call["parse_mode"] == "HTML"
    assert call["text"] == (
        '<b>Hi</b> &lt;there&gt; &amp; <a href="https://example.com">site</a>\n\n'
        "<pre><code class=\"language-sh\">echo '&lt;x&gt;'</code></pre>"
    )


async def test_unparseable_html_is_resent_as_plain_text(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    fake.fail_next["sendMessage"] = (400, "Bad Request: can't parse entities: unsupported tag")
    await channel.send(
        OutboundMessage(platform="telegram", chat_id="7", text="**x** & y", session_key="k")
    )
    first, second = fake.calls_to("sendMessage")
    assert first["parse_mode"] == "HTML"
    assert "parse_mode" not in second
    assert second["text"] == "**x** & y"


async def test_html_growing_past_the_limit_is_rechunked(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    text = "a < b & c " * 400  # 4,000 chars of Markdown, ~8,800 once escaped
    await channel.send(
        OutboundMessage(platform="telegram", chat_id="7", text=text, session_key="k")
    )
    sent = fake.calls_to("sendMessage")
    assert len(sent) >= 3
    for call in sent:
        assert call["parse_mode"] == "HTML"
        assert len(call["text"]) <= 4096
        assert html_problem(call["text"]) is None
    joined = html.unescape(" ".join(c["text"] for c in sent))
    assert joined.split() == text.split()


# -- flood control (429) ------------------------------------------------------------------------

# PTB's own RetryAfter constructor warns about its future timedelta type; not ours to fix.
_RETRY_AFTER_WARNING = pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")


@_RETRY_AFTER_WARNING
async def test_429_is_waited_out_and_the_reply_arrives(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    fake.rate_limit("sendMessage", retry_after=1)  # PTB reads 0 as "no retry_after": use 1 s
    loop = asyncio.get_running_loop()
    began = loop.time()
    await channel.send(
        OutboundMessage(platform="telegram", chat_id="7", text="hi", session_key="k")
    )
    assert loop.time() - began >= 0.9  # Telegram's retry_after was honoured
    calls = fake.calls_to("sendMessage")
    assert [c["text"] for c in calls] == ["hi", "hi"]
    assert not fake.rate_limited["sendMessage"]


@_RETRY_AFTER_WARNING
async def test_429_wait_is_capped_and_attempts_bounded(
    fake: FakeTelegram, channel: TelegramChannel
) -> None:
    from telegram.error import RetryAfter

    channel.max_retry_wait = 0.01  # Telegram asks for 30 s; we wait at most the cap
    loop = asyncio.get_running_loop()
    began = loop.time()
    fake.rate_limit("sendMessage", retry_after=30, times=3)
    await channel.send(OutboundMessage(platform="telegram", chat_id="7", text="a", session_key="k"))
    assert loop.time() - began < 2
    assert len(fake.calls_to("sendMessage")) == 4
    channel.send_attempts = 2
    fake.rate_limit("sendMessage", retry_after=1, times=2)
    with pytest.raises(RetryAfter):
        await channel.send(
            OutboundMessage(platform="telegram", chat_id="7", text="b", session_key="k")
        )


# -- malformed payloads -------------------------------------------------------------------------


async def test_malformed_polled_updates_are_skipped(
    fake: FakeTelegram,
    channel: TelegramChannel,
    collector: Collector,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = [
        fake.queue_update({"message": {"message_id": 1, "chat": "not a chat"}}),
        fake.queue_update({"message": {"message_id": "x", "text": 5, "date": "soon"}}),
        fake.queue_update({"something_new": {"x": 1}}),
    ]
    odd = fake.private_message(7, "ok")  # then a readable update with odd fields
    odd["message"]["entities"] = [{"type": "mention", "offset": 99, "length": "?"}]
    fake.updates.append({"update_id": "nope"})
    good = fake.private_message(7, "still here")
    msg = await collector.next()
    assert msg.text == "still here"
    assert [m.text for m in collector.calls] == ["still here"]
    last = good["update_id"]
    await fake.wait_for_call("getUpdates", where=lambda p: int(p.get("offset") or 0) > last)
    assert str(bad[0]["update_id"]) in caplog.text
    assert "unreadable update" in caplog.text


async def test_malformed_webhook_bodies_are_ignored(
    fake: FakeTelegram,
    collector: Collector,
    webhook: tuple[TelegramChannel, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, client = webhook
    headers = {SECRET_HEADER: "s3cret-Token_1"}
    for body in (
        {"hello": "world"},
        [1, 2, 3],
        "a string",
        {"update_id": 9, "message": {"message_id": 1, "chat": 5}},
        {"update_id": 10, "message": {"message_id": 2, "date": 0, "chat": {"id": 1}}},
    ):
        response = await client.post(WEBHOOK_PATH, json=body, headers=headers)
        assert response.status == 200, body
    assert "not an update" in caplog.text
    assert collector.calls == []
    update = fake.private_message(7, "good one", enqueue=False)
    assert (await client.post(WEBHOOK_PATH, json=update, headers=headers)).status == 200
    assert [m.text for m in collector.calls] == ["good one"]


# -- golden fixtures ----------------------------------------------------------------------------

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("telegram_*.json"))
ME = User(id=4242, is_bot=True, first_name="Gatehouse", username="gatehouse_bot")


def test_there_are_golden_fixtures() -> None:
    assert len(FIXTURES) >= 5


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_golden_update(path: Path) -> None:
    data = json.loads(path.read_text())
    update = Update.de_json(data["update"], None)
    assert update.message is not None
    msg = to_inbound(update.message, ME)
    assert msg is not None
    got = dataclasses.asdict(msg)
    got["attachments"] = [dict(a) for a in msg.attachments]
    expected = data["expected"]
    assert {k: got[k] for k in expected} == expected
