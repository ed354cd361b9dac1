"""The Discord adapter against the real discord.py, talking to a fake Discord over sockets."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import discord.gateway
import discord.http
import pytest

from channels.base import InboundMessage, InboundResult, OutboundMessage
from channels.discord import DiscordChannel, defuse_mass_mentions
from channels.formatting import DISCORD_LIMIT, DISCORD_MAX_LINES
from channels.settings import DiscordSettings
from tests.fakes.discord_server import FakeDiscord
from tests.helpers.discord_fixture import fixture_channel


class Collector:
    """An ``on_message`` handler that records what it got and lets a test wait for it."""

    def __init__(self) -> None:
        self.messages: list[InboundMessage] = []
        self._cond = asyncio.Condition()

    async def __call__(self, message: InboundMessage) -> InboundResult:
        async with self._cond:
            self.messages.append(message)
            self._cond.notify_all()
        return InboundResult(session_key="k", accepted=True)

    async def wait_for(self, n: int = 1, timeout: float = 5.0) -> list[InboundMessage]:  # noqa: ASYNC109
        async with asyncio.timeout(timeout), self._cond:
            await self._cond.wait_for(lambda: len(self.messages) >= n)
        return self.messages[:n]


def settings_for(fake: FakeDiscord, **extra: object) -> DiscordSettings:
    return DiscordSettings(
        enabled=True,
        token=fake.token,
        api_base_url=fake.api_base_url,
        gateway_url=fake.gateway_url,
        **extra,  # type: ignore[arg-type]
    )


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as server:
        yield server


@pytest.fixture
async def collector() -> Collector:
    return Collector()


@pytest.fixture
async def channel(fake: FakeDiscord, collector: Collector) -> AsyncIterator[DiscordChannel]:
    chan = DiscordChannel(settings_for(fake), guild_ready_timeout=0.01, ready_timeout=10)
    await chan.start(collector)
    yield chan
    await chan.stop()


def out(fake: FakeDiscord, text: str, **kw: object) -> OutboundMessage:
    return OutboundMessage(
        platform="discord",
        chat_id=str(kw.pop("chat_id", fake.text_channel_id)),
        text=text,
        session_key="k",
        **kw,  # type: ignore[arg-type]
    )


# -- construction ------------------------------------------------------------------------------


def test_missing_token_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"channels\.discord\.token"):
        DiscordChannel(DiscordSettings())


def test_shard_ids_need_shard_count() -> None:
    with pytest.raises(ValueError, match="shard_count"):
        DiscordChannel(DiscordSettings(token="t", shard_ids=[0]))


def test_capabilities() -> None:
    caps = DiscordChannel.capabilities
    assert caps.max_message_chars == DISCORD_LIMIT == 2000
    assert caps.threads and caps.edits and caps.typing
    assert DiscordChannel.name == "discord"


# -- connecting ----------------------------------------------------------------------------------


async def test_start_logs_in_and_identifies_with_intents(
    fake: FakeDiscord, channel: DiscordChannel
) -> None:
    assert channel.client.user is not None
    assert str(channel.client.user.id) == fake.bot_id
    assert fake.calls_to("GET", "/users/@me")
    [identify] = fake.identifies
    assert identify["token"] == fake.token
    intents = discord.Intents._from_value(identify["intents"])
    assert intents.guilds and intents.guild_messages and intents.dm_messages
    assert intents.message_content
    assert not intents.members and not intents.presences


async def test_bad_token_fails_start_clearly(fake: FakeDiscord, collector: Collector) -> None:
    settings = settings_for(fake)
    settings.token = "wrong"
    chan = DiscordChannel(settings, guild_ready_timeout=0.01, ready_timeout=5)
    with pytest.raises(RuntimeError, match="login failed"):
        await chan.start(collector)
    assert discord.http.Route.BASE == "https://discord.com/api/v10"  # restored


async def test_endpoints_are_restored_after_stop(fake: FakeDiscord, collector: Collector) -> None:
    chan = DiscordChannel(settings_for(fake), guild_ready_timeout=0.01)
    await chan.start(collector)
    assert discord.http.Route.BASE == fake.api_base_url
    assert str(discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY) == fake.gateway_url
    await chan.stop()
    assert discord.http.Route.BASE == "https://discord.com/api/v10"
    assert str(discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY) == "wss://gateway.discord.gg/"


async def test_each_shard_gets_its_own_guilds_and_shard_0_the_dms(collector: Collector) -> None:
    async with FakeDiscord(shard_count=2, guild_shard=1) as fake:
        only_0 = DiscordChannel(
            settings_for(fake, shard_count=2, shard_ids=[0]), guild_ready_timeout=0.01
        )
        await only_0.start(collector)
        try:
            fake.guild_message("for shard 1", mention=True)
            fake.dm_message("for shard 0")
            [dm] = await collector.wait_for(1)
            assert dm.text == "for shard 0"
            await asyncio.sleep(0.2)
            assert len(collector.messages) == 1  # the guild is another process's shard
        finally:
            await only_0.stop()
        both = DiscordChannel(
            settings_for(fake, shard_count=2, shard_ids=[0, 1]), guild_ready_timeout=0.01
        )
        await both.start(collector)
        try:
            [_dm, guild] = await collector.wait_for(2)
            assert guild.text == "for shard 1" and guild.chat_type == "channel"
            assert sorted(i["shard"] for i in fake.identifies[1:]) == [[0, 2], [1, 2]]
        finally:
            await both.stop()


async def test_auto_sharded_client(fake: FakeDiscord, collector: Collector) -> None:
    chan = DiscordChannel(
        settings_for(fake, shard_count=1, shard_ids=[0]), guild_ready_timeout=0.01
    )
    await chan.start(collector)
    try:
        assert isinstance(chan.client, discord.AutoShardedClient)
        assert fake.identifies[0]["shard"] == [0, 1]
        sent = fake.dm_message("sharded hello")
        [msg] = await collector.wait_for(1)
        assert msg.platform_message_id == sent["id"]
    finally:
        await chan.stop()


async def test_stop_closes_promptly(fake: FakeDiscord, collector: Collector) -> None:
    chan = DiscordChannel(settings_for(fake), guild_ready_timeout=0.01)
    await chan.start(collector)
    assert fake.connections == 1
    started = time.monotonic()
    await chan.stop()
    assert time.monotonic() - started < 2.0
    await fake.wait_for_disconnect(timeout=2)
    await chan.stop()  # idempotent


# -- inbound -------------------------------------------------------------------------------------


async def test_dm_is_normalized(
    fake: FakeDiscord, channel: DiscordChannel, collector: Collector
) -> None:
    sent = fake.dm_message("hello there")
    [msg] = await collector.wait_for(1)
    assert msg.platform == "discord"
    assert msg.chat_type == "direct"
    assert msg.chat_id == sent["channel_id"]
    assert msg.sender_id == fake.alice["id"]
    assert msg.sender_name == "Alice A."
    assert msg.text == "hello there"
    assert msg.was_mentioned is True
    assert msg.thread_id is None
    assert msg.platform_message_id == sent["id"]
    assert msg.reply_to is None
    assert msg.timestamp == pytest.approx(time.time(), abs=60)


async def test_guild_mention_is_detected_and_stripped(
    fake: FakeDiscord, channel: DiscordChannel, collector: Collector
) -> None:
    sent = fake.guild_message("what is up?", mention=True)
    [msg] = await collector.wait_for(1)
    assert msg.chat_type == "channel"
    assert msg.chat_id == fake.text_channel_id
    assert msg.sender_id == fake.alice["id"]
    assert msg.was_mentioned is True
    assert msg.text == "what is up?"
    assert msg.platform_message_id == sent["id"]


async def test_nickname_style_mention_is_stripped(
    fake: FakeDiscord, channel: DiscordChannel, collector: Collector
) -> None:
    fake.guild_message(f"hey <@!{fake.bot_id}> look", mentions=[fake.bot_user])
    [msg] = await collector.wait_for(1)
    assert msg.was_mentioned is True
    assert msg.text == "hey look"


async def test_bot_role_mention_counts(
    fake: FakeDiscord, channel: DiscordChannel, collector: Collector
) -> None:
    fake.role_mention_message("ping the role")
    [msg] = await collector.wait_for(1)
    assert msg.was_mentioned is True
    assert msg.text == "ping the role"


async def test_unmentioned_guild_message(
    fake: FakeDiscord, channel: DiscordChannel, collector: Collector
) -> None:
    fake.guild_message(f"talking about <@{fake.bob['id']}>", mentions=[fake.bob])
    [msg] = await collector.wait_for(1)
    assert msg.chat_type == "channel"
    assert msg.was_mentioned is False
    assert msg.text == f"talking about <@{fake.bob['id']}>"


async def test_reply_to_the_bot_counts_as_mention(
    fake: FakeDiscord, channel: DiscordChannel, collector: Collector
) -> None:
    sent = fake.reply_to_bot("and then?")
    [msg] = await collector.wait_for(1)
    assert msg.was_mentioned is True
    assert msg.reply_to == sent["referenced_message"]["id"]
    assert msg.text == "and then?"


async def test_thread_message_keys_on_the_parent_channel(
    fake: FakeDiscord, channel: DiscordChannel, collector: Collector
) -> None:
    fake.thread_message("in the thread", mention=True)
    [msg] = await collector.wait_for(1)
    assert msg.chat_type == "channel"
    assert msg.chat_id == fake.text_channel_id
    assert msg.thread_id == fake.thread_id
    assert msg.was_mentioned is True
    assert msg.text == "in the thread"
    fake.thread_message("no mention here")  # the thread was started by alice, not the bot
    _, plain = await collector.wait_for(2)
    assert (plain.thread_id, plain.was_mentioned) == (fake.thread_id, False)


async def test_own_other_bot_and_system_messages_are_ignored(
    fake: FakeDiscord, channel: DiscordChannel, collector: Collector
) -> None:
    fake.own_message("I said this")
    fake.guild_message("beep", author=fake.other_bot, mention=True)
    fake.guild_message("alice pinned a message", type_=6)  # CHANNEL_PINNED_MESSAGE
    last = fake.dm_message("after the ignored ones")
    [msg] = await collector.wait_for(1)
    # Dispatches are delivered in order, so anything not ignored would have come first.
    assert msg.platform_message_id == last["id"]
    assert len(collector.messages) == 1


async def test_attachments_are_small_dicts(
    fake: FakeDiscord, channel: DiscordChannel, collector: Collector
) -> None:
    attachment = {
        "id": "1234567890123456789",
        "filename": "notes.txt",
        "size": 12,
        "url": "https://cdn.example/notes.txt",
        "proxy_url": "https://media.example/notes.txt",
        "content_type": "text/plain",
    }
    fake.dm_message("", attachments=[attachment])
    [msg] = await collector.wait_for(1)
    assert msg.text == ""
    [att] = msg.attachments
    assert att["filename"] == "notes.txt"
    assert att["url"] == "https://cdn.example/notes.txt"
    assert att["content_type"] == "text/plain"


# -- outbound ------------------------------------------------------------------------------------


async def test_long_reply_is_chunked_with_balanced_fences(
    fake: FakeDiscord, channel: DiscordChannel
) -> None:
    code = "\n".join(f"    line_{i} = {i} * 2  # a comment to make it long" for i in range(60))
    prose = " ".join(["Words of the answer."] * 60)
    text = f"{prose}\n\n```python\n{code}\n```\n\n{prose}"
    assert len(text) >= 5000
    trigger = "1234567890123456789"
    await channel.send(out(fake, text, reply_to=trigger))
    prefix = f"/channels/{fake.text_channel_id}/messages"
    await fake.wait_for_call("POST", prefix, n=3)
    calls = fake.calls_to("POST", prefix)
    bodies = [c.json for c in calls]
    assert all(len(b["content"]) <= DISCORD_LIMIT for b in bodies)
    for body in bodies:
        assert body["content"].count("```") % 2 == 0, body["content"]
        assert body["allowed_mentions"]["parse"] == []  # no @everyone, roles or users
        assert body["allowed_mentions"].get("replied_user", False) is False
    assert str(bodies[0]["message_reference"]["message_id"]) == trigger
    assert str(bodies[0]["message_reference"]["channel_id"]) == fake.text_channel_id
    assert bodies[0]["message_reference"]["fail_if_not_exists"] is False
    assert all("message_reference" not in b for b in bodies[1:])
    joined = "".join(b["content"] for b in bodies)
    assert re.sub(r"\s|`|python", "", joined) == re.sub(r"\s|`|python", "", text)


async def test_send_to_a_thread(fake: FakeDiscord, channel: DiscordChannel) -> None:
    await channel.send(out(fake, "threaded answer", thread_id=fake.thread_id))
    [call] = await fake.wait_for_call("POST", f"/channels/{fake.thread_id}/messages")
    assert call.json["content"] == "threaded answer"
    assert "message_reference" not in call.json


async def test_send_to_an_unseen_dm_fetches_the_channel(
    fake: FakeDiscord, channel: DiscordChannel, collector: Collector
) -> None:
    sent = fake.dm_message("hi")
    [msg] = await collector.wait_for(1)
    channel._dm_channels.clear()  # as after a restart: discord.py does not cache DM channels
    await channel.send(
        out(fake, "hello Alice", chat_id=msg.chat_id, reply_to=msg.platform_message_id)
    )
    [call] = await fake.wait_for_call("POST", f"/channels/{sent['channel_id']}/messages")
    assert call.json["content"] == "hello Alice"
    assert str(call.json["message_reference"]["message_id"]) == sent["id"]
    assert [c.path for c in fake.calls_to("GET", "/channels/")] == [f"/channels/{msg.chat_id}"]


async def test_typing(fake: FakeDiscord, channel: DiscordChannel) -> None:
    await channel.typing(fake.text_channel_id, None)
    in_channel = await fake.wait_for_call("POST", f"/channels/{fake.text_channel_id}/typing")
    await channel.typing(fake.text_channel_id, fake.thread_id)
    in_thread = await fake.wait_for_call("POST", f"/channels/{fake.thread_id}/typing")
    assert len(in_channel) == 1 and len(in_thread) == 1, "one typing call for each target"


async def test_reply_to_a_dm_seen_inbound_needs_no_fetch(
    fake: FakeDiscord, channel: DiscordChannel, collector: Collector
) -> None:
    sent = fake.dm_message("hi again")
    [msg] = await collector.wait_for(1)
    await channel.send(out(fake, "hello", chat_id=msg.chat_id, reply_to=msg.platform_message_id))
    [call] = await fake.wait_for_call("POST", f"/channels/{sent['channel_id']}/messages")
    assert call.json["content"] == "hello"
    assert fake.calls_to("GET", "/channels/") == []


async def test_sixty_line_reply_is_split_at_seventeen_lines(
    fake: FakeDiscord, channel: DiscordChannel
) -> None:
    text = "\n".join(f"{i}. a short line" for i in range(1, 61))
    await channel.send(out(fake, text))
    prefix = f"/channels/{fake.text_channel_id}/messages"
    await fake.wait_for_call("POST", prefix, n=4)
    await asyncio.sleep(0.05)
    bodies = [c.json["content"] for c in fake.calls_to("POST", prefix)]
    assert len(bodies) == 4
    assert all(len(b.split("\n")) <= DISCORD_MAX_LINES for b in bodies)
    assert "\n".join(bodies).split("\n") == text.split("\n")


async def test_code_heavy_reply_respects_line_cap_and_fences(
    fake: FakeDiscord, channel: DiscordChannel
) -> None:
    code = "\n".join(f"x_{i} = {i}" for i in range(50))
    await channel.send(out(fake, f"Here:\n\n```python\n{code}\n```\nDone."))
    prefix = f"/channels/{fake.text_channel_id}/messages"
    await fake.wait_for_call("POST", prefix, n=4)
    await asyncio.sleep(0.05)
    for call in fake.calls_to("POST", prefix):
        content = call.json["content"]
        assert len(content.split("\n")) <= DISCORD_MAX_LINES, content
        assert content.count("```") % 2 == 0, content


async def test_mass_mentions_are_defused_in_text(
    fake: FakeDiscord, channel: DiscordChannel
) -> None:
    await channel.send(out(fake, "hey @everyone and @here, mail me at a@here.example"))
    [call] = await fake.wait_for_call("POST", f"/channels/{fake.text_channel_id}/messages")
    content = call.json["content"]
    assert "@everyone" not in content and "@here," not in content
    assert "@\u200beveryone" in content and "@\u200bhere," in content
    assert call.json["allowed_mentions"]["parse"] == []
    assert defuse_mass_mentions("no mentions") == "no mentions"


# -- rate limits ---------------------------------------------------------------------------------


async def test_429_is_retried_by_discord_py_and_nothing_is_dropped(
    fake: FakeDiscord, channel: DiscordChannel
) -> None:
    fake.rate_limit_next_post(1, retry_after=0.05)
    started = time.monotonic()
    await channel.send(out(fake, "after a rate limit"))
    prefix = f"/channels/{fake.text_channel_id}/messages"
    calls = await fake.wait_for_call("POST", prefix, n=2)
    assert [c.status for c in calls] == [429, 200]
    assert time.monotonic() - started >= 0.05
    assert [m["content"] for m in fake.sent_messages] == ["after a rate limit"]


async def test_429_discord_py_gives_up_on_is_retried_by_send(
    fake: FakeDiscord, channel: DiscordChannel
) -> None:
    # Without "Via", discord.py takes the 429 for a Cloudflare ban and raises at once.
    fake.rate_limit_next_post(1, retry_after=0.05, via=False)
    await channel.send(out(fake, "one\n" * 20))
    prefix = f"/channels/{fake.text_channel_id}/messages"
    calls = await fake.wait_for_call("POST", prefix, n=3)
    assert [c.status for c in calls] == [429, 200, 200]
    assert len(fake.sent_messages) == 2


async def test_persistent_429_fails_after_bounded_retries(
    fake: FakeDiscord, channel: DiscordChannel
) -> None:
    fake.rate_limit_next_post(10, retry_after=0.01, via=False)
    with pytest.raises(discord.HTTPException):
        await channel.send(out(fake, "never"))
    assert len(fake.calls_to("POST", f"/channels/{fake.text_channel_id}/messages")) == 3
    assert fake.sent_messages == []


# -- malformed dispatches ------------------------------------------------------------------------


async def test_malformed_message_creates_do_not_break_the_client(
    fake: FakeDiscord, channel: DiscordChannel, collector: Collector
) -> None:
    null_content = fake.message("x", channel_id=fake.text_channel_id, author=fake.alice, guild=True)
    null_content["content"] = None
    fake.dispatch("MESSAGE_CREATE", null_content)
    no_author = fake.message("who?", channel_id=fake.text_channel_id, author=fake.bob, guild=True)
    del no_author["author"]  # discord.py's parser raises; unguarded, it ends Client.start
    fake.dispatch("MESSAGE_CREATE", no_author)
    fake.dispatch("MESSAGE_CREATE", {"id": "not-a-snowflake", "content": 5})
    fake.dispatch("MESSAGE_CREATE", {})
    unknown = fake.message(
        "somewhere else", channel_id="1111111111111111111", author=fake.alice, guild=True
    )
    fake.dispatch("MESSAGE_CREATE", unknown)
    good = fake.dm_message("still here")
    [first, second] = await collector.wait_for(2)
    # An unknown guild channel is a PartialMessageable: still a plain channel message.
    assert (first.platform_message_id, first.chat_type, first.chat_id, first.text) == (
        unknown["id"],
        "channel",
        "1111111111111111111",
        "somewhere else",
    )
    assert (second.platform_message_id, second.text) == (good["id"], "still here")
    assert len(collector.messages) == 2  # null content (no text, no attachments) was skipped
    assert fake.connections == 1 and channel._task is not None and not channel._task.done()
    fake.guild_message("and after that", mention=True)
    [*_, third] = await collector.wait_for(3)
    assert third.text == "and after that"


# -- golden fixtures -----------------------------------------------------------------------------

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = sorted(FIXTURES.glob("discord_*.json"))
@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden_message_create_payloads(path: Path) -> None:
    case = json.loads(path.read_text())
    chan, state = fixture_channel()
    parsed: list[discord.Message] = []
    state.dispatch = lambda event, *args: parsed.append(args[0]) if event == "message" else None
    state.parse_message_create(case["message"])
    [message] = parsed
    inbound = chan.normalize(message)
    assert inbound is not None
    got = {k: getattr(inbound, k) for k in case["expected"]}
    got["attachments"] = [dict(a) for a in inbound.attachments]
    expected = dict(case["expected"])
    expected.setdefault("attachments", [])
    assert got == expected


def test_there_are_golden_fixtures() -> None:
    assert len(GOLDEN) >= 5
