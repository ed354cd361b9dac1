"""The Slack adapter behind a real Gateway: slack-bolt on the fake Slack, the fake OpenAI LLM."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest

from channels.settings import SlackSettings
from channels.slack import SlackChannel
from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.fakes.slack_server import (
    BOT_USER_ID,
    FakeSlack,
    app_mention,
    channel_message,
    im_message,
)


@pytest.fixture
async def fake_slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


@pytest.fixture
async def gateway(
    fake_llm: FakeOpenAI, fake_slack: FakeSlack, make_config: MakeConfig
) -> AsyncIterator[Gateway]:
    config = make_config(
        fake_llm,
        channels={
            "slack": {
                "enabled": True,
                "bot_token": "xoxb-test",
                "app_token": "xapp-test",
                "base_url": fake_slack.api_url,
            }
        },
    )
    gw = Gateway(config)
    gw.add_channel(SlackChannel(config.channels.slack))
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop()


async def settle(fake: FakeSlack, gateway: Gateway, *envelope_ids: str) -> None:
    """Wait until every envelope was acked (so persisted, its lane woken) and every lane is idle."""
    for envelope_id in envelope_ids:
        await fake.wait_for_ack(envelope_id)
    await gateway.lanes.join()


def test_config_section_builds_the_channel(make_config: MakeConfig) -> None:
    config = make_config(channels={"slack": {"bot_token": "xoxb-1", "app_token": "xapp-1"}})
    assert isinstance(config.channels.slack, SlackSettings)
    assert config.channels.slack.dm_policy == "pairing"


async def test_pairing_then_answer(
    gateway: Gateway, fake_slack: FakeSlack, fake_llm: FakeOpenAI
) -> None:
    first = fake_slack.push_event(im_message("hello there", user="U42"))
    [post] = await fake_slack.wait_for_call("chat.postMessage")
    await settle(fake_slack, gateway, first)
    assert post["channel"] == "D0000DM01"
    match = re.search(r"pairing code is ([A-Z0-9]{8})", post["text"])
    assert match, post["text"]
    assert fake_llm.requests == []

    assert await gateway.store.decide_pairing(match.group(1), "approved") is not None
    second = fake_slack.push_event(im_message("**now** answer me", user="U42"))
    posts = await fake_slack.wait_for_call("chat.postMessage", 2)
    await settle(fake_slack, gateway, second)
    assert posts[1]["channel"] == "D0000DM01"
    # The fake LLM echoes the Markdown; the adapter renders it as mrkdwn.
    assert posts[1]["text"] == "echo: *now* answer me"
    assert "thread_ts" not in posts[1]
    assert len(fake_llm.requests) == 1


async def test_mention_answered_in_its_thread_and_chatter_ignored(
    gateway: Gateway, fake_slack: FakeSlack, fake_llm: FakeOpenAI
) -> None:
    chatter = fake_slack.push_event(channel_message("just chatting", user="U7"))
    await settle(fake_slack, gateway, chatter)
    assert fake_slack.calls_to("chat.postMessage") == []
    assert fake_llm.requests == []

    parent = "1767225600.000001"
    mention = fake_slack.push_event(
        app_mention(f"<@{BOT_USER_ID}> what did I say?", user="U7", thread_ts=parent)
    )
    [post] = await fake_slack.wait_for_call("chat.postMessage")
    await settle(fake_slack, gateway, mention)
    assert post["channel"] == "C0000CHAN1"
    assert post["thread_ts"] == parent
    assert post["text"].startswith("echo: ")
    assert len(fake_llm.requests) == 1


async def test_redelivered_event_is_answered_once(
    fake_llm: FakeOpenAI, fake_slack: FakeSlack, make_config: MakeConfig
) -> None:
    config = make_config(
        fake_llm,
        channels={
            "slack": {
                "enabled": True,
                "bot_token": "xoxb-test",
                "app_token": "xapp-test",
                "base_url": fake_slack.api_url,
                "dm_policy": "open",
            }
        },
    )
    gw = Gateway(config)
    gw.add_channel(SlackChannel(config.channels.slack))
    await gw.start()
    try:
        event = im_message("only once please", user="U42")
        ids = [fake_slack.push_event(event), fake_slack.push_event(dict(event))]
        [post] = await fake_slack.wait_for_call("chat.postMessage")
        await settle(fake_slack, gw, *ids)
        assert post["text"] == "echo: only once please"
        assert len(fake_llm.requests) == 1
        assert len(fake_slack.calls_to("chat.postMessage")) == 1
    finally:
        await gw.stop()
