"""Discord attachments through discord.py on the fake Discord and a real Gateway: fetched from
the attachment URL (discord.py's CDN fetch), saved to the inbox, described or answered."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from channels.discord import DiscordChannel
from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.fakes.discord_server import FakeDiscord

PNG = b"\x89PNG\r\n\x1a\n" + b"\x01" * 3000
OGG = b"OggS\x00\x02" + b"\x00" * 500
ELF = b"\x7fELF\x02\x01\x01" + b"\x00" * 100


@asynccontextmanager
async def running(
    make_config: MakeConfig, fake: FakeOpenAI, **sections: Any
) -> AsyncIterator[tuple[Gateway, FakeDiscord]]:
    async with FakeDiscord() as discord:
        config = make_config(
            fake,
            channels={"discord": {
                "enabled": True, "token": discord.token, "api_base_url": discord.api_base_url,
                "gateway_url": discord.gateway_url, "dm_policy": "open",
            }},
            **sections,
        )
        gw = Gateway(config)
        gw.add_channel(DiscordChannel(config.channels.discord, guild_ready_timeout=0.01,
                                      ready_timeout=10))
        await gw.start()
        try:
            yield gw, discord
        finally:
            await gw.stop(grace=2)


def inbox_files(gw: Gateway) -> list[Path]:
    return sorted(p for p in (gw.config.workspace / "inbox").rglob("*") if p.is_file())


async def answer_in(discord: FakeDiscord, channel_id: str) -> dict[str, Any]:
    [call] = await discord.wait_for_call("POST", f"/channels/{channel_id}/messages")
    assert isinstance(call.json, dict)
    return call.json


async def test_an_image_alone_without_vision_gets_a_plain_answer(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    async with running(make_config, fake_llm) as (gw, discord):
        image = discord.attachment("image.png", PNG, content_type="image/png")
        sent = discord.dm_message("", attachments=[image])
        reply = await answer_in(discord, sent["channel_id"])
        [saved] = inbox_files(gw)
        assert saved.read_bytes() == PNG
        assert saved.name == f"discord-{discord.alice['id']}-{image['id']}-image.png"
        relative = saved.relative_to(gw.config.workspace).as_posix()
        assert reply["content"] == (
            f"I received image.png (saved to {relative}) but this model cannot see images."
        )
        assert str(reply["message_reference"]["message_id"]) == sent["id"]
        assert discord.attachment_downloads == [f"/attachments/{image['id']}/image.png"]
        assert fake_llm.requests == []


async def test_a_voice_message_is_saved_and_answered_plainly(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    async with running(make_config, fake_llm) as (gw, discord):
        voice = discord.attachment("voice-message.ogg", OGG, content_type="audio/ogg")
        sent = discord.dm_message("", attachments=[voice])
        reply = await answer_in(discord, sent["channel_id"])
        [saved] = inbox_files(gw)
        relative = saved.relative_to(gw.config.workspace).as_posix()
        assert reply["content"] == (
            f"I received your voice note (saved to {relative}) but I cannot listen to audio yet."
        )


async def test_an_oversized_attachment_is_refused_before_downloading(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    async with running(make_config, fake_llm) as (gw, discord):
        big = discord.attachment("dump.tar", b"x", size=25 * 1024 * 1024)
        sent = discord.dm_message("", attachments=[big])
        reply = await answer_in(discord, sent["channel_id"])
        assert reply["content"] == (
            "I could not take dump.tar: it is 25.0 MB, and files may be at most 20.0 MB."
        )
        assert discord.attachment_downloads == []
        assert inbox_files(gw) == []


async def test_a_pdf_that_is_an_executable_is_recorded_by_its_sniffed_type(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    async with running(make_config, fake_llm, llm={"vision": True}) as (gw, discord):
        disguised = discord.attachment("invoice.pdf", ELF, content_type="application/pdf")
        discord.guild_message("please pay this", mention=True, attachments=[disguised])
        reply = await answer_in(discord, discord.text_channel_id)
        [saved] = inbox_files(gw)
        assert saved.name.endswith("-invoice.pdf.bin")  # never a name that would run or mislead
        relative = saved.relative_to(gw.config.workspace).as_posix()
        [body] = fake_llm.requests
        user = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        assert user == (
            "Alice A.: please pay this\n[attachment: invoice.pdf, application/x-executable "
            f"(sent as application/pdf), {len(ELF)} bytes, saved to {relative}]"
        )
        assert reply["content"].startswith("echo: Alice A.: please pay this")
