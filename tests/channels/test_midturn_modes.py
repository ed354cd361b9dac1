"""Messages that arrive mid-turn, in each queue mode, on each platform: the real adapter (PTB,
slack-bolt in Socket Mode, discord.py) against its fake, and the web chat over HTTP, inside a
real Gateway whose fake model holds its first request open (tests/helpers/midturn.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from channels.base import OutboundMessage
from channels.discord import DiscordChannel
from channels.slack import SlackChannel
from channels.telegram import TelegramChannel
from channels.webchat import WebchatChannel
from gateway.app import Gateway
from gateway.config import Config
from gateway.web.server import WebServer, build_app
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI, reply, stall_stream
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.slack_server import FakeSlack, im_message
from tests.fakes.telegram_server import FakeTelegram
from tests.helpers.midturn import (
    INTERRUPT_CUT,
    SCENARIOS,
    Chat,
    Gate,
    arrived,
    settle,
    until,
)

MODES = list(SCENARIOS)
USER = 7


async def _stored_one_more(gateway: Gateway, push: Callable[[], Any]) -> None:
    """Push a message through the platform and wait until the gateway stored it."""
    before = await gateway.store.message_count()
    push()

    async def stored() -> bool:
        return await gateway.store.message_count() > before

    await until(stored)


class TelegramChat:
    def __init__(self, gateway: Gateway, fake: FakeTelegram) -> None:
        self.gateway, self.fake = gateway, fake

    async def send(self, text: str) -> None:
        await _stored_one_more(self.gateway, lambda: self.fake.private_message(USER, text))

    async def replies(self, n: int) -> list[str]:
        sent = await self.fake.wait_for_call(
            "sendMessage", n, where=lambda p: p.get("chat_id") == USER
        )
        return [p["text"] for p in sent]


class SlackChat:
    def __init__(self, gateway: Gateway, fake: FakeSlack) -> None:
        self.gateway, self.fake = gateway, fake

    async def send(self, text: str) -> None:
        await _stored_one_more(
            self.gateway, lambda: self.fake.push_event(im_message(text, user="U42"))
        )

    async def replies(self, n: int) -> list[str]:
        return [p["text"] for p in await self.fake.wait_for_call("chat.postMessage", n)]


class DiscordChat:
    def __init__(self, gateway: Gateway, fake: FakeDiscord) -> None:
        self.gateway, self.fake = gateway, fake
        self.dm: str | None = None

    async def send(self, text: str) -> None:
        def push() -> None:
            self.dm = self.fake.dm_message(text)["channel_id"]

        await _stored_one_more(self.gateway, push)

    async def replies(self, n: int) -> list[str]:
        calls = await self.fake.wait_for_call("POST", f"/channels/{self.dm}/messages", n=n)
        return [c.json["content"] for c in calls if c.status == 200]


class RecordingWebchat(WebchatChannel):
    """The web chat channel, keeping each reply the gateway sent it, in order."""

    def __init__(self) -> None:
        super().__init__(reply_timeout=10)
        self.sent: list[str] = []
        self.changed = asyncio.Condition()

    async def send(self, message: OutboundMessage) -> None:
        async with self.changed:
            self.sent.append(message.text)
            self.changed.notify_all()
        await super().send(message)


class WebChat:
    """POST /api/messages, each request waiting for its reply as the page does."""

    def __init__(self, gateway: Gateway, channel: RecordingWebchat, url: str) -> None:
        self.gateway, self.channel, self.url = gateway, channel, url
        self.requests: dict[str, asyncio.Task[list[str]]] = {}

    async def _post(self, text: str) -> list[str]:
        async with aiohttp.ClientSession() as http:
            body = {"user_id": "tester", "text": text}
            async with http.post(f"{self.url}/api/messages", json=body) as r:
                assert r.status == 200, await r.text()
                replies: list[str] = (await r.json())["replies"]
                return replies

    async def send(self, text: str) -> None:
        def push() -> None:
            self.requests[text] = asyncio.create_task(self._post(text))

        await _stored_one_more(self.gateway, push)

    async def replies(self, n: int) -> list[str]:
        async with asyncio.timeout(5), self.channel.changed:
            await self.channel.changed.wait_for(lambda: len(self.channel.sent) >= n)
        return list(self.channel.sent)

    async def answers(self) -> dict[str, list[str]]:
        """What each HTTP request got back."""
        return {text: await task for text, task in self.requests.items()}


Rig = tuple[Gateway, Chat]
Platform = Callable[[str], Awaitable[Rig]]


@pytest.fixture
async def platform(
    request: pytest.FixtureRequest, fake_llm: FakeOpenAI, make_config: MakeConfig
) -> AsyncIterator[Platform]:
    """Starts a gateway with one platform's adapter in a queue mode; stops it afterwards."""
    stack: list[Callable[[], Awaitable[None]]] = []

    async def start(config: Config, gateway: Gateway) -> Gateway:
        await gateway.start()
        stack.append(lambda: gateway.stop(grace=2))
        return gateway

    async def enter(fake: Any) -> Any:
        await fake.__aenter__()
        stack.append(lambda: fake.__aexit__(None, None, None))
        return fake

    def channel(mode: str, **settings: Any) -> dict[str, Any]:
        return {"enabled": True, "dm_policy": "open", "queue_mode": mode, **settings}

    async def telegram(mode: str) -> Rig:
        tg = await enter(FakeTelegram())
        config = make_config(
            fake_llm,
            channels={"telegram": channel(mode, token=tg.token, base_url=tg.base_url)},
        )
        gw = Gateway(config)
        gw.add_channel(TelegramChannel(config.channels.telegram))
        return await start(config, gw), TelegramChat(gw, tg)

    async def slack(mode: str) -> Rig:
        fake = await enter(FakeSlack())
        config = make_config(
            fake_llm,
            channels={
                "slack": channel(
                    mode, bot_token="xoxb-test", app_token="xapp-test", base_url=fake.api_url
                )
            },
        )
        gw = Gateway(config)
        gw.add_channel(SlackChannel(config.channels.slack))
        return await start(config, gw), SlackChat(gw, fake)

    async def discord(mode: str) -> Rig:
        fake = await enter(FakeDiscord())
        config = make_config(
            fake_llm,
            channels={
                "discord": channel(
                    mode, token=fake.token, api_base_url=fake.api_base_url,
                    gateway_url=fake.gateway_url,
                )
            },
        )
        gw = Gateway(config)
        gw.add_channel(
            DiscordChannel(config.channels.discord, guild_ready_timeout=0.01, ready_timeout=10)
        )
        return await start(config, gw), DiscordChat(gw, fake)

    async def webchat(mode: str) -> Rig:
        # The web chat takes the [gateway] default (no [channels.webchat] queue_mode).
        config = make_config(fake_llm, gateway={"queue_mode": mode})
        gw = Gateway(config)
        web = RecordingWebchat()
        gw.add_channel(web)
        await start(config, gw)
        server = WebServer(build_app(gw, web), "127.0.0.1", 0)
        url = await server.start()
        stack.append(server.stop)
        return gw, WebChat(gw, web, url)

    platforms: dict[str, Platform] = {
        "telegram": telegram, "slack": slack, "discord": discord, "webchat": webchat,
    }
    try:
        yield platforms[request.param]
    finally:
        for stop in reversed(stack):
            await stop()


PLATFORMS = ["telegram", "slack", "discord", "webchat"]

WEBCHAT_ANSWERS = {
    "collect": {"one": ["first answer"], "two": ["echo: three"], "three": ["echo: three"]},
    "followup": {"one": ["first answer"], "two": ["echo: two"], "three": ["echo: three"]},
    "steer": {"one": ["both answered"], "two": ["both answered"]},
    "interrupt": {"one": [INTERRUPT_CUT], "two": ["echo: two"]},
}
"""Which reply each web chat request got: every message is answered, by the turn that took it."""


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("platform", PLATFORMS, indirect=True)
async def test_messages_arriving_mid_turn(
    platform: Platform, mode: str, fake_llm: FakeOpenAI
) -> None:
    gateway, chat = await platform(mode)
    await SCENARIOS[mode](gateway, chat, fake_llm)
    if isinstance(chat, WebChat):
        assert await chat.answers() == WEBCHAT_ANSWERS[mode]


@pytest.mark.parametrize("platform", PLATFORMS, indirect=True)
async def test_steer_falls_back_to_a_follow_up_without_a_boundary(
    platform: Platform, fake_llm: FakeOpenAI
) -> None:
    """Steer, but the running turn's call is its last (no tool round): a follow-up answers."""
    gateway, chat = await platform("steer")
    gate = Gate()
    fake_llm.script(gate.hold(reply("first answer")))
    await chat.send("one")
    await fake_llm.wait_for_requests(1)
    await chat.send("two")
    await arrived(gateway, 1)
    gate.open()
    assert await chat.replies(2) == ["first answer", "echo: two"]
    await settle(gateway)
    assert len(fake_llm.requests) == 2


async def test_an_interrupted_preview_is_edited_into_the_cut_reply(
    fake_llm: FakeOpenAI, make_config: MakeConfig
) -> None:
    """Telegram with a streamed preview: the words shown so far stay, marked interrupted."""
    async with FakeTelegram() as tg:
        config = make_config(
            fake_llm,
            channels={
                "telegram": {
                    "enabled": True, "token": tg.token, "base_url": tg.base_url,
                    "dm_policy": "open", "queue_mode": "interrupt",
                    "stream_preview": True, "stream_min_chars": 5,
                }
            },
        )
        gw = Gateway(config)
        gw.add_channel(TelegramChannel(config.channels.telegram))
        await gw.start()
        try:
            fake_llm.script(
                stall_stream(after_chunks=4, text="Let me think about this very carefully")
            )
            chat = TelegramChat(gw, tg)
            await chat.send("one")
            [preview] = await tg.wait_for_call("sendMessage")
            assert preview["text"].startswith("Let me") and "parse_mode" not in preview

            async def written() -> bool:
                turn = gw.runner.arrivals.turn("agent:main:telegram:direct:7")
                return turn is not None and turn.partial == "Let me think about"

            await until(written)
            await chat.send("two")
            [cut, *_] = await tg.wait_for_call(
                "editMessageText", where=lambda p: p.get("parse_mode") == "HTML"
            )
            assert cut["text"] == INTERRUPT_CUT
            assert int(cut["message_id"]) == min(m for c, m in tg.bot_messages if c == USER)
            await settle(gw)
            replies = [p["text"] for p in tg.calls_to("editMessageText") if p.get("parse_mode")]
            assert replies == [INTERRUPT_CUT, "echo: two"]
        finally:
            await gw.stop(grace=2)
