"""Issue 20 on every channel: invisible text is empty text, and ids never meet another's.

- A message made only of zero-width characters (U+200B, U+200C, U+200D, U+2060, U+FEFF) is
  treated by each platform normalizer exactly like an empty one.
- `ReplyWaiters` (console, webchat) are keyed by (chat id, message id), the pair the store
  dedupes by: one user's message id never resolves another user's request, and a retry waits for
  the same reply.
- Slack's in-memory dedupe of message/app_mention copies keys by (channel, ts) as a pair, so
  ids holding ``:`` cannot make two messages one.
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import discord
import pytest
from telegram import Update, User

from channels.base import InboundMessage, InboundResult, OutboundMessage, ReplyWaiters, is_blank
from channels.settings import SlackSettings
from channels.slack import SlackChannel
from channels.telegram import to_inbound
from tests.fakes.slack_server import BOT_ID, BOT_USER_ID
from tests.helpers.discord_fixture import fixture_channel as _fixture_channel

FIXTURES = Path(__file__).parent / "fixtures"
ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff"
ME = User(id=4242, is_bot=True, first_name="Gatehouse", username="gatehouse_bot")


def fixture(name: str, key: str) -> dict[str, Any]:
    return copy.deepcopy(json.loads((FIXTURES / name).read_text())[key])


@pytest.mark.parametrize(
    ("text", "blank"),
    [("", True), (" \n\t", True), (ZERO_WIDTH, True), (f" {ZERO_WIDTH} \n", True),
     ("\u200bx", False), ("👩\u200d👩\u200d👧", False), ("\u00a0.", False)],
)
def test_blank_means_nothing_a_person_can_see(text: str, blank: bool) -> None:
    assert is_blank(text) is blank


# -- Telegram -----------------------------------------------------------------------------------


def telegram_message(**fields: Any) -> Any:
    raw = fixture("telegram_private_text.json", "update")
    raw["message"].pop("text")
    raw["message"].update(fields)
    update = Update.de_json(raw, None)
    assert update.message is not None
    return update.message


@pytest.mark.parametrize("text", ["", ZERO_WIDTH, "\u200b \ufeff"])
def test_telegram_zero_width_text_is_ignored_like_an_empty_message(text: str) -> None:
    assert to_inbound(telegram_message(text=text), ME) is None


def test_telegram_zero_width_caption_of_a_photo_is_no_caption() -> None:
    photo = [{"file_id": "p", "file_unique_id": "p1", "width": 9, "height": 9}]
    with_empty = to_inbound(telegram_message(photo=photo), ME)
    with_zero_width = to_inbound(telegram_message(photo=photo, caption=ZERO_WIDTH), ME)
    assert with_empty is not None and with_zero_width is not None
    assert with_zero_width.text == with_empty.text == ""
    assert with_zero_width.attachments == with_empty.attachments


# -- Slack --------------------------------------------------------------------------------------


def slack() -> SlackChannel:
    channel = SlackChannel(SlackSettings(bot_token="xoxb-t", app_token="xapp-t"))
    channel._identify(BOT_USER_ID, BOT_ID)
    return channel


@pytest.mark.parametrize("text", ["", ZERO_WIDTH, f"<@{BOT_USER_ID}> \u200b\u2060"])
def test_slack_zero_width_text_is_ignored_like_an_empty_message(text: str) -> None:
    event = fixture("slack_message_im.json", "event")
    event["text"] = text
    assert slack().normalize(event) is None


@pytest.mark.parametrize("user", ["", "   ", "\u200b"])
def test_slack_blank_user_is_malformed_like_a_missing_one(
    user: str, caplog: pytest.LogCaptureFixture
) -> None:
    event = fixture("slack_message_im.json", "event")
    event["user"] = user
    assert slack().normalize(event) is None
    [line] = [r for r in caplog.records if r.name == "channels.slack"]
    assert "no user" in line.getMessage() and line.exc_info is None


async def test_slack_dedupe_keys_channel_and_ts_as_a_pair() -> None:
    channel = slack()
    got: list[InboundMessage] = []

    async def take(msg: InboundMessage) -> InboundResult:
        got.append(msg)
        return InboundResult("k", accepted=True)

    channel._handler = take
    first = fixture("slack_message_im.json", "event")
    first.update(channel="D1:2", ts="3")
    second = fixture("slack_message_im.json", "event")
    second.update(channel="D1", ts="2:3")  # "D1:2" + ":" + "3" == "D1" + ":" + "2:3"
    await channel._dispatch(first)
    await channel._dispatch(second)
    await channel._dispatch(copy.deepcopy(first))  # the app_mention copy: still dropped
    assert [(m.chat_id, m.platform_message_id) for m in got] == [("D1:2", "3"), ("D1", "2:3")]


# -- Discord ------------------------------------------------------------------------------------


@pytest.mark.parametrize("content", ["", ZERO_WIDTH, "<@1180381729134280724> \u200b"])
def test_discord_zero_width_content_is_ignored_like_an_empty_message(content: str) -> None:
    payload = fixture("discord_dm.json", "message")
    payload["content"] = content
    chan, state = _fixture_channel()
    parsed: list[discord.Message] = []
    state.dispatch = lambda event, *args: parsed.append(args[0]) if event == "message" else None
    state.parse_message_create(payload)
    [message] = parsed
    assert chan.normalize(message) is None


# -- reply waiters (console, webchat) ---------------------------------------------------------


def reply_to(chat_id: str, *ids: str, text: str = "reply") -> OutboundMessage:
    return OutboundMessage("webchat", chat_id, text, "k", reply_to=ids[-1], answers=ids)


async def test_waiters_are_scoped_to_the_chat_that_sent_the_id() -> None:
    waiters = ReplyWaiters()
    alice = waiters.expect("alice", "shared-1")
    bob = waiters.expect("bob", "shared-1")
    waiters.resolve(reply_to("alice", "shared-1", text="the secret"))
    assert alice.result() == ["the secret"]
    assert not bob.done()
    waiters.resolve(reply_to("bob", "shared-1", text="hi bob"))
    assert bob.result() == ["hi bob"]


async def test_every_request_waiting_for_one_message_gets_its_reply() -> None:
    waiters = ReplyWaiters()
    first = waiters.expect("alice", "m-1")
    retry = waiters.expect("alice", "m-1")
    waiters.forget("alice", "m-1", retry)  # a retry that gave up leaves the first waiting
    again = waiters.expect("alice", "m-1")
    waiters.resolve(reply_to("alice", "m-0", "m-1"))
    assert first.result() == again.result() == ["reply"]
    assert not retry.done()


async def test_a_reply_that_went_elsewhere_is_found_in_the_store() -> None:
    """A message answered by a reply addressed to another chat (a shared session) or sent by
    another process: the waiter finds the stored reply instead of waiting for the timeout."""
    stored: dict[tuple[str, str], list[str]] = {}

    async def lookup(chat_id: str, message_id: str) -> list[str] | None:
        return stored.get((chat_id, message_id))

    waiters = ReplyWaiters(lookup, poll_interval=0.05)
    future = waiters.expect("alice", "m-1")
    waiting = asyncio.create_task(waiters.wait("alice", "m-1", future, within=5))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    stored["alice", "m-1"] = ["from the store"]
    assert await asyncio.wait_for(waiting, 1) == ["from the store"]
    with pytest.raises(TimeoutError):
        await waiters.wait("bob", "m-1", waiters.expect("bob", "m-1"), within=0.2)
