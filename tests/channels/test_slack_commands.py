"""Chat commands on Slack: the app's slash command in HTTP mode (signed requests to the real
slack-bolt app, the answer posted to the invocation's response_url) and a command typed as a
message. Real Gateway, fake Slack and fake OpenAI servers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from channels.commands import CHAT_COMMANDS
from channels.slack import EVENTS_PATH, SlackChannel
from channels.slack_commands import SlackSlashCommand
from gateway.app import Gateway
from gateway.operations import show_session
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.fakes.slack_server import FakeSlack, event_callback, im_message, signed_headers

SECRET = "5f1e2d3c4b0d9c3e1a2b4f5e6d7c8b9a"


@dataclass
class Rig:
    fake: FakeSlack
    llm: FakeOpenAI
    gateway: Gateway
    client: TestClient[web.Request, web.Application]

    async def post(self, body: str, form: bool = True) -> int:
        headers = signed_headers(SECRET, body)
        if form:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        response = await self.client.post(EVENTS_PATH, data=body, headers=headers)
        return response.status


@pytest.fixture
async def rig(fake_llm: FakeOpenAI, make_config: MakeConfig) -> AsyncIterator[Rig]:
    async with FakeSlack() as fake:
        config = make_config(
            fake_llm,
            channels={"slack": {
                "enabled": True, "mode": "http", "bot_token": "xoxb-test",
                "signing_secret": SECRET, "base_url": fake.api_url, "dm_policy": "open",
            }},
        )
        gateway = Gateway(config)
        channel = SlackChannel(config.channels.slack)
        gateway.add_channel(channel)
        await gateway.start()
        app = web.Application()
        channel.add_routes(app)
        try:
            async with TestClient(TestServer(app)) as client:
                yield Rig(fake, fake_llm, gateway, client)
        finally:
            await gateway.stop()


async def test_the_slash_command_is_answered_through_its_response_url(rig: Rig) -> None:
    fake = rig.fake
    body, trigger = fake.slash_command("status")
    assert await rig.post(body) == 200, "acknowledged once stored"
    [answer] = await fake.wait_for_call("response_url")
    assert answer["trigger_id"] == trigger
    assert answer["response_type"] == "in_channel"
    assert answer["text"].startswith("Model: `fake-model`") and "Context: " in answer["text"]
    assert fake.calls_to("chat.postMessage") == []
    assert rig.llm.requests == [], "the command did not call the model"

    body, _trigger = fake.slash_command("")  # the bare slash command: the list
    assert await rig.post(body) == 200
    _first, help_ = await fake.wait_for_call("response_url", n=2)
    assert all(f"/{c.name}" in help_["text"] for c in CHAT_COMMANDS)

    body, _trigger = fake.slash_command("compact  keep the ticket ids")
    assert await rig.post(body) == 200
    await fake.wait_for_call("response_url", n=3)
    shown = await show_session(rig.gateway.config, "agent:main:slack:direct:U0SLASH01", True)
    assert shown is not None
    users = [m.message.content for m in shown.messages if m.message.role == "user"]
    assert users == ["/status", "/help", "/compact keep the ticket ids"], "stored as typed"


async def test_a_command_typed_as_a_message(rig: Rig) -> None:
    # Slack's composer takes a leading "/" as a slash command: a typed one starts with a blank.
    body = event_callback(im_message(" /new", user="U0TYPED01"))
    assert await rig.post(json.dumps(body), form=False) == 200
    [post] = await rig.fake.wait_for_call("chat.postMessage")
    assert post["text"].startswith("Already a fresh context")
    assert rig.llm.requests == []


def test_an_invocation_reads_as_the_command_it_names() -> None:
    slash = SlackSlashCommand("/gatehouse", "slack")
    base = {"user_id": "U1", "channel_id": "C1", "trigger_id": "T1", "channel_name": "general"}
    for text, typed in [
        ("status", "/status"), ("  CONTEXT ", "/context"), ("reset", "/new"), ("", "/help"),
        ("what is this", "/help"), ("compact  focus on db01", "/compact focus on db01"),
        ("new and more", "/new"),
    ]:
        msg = slash.normalize({**base, "text": text})
        assert msg is not None and msg.text == typed, text
        assert msg.chat_type == "channel" and msg.was_mentioned
    dm = slash.normalize({**base, "channel_id": "D1", "channel_name": "directmessage"})
    assert dm is not None and dm.chat_type == "direct"
    group = slash.normalize({**base, "channel_name": "mpdm-a--b-1"})
    assert group is not None and group.chat_type == "group"
    malformed: list[Any] = [None, [], {**base, "user_id": None}, {**base, "channel_id": " "},
                            {**base, "trigger_id": 5}]
    for bad in malformed:
        assert slash.normalize(bad) is None
