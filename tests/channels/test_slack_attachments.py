"""Files shared on Slack, through slack-bolt on the fake Slack and a real Gateway: downloaded
from ``url_private`` with the bot token, saved to the inbox, described to the agent."""

from __future__ import annotations

import base64
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, TCPConnector
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from channels.attachments import AttachmentUnavailable
from channels.settings import SlackSettings
from channels.slack import SlackChannel
from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.fakes.file_bodies import BigBody, Compressed, RecordingServer, Redirect
from tests.fakes.slack_server import BOT_USER_ID, FakeSlack, app_mention, im_message
from tests.helpers.memory import MiB, PeakRss

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 2000
DM = "D0000DM01"


@asynccontextmanager
async def running(
    make_config: MakeConfig, fake: FakeOpenAI, **sections: Any
) -> AsyncIterator[tuple[Gateway, FakeSlack]]:
    async with FakeSlack() as slack:
        config = make_config(
            fake,
            channels={"slack": {
                "enabled": True, "bot_token": "xoxb-test", "app_token": "xapp-test",
                "base_url": slack.api_url, "dm_policy": "open",
            }},
            **sections,
        )
        gw = Gateway(config)
        gw.add_channel(SlackChannel(config.channels.slack))
        await gw.start()
        try:
            yield gw, slack
        finally:
            await gw.stop()


def inbox_files(gw: Gateway) -> list[Path]:
    return sorted(p for p in (gw.config.workspace / "inbox").rglob("*") if p.is_file())


def user_content(body: dict[str, Any]) -> Any:
    return [m for m in body["messages"] if m["role"] == "user"][-1]["content"]


async def test_an_image_alone_reaches_a_vision_model(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    async with running(make_config, fake_llm, llm={"vision": True}) as (gw, slack):
        shared = slack.add_file("screenshot.png", PNG, "image/png")
        slack.push_event(im_message("", subtype="file_share", files=[shared]))
        [post] = await slack.wait_for_call("chat.postMessage")
        assert post["channel"] == DM and "thread_ts" not in post  # a DM stays top-level
        [(path, token)] = slack.file_downloads
        assert token == "xoxb-test" and path.endswith("/screenshot.png")
        [saved] = inbox_files(gw)
        assert saved.read_bytes() == PNG
        assert saved.name.startswith("slack-U0000USER-F0000001-")
        [body] = fake_llm.requests
        text, image = user_content(body)
        relative = saved.relative_to(gw.config.workspace).as_posix()
        assert text["text"] == f"[attachment: screenshot.png, image/png, 2 KB, saved to {relative}]"
        url = image["image_url"]["url"]
        assert base64.b64decode(url.removeprefix("data:image/png;base64,")) == PNG


async def test_a_document_with_a_mention_is_described_in_the_thread(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    async with running(make_config, fake_llm) as (gw, slack):
        shared = slack.add_file("notes.txt", b"remember the milk\n", "text/plain")
        mention = app_mention(f"<@{BOT_USER_ID}> summarize", user="U7", files=[shared])
        slack.push_event(mention)
        [post] = await slack.wait_for_call("chat.postMessage")
        assert post["thread_ts"] == mention["ts"]
        [saved] = inbox_files(gw)
        relative = saved.relative_to(gw.config.workspace).as_posix()
        [body] = fake_llm.requests
        assert user_content(body) == (
            f"U7: summarize\n[attachment: notes.txt, text/plain, 18 bytes, saved to {relative}]"
        )


async def test_without_the_files_read_scope_the_person_is_told(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    async with running(make_config, fake_llm) as (gw, slack):
        slack.file_token = "xoxb-another-app"  # ours lacks files:read: Slack's sign-in page
        shared = slack.add_file("plan.pdf", b"%PDF-1.7 ...", "application/pdf")
        slack.push_event(im_message("", subtype="file_share", files=[shared]))
        [post] = await slack.wait_for_call("chat.postMessage")
        assert post["text"] == (
            "I could not get plan.pdf: Slack sent a web page instead of the file (does the app "
            "have the files:read scope?). Please try sending it again."
        )
        assert inbox_files(gw) == []
        assert fake_llm.requests == []


async def test_the_bot_token_goes_to_slack_only(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    async with running(make_config, fake_llm) as (_gw, slack):
        shared = {**slack.add_file("x.pdf", b"%PDF-1.7", "application/pdf"),
                  "url_private": "http://files.evil.example/x.pdf"}
        slack.push_event(im_message("", subtype="file_share", files=[shared]))
        [post] = await slack.wait_for_call("chat.postMessage")
        assert "the bot token is not sent there" in post["text"]
        assert slack.file_downloads == []


async def test_an_oversized_file_is_refused_before_downloading(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    async with running(make_config, fake_llm, attachments={"max_bytes": 1024}) as (_gw, slack):
        shared = slack.add_file("video.mp4", b"\x00" * 10, "video/mp4", size=3 * 1024 * 1024)
        slack.push_event(im_message("what about this", subtype="file_share", files=[shared]))
        [post] = await slack.wait_for_call("chat.postMessage")
        assert slack.file_downloads == []
        # With text, the model answers, and is told the file was refused.
        [body] = fake_llm.requests
        assert user_content(body) == (
            "what about this\n[attachment: video.mp4, 3.0 MB: not saved, larger than the 1 KB "
            "limit]"
        )
        assert post["text"].startswith("echo: what about this")


HUGE = 300 * 1024 * 1024
CAP = 4 * MiB


@pytest.mark.parametrize("content_length", [
    pytest.param(None, id="chunked"), pytest.param(HUGE, id="header-says-300MB"),
])
async def test_a_huge_file_under_a_lying_size_is_refused_with_bounded_memory(
    make_config: MakeConfig, fake_llm: FakeOpenAI, content_length: int | None
) -> None:
    body = BigBody(HUGE, content_length=content_length)
    async with running(make_config, fake_llm, attachments={"max_bytes": CAP}) as (gw, slack):
        shared = slack.add_file("dump.bin", b"", "application/octet-stream", size=100,
                                served=body)
        with PeakRss() as rss:
            slack.push_event(im_message("", subtype="file_share", files=[shared]))
            [post] = await slack.wait_for_call("chat.postMessage")
        shown = "larger than 4.0 MB, the most I take" if content_length is None else (
            "300.0 MB, and files may be at most 4.0 MB"
        )
        assert post["text"] == f"I could not take dump.bin: it is {shown}."
        assert inbox_files(gw) == []
    assert rss.growth < CAP + 16 * MiB, f"grew {rss.growth / MiB:.0f} MiB"
    assert body.written < CAP + 16 * MiB


async def test_a_compressed_bomb_is_refused_with_bounded_memory(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    bomb = Compressed(64 * MiB)  # 64 KiB on the wire; aiohttp inflates it a bounded step at a time
    assert len(bomb.body) < 100 * 1024
    async with running(make_config, fake_llm, attachments={"max_bytes": CAP}) as (gw, slack):
        shared = slack.add_file("bomb.bin", b"", "application/octet-stream", size=100,
                                served=bomb)
        with PeakRss() as rss:
            slack.push_event(im_message("", subtype="file_share", files=[shared]))
            [post] = await slack.wait_for_call("chat.postMessage")
        assert post["text"] == "I could not take bomb.bin: it is larger than 4.0 MB, the most I take."
        assert inbox_files(gw) == []
    assert rss.growth < CAP + 16 * MiB, f"grew {rss.growth / MiB:.0f} MiB"


async def test_a_redirect_within_the_configured_origin_keeps_the_token(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    async with running(make_config, fake_llm) as (gw, slack):
        real = slack.add_file("notes.txt", b"the real file\n", "text/plain")
        moved = slack.add_file("old.txt", b"", "text/plain",
                               served=Redirect(real["url_private"].split(str(slack.port))[1]))
        slack.push_event(im_message("", subtype="file_share", files=[{**moved, "name": "a.txt"}]))
        await slack.wait_for_call("chat.postMessage")
        assert [token for _path, token in slack.file_downloads] == ["xoxb-test", "xoxb-test"]
        [saved] = inbox_files(gw)
        assert saved.read_bytes() == b"the real file\n"


@pytest.mark.parametrize("where", ["other-port", "other-host", "other-scheme", "downgrade"])
async def test_a_redirect_off_the_configured_origin_never_gets_the_token(
    make_config: MakeConfig, fake_llm: FakeOpenAI, where: str
) -> None:
    async with RecordingServer() as elsewhere, running(make_config, fake_llm) as (gw, slack):
        path = "/files-pri/T0000TEAM-F0000009/x.pdf"
        location, origin = {
            "other-port": (f"{elsewhere.url}{path}", f"http://127.0.0.1:{elsewhere.port}"),
            # The fake itself under another name: it records the token of every request.
            "other-host": (f"http://localhost:{slack.port}{path}",
                           f"http://localhost:{slack.port}"),
            "other-scheme": (f"https://127.0.0.1:{slack.port}{path}",
                             f"https://127.0.0.1:{slack.port}"),
            "downgrade": (f"http://files.slack.com{path}", "http://files.slack.com:80"),
        }[where]
        shared = slack.add_file("x.pdf", b"", "application/pdf", served=Redirect(location))
        slack.push_event(im_message("", subtype="file_share", files=[shared]))
        [post] = await slack.wait_for_call("chat.postMessage")
        assert post["text"] == (
            f"I could not get x.pdf: Slack redirected it away from Slack ({origin}); the bot "
            "token is not sent there. Please try sending it again."
        )
        # Only the first request, to the configured origin, carried it; nothing went elsewhere.
        assert slack.file_downloads == [(URL(shared["url_private"]).path, "xoxb-test")]
        assert elsewhere.requests == []
        assert inbox_files(gw) == []


class StaticResolver(AbstractResolver):
    """Every host name resolves to 127.0.0.1: Slack's own names reach a local server, so a
    refusal below is the check's, not DNS's."""

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [ResolveResult(hostname=host, host="127.0.0.1", port=port,
                              family=socket.AF_INET, proto=0, flags=socket.AI_NUMERICHOST)]

    async def close(self) -> None:
        pass


@asynccontextmanager
async def offline_slack(base_url: str | None) -> AsyncIterator[SlackChannel]:
    """A Slack channel (not started: `fetch_attachment` needs only its session) whose session
    resolves every name to 127.0.0.1."""
    channel = SlackChannel(SlackSettings(enabled=True, bot_token="xoxb-test",
                                         app_token="xapp-test", base_url=base_url))
    async with ClientSession(connector=TCPConnector(resolver=StaticResolver())) as session:
        channel.client.session = session
        yield channel


async def test_the_configured_origin_is_trusted_exactly_as_configured() -> None:
    async with RecordingServer() as server:
        async with offline_slack(f"http://slack.com:{server.port}/api/") as channel:
            url = f"http://slack.com:{server.port}/files-pri/T1-F1/a.bin"
            assert await channel.fetch_attachment({"url": url}, 1000) == b"recorded"
        [request] = server.requests
        assert request.headers["Authorization"] == "Bearer xoxb-test"


@pytest.mark.parametrize("url", [
    "http://slack.com:{port}/files-pri/a",          # plain http to Slack's own name
    "http://files.slack.com:{port}/files-pri/a",
    "https://files.slack.com:{port}/files-pri/a",   # https, but not port 443
    "https://slack.com:{port}/files-pri/a",
    "http://files.slack.com/files-pri/a",           # http on its default port
    "https://files.slack.com.evil.example:{port}/a",
    "https://evilslack.com:{port}/a",
    "https://files.slack.com:443@127.0.0.1:{port}/a",  # user info: the host is 127.0.0.1
    "http://127.0.0.1:{port}/a",
])
async def test_the_token_goes_only_to_slack_over_https_on_443(url: str) -> None:
    async with RecordingServer() as server, offline_slack(None) as channel:
        with pytest.raises(AttachmentUnavailable, match="the bot token is not sent there"):
            await channel.fetch_attachment({"url": url.format(port=server.port)}, 1000)
        assert server.requests == []
