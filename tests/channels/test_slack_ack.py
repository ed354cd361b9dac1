"""Slack is acknowledged only after the message is persisted (HTTP 200 and Socket Mode acks).

Bolt runs with ``process_before_response``: an event the gateway could not store is not acked,
so Slack delivers it again; one it stored is acked once, and a redelivery is not answered twice.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from channels.base import InboundMessage, InboundResult
from channels.settings import SlackSettings
from channels.slack import EVENTS_PATH, SlackChannel
from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.fakes.slack_server import FakeSlack, event_callback, im_message, signed_headers

SECRET = "0d9c3e1a2b4f5e6d7c8b9a0f1e2d3c4b"


class Gate:
    """An ``on_message`` handler that holds each message until released, or fails once."""

    def __init__(self, fail: int = 0) -> None:
        self.fail = fail
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.stored: list[InboundMessage] = []

    async def __call__(self, msg: InboundMessage) -> InboundResult:
        self.entered.set()
        await self.release.wait()
        if self.fail:
            self.fail -= 1
            raise RuntimeError("the store is unavailable")
        self.stored.append(msg)
        return InboundResult(session_key="k", accepted=True)


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


def _signed(event: dict[str, object]) -> tuple[str, dict[str, str]]:
    body = json.dumps(event_callback(event))
    return body, signed_headers(SECRET, body)


async def test_http_answers_200_only_after_the_handler_stored_the_message(fake: FakeSlack) -> None:
    gate = Gate()
    channel = SlackChannel(
        SlackSettings(mode="http", bot_token="xoxb-t", signing_secret=SECRET, base_url=fake.api_url)
    )
    await channel.start(gate)
    app = web.Application()
    channel.add_routes(app)
    try:
        async with TestClient(TestServer(app)) as client:
            body, headers = _signed(im_message("persist me first", user="U1"))
            post = asyncio.create_task(client.post(EVENTS_PATH, data=body, headers=headers))
            await asyncio.wait_for(gate.entered.wait(), 5)
            await asyncio.sleep(0.05)
            assert not post.done(), "acked before the message was stored"
            gate.release.set()
            assert (await post).status == 200
            assert [m.text for m in gate.stored] == ["persist me first"]
    finally:
        await channel.stop()


async def test_http_failure_to_store_answers_500_and_the_retry_is_taken(fake: FakeSlack) -> None:
    gate = Gate(fail=1)
    gate.release.set()
    channel = SlackChannel(
        SlackSettings(mode="http", bot_token="xoxb-t", signing_secret=SECRET, base_url=fake.api_url)
    )
    await channel.start(gate)
    app = web.Application()
    channel.add_routes(app)
    try:
        async with TestClient(TestServer(app)) as client:
            body, headers = _signed(im_message("try again", user="U1"))
            assert (await client.post(EVENTS_PATH, data=body, headers=headers)).status == 500
            assert gate.stored == []
            retry = {**headers, "X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_error"}
            assert (await client.post(EVENTS_PATH, data=body, headers=retry)).status == 200
            assert [m.text for m in gate.stored] == ["try again"]
    finally:
        await channel.stop()


async def test_socket_mode_acks_after_the_handler_and_not_on_failure(fake: FakeSlack) -> None:
    gate = Gate(fail=1)
    channel = SlackChannel(
        SlackSettings(bot_token="xoxb-t", app_token="xapp-t", base_url=fake.api_url)
    )
    await channel.start(gate)
    try:
        event = im_message("socket persist", user="U2")
        first = fake.push_event(event)
        await asyncio.wait_for(gate.entered.wait(), 5)
        await asyncio.sleep(0.05)
        assert not any(a.get("envelope_id") == first for a in fake.acks)
        gate.release.set()  # ... and the store fails: no ack, Slack will deliver it again
        await asyncio.sleep(0.2)
        assert not any(a.get("envelope_id") == first for a in fake.acks)
        second = fake.push_event(dict(event))  # Slack's redelivery of the unacked event
        await fake.wait_for_ack(second)
        assert [m.text for m in gate.stored] == ["socket persist"]
    finally:
        await channel.stop()


async def test_gateway_has_the_message_in_its_store_when_slack_gets_the_200(
    fake_llm: FakeOpenAI, fake: FakeSlack, make_config: MakeConfig
) -> None:
    config = make_config(
        fake_llm,
        channels={
            "slack": {
                "enabled": True,
                "mode": "http",
                "bot_token": "xoxb-test",
                "signing_secret": SECRET,
                "base_url": fake.api_url,
                "dm_policy": "open",
            }
        },
    )
    gateway = Gateway(config)
    channel = SlackChannel(config.channels.slack)
    gateway.add_channel(channel)
    await gateway.start()
    app = web.Application()
    channel.add_routes(app)
    try:
        async with TestClient(TestServer(app)) as client:
            body, headers = _signed(im_message("stored before the ack", user="U3"))
            assert (await client.post(EVENTS_PATH, data=body, headers=headers)).status == 200
            # No waiting: the 200 means the message is already in the store.
            session = await gateway.store.get_session("agent:main:slack:direct:U3")
            assert session is not None and session.id is not None
            assert await gateway.store.message_count(session.id) >= 1
            retry = {**headers, "X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "timeout"}
            assert (await client.post(EVENTS_PATH, data=body, headers=retry)).status == 200
            [post] = await fake.wait_for_call("chat.postMessage", timeout=10)
            await gateway.lanes.join()
        assert post["text"] == "echo: stored before the ack"
        assert len(fake_llm.requests) == 1
        assert len(fake.calls_to("chat.postMessage")) == 1
    finally:
        await gateway.stop()
