"""``[channels.slack] reply_in_thread``: a top-level channel mention is answered in a thread
under it, and that thread is one conversation (slack-bolt on the fake Slack, a real Gateway)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from channels.slack import SlackChannel
from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.fakes.slack_server import BOT_USER_ID, FakeSlack, app_mention, channel_message

CHANNEL = "C0000CHAN1"
CHANNEL_KEY = f"agent:main:slack:channel:{CHANNEL}"


@asynccontextmanager
async def running(
    make_config: MakeConfig, fake: FakeOpenAI, **slack_settings: object
) -> AsyncIterator[tuple[Gateway, FakeSlack]]:
    async with FakeSlack() as slack:
        config = make_config(fake, channels={"slack": {
            "enabled": True, "bot_token": "xoxb-test", "app_token": "xapp-test",
            "base_url": slack.api_url, **slack_settings,
        }})
        gw = Gateway(config)
        gw.add_channel(SlackChannel(config.channels.slack))
        await gw.start()
        try:
            yield gw, slack
        finally:
            await gw.stop()


async def settle(gw: Gateway) -> None:
    await asyncio.sleep(0.2)
    await gw.lanes.join()


async def test_a_top_level_mention_is_answered_in_a_thread_that_continues(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    async with running(make_config, fake_llm) as (gw, slack):
        assert gw.config.channels.slack.reply_in_thread is True  # the default
        mention = app_mention(f"<@{BOT_USER_ID}> remember 42", user="U7")
        slack.push_event(mention)
        [first] = await slack.wait_for_call("chat.postMessage")
        assert first["channel"] == CHANNEL
        assert first["thread_ts"] == mention["ts"]

        # A follow-up in that thread: no mention needed, same conversation, same thread.
        slack.push_event(channel_message("what number?", user="U7", thread_ts=mention["ts"]))
        _first, second = await slack.wait_for_call("chat.postMessage", 2)
        assert second["thread_ts"] == mention["ts"]
        later = fake_llm.requests[1]
        said = [m["content"] for m in later["messages"] if m["role"] != "system"]
        assert said == ["U7: remember 42", "echo: U7: remember 42", "U7: what number?"]

        thread_key = f"{CHANNEL_KEY}:thread:{mention['ts']}"
        assert await gw.store.get_session(thread_key) is not None
        assert await gw.store.get_session(CHANNEL_KEY) is None


async def test_chatter_in_a_thread_the_bot_did_not_open_still_needs_a_mention(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    async with running(make_config, fake_llm) as (gw, slack):
        parent = "1767225600.000001"
        slack.push_event(channel_message("people talking", user="U7", thread_ts=parent))
        await settle(gw)
        assert slack.calls_to("chat.postMessage") == [] and fake_llm.requests == []

        # A mention inside an existing thread is answered in that thread.
        slack.push_event(app_mention(f"<@{BOT_USER_ID}> and you?", user="U8", thread_ts=parent))
        [post] = await slack.wait_for_call("chat.postMessage")
        assert post["thread_ts"] == parent


async def test_reply_in_thread_off_answers_at_top_level(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    async with running(make_config, fake_llm, reply_in_thread=False) as (gw, slack):
        slack.push_event(app_mention(f"<@{BOT_USER_ID}> hello", user="U7"))
        [post] = await slack.wait_for_call("chat.postMessage")
        assert post["channel"] == CHANNEL
        assert "thread_ts" not in post
        assert await gw.store.get_session(CHANNEL_KEY) is not None


async def test_group_dms_stay_top_level(make_config: MakeConfig, fake_llm: FakeOpenAI) -> None:
    async with running(make_config, fake_llm, require_mention=False) as (_gw, slack):
        slack.push_event(channel_message(
            f"<@{BOT_USER_ID}> hi both", user="U7", channel="G0000MPIM", channel_type="mpim",
        ))
        [post] = await slack.wait_for_call("chat.postMessage")
        assert post["channel"] == "G0000MPIM" and "thread_ts" not in post
