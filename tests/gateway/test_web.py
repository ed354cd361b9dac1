"""The webchat HTTP API over a real socket (aiohttp server + aiohttp client)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from gateway.web import WebServer, build_app
from tests.conftest import RunningGateway
from tests.fakes import FakeOpenAI, reply


@pytest.fixture
async def base_url(running: RunningGateway) -> AsyncIterator[str]:
    server = WebServer(build_app(running.gateway, running.webchat), "127.0.0.1", 0)
    url = await server.start()
    yield url
    await server.stop()


async def post(url: str, data: bytes | str, ctype: str = "application/json") -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http:
        body = data.encode() if isinstance(data, str) else data
        async with http.post(f"{url}/api/messages", data=body, headers={"Content-Type": ctype}) as r:
            return r.status, await r.json()


async def test_chat_round_trip(base_url: str, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(reply("hi alice"))
    status, body = await post(base_url, '{"user_id": "alice", "text": "hello"}')
    assert status == 200
    assert body == {"session_key": "agent:main:webchat:direct:alice", "replies": ["hi alice"]}


async def test_page_and_health(base_url: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base_url}/") as r:
            assert r.status == 200
            assert "/api/messages" in await r.text()
        async with http.get(f"{base_url}/healthz") as r:
            assert (await r.json())["status"] == "ok"


@pytest.mark.parametrize(
    ("payload", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"\xff\xfe{}", 400, "not valid UTF-8"),
        (b'{"text": "hi"}', 422, "user_id"),
        (b'{"user_id": "a"}', 422, "text"),
        (b'{"user_id": "a", "text": 5}', 422, "text"),
        (b'{"user_id": "a", "text": "   "}', 422, "text is empty"),
        (b'{"user_id": "a", "text": "x", "extra": 1}', 422, "extra"),
        (b"[1, 2]", 422, "invalid request"),
    ],
)
async def test_bad_requests_get_clear_4xx(
    base_url: str, fake_llm: FakeOpenAI, payload: bytes, status: int, needle: str
) -> None:
    got, body = await post(base_url, payload)
    assert got == status
    assert needle in body["error"]
    assert fake_llm.requests == []


async def test_one_megabyte_message_is_refused_cleanly(
    base_url: str, running: RunningGateway, fake_llm: FakeOpenAI
) -> None:
    big = '{"user_id": "a", "text": "' + "x" * 1_000_000 + '"}'
    status, body = await post(base_url, big)
    assert status == 413
    assert "1,000,000 characters" in body["error"]
    assert await running.gateway.store.message_count() == 0


async def test_lone_surrogate_escape_is_accepted(base_url: str, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(reply("ok"))
    status, body = await post(base_url, '{"user_id": "a", "text": "x \\ud800 y"}')
    assert status == 200
    assert body["replies"] == ["ok"]


async def test_duplicate_message_id_is_answered_once(
    base_url: str, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script(reply("first"))
    payload = '{"user_id": "a", "text": "hi", "message_id": "m-1"}'
    assert (await post(base_url, payload))[0] == 200
    status, body = await post(base_url, payload)
    assert status == 409
    assert body["error"] == "duplicate message"
    assert len(fake_llm.requests) == 1
