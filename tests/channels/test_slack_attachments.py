"""Files shared on Slack, through slack-bolt on the fake Slack and a real Gateway: downloaded
from ``url_private`` with the bot token, saved to the inbox, described to the agent."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from channels.slack import SlackChannel
from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.fakes.slack_server import BOT_USER_ID, FakeSlack, app_mention, im_message

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
