"""Streamed previews on Discord: real discord.py against the fake Discord, the fake model
streaming."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from channels.discord import DiscordChannel
from channels.formatting import DISCORD_LIMIT, DISCORD_MAX_LINES, chunk_text
from gateway.config import Config
from tests.channels.previews import (
    INTERVAL_MS,
    StartGateway,
    assert_spaced,
    gateways,
    long_reply,
    preview_settings,
    streamed_reply,
)
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI, reply
from tests.fakes.discord_server import FakeDiscord, RecordedCall


@pytest.fixture
async def fake_discord() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord() as server:
        yield server


@pytest.fixture
async def start_gateway(
    fake_llm: FakeOpenAI, make_config: MakeConfig, fake_discord: FakeDiscord
) -> AsyncIterator[StartGateway]:
    """Start a gateway with a Discord channel; keyword arguments go to [channels.discord]."""
    connection = {
        "token": fake_discord.token,
        "api_base_url": fake_discord.api_base_url,
        "gateway_url": fake_discord.gateway_url,
    }

    def build(config: Config) -> DiscordChannel:
        return DiscordChannel(config.channels.discord, guild_ready_timeout=0.01, ready_timeout=10)

    async with gateways(fake_llm, make_config, "discord", connection, build) as start:
        yield start


def _outbound(fake: FakeDiscord, channel_id: str) -> list[RecordedCall]:
    prefix = f"/channels/{channel_id}/messages"
    return [
        c
        for c in fake.calls
        if c.path.startswith(prefix) and c.method in ("POST", "PATCH") and c.status == 200
    ]


async def _final_edit(fake: FakeDiscord, channel_id: str, content: str) -> None:
    await fake.wait_for_call(
        "PATCH",
        f"/channels/{channel_id}/messages/",
        where=lambda c: c.status == 200 and (c.json or {}).get("content") == content,
    )


async def test_streamed_reply_is_one_preview_edited_then_final(
    start_gateway: StartGateway, fake_discord: FakeDiscord, fake_llm: FakeOpenAI
) -> None:
    gateway = await start_gateway(**preview_settings())
    answer = streamed_reply()
    fake_llm.script(reply(answer))
    asked = fake_discord.dm_message("tell me")
    dm = asked["channel_id"]
    await _final_edit(fake_discord, dm, answer)
    await gateway.lanes.join()

    assert fake_llm.requests[-1]["stream"] is True
    preview, *edits = _outbound(fake_discord, dm)
    assert preview.method == "POST" and preview.path == f"/channels/{dm}/messages"
    assert str(preview.json["message_reference"]["message_id"]) == asked["id"]
    assert preview.json["allowed_mentions"]["parse"] == []
    *streamed, final = edits
    assert len(streamed) >= 1
    assert_spaced([c.at for c in [preview, *streamed]])
    shown = [preview.json["content"], *(e.json["content"] for e in streamed)]
    assert all(answer.startswith(text) for text in shown)
    preview_id = fake_discord.sent_messages[0]["id"]
    assert all(e.path == f"/channels/{dm}/messages/{preview_id}" for e in edits)
    assert final.json["content"] == answer  # Discord renders the Markdown itself
    assert fake_discord.messages[preview_id]["content"] == answer
    assert len(fake_discord.sent_messages) == 1


async def test_long_reply_edits_the_preview_into_chunk_one_and_sends_the_rest(
    start_gateway: StartGateway, fake_discord: FakeDiscord, fake_llm: FakeOpenAI
) -> None:
    gateway = await start_gateway(**preview_settings())
    answer = long_reply(DISCORD_LIMIT + 1_500)
    fake_llm.script(reply(answer))
    dm = fake_discord.dm_message("a long one please")["channel_id"]
    first, second = chunk_text(answer, DISCORD_LIMIT, max_lines=DISCORD_MAX_LINES)
    await _final_edit(fake_discord, dm, first)
    await fake_discord.wait_for_call("POST", f"/channels/{dm}/messages", n=2)
    await gateway.lanes.join()

    posts = [c.json for c in fake_discord.calls_to("POST", f"/channels/{dm}/messages")]
    assert [p["content"] for p in posts[1:]] == [second]
    assert "message_reference" not in posts[1]
    assert fake_discord.messages[fake_discord.sent_messages[0]["id"]]["content"] == first
    patches = fake_discord.calls_to("PATCH", f"/channels/{dm}/messages/")
    assert all(len(p.json["content"]) <= DISCORD_LIMIT for p in patches)


async def test_preview_off_is_a_single_send(
    start_gateway: StartGateway, fake_discord: FakeDiscord, fake_llm: FakeOpenAI
) -> None:
    gateway = await start_gateway(llm={"stream": True}, dm_policy="open")
    answer = streamed_reply(20)
    fake_llm.script(reply(answer))
    dm = fake_discord.dm_message("no preview please")["channel_id"]
    [post] = await fake_discord.wait_for_call("POST", f"/channels/{dm}/messages")
    await gateway.lanes.join()

    assert fake_llm.requests[-1]["stream"] is True
    assert [c.method for c in _outbound(fake_discord, dm)] == ["POST"]
    assert post.json["content"] == answer


async def test_a_deleted_preview_does_not_lose_the_reply(
    start_gateway: StartGateway, fake_discord: FakeDiscord, fake_llm: FakeOpenAI
) -> None:
    gateway = await start_gateway(**preview_settings())
    answer = streamed_reply()
    fake_llm.script(reply(answer))
    asked = fake_discord.dm_message("tell me")
    dm = asked["channel_id"]
    await fake_discord.wait_for_call("POST", f"/channels/{dm}/messages")
    fake_discord.delete_message(fake_discord.sent_messages[0]["id"])

    [_, final] = await fake_discord.wait_for_call("POST", f"/channels/{dm}/messages", n=2)
    await gateway.lanes.join()
    assert final.json["content"] == answer
    assert str(final.json["message_reference"]["message_id"]) == asked["id"]
    assert all(c.status == 404 for c in fake_discord.calls_to("PATCH", f"/channels/{dm}/"))


async def test_a_rate_limited_edit_is_waited_out_by_discord_py(
    start_gateway: StartGateway, fake_discord: FakeDiscord, fake_llm: FakeOpenAI
) -> None:
    gateway = await start_gateway(**preview_settings())
    answer = streamed_reply()
    fake_llm.script(reply(answer))
    fake_discord.rate_limit_next_edit(retry_after=INTERVAL_MS / 1000)
    dm = fake_discord.dm_message("tell me")["channel_id"]
    await _final_edit(fake_discord, dm, answer)
    await gateway.lanes.join()

    patches = fake_discord.calls_to("PATCH", f"/channels/{dm}/messages/")
    assert patches[0].status == 429
    assert patches[1].status == 200
    assert patches[1].at - patches[0].at >= INTERVAL_MS / 1000
    preview_id = fake_discord.sent_messages[0]["id"]
    assert fake_discord.messages[preview_id]["content"] == answer
