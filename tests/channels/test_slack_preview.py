"""Streamed previews on Slack: real slack-bolt / slack-sdk against the fake Slack, the fake model
streaming."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from channels.formatting import SLACK_LIMIT
from channels.slack import SlackChannel, markdown_to_mrkdwn, slack_chunks
from gateway.config import Config
from tests.channels.previews import (
    StartGateway,
    assert_spaced,
    gateways,
    long_reply,
    preview_settings,
    streamed_reply,
)
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI, reply
from tests.fakes.slack_server import ApiCall, FakeSlack, im_message

DM = "D0000DM01"


@pytest.fixture
async def fake_slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


@pytest.fixture
async def start_gateway(
    fake_llm: FakeOpenAI, make_config: MakeConfig, fake_slack: FakeSlack
) -> AsyncIterator[StartGateway]:
    """Start a gateway with a Slack channel; keyword arguments go to [channels.slack]."""
    connection = {"bot_token": "xoxb-test", "app_token": "xapp-test", "base_url": fake_slack.api_url}

    def build(config: Config) -> SlackChannel:
        return SlackChannel(config.channels.slack)

    async with gateways(fake_llm, make_config, "slack", connection, build) as start:
        yield start


def _outbound(fake: FakeSlack) -> list[ApiCall]:
    return [
        c for c in fake.calls if c.method in ("chat.postMessage", "chat.update") and c.status == 200
    ]


async def _final_update(fake: FakeSlack, text: str) -> None:
    await fake.wait_for_call("chat.update", where=lambda params: params.get("text") == text)


async def test_streamed_reply_is_one_preview_edited_then_formatted(
    start_gateway: StartGateway, fake_slack: FakeSlack, fake_llm: FakeOpenAI
) -> None:
    gateway = await start_gateway(**preview_settings())
    answer = streamed_reply()
    fake_llm.script(reply(answer))
    parent = "1767225600.000001"
    fake_slack.push_event(im_message("tell me", thread_ts=parent))
    formatted = markdown_to_mrkdwn(answer)
    await _final_update(fake_slack, formatted)
    await gateway.lanes.join()

    assert fake_llm.requests[-1]["stream"] is True
    preview, *edits, final = _outbound(fake_slack)
    assert preview.method == "chat.postMessage"
    assert preview.params["thread_ts"] == parent  # in the thread, like the reply
    assert len(edits) >= 1
    assert all(e.method == "chat.update" for e in edits)
    assert_spaced([c.at for c in [preview, *edits]])
    shown = [preview.params["text"], *(e.params["text"] for e in edits)]
    assert all(answer.startswith(text) for text in shown)  # raw Markdown, not mrkdwn
    ts = fake_slack.messages[(DM, final.params["ts"])]["ts"]
    assert all(e.params["ts"] == ts for e in [*edits, final])
    assert fake_slack.messages[(DM, ts)]["text"] == formatted
    assert fake_slack.messages[(DM, ts)]["thread_ts"] == parent


async def test_preview_text_is_escaped(
    start_gateway: StartGateway, fake_slack: FakeSlack, fake_llm: FakeOpenAI
) -> None:
    gateway = await start_gateway(**preview_settings())
    answer = "Careful with <!channel> & friends: " + streamed_reply(10)
    fake_llm.script(reply(answer))
    fake_slack.push_event(im_message("tell me"))
    await _final_update(fake_slack, markdown_to_mrkdwn(answer))
    await gateway.lanes.join()

    shown = [c.params["text"] for c in _outbound(fake_slack)]
    assert not any("<!channel>" in text for text in shown)  # never a control sequence
    assert any("&lt;!channel&gt; &amp; friends" in text for text in shown[:-1])


async def test_long_reply_edits_the_preview_into_chunk_one_and_posts_the_rest(
    start_gateway: StartGateway, fake_slack: FakeSlack, fake_llm: FakeOpenAI
) -> None:
    gateway = await start_gateway(**preview_settings())
    answer = long_reply(SLACK_LIMIT + 1_500)
    fake_llm.chunk_delay = 0.01
    fake_llm.script(reply(answer))
    fake_slack.push_event(im_message("a long one please"))
    first, second = slack_chunks(answer)
    await _final_update(fake_slack, first)
    await fake_slack.wait_for_call("chat.postMessage", 2)
    await gateway.lanes.join()

    posts = fake_slack.calls_to("chat.postMessage")
    assert [p["text"] for p in posts[1:]] == [second]
    preview_ts = fake_slack.calls_to("chat.update")[-1]["ts"]
    assert fake_slack.messages[(DM, preview_ts)]["text"] == first
    assert all(len(p["text"]) <= SLACK_LIMIT for p in fake_slack.calls_to("chat.update"))


async def test_preview_off_is_a_single_post(
    start_gateway: StartGateway, fake_slack: FakeSlack, fake_llm: FakeOpenAI
) -> None:
    gateway = await start_gateway(llm={"stream": True}, dm_policy="open")
    answer = streamed_reply(20)
    fake_llm.script(reply(answer))
    fake_slack.push_event(im_message("no preview please"))
    [post] = await fake_slack.wait_for_call("chat.postMessage")
    await gateway.lanes.join()

    assert fake_llm.requests[-1]["stream"] is True
    assert [c.method for c in _outbound(fake_slack)] == ["chat.postMessage"]
    assert post["text"] == markdown_to_mrkdwn(answer)


async def test_a_deleted_preview_does_not_lose_the_reply(
    start_gateway: StartGateway, fake_slack: FakeSlack, fake_llm: FakeOpenAI
) -> None:
    gateway = await start_gateway(**preview_settings())
    answer = streamed_reply()
    fake_llm.script(reply(answer))
    fake_slack.push_event(im_message("tell me"))
    await fake_slack.wait_for_call("chat.postMessage")
    [(channel, ts)] = fake_slack.messages
    fake_slack.delete_message(channel, ts)

    await fake_slack.wait_for_call("chat.postMessage", 2)
    await gateway.lanes.join()
    final = fake_slack.calls_to("chat.postMessage")[-1]
    assert final["text"] == markdown_to_mrkdwn(answer)
    assert len(fake_slack.calls_to("chat.postMessage")) == 2
