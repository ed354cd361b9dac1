"""The webchat HTTP API over a real socket (aiohttp server + aiohttp client)."""

from __future__ import annotations

import logging

import aiohttp
import pytest

from tests.conftest import RunningGateway
from tests.fakes import FakeOpenAI, reply


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
            health = await r.json()
        assert health["status"] == "ok"
        assert health["memory_search"] == "off"  # the tests' config: [memory] embeddings = false


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
    first = await post(base_url, payload)
    assert first == (200, {"session_key": "agent:main:webchat:direct:a", "replies": ["first"]})
    assert await post(base_url, payload) == first  # the stored reply, not a second answer
    assert len(fake_llm.requests) == 1


# -- hardening (issue 20): malformed input is a 4xx and one log line; cross-site posts refused --

DEEP = b'{"user_id": "a", "text": ' + b"[" * 5_000 + b"]" * 5_000 + b"}"


def refusal_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """Records a refused request left, from the gateway, the channels or aiohttp itself
    (refusals are warnings; background jobs' INFO lines, e.g. leader election on PostgreSQL,
    are not about the request)."""
    return [
        r for r in caplog.records
        if r.name.split(".")[0] in ("gateway", "channels", "aiohttp", "slack_bolt")
        and r.levelno >= logging.WARNING
    ]


@pytest.mark.parametrize(
    "payload",
    [DEEP, b"[" * 100_000, b'{"user_id": "a", "text": ' + b"1" * 5_000 + b"}"],
    ids=["deep-object", "deep-array", "huge-integer"],
)
async def test_deep_or_huge_json_is_a_400_and_one_log_line_without_traceback(
    base_url: str, fake_llm: FakeOpenAI, caplog: pytest.LogCaptureFixture, payload: bytes
) -> None:
    caplog.set_level(logging.INFO)
    status, body = await post(base_url, payload)
    assert status == 400, body
    assert "JSON" in body["error"]
    [line] = refusal_lines(caplog)
    assert line.exc_info is None and "Traceback" not in caplog.text
    assert fake_llm.requests == []


@pytest.mark.parametrize(
    "ctype",
    ["application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x", ""],
)
async def test_only_json_is_accepted_so_a_cross_site_form_cannot_post(
    base_url: str, running: RunningGateway, ctype: str
) -> None:
    status, body = await post(base_url, '{"user_id": "alice", "text": "hi"}', ctype=ctype)
    assert status == 415
    assert "application/json" in body["error"]
    assert await running.gateway.store.message_count() == 0


async def test_foreign_host_and_cross_site_origin_are_refused(
    base_url: str, running: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    payload = b'{"user_id": "alice", "text": "hi"}'
    json_type = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        # DNS rebinding: evil.example resolves to 127.0.0.1, the browser still sends its name.
        async with http.post(f"{base_url}/api/messages", data=payload,
                             headers={**json_type, "Host": "evil.example:8787"}) as r:
            assert r.status == 421
        async with http.get(f"{base_url}/healthz", headers={"Host": "evil.example"}) as r:
            assert r.status == 421
        for forged in ({"Origin": "https://evil.example"}, {"Origin": "null"},
                       {"Referer": "https://evil.example/page"}):
            async with http.post(f"{base_url}/api/messages", data=payload,
                                 headers={**json_type, **forged}) as r:
                assert r.status == 403, forged
                assert "cross-site" in (await r.json())["error"]
    assert await running.gateway.store.message_count() == 0
    assert len(refusal_lines(caplog)) == 5
    assert "Traceback" not in caplog.text
