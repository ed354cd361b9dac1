"""The Discord adapter inside a real Gateway: fake Discord (REST + gateway) and a fake LLM."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from channels.discord import DiscordChannel
from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.fakes.discord_server import FakeDiscord


@dataclass
class Rig:
    fake: FakeDiscord
    llm: FakeOpenAI
    gateway: Gateway
    channel: DiscordChannel

    def posts(self, channel_id: str) -> list[dict[str, Any]]:
        calls = self.fake.calls_to("POST", f"/channels/{channel_id}/messages")
        return [c.json for c in calls if c.status == 200]

    async def settle(self) -> None:
        """Let every delivered dispatch reach the gateway and every turn finish."""
        await asyncio.sleep(0.2)
        await self.gateway.lanes.join()


@pytest.fixture
async def rig(fake_llm: FakeOpenAI, make_config: MakeConfig) -> AsyncIterator[Rig]:
    async with FakeDiscord() as fake:
        config = make_config(
            fake_llm,
            channels={
                "discord": {
                    "enabled": True,
                    "token": fake.token,
                    "api_base_url": fake.api_base_url,
                    "gateway_url": fake.gateway_url,
                }
            },
        )
        gateway = Gateway(config)
        channel = DiscordChannel(
            config.channels.discord, guild_ready_timeout=0.01, ready_timeout=10
        )
        gateway.add_channel(channel)
        await gateway.start()
        try:
            yield Rig(fake, fake_llm, gateway, channel)
        finally:
            await gateway.stop(grace=2)


async def test_dm_pairing_then_answer(rig: Rig) -> None:
    fake = rig.fake
    first = fake.dm_message("hello bot")
    dm = first["channel_id"]
    [call] = await fake.wait_for_call("POST", f"/channels/{dm}/messages")
    content = call.json["content"]
    assert "pairing code is" in content
    assert str(call.json["message_reference"]["message_id"]) == first["id"]
    code = content.split("pairing code is ")[1][:8]
    assert rig.llm.requests == []

    await rig.gateway.store.decide_pairing(code, "approved")
    second = fake.dm_message("what time is it?")
    await fake.wait_for_call("POST", f"/channels/{dm}/messages", n=2)
    reply = rig.posts(dm)[-1]
    assert reply["content"] == "echo: what time is it?"
    assert str(reply["message_reference"]["message_id"]) == second["id"]
    assert len(rig.llm.requests) == 1


async def test_guild_mention_is_answered_and_unmentioned_is_not(rig: Rig) -> None:
    fake = rig.fake
    fake.guild_message("just chatting among ourselves")
    asked = fake.guild_message("what is 2+2?", mention=True)
    channel_posts = f"/channels/{fake.text_channel_id}/messages"
    [call] = await fake.wait_for_call("POST", channel_posts)
    assert call.json["content"] == "echo: Alice A.: what is 2+2?"
    assert str(call.json["message_reference"]["message_id"]) == asked["id"]
    await rig.settle()
    assert len(rig.posts(fake.text_channel_id)) == 1
    assert len(rig.llm.requests) == 1
    # The unmentioned message was kept as context for the mentioned one.
    prompt = "\n".join(str(m.get("content")) for m in rig.llm.requests[0]["messages"])
    assert "just chatting among ourselves" in prompt


async def test_redelivered_message_create_is_answered_once(rig: Rig) -> None:
    fake = rig.fake
    fake.dm_message("pair me")  # the first DM only gets a pairing code
    await fake.wait_for_call("POST", "/channels/")
    [pending] = await rig.gateway.store.pending_pairings("discord")
    await rig.gateway.store.decide_pairing(pending.code, "approved")

    payload = fake.dm_message("only once, please")
    fake.dispatch("MESSAGE_CREATE", payload)  # the same event again, as after a RESUME
    dm = payload["channel_id"]
    await fake.wait_for_call("POST", f"/channels/{dm}/messages", n=2)
    await rig.settle()
    replies = [p for p in rig.posts(dm) if p["content"].startswith("echo:")]
    assert [p["content"] for p in replies] == ["echo: only once, please"]
    assert len(rig.llm.requests) == 1
