"""The Slack adapter driven through the real slack-bolt / slack-sdk against a fake Slack."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from slack_sdk.errors import SlackApiError

from channels.base import InboundMessage, InboundResult, OutboundMessage
from channels.formatting import SLACK_LIMIT
from channels.settings import SlackSettings
from channels.slack import SlackChannel, markdown_to_mrkdwn, slack_chunks
from tests.fakes.slack_server import (
    BOT_USER_ID,
    FakeSlack,
    app_mention,
    bot_message,
    channel_message,
    event_callback,
    events_api_envelope,
    im_message,
    message_changed,
    message_deleted,
    signed_headers,
    url_verification,
    user_profile,
)

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
FIXTURES = Path(__file__).parent / "fixtures"


class Collector:
    """An ``on_message`` handler that records what it gets and lets a test wait for it."""

    def __init__(self) -> None:
        self.messages: list[InboundMessage] = []
        self._cond = asyncio.Condition()

    async def __call__(self, msg: InboundMessage) -> InboundResult:
        async with self._cond:
            self.messages.append(msg)
            self._cond.notify_all()
        return InboundResult(session_key="k", accepted=True)

    async def wait_for(self, n: int = 1, timeout: float = 5.0) -> list[InboundMessage]:  # noqa: ASYNC109
        async with asyncio.timeout(timeout), self._cond:
            await self._cond.wait_for(lambda: len(self.messages) >= n)
        return self.messages[:n]


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


@pytest.fixture
def collector() -> Collector:
    return Collector()


@pytest.fixture
async def socket_channel(fake: FakeSlack, collector: Collector) -> AsyncIterator[SlackChannel]:
    channel = SlackChannel(
        SlackSettings(bot_token="xoxb-test", app_token="xapp-test", base_url=fake.api_url)
    )
    await channel.start(collector)
    yield channel
    await channel.stop()


@pytest.fixture
async def http_channel(fake: FakeSlack, collector: Collector) -> AsyncIterator[SlackChannel]:
    channel = SlackChannel(
        SlackSettings(
            mode="http", bot_token="xoxb-test", signing_secret=SECRET, base_url=fake.api_url
        )
    )
    await channel.start(collector)
    yield channel
    await channel.stop()


@pytest.fixture
async def http(
    http_channel: SlackChannel,
) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = web.Application()
    http_channel.add_routes(app)
    async with TestClient(TestServer(app)) as client:
        yield client


async def deliver_all(
    fake: FakeSlack,
    channel: SlackChannel,
    collector: Collector,
    events: list[dict[str, Any]],
    expected: int,
) -> list[InboundMessage]:
    """Push events over Socket Mode, wait for every ack and ``expected`` messages, then stop the
    channel (which waits for in-flight handlers) so nothing more can arrive."""
    ids = [fake.push_event(event) for event in events]
    for envelope_id in ids:
        await fake.wait_for_ack(envelope_id)
    await collector.wait_for(expected)
    await channel.stop()
    return collector.messages


# -- configuration -------------------------------------------------------------------------


def test_missing_credentials_are_explained() -> None:
    with pytest.raises(ValueError, match="bot_token"):
        SlackChannel(SlackSettings(app_token="xapp-1"))
    with pytest.raises(ValueError, match="app_token"):
        SlackChannel(SlackSettings(bot_token="xoxb-1"))
    with pytest.raises(ValueError, match="signing_secret"):
        SlackChannel(SlackSettings(bot_token="xoxb-1", mode="http"))
    SlackChannel(SlackSettings(bot_token="xoxb-1", mode="http", signing_secret="s"))


def test_capabilities() -> None:
    caps = SlackChannel.capabilities
    assert (caps.max_message_chars, caps.threads, caps.edits, caps.typing) == (
        SLACK_LIMIT,
        True,
        True,
        False,
    )
    assert SlackChannel.name == "slack"


async def test_bad_app_token_fails_start(fake: FakeSlack, collector: Collector) -> None:
    fake.fail("apps.connections.open", "invalid_auth")
    channel = SlackChannel(
        SlackSettings(bot_token="xoxb-test", app_token="xapp-bad", base_url=fake.api_url)
    )
    with pytest.raises(SlackApiError, match="invalid_auth"):
        await channel.start(collector)
    await channel.stop()
    assert fake.connections == 0


# -- Socket Mode inbound ---------------------------------------------------------------------


async def test_socket_mode_dm(
    fake: FakeSlack, socket_channel: SlackChannel, collector: Collector
) -> None:
    assert socket_channel.bot_user_id == BOT_USER_ID
    await fake.wait_for_call("auth.test")
    assert fake.calls[0].token == "xoxb-test"
    [opened] = [c for c in fake.calls if c.method == "apps.connections.open"]
    assert opened.token == "xapp-test"
    assert fake.sent[0]["type"] == "hello"

    event = im_message(
        "hello &amp; <welcome> &lt;3", user="U42", profile=user_profile("Ada Lovelace")
    )
    envelope_id = fake.push_event(event)
    ack = await fake.wait_for_ack(envelope_id)
    assert ack == {"envelope_id": envelope_id}
    [msg] = await collector.wait_for(1)

    assert msg.platform == "slack"
    assert msg.chat_type == "direct"
    assert msg.chat_id == "D0000DM01"
    assert msg.sender_id == "U42"
    assert msg.sender_name == "ada"
    assert msg.text == "hello & <welcome> <3"
    assert msg.platform_message_id == event["ts"]
    assert msg.timestamp == float(event["ts"])
    assert msg.thread_id is None and msg.reply_to is None
    assert msg.was_mentioned is False


async def test_app_mention_strips_mention(
    fake: FakeSlack, socket_channel: SlackChannel, collector: Collector
) -> None:
    fake.push_event(app_mention(f"<@{BOT_USER_ID}> what's  the weather?", user="U7"))
    [msg] = await collector.wait_for(1)
    assert msg.chat_type == "channel"
    assert msg.chat_id == "C0000CHAN1"
    assert msg.was_mentioned is True
    assert msg.text == "what's the weather?"
    assert msg.sender_id == "U7"


async def test_plain_channel_message_is_not_a_mention(
    fake: FakeSlack, socket_channel: SlackChannel, collector: Collector
) -> None:
    fake.push_event(channel_message("just chatting", profile=user_profile("Grace Hopper", "")))
    fake.push_event(channel_message("in a group dm", channel="G0000MPIM", channel_type="mpim"))
    first, second = await collector.wait_for(2)
    by_text = {m.text: m for m in (first, second)}
    plain = by_text["just chatting"]
    assert plain.chat_type == "channel"
    assert plain.was_mentioned is False
    assert plain.sender_name == "Grace Hopper"  # empty display_name falls back to real_name
    assert by_text["in a group dm"].chat_type == "group"


@pytest.mark.parametrize("mention_first", [True, False])
async def test_mention_delivered_as_message_and_app_mention_is_handled_once(
    fake: FakeSlack, socket_channel: SlackChannel, collector: Collector, mention_first: bool
) -> None:
    ts = "1767225600.000100"
    text = f"hey <@{BOT_USER_ID}> summarize this"
    pair = [app_mention(text, ts=ts), channel_message(text, ts=ts)]
    if not mention_first:
        pair.reverse()
    sentinel = channel_message("after")
    messages = await deliver_all(fake, socket_channel, collector, [*pair, sentinel], expected=2)
    assert len(messages) == 2
    [mention] = [m for m in messages if m.platform_message_id == ts]
    assert mention.was_mentioned is True  # whichever copy came first
    assert mention.text == "hey summarize this"


async def test_thread_reply_keeps_thread(
    fake: FakeSlack, socket_channel: SlackChannel, collector: Collector
) -> None:
    parent = "1767225600.000001"
    fake.push_event(app_mention(f"<@{BOT_USER_ID}> and this?", thread_ts=parent))
    [msg] = await collector.wait_for(1)
    assert msg.thread_id == parent
    assert msg.reply_to == parent

    await socket_channel.send(
        OutboundMessage(
            platform="slack",
            chat_id=msg.chat_id,
            text="in the thread",
            session_key="k",
            thread_id=msg.thread_id,
            reply_to=msg.platform_message_id,
        )
    )
    [post] = await fake.wait_for_call("chat.postMessage")
    assert post["channel"] == "C0000CHAN1"
    assert post["thread_ts"] == parent
    assert post["text"] == "in the thread"


async def test_own_and_other_bot_messages_and_edits_are_ignored(
    fake: FakeSlack, socket_channel: SlackChannel, collector: Collector
) -> None:
    ignored = [
        bot_message("my own reply"),
        bot_message("another bot", bot_id="B0THER", user="U0THERBOT"),
        channel_message("from the bot user", user=BOT_USER_ID),
        message_changed("edited text"),
        message_deleted(),
        channel_message("<@U42> has joined the channel", user="U42", subtype="channel_join"),
        channel_message("", user="U42"),
        {  # an event type the adapter doesn't use: still acked, so Slack doesn't retry it
            "type": "reaction_added",
            "user": "U42",
            "reaction": "eyes",
            "item": {"type": "message", "channel": "C0000CHAN1", "ts": "1767225600.000001"},
            "event_ts": "1767225600.000002",
        },
    ]
    sentinel = channel_message("a person talking", user="U42")
    messages = await deliver_all(fake, socket_channel, collector, [*ignored, sentinel], expected=1)
    assert [m.text for m in messages] == ["a person talking"]


async def test_file_share_becomes_attachment(
    fake: FakeSlack, socket_channel: SlackChannel, collector: Collector
) -> None:
    files = [
        {
            "id": "F1",
            "name": "plan.pdf",
            "mimetype": "application/pdf",
            "size": 1234,
            "url_private": "https://files.slack.com/files-pri/T1-F1/plan.pdf",
        }
    ]
    fake.push_event(im_message("", subtype="file_share", files=files))
    [msg] = await collector.wait_for(1)
    assert msg.text == ""
    assert msg.attachments == (
        {
            "id": "F1",
            "name": "plan.pdf",
            "mimetype": "application/pdf",
            "size": 1234,
            "url": "https://files.slack.com/files-pri/T1-F1/plan.pdf",
        },
    )


# -- outbound -----------------------------------------------------------------------------


async def test_long_reply_is_chunked_with_balanced_fences(
    fake: FakeSlack, socket_channel: SlackChannel
) -> None:
    prose = "\n\n".join(f"Paragraph {i}: " + "words " * 60 for i in range(10))
    code = "\n".join(f"    value_{i} = compute({i})  # step {i}" for i in range(140))
    text = f"{prose}\n\n```python\n{code}\n```\n\nDone."
    assert len(text) >= 9_000
    await socket_channel.send(
        OutboundMessage(platform="slack", chat_id="D0000DM01", text=text, session_key="k")
    )
    posts = fake.calls_to("chat.postMessage")
    assert len(posts) >= 3
    for post in posts:
        assert len(post["text"]) <= SLACK_LIMIT
        assert post["channel"] == "D0000DM01"
        assert "thread_ts" not in post
        fences = [line for line in post["text"].split("\n") if line.lstrip().startswith("```")]
        assert len(fences) % 2 == 0, post["text"]
    # The code block was split and re-opened in each chunk (mrkdwn fences carry no language tag).
    assert sum(p["text"].startswith("```\n") for p in posts) >= 2
    assert not any("```python" in p["text"] for p in posts)
    joined = "\n".join(p["text"] for p in posts)
    assert "value_0 = compute(0)" in joined and "value_139 = compute(139)" in joined
    assert joined.rstrip().endswith("Done.")


async def test_web_api_calls_share_one_connection_until_stop(
    fake: FakeSlack, collector: Collector
) -> None:
    channel = SlackChannel(
        SlackSettings(bot_token="xoxb-test", app_token="xapp-test", base_url=fake.api_url)
    )
    await channel.start(collector)
    for text in ("one", "two", "three"):
        await channel.send(
            OutboundMessage(platform="slack", chat_id="D0000DM01", text=text, session_key="k")
        )
    session = channel.client.session
    await channel.stop()
    # slack_sdk alone opens a new session, so a new TCP connection, for every call.
    peers = {call.peer for call in fake.calls if call.method in ("auth.test", "chat.postMessage")}
    assert len(peers) == 1
    assert session is not None and session.closed and channel.client.session is None


async def test_outbound_text_is_escaped(fake: FakeSlack, socket_channel: SlackChannel) -> None:
    await socket_channel.send(
        OutboundMessage(platform="slack", chat_id="C1", text="if a < b && b > c", session_key="k")
    )
    [post] = fake.calls_to("chat.postMessage")
    assert post["text"] == "if a &lt; b &amp;&amp; b &gt; c"


async def test_escaping_never_pushes_a_chunk_over_the_limit(
    fake: FakeSlack, socket_channel: SlackChannel
) -> None:
    text = "<&> " * 2_500
    await socket_channel.send(
        OutboundMessage(platform="slack", chat_id="C1", text=text, session_key="k")
    )
    posts = fake.calls_to("chat.postMessage")
    assert all(len(p["text"]) <= SLACK_LIMIT for p in posts)
    assert sum(p["text"].count("&amp;") for p in posts) == 2_500


# -- HTTP mode ----------------------------------------------------------------------------


def _event_body(event: dict[str, Any]) -> str:
    return json.dumps(event_callback(event))


async def test_http_signed_event_reaches_handler(
    http: TestClient[web.Request, web.Application], collector: Collector
) -> None:
    body = _event_body(im_message("over http", user="U9"))
    response = await http.post("/slack/events", data=body, headers=signed_headers(SECRET, body))
    assert response.status == 200
    [msg] = await collector.wait_for(1)  # bolt acked first; the listener runs after
    assert (msg.chat_type, msg.sender_id, msg.text) == ("direct", "U9", "over http")


async def test_http_forged_signature_is_rejected(
    http: TestClient[web.Request, web.Application], collector: Collector
) -> None:
    body = _event_body(im_message("forged"))
    headers = signed_headers("not-the-secret", body)
    response = await http.post("/slack/events", data=body, headers=headers)
    assert response.status == 401

    tampered = _event_body(im_message("tampered"))
    headers = signed_headers(SECRET, body)
    response = await http.post("/slack/events", data=tampered, headers=headers)
    assert response.status == 401

    ok = _event_body(im_message("genuine"))
    response = await http.post("/slack/events", data=ok, headers=signed_headers(SECRET, ok))
    assert response.status == 200
    await collector.wait_for(1)
    assert [m.text for m in collector.messages] == ["genuine"]


async def test_http_stale_timestamp_is_rejected(
    http: TestClient[web.Request, web.Application], collector: Collector
) -> None:
    body = _event_body(im_message("replayed"))
    headers = signed_headers(SECRET, body, timestamp=int(time.time()) - 6 * 60)
    response = await http.post("/slack/events", data=body, headers=headers)
    assert response.status == 401
    assert collector.messages == []


async def test_http_url_verification(http: TestClient[web.Request, web.Application]) -> None:
    body = json.dumps(url_verification("challenge-123"))
    response = await http.post("/slack/events", data=body, headers=signed_headers(SECRET, body))
    assert response.status == 200
    assert (await response.json())["challenge"] == "challenge-123"


async def test_http_before_start_is_unavailable(fake: FakeSlack) -> None:
    channel = SlackChannel(
        SlackSettings(mode="http", bot_token="xoxb-t", signing_secret=SECRET, base_url=fake.api_url)
    )
    app = web.Application()
    channel.add_routes(app)
    async with TestClient(TestServer(app)) as client:
        body = _event_body(im_message("too early"))
        response = await client.post(
            "/slack/events", data=body, headers=signed_headers(SECRET, body)
        )
        assert response.status == 503



DEEP_JSON = "[" * 50_000 + "]" * 50_000


def _no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    assert all(r.exc_info is None for r in caplog.records)
    assert "Traceback" not in caplog.text


def _lines(caplog: pytest.LogCaptureFixture) -> int:
    """Log lines a request left (the test server's access log aside: the gateway has none)."""
    return sum(r.levelno >= logging.INFO and r.name != "aiohttp.access" for r in caplog.records)


@pytest.mark.parametrize(
    ("body", "ctype"),
    [
        ('{"event": ' + DEEP_JSON + "}", "application/json"),
        (DEEP_JSON, "application/json"),
        ("payload=" + DEEP_JSON, "application/x-www-form-urlencoded"),
        ("{not json", "application/json"),
    ],
    ids=["deep-object", "deep-array", "deep-form-payload", "malformed"],
)
async def test_http_unsigned_bodies_are_refused_before_they_are_parsed(
    http: TestClient[web.Request, web.Application],
    collector: Collector,
    caplog: pytest.LogCaptureFixture,
    body: str,
    ctype: str,
) -> None:
    caplog.set_level(logging.INFO)
    for headers in (
        {"Content-Type": ctype},  # unsigned
        {**signed_headers("not-the-secret", body), "Content-Type": ctype},
        {**signed_headers(SECRET, body), "Content-Type": ctype, "X-Slack-Request-Timestamp": "x"},
        {**signed_headers(SECRET, body), "Content-Type": ctype, "X-Slack-Signature": "v0=\u00e9"},
    ):
        caplog.clear()
        response = await http.post("/slack/events", data=body.encode(), headers=headers)
        assert response.status == 401, headers
        _no_traceback(caplog)
        assert _lines(caplog) == 1
    assert collector.messages == []


@pytest.mark.parametrize(
    ("body", "ctype"),
    [
        ('{"event": ' + DEEP_JSON + "}", "application/json"),
        ("payload=" + DEEP_JSON, "application/x-www-form-urlencoded"),
        ("{not json", "application/json"),
        ('{"type": "event_callback", "event": ' + "[" * 200 + "]" * 200 + "}", "application/json"),
    ],
    ids=["deep-object", "deep-form-payload", "malformed", "deep-but-parseable"],
)
async def test_http_signed_malformed_bodies_are_a_400_not_a_500(
    http: TestClient[web.Request, web.Application],
    collector: Collector,
    caplog: pytest.LogCaptureFixture,
    body: str,
    ctype: str,
) -> None:
    caplog.set_level(logging.INFO)
    headers = {**signed_headers(SECRET, body), "Content-Type": ctype}
    response = await http.post("/slack/events", data=body.encode(), headers=headers)
    assert response.status == 400
    _no_traceback(caplog)
    assert _lines(caplog) == 1
    assert collector.messages == []

# -- Markdown -> mrkdwn ----------------------------------------------------------------------

MRKDWN_GOLDENS = [
    ("**bold** and __also bold__", "*bold* and *also bold*"),
    ("*italic* and _italic_", "_italic_ and _italic_"),
    ("~~gone~~", "~gone~"),
    ("use `a < b && c`", "use `a &lt; b &amp;&amp; c`"),
    ("***both***", "_*both*_"),
    ("[the docs](https://example.com/a?b=1&c=2)", "<https://example.com/a?b=1&amp;c=2|the docs>"),
    ("see <https://example.com>", "see <https://example.com>"),
    ("[**bold link**](https://x.io)", "<https://x.io|*bold link*>"),
    ("# Title\n\n## Sub **x**\n\nbody", "*Title*\n\n*Sub x*\n\nbody"),
    ("- one\n- two **2**\n  - nested", "• one\n• two *2*\n    • nested"),
    ("3. three\n4. four", "3. three\n4. four"),
    ("* star item\n+ plus item", "• star item\n\n• plus item"),
    ("```python\nif a < b and **x**:\n    pass\n```", "```\nif a &lt; b and **x**:\n    pass\n```"),
    ("    indented code", "```\nindented code\n```"),
    ("> quoted\n> text", "> quoted\n> text"),
    ("a\n\n---\n\nb", "a\n\n———\n\nb"),
    ("line one\nline two", "line one\nline two"),
    ("if a < b && b > c", "if a &lt; b &amp;&amp; b &gt; c"),
    ("<!channel> <@U123> <b>hi</b>", "&lt;!channel&gt; &lt;@U123&gt; &lt;b&gt;hi&lt;/b&gt;"),
    ("already &amp; escaped", "already &amp; escaped"),
    ("snake_case_name and 2*3*4", "snake_case_name and 2_3_4"),
    ("", ""),
]


@pytest.mark.parametrize(("markdown", "mrkdwn"), MRKDWN_GOLDENS)
def test_markdown_to_mrkdwn(markdown: str, mrkdwn: str) -> None:
    assert markdown_to_mrkdwn(markdown) == mrkdwn


def test_slack_chunks_convert_each_markdown_chunk() -> None:
    para = "**word** " * 500  # ~4500 chars of Markdown, ~3500 once converted
    chunks = slack_chunks(f"{para}\n\n{para}")
    assert len(chunks) >= 2
    assert all(len(c) <= SLACK_LIMIT for c in chunks)
    assert all("**" not in c for c in chunks)
    assert sum(c.count("*word*") for c in chunks) == 1000


def test_slack_chunks_resplit_when_escaping_grows_a_chunk() -> None:
    chunks = slack_chunks("a & b " * 1_300)  # every chunk grows by 4 chars per "&"
    assert all(len(c) <= SLACK_LIMIT for c in chunks)
    assert sum(c.count("&amp;") for c in chunks) == 1_300
    assert not any("&amp;amp;" in c for c in chunks)


async def test_send_posts_mrkdwn(fake: FakeSlack, socket_channel: SlackChannel) -> None:
    text = (
        "## Result\n\nThe **build** is _green_; see [the log](https://ci.example.com/1?x=1&y=2)."
        "\n\n- step `a<b`\n- ~~old~~ new\n\n```sh\nmake test && echo ok\n```"
    )
    await socket_channel.send(
        OutboundMessage(platform="slack", chat_id="C1", text=text, session_key="k")
    )
    [post] = fake.calls_to("chat.postMessage")
    assert post["text"] == (
        "*Result*\n\nThe *build* is _green_; see <https://ci.example.com/1?x=1&amp;y=2|the log>."
        "\n\n• step `a&lt;b`\n• ~old~ new\n\n```\nmake test &amp;&amp; echo ok\n```"
    )


# -- rate limits ------------------------------------------------------------------------------


async def test_reply_arrives_after_a_429(fake: FakeSlack, socket_channel: SlackChannel) -> None:
    fake.rate_limit("chat.postMessage", retry_after=0)
    await socket_channel.send(
        OutboundMessage(platform="slack", chat_id="C1", text="after the limit", session_key="k")
    )
    statuses = [c.status for c in fake.calls if c.method == "chat.postMessage"]
    assert statuses == [429, 200]
    [post] = fake.calls_to("chat.postMessage")
    assert post["text"] == "after the limit"


async def test_rate_limit_retries_are_bounded(
    fake: FakeSlack, socket_channel: SlackChannel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK sleeps Retry-After plus up to 1s of jitter; drop the jitter to keep this fast.
    monkeypatch.setattr(
        "slack_sdk.http_retry.builtin_async_handlers.random", SimpleNamespace(random=lambda: 0.0)
    )
    fake.rate_limit("chat.postMessage", retry_after=0, times=10)
    with pytest.raises(SlackApiError, match="ratelimited"):
        await socket_channel.send(
            OutboundMessage(platform="slack", chat_id="C1", text="never", session_key="k")
        )
    assert len([c for c in fake.calls if c.method == "chat.postMessage"]) == 4  # 1 + 3 retries


# -- malformed payloads -------------------------------------------------------------------------

MALFORMED_EVENTS: list[Any] = [
    {k: v for k, v in im_message("no channel").items() if k != "channel"},
    {k: v for k, v in im_message("no user").items() if k != "user"},
    {**im_message("x"), "text": 42},
    {**im_message("x"), "text": {"rich": "text"}},
    {**im_message("x"), "ts": 1767225600.5},
    {**im_message("x"), "user": ["U1"]},
    {**im_message("x"), "channel": None},
    {**im_message("x"), "user_profile": "Ada"},
    {**im_message("x"), "files": "plan.pdf"},
    {**im_message("x"), "subtype": ["file_share"]},
    {**app_mention(f"<@{BOT_USER_ID}> hi"), "text": None, "user": None},
]


async def test_malformed_socket_events_are_ignored(
    fake: FakeSlack,
    socket_channel: SlackChannel,
    collector: Collector,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="channels.slack")
    ids = [fake.push_event(event) for event in MALFORMED_EVENTS]
    # Envelopes with no event at all, an event that is not an object, or a payload that is not
    # an event_callback.
    body_without_event = event_callback(im_message("x"))
    del body_without_event["event"]
    ids.append(fake.push_envelope(events_api_envelope(body_without_event)))
    ids.append(fake.push_envelope(events_api_envelope({**event_callback({}), "event": "junk"})))
    ids.append(fake.push_envelope(events_api_envelope({"type": "event_callback"})))
    good = im_message("still alive", user="U42")
    messages = await deliver_all(fake, socket_channel, collector, [good], expected=1)
    for envelope_id in ids:
        assert any(a.get("envelope_id") == envelope_id for a in fake.acks)
    assert [m.text for m in messages] == ["still alive"]
    assert sum("malformed" in r.getMessage() for r in caplog.records) >= len(MALFORMED_EVENTS)


async def test_malformed_http_events_are_ignored(
    http: TestClient[web.Request, web.Application],
    collector: Collector,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="channels.slack")
    bodies = [_event_body(event) for event in MALFORMED_EVENTS]
    bodies.append(json.dumps({**event_callback({}), "event": "junk"}))
    bodies.append(json.dumps({"type": "event_callback"}))
    bodies.append("[1, 2, 3]")
    for body in bodies:
        response = await http.post("/slack/events", data=body, headers=signed_headers(SECRET, body))
        assert response.status < 500, body
    ok = _event_body(im_message("genuine", user="U9"))
    response = await http.post("/slack/events", data=ok, headers=signed_headers(SECRET, ok))
    assert response.status == 200
    [msg] = await collector.wait_for(1)
    assert msg.text == "genuine"
    assert [m.text for m in collector.messages] == ["genuine"]
    assert sum("malformed" in r.getMessage() for r in caplog.records) >= len(MALFORMED_EVENTS)


# -- golden payload fixtures -----------------------------------------------------------------

FIXTURE_FILES = sorted(FIXTURES.glob("slack_*.json"))


def test_fixtures_exist() -> None:
    assert len(FIXTURE_FILES) >= 5


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.stem)
def test_fixture_normalization(path: Path) -> None:
    data = json.loads(path.read_text())
    channel = SlackChannel(SlackSettings(bot_token="xoxb-test", app_token="xapp-test"))
    channel._identify(BOT_USER_ID, "BBOT0001")
    msg = channel.normalize(data["event"])
    assert msg is not None
    actual = asdict(msg)
    actual["attachments"] = list(actual["attachments"])
    expected = data["expected"]
    assert set(expected) == {f.name for f in fields(InboundMessage)}
    assert actual == expected
