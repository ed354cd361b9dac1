"""Discord attachments through discord.py on the fake Discord and a real Gateway: fetched from
the attachment URL (discord.py's CDN fetch), saved to the inbox, described or answered."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from channels.discord import DiscordChannel
from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.file_bodies import BigBody, Compressed, Redirect, Served, Stall, Status
from tests.helpers.memory import MiB, PeakRss

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
        channel = DiscordChannel(config.channels.discord, guild_ready_timeout=0.01,
                                 ready_timeout=10)
        channel.download_timeout = 0.3  # a stalled download gives up quickly
        gw.add_channel(channel)
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


HUGE = 300 * 1024 * 1024
CAP = 4 * MiB


@pytest.mark.parametrize("content_length", [
    pytest.param(None, id="chunked"), pytest.param(HUGE, id="header-says-300MB"),
])
async def test_a_huge_file_under_a_lying_size_is_refused_with_bounded_memory(
    make_config: MakeConfig, fake_llm: FakeOpenAI, content_length: int | None
) -> None:
    body = BigBody(HUGE, content_length=content_length)
    async with running(make_config, fake_llm, attachments={"max_bytes": CAP}) as (gw, discord):
        big = discord.attachment("dump.bin", b"", size=100, served=body)  # Discord says 100 B
        with PeakRss() as rss:
            sent = discord.dm_message("", attachments=[big])
            reply = await answer_in(discord, sent["channel_id"])
        shown = "larger than 4.0 MB, the most I take" if content_length is None else (
            "300.0 MB, and files may be at most 4.0 MB"
        )
        assert reply["content"] == f"I could not take dump.bin: it is {shown}."
        assert discord.attachment_downloads == [f"/attachments/{big['id']}/dump.bin"]
        assert inbox_files(gw) == []
    # get_from_cdn read all 300 MB before the size was compared; streamed, only the cap.
    assert rss.growth < CAP + 16 * MiB, f"grew {rss.growth / MiB:.0f} MiB"
    assert body.written < CAP + 16 * MiB


async def test_a_compressed_bomb_is_refused_with_bounded_memory(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    bomb = Compressed(64 * MiB)  # 64 KiB on the wire; aiohttp inflates it a bounded step at a time
    assert len(bomb.body) < 100 * 1024
    async with running(make_config, fake_llm, attachments={"max_bytes": CAP}) as (gw, discord):
        big = discord.attachment("bomb.bin", b"", size=100, served=bomb)
        with PeakRss() as rss:
            sent = discord.dm_message("", attachments=[big])
            reply = await answer_in(discord, sent["channel_id"])
        assert reply["content"] == (
            "I could not take bomb.bin: it is larger than 4.0 MB, the most I take."
        )
        assert inbox_files(gw) == []
    assert rss.growth < CAP + 16 * MiB, f"grew {rss.growth / MiB:.0f} MiB"


@pytest.mark.parametrize(("served", "why"), [
    pytest.param(Status(404), "Discord no longer has it (404)", id="gone"),
    pytest.param(Status(403), "Discord answered HTTP 403", id="forbidden"),
    pytest.param(Stall(), "Discord sent nothing for 0.3 s", id="stall"),
    pytest.param(Redirect("/attachments/nowhere/x.bin"), "Discord no longer has it (404)",
                 id="redirect-followed-as-discord-py-does"),
])
async def test_a_failed_download_is_told_and_logged_once(
    make_config: MakeConfig, fake_llm: FakeOpenAI, caplog: pytest.LogCaptureFixture,
    served: Served, why: str,
) -> None:
    async with running(make_config, fake_llm) as (_gw, discord):
        doc = discord.attachment("report.pdf", b"", size=100, served=served)
        sent = discord.dm_message("", attachments=[doc])
        reply = await answer_in(discord, sent["channel_id"])
    assert reply["content"] == f"I could not get report.pdf: {why}. Please try sending it again."
    [line] = [r for r in caplog.records if "report.pdf" in r.getMessage()]
    assert line.getMessage() == (
        f"attachments: discord attachment 'report.pdf' of message {sent['id']} could not be "
        f"downloaded: {why}"
    )
    assert line.exc_info is None
