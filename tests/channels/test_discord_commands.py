"""Chat commands on Discord: registered as application commands at start, a slash invocation
answered as the interaction's follow-up, and typed commands answered like messages. The real
discord.py against the fake Discord (REST + gateway), inside a real Gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from channels.commands import CHAT_COMMANDS
from channels.discord import DiscordChannel
from gateway.app import Gateway
from gateway.operations import show_session
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.fakes.discord_server import FakeDiscord, RecordedCall


@dataclass
class Rig:
    fake: FakeDiscord
    llm: FakeOpenAI
    gateway: Gateway


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
                    "dm_policy": "open",
                    "group_allowlist": [fake.text_channel_id],
                }
            },
        )
        gateway = Gateway(config)
        gateway.add_channel(
            DiscordChannel(config.channels.discord, guild_ready_timeout=0.01, ready_timeout=10)
        )
        await gateway.start()
        try:
            yield Rig(fake, fake_llm, gateway)
        finally:
            await gateway.stop(grace=2)


async def followups(fake: FakeDiscord, interaction: dict[str, object], n: int = 1) -> list[str]:
    path = f"/webhooks/{fake.app_id}/{interaction['token']}"
    calls: list[RecordedCall] = await fake.wait_for_call("POST", path, n=n)
    return [str(c.json["content"]) for c in calls]


async def test_the_commands_are_registered_at_start(rig: Rig) -> None:
    [put] = rig.fake.calls_to("PUT", f"/applications/{rig.fake.app_id}/commands")
    assert put.status == 200
    registered = {c["name"]: c for c in rig.fake.app_commands}
    assert list(registered) == [c.name for c in CHAT_COMMANDS]
    assert registered["status"]["description"] == CHAT_COMMANDS[0].description
    [option] = registered["compact"]["options"]
    assert (option["name"], option["type"], option.get("required", False)) == (
        "instructions", 3, False
    )


async def test_a_slash_command_is_answered_as_its_follow_up(rig: Rig) -> None:
    fake = rig.fake
    interaction = fake.slash_command("status")
    [callback] = await fake.wait_for_call("POST", f"/interactions/{interaction['id']}/")
    assert callback.json["type"] == 5, "deferred at once: Discord shows 'thinking…'"
    [status] = await followups(fake, interaction)
    assert status.startswith("Model: `fake-model`") and "Context: " in status
    dm = str(interaction["channel_id"])
    assert fake.calls_to("POST", f"/channels/{dm}/messages") == [], "not a second message"
    assert rig.llm.requests == [], "the command did not call the model"

    compact = fake.slash_command("compact", {"instructions": "keep the ticket ids"})
    [answer] = await followups(fake, compact)
    assert answer.startswith("Nothing to compact yet")
    key = f"agent:main:discord:direct:{fake.alice['id']}"
    shown = await show_session(rig.gateway.config, key, show_all=True)
    assert shown is not None
    users = [m.message.content for m in shown.messages if m.message.role == "user"]
    assert users == ["/status", "/compact keep the ticket ids"], "stored as typed"


async def test_a_slash_command_in_a_guild_channel(rig: Rig) -> None:
    interaction = rig.fake.slash_command("help", dm=False)
    [answer] = await followups(rig.fake, interaction)
    assert all(f"/{c.name}" in answer for c in CHAT_COMMANDS)


async def test_a_typed_command_is_answered_like_a_message(rig: Rig) -> None:
    fake = rig.fake
    sent = fake.dm_message("/new")
    [call] = await fake.wait_for_call("POST", f"/channels/{sent['channel_id']}/messages")
    assert call.json["content"].startswith("Already a fresh context")
    assert str(call.json["message_reference"]["message_id"]) == sent["id"]
    assert rig.llm.requests == []
