"""Attachments through the real Telegram adapter: PTB downloads from the fake Bot API (getFile +
/file/bot<token>/<path>), a real Gateway saves and describes them, the fake OpenAI answers."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from channels.telegram import TelegramChannel
from context.types import Message
from gateway.app import Gateway
from gateway.store.messages import FETCHING_STATUS
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.fakes.file_bodies import (
    BigBody,
    Compressed,
    Hangup,
    Redirect,
    Served,
    Stall,
    Status,
)
from tests.fakes.telegram_server import FakeTelegram
from tests.helpers.memory import MiB, PeakRss

JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(range(256)) * 4
OGG = b"OggS\x00\x02" + b"\x00" * 200
HTML = b"<!DOCTYPE html><html><body><script>alert(1)</script></body></html>"
USER = 7


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


@asynccontextmanager
async def running(
    make_config: MakeConfig, tg: FakeTelegram, fake: FakeOpenAI,
    stall_timeout: float | None = None, **sections: Any,
) -> AsyncIterator[Gateway]:
    config = make_config(
        fake,
        channels={"telegram": {
            "enabled": True, "token": tg.token, "base_url": tg.base_url, "dm_policy": "open",
        }},
        **sections,
    )
    gw = Gateway(config)
    channel = TelegramChannel(config.channels.telegram)
    if stall_timeout is not None:
        channel.download_timeout = stall_timeout
    gw.add_channel(channel)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop(grace=2)


def _to(chat_id: int) -> Callable[[dict[str, Any]], bool]:
    return lambda params: params.get("chat_id") == chat_id


def inbox_files(gw: Gateway) -> list[Path]:
    return sorted(p for p in (gw.config.workspace / "inbox").rglob("*") if p.is_file())


def user_content(body: dict[str, Any]) -> Any:
    return [m for m in body["messages"] if m["role"] == "user"][-1]["content"]


async def test_a_photo_alone_without_vision_gets_a_plain_answer_not_empty(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    async with running(make_config, tg, fake_llm) as gw:
        photo = tg.add_file(JPEG, suffix=".jpg")
        small = tg.add_file(JPEG[:40], suffix=".jpg")
        tg.private_message(USER, None, photo=[{**small, "width": 90, "height": 90},
                                              {**photo, "width": 800, "height": 600}])
        [answer] = await tg.wait_for_call("sendMessage", where=_to(USER))
        [saved] = inbox_files(gw)
        assert saved.read_bytes() == JPEG  # the largest size, as sent
        relative = saved.relative_to(gw.config.workspace).as_posix()
        assert relative.startswith("inbox/") and saved.name.startswith("telegram-7-")
        assert saved.name.endswith("-photo.jpg")
        assert answer["text"] == (
            f"I received your photo (saved to {relative}) but this model cannot see images."
        )
        assert "empty" not in answer["text"]
        assert fake_llm.requests == []  # nothing for the model to see: no turn
        assert [call["file_id"] for call in tg.calls_to("getFile")] == [photo["file_id"]]

        # The conversation keeps both: the next turn's prompt shows what arrived and the answer.
        tg.private_message(USER, "did you get it?")
        await tg.wait_for_call("sendMessage", n=2, where=_to(USER))
        [body] = fake_llm.requests
        said = [m["content"] for m in body["messages"] if m["role"] != "system"]
        assert said[0] == (
            f"[attachment: photo, image/jpeg, 1 KB, saved to {relative}; this model cannot see "
            "images]"
        )
        assert said[1] == answer["text"]
        assert said[2] == "did you get it?"


async def test_a_photo_reaches_a_vision_model_as_an_image_part(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    async with running(make_config, tg, fake_llm, llm={"vision": True}) as gw:
        photo = tg.add_file(JPEG, suffix=".jpg")
        tg.private_message(USER, None, caption="what is this?", photo=[{**photo, "width": 800, "height": 600}])
        [answer] = await tg.wait_for_call("sendMessage", where=_to(USER))
        [body] = fake_llm.requests
        text, image = user_content(body)
        [saved] = inbox_files(gw)
        relative = saved.relative_to(gw.config.workspace).as_posix()
        assert text == {
            "type": "text",
            "text": f"what is this?\n[attachment: photo, image/jpeg, 1 KB, saved to {relative}]",
        }
        assert image["type"] == "image_url"
        url = image["image_url"]["url"]
        assert url.startswith("data:image/jpeg;base64,")
        assert base64.b64decode(url.split(",", 1)[1]) == JPEG
        assert answer["text"].startswith("echo: what is this?")

        # Stored by reference, counted at a fixed cost: the row holds the path, not the bytes.
        session = await gw.store.get_session(f"agent:main:telegram:direct:{USER}")
        assert session is not None and session.id is not None
        [stored, _reply] = await gw.store.history(session.id)
        assert isinstance(stored.content, list)
        assert stored.content[1] == {
            "type": "image_url", "image_url": {"url": f"workspace:{relative}"},
        }
        counter = gw.resolver.counter
        text_only = counter.count_message(Message(role="user", content=text["text"]))
        assert stored.tokens == text_only + 1_200


async def test_a_document_with_a_caption_is_saved_and_described_to_the_agent(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    async with running(make_config, tg, fake_llm) as gw:
        doc = tg.add_file(b"name,qty\nbolts,12\n", suffix=".csv")
        tg.private_message(USER, None, caption="please check", document={
            **doc, "file_name": "../../orders Q3.csv", "mime_type": "text/csv",
        })
        await tg.wait_for_call("sendMessage", where=_to(USER))
        [saved] = inbox_files(gw)
        assert saved.name.endswith("-orders_Q3.csv")  # the path in the name is gone
        relative = saved.relative_to(gw.config.workspace).as_posix()
        [body] = fake_llm.requests
        assert user_content(body) == (
            f"please check\n[attachment: orders Q3.csv, text/plain, 18 bytes, saved to "
            f"{relative}]"
        )


async def test_a_voice_note_alone_is_saved_and_answered_plainly(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    async with running(make_config, tg, fake_llm, llm={"vision": True}) as gw:
        voice = tg.add_file(OGG, suffix=".oga")
        tg.private_message(USER, None, voice={**voice, "duration": 3, "mime_type": "audio/ogg"})
        [answer] = await tg.wait_for_call("sendMessage", where=_to(USER))
        [saved] = inbox_files(gw)
        assert saved.name.endswith("-voice-note.ogg")
        relative = saved.relative_to(gw.config.workspace).as_posix()
        assert answer["text"] == (
            f"I received your voice note (saved to {relative}) but I cannot listen to audio yet."
        )
        assert fake_llm.requests == []


async def test_an_oversized_file_is_refused_with_a_clear_reply(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    async with running(
        make_config, tg, fake_llm, attachments={"max_bytes": 1000}
    ) as gw:
        doc = tg.add_file(b"x" * 5000, suffix=".zip")
        tg.private_message(USER, None, document={**doc, "file_name": "backup.zip"})
        [answer] = await tg.wait_for_call("sendMessage", where=_to(USER))
        assert answer["text"] == (
            "I could not take backup.zip: it is 5 KB, and files may be at most 1000 bytes."
        )
        assert tg.file_downloads == []  # getFile said the size: nothing was downloaded
        assert inbox_files(gw) == []
        assert fake_llm.requests == []


async def test_telegrams_own_20_mb_refusal_is_a_clear_reply(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    async with running(make_config, tg, fake_llm):
        doc = tg.add_file(b"x" * 10, reported_size=30 * 1024 * 1024)
        tg.private_message(USER, None, document={**doc, "file_name": "film.mkv"})
        [answer] = await tg.wait_for_call("sendMessage", where=_to(USER))
        assert answer["text"] == (
            "I could not take film.mkv: it is larger than 20.0 MB, the most I take."
        )


async def test_a_jpg_that_is_html_is_recorded_by_what_it_is(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    async with running(make_config, tg, fake_llm, llm={"vision": True}) as gw:
        doc = tg.add_file(HTML, suffix=".jpg")
        tg.private_message(USER, None, document={
            **doc, "file_name": "cat.jpg", "mime_type": "image/jpeg",
        })
        await tg.wait_for_call("sendMessage", where=_to(USER))
        [saved] = inbox_files(gw)
        assert saved.name.endswith("-cat.jpg.html")
        relative = saved.relative_to(gw.config.workspace).as_posix()
        [body] = fake_llm.requests
        # Not sent as an image (it is none), and the agent is told what it really is.
        assert user_content(body) == (
            f"[attachment: cat.jpg, text/html (sent as a .jpg file), {len(HTML)} bytes, saved to "
            f"{relative}]"
        )


async def test_a_failed_download_is_one_log_line_and_a_clear_answer(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running(make_config, tg, fake_llm):
        tg.private_message(USER, None, document={"file_id": "gone", "file_unique_id": "g",
                                                 "file_name": "report.pdf"})
        [answer] = await tg.wait_for_call("sendMessage", where=_to(USER))
        assert answer["text"] == (
            "I could not get report.pdf: Telegram refused it: Invalid file_id. "
            "Please try sending it again."
        )
    lines = [r for r in caplog.records if "report.pdf" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None


async def test_the_message_is_stored_before_the_download_and_finished_after_a_restart(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    photo = tg.add_file(JPEG, suffix=".jpg")
    async with running(make_config, tg, fake_llm, llm={"vision": True}) as gw:
        tg.hold("getFile")
        tg.private_message(USER, None, caption="look", photo=[{**photo, "width": 800, "height": 600}])
        await tg.wait_for_held()
        [(row, _session)] = await gw.store.fetching_messages()
        assert row.status == FETCHING_STATUS and row.handled  # stored, out of every turn
        assert row.content[0]["text"] == "look\n[attachment: photo: being downloaded]"
        await asyncio.sleep(0.2)
        assert fake_llm.requests == [] and tg.calls_to("sendMessage") == []
        await gw.intake.close(grace=0)  # the process stops mid-download
    tg.release("getFile")

    async with running(make_config, tg, fake_llm, llm={"vision": True}) as gw:
        [answer] = await tg.wait_for_call("sendMessage", where=_to(USER))
        assert answer["text"].startswith("echo: look")
        [body] = fake_llm.requests
        assert user_content(body)[1]["type"] == "image_url"
        assert await gw.store.fetching_messages() == []


async def test_an_unmentioned_group_photo_is_context_and_not_downloaded(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    group = -1001234567890
    async with running(make_config, tg, fake_llm) as gw:
        photo = tg.add_file(JPEG, suffix=".jpg")
        tg.group_message(group, USER, None, photo=[{**photo, "width": 8, "height": 8}])
        tg.group_message(group, 8, "what did they send?", reply_to_bot=True)
        await tg.wait_for_call("sendMessage", where=_to(group))
        assert tg.calls_to("getFile") == [] and inbox_files(gw) == []
        [body] = fake_llm.requests
        said = [m["content"] for m in body["messages"] if m["role"] == "user"]
        assert said[0] == (
            "User7:\n[attachment: photo: not downloaded (the message was not addressed to me)]"
        )


async def test_an_inbox_that_leads_outside_the_workspace_is_never_written_through(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    async with running(make_config, tg, fake_llm) as gw:
        (gw.config.workspace / "inbox").symlink_to(elsewhere, target_is_directory=True)
        photo = tg.add_file(JPEG, suffix=".jpg")
        tg.private_message(USER, None, photo=[{**photo, "width": 8, "height": 8}])
        [answer] = await tg.wait_for_call("sendMessage", where=_to(USER))
        assert answer["text"] == (
            "I could not get your photo: it could not be saved. Please try sending it again."
        )
        assert list(elsewhere.rglob("*")) == []


HUGE = 300 * 1024 * 1024
CAP = 4 * MiB


@pytest.mark.parametrize(("declared", "content_length"), [
    pytest.param(100, None, id="getFile-says-100-bytes-chunked"),
    pytest.param(None, None, id="getFile-says-no-size-chunked"),
    pytest.param(100, HUGE, id="getFile-says-100-bytes-header-says-300MB"),
])
async def test_a_huge_file_under_a_lying_size_is_refused_with_bounded_memory(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI,
    declared: int | None, content_length: int | None,
) -> None:
    body = BigBody(HUGE, content_length=content_length)
    async with running(make_config, tg, fake_llm, attachments={"max_bytes": CAP}) as gw:
        doc = tg.add_file(suffix=".bin", reported_size=declared, size_unknown=declared is None,
                          served=body)
        with PeakRss() as rss:
            tg.private_message(USER, None, document={**doc, "file_name": "dump.bin"})
            [answer] = await tg.wait_for_call("sendMessage", where=_to(USER))
        if content_length is None:
            assert answer["text"] == (
                "I could not take dump.bin: it is larger than 4.0 MB, the most I take."
            )
        else:  # the Content-Length said it: refused before reading the body
            assert answer["text"] == (
                "I could not take dump.bin: it is 300.0 MB, and files may be at most 4.0 MB."
            )
        assert tg.file_downloads == ["files/file_1.bin"]
        assert inbox_files(gw) == []
        assert fake_llm.requests == []
    # PTB's own download held all 300 MB (three times over) before comparing; streamed, at
    # most the cap and a read buffer is held, and the connection is dropped right there.
    assert rss.growth < CAP + 16 * MiB, f"grew {rss.growth / MiB:.0f} MiB"
    assert body.written < CAP + 16 * MiB


async def test_a_file_within_the_cap_still_arrives_whole_when_streamed(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI
) -> None:
    body = BigBody(CAP)  # exactly the cap, chunked: kept, not refused
    async with running(make_config, tg, fake_llm, attachments={"max_bytes": CAP}) as gw:
        doc = tg.add_file(suffix=".bin", size_unknown=True, served=body)
        tg.private_message(USER, "keep this", document={**doc, "file_name": "zeros.bin"})
        await tg.wait_for_call("sendMessage", where=_to(USER))
        [saved] = inbox_files(gw)
        assert saved.stat().st_size == CAP and saved.read_bytes() == bytes(CAP)


@pytest.mark.parametrize(("served", "why"), [
    pytest.param(Redirect("http://127.0.0.1:9/elsewhere"),
                 "Telegram answered HTTP 302, a redirect (not followed)", id="redirect"),
    pytest.param(Redirect("/file/bot123456:TEST-TOKEN/files/file_1.pdf", status=301),
                 "Telegram answered HTTP 301, a redirect (not followed)", id="redirect-home"),
    pytest.param(Status(403), "Telegram answered HTTP 403", id="refused-403"),
    pytest.param(Status(502), "Telegram answered HTTP 502", id="refused-502"),
    pytest.param(Hangup(), "the download from Telegram failed (RemoteProtocolError)",
                 id="hang-up"),
    pytest.param(Stall(), "Telegram sent nothing for 0.3 s (ReadTimeout)", id="stall"),
    # httpx would inflate it without a bound: asked for unencoded, a gzip body is refused.
    pytest.param(Compressed(64 * MiB), "Telegram sent it gzip-encoded, unasked", id="gzip-bomb"),
    pytest.param(BigBody(HUGE), None, id="too-large"),
])
async def test_a_failed_download_is_one_line_naming_platform_message_and_why(
    make_config: MakeConfig, tg: FakeTelegram, fake_llm: FakeOpenAI,
    caplog: pytest.LogCaptureFixture, served: Served, why: str | None,
) -> None:
    caplog.set_level(logging.INFO)
    async with running(make_config, tg, fake_llm, stall_timeout=0.3,
                       attachments={"max_bytes": MiB}):
        doc = tg.add_file(suffix=".pdf", reported_size=100, served=served)
        update = tg.private_message(USER, None, document={**doc, "file_name": "report.pdf"})
        [answer] = await tg.wait_for_call("sendMessage", where=_to(USER))
    message_id = update["message"]["message_id"]
    if why is None:
        assert answer["text"] == (
            "I could not take report.pdf: it is larger than 1.0 MB, the most I take."
        )
        why = "too large; the limit is 1,048,576 bytes"
    else:
        assert answer["text"] == f"I could not get report.pdf: {why}. Please try sending it again."
    lines = [r for r in caplog.records if "report.pdf" in r.getMessage()]
    assert len(lines) == 1, [f"{r.name}: {r.getMessage()}" for r in lines]
    [line] = lines
    assert line.getMessage() == (
        f"attachments: telegram attachment 'report.pdf' of message {message_id} "
        + ("refused: " if "limit" in why else "could not be downloaded: ") + why
    )
    # No traceback from any part of the client side (PTB logged one for a redirect), and the
    # file URL, which holds the bot token, is in none of the gateway's lines.
    client_side = [r for r in caplog.records if not r.name.startswith("aiohttp")]
    assert [r.getMessage() for r in client_side if r.exc_info or r.exc_text] == []
    ours = [r for r in caplog.records if r.name.startswith(("gateway", "channels"))]
    assert not [r for r in ours if tg.token in r.getMessage()]
