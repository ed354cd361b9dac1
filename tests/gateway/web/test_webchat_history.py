"""`GET /api/history`: what the webchat page shows of a user's conversation after a reload.

Over a real socket (aiohttp server + client), like test_server.py: only the session the user's
own messages go to is ever read; ids are checked like every other input (a malformed query gets
a 422 and one log line); a reset (`/new`) is a boundary the page starts after; notices that
answer no message wait for the page's next poll. The page's static files carry the same CSP.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest

from channels.base import OutboundMessage
from gateway.app import Gateway
from gateway.web.server import WebServer, build_app
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import FakeOpenAI


async def post(url: str, user: str, text: str, message_id: str | None = None) -> dict[str, Any]:
    payload: dict[str, Any] = {"user_id": user, "text": text}
    if message_id is not None:
        payload["message_id"] = message_id
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/api/messages", json=payload) as r:
            assert r.status == 200, await r.text()
            body: dict[str, Any] = await r.json()
            return body


async def history(url: str, query: str | dict[str, Any]) -> tuple[int, dict[str, Any]]:
    qs = query if isinstance(query, str) else urlencode(query)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/api/history?{qs}") as r:
            body: dict[str, Any] = await r.json()
            if r.status == 200:
                assert r.headers["Cache-Control"] == "no-store"
            return r.status, body


def texts(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["role"], m["text"]) for m in body["messages"]]


async def test_history_is_the_users_own_session_in_order(base_url: str) -> None:
    await post(base_url, "alice", "first from alice", message_id="a-1")
    await post(base_url, "bob", "bob's secret")
    await post(base_url, "alice", "second from alice")
    for _ in range(50):  # the lane ends just after the reply is handed over
        status, body = await history(base_url, {"user_id": "alice"})
        if not body.get("busy"):
            break
        await asyncio.sleep(0.05)
    assert status == 200
    assert body["session_key"] == "agent:main:webchat:direct:alice"
    assert texts(body) == [
        ("user", "first from alice"), ("assistant", "echo: first from alice"),
        ("user", "second from alice"), ("assistant", "echo: second from alice"),
    ]
    seqs = [m["seq"] for m in body["messages"]]
    assert seqs == sorted(seqs) and body["last_seq"] == seqs[-1]
    assert body["messages"][0]["message_id"] == "a-1"  # the page matches its own bubble by it
    assert body["messages"][1]["message_id"] is None
    assert body["busy"] is False and body["shared"] is False and body["notices"] == []
    assert "bob" not in str(body)
    # Only what comes after the page's newest seq; at most `limit`, the newest.
    _, later = await history(base_url, {"user_id": "alice", "after": seqs[1]})
    assert [m["seq"] for m in later["messages"]] == seqs[2:]
    _, newest = await history(base_url, {"user_id": "alice", "limit": 1})
    assert texts(newest) == [("assistant", "echo: second from alice")]
    # A user who never wrote has an empty history (and no session is made for them).
    _, nobody = await history(base_url, {"user_id": "carol"})
    assert nobody["messages"] == [] and nobody["last_seq"] == 0


async def test_tool_steps_are_left_out(base_url: str, fake_llm: FakeOpenAI) -> None:
    from tests.fakes import reply, tool_call

    fake_llm.script(tool_call("memory_search", {"query": "ORD-7"}), reply("Nothing on ORD-7."))
    await post(base_url, "alice", "what about ORD-7?")
    _, body = await history(base_url, {"user_id": "alice"})
    assert texts(body) == [("user", "what about ORD-7?"), ("assistant", "Nothing on ORD-7.")]


async def test_a_reset_is_where_the_history_starts(
    base_url: str, running: RunningGateway
) -> None:
    await post(base_url, "alice", "old topic")
    key = "agent:main:webchat:direct:alice"
    assert await running.gateway.reset_session(key, "new chat", flush=False) is not None
    await post(base_url, "alice", "new topic")
    _, body = await history(base_url, {"user_id": "alice"})
    assert texts(body) == [("user", "new topic"), ("assistant", "echo: new topic")]
    assert body["reset_seq"] == 2
    # An undone reset brings the messages back (nothing was deleted).
    await running.gateway.runner.compactions.uncompact(key)
    _, body = await history(base_url, {"user_id": "alice"})
    assert [t for _, t in texts(body)][:2] == ["old topic", "echo: old topic"]


async def test_notices_that_answer_no_message_wait_for_the_next_poll(
    base_url: str, running: RunningGateway
) -> None:
    await post(base_url, "alice", "hello")
    key = "agent:main:webchat:direct:alice"
    for text in ("Compacting earlier messages…", "Kept the last 4 turns."):
        await running.gateway.deliver(
            OutboundMessage(platform="webchat", chat_id="alice", text=text, session_key=key)
        )
    _, bob = await history(base_url, {"user_id": "bob"})
    assert bob["notices"] == []
    _, body = await history(base_url, {"user_id": "alice"})
    assert body["notices"] == ["Compacting earlier messages…", "Kept the last 4 turns."]
    _, again = await history(base_url, {"user_id": "alice"})
    assert again["notices"] == []  # each once


@pytest.fixture
async def shared_url(fake_llm: FakeOpenAI, make_config: MakeConfig) -> AsyncIterator[str]:
    """A gateway where every DM is one session (``dm_scope = "main"``)."""
    gateway = Gateway(make_config(fake_llm, sessions={"dm_scope": "main"}))
    rg = RunningGateway(gateway)
    await gateway.start()
    server = WebServer(build_app(gateway, rg.webchat), "127.0.0.1", 0)
    try:
        yield await server.start()
    finally:
        await server.stop()
        await gateway.stop()


async def test_a_session_shared_by_every_chat_shows_no_history(shared_url: str) -> None:
    await post(shared_url, "alice", "alice's secret")
    status, body = await history(shared_url, {"user_id": "bob"})
    assert status == 200
    assert body["shared"] is True and body["messages"] == []
    _, own = await history(shared_url, {"user_id": "alice"})
    assert own["messages"] == []  # the session holds everyone's messages: none is shown


@pytest.mark.parametrize(
    ("query", "needle"),
    [
        ("", "user_id"),
        ("user_id=", "user_id"),
        ("user_id=%20%20", "user_id is blank"),
        ("user_id=%E2%80%8B", "user_id is blank"),
        ("user_id=ev%00il", "NUL"),
        ("user_id=" + "a" * 257, "user_id"),
        ("user_id=alice&user_id=bob", "user_id given more than once"),
        ("user_id=alice&after=-1", "after"),
        ("user_id=alice&after=1.5", "after"),
        ("user_id=alice&after=" + "9" * 5000, "after"),
        ("user_id=alice&limit=0", "limit"),
        ("user_id=alice&limit=201", "limit"),
        ("user_id=alice&limit=%EF%BC%91", "limit"),  # a full-width digit one
        ("user_id=alice&session_key=agent%3Amain%3Amain", "session_key"),
    ],
    ids=["missing", "empty", "blank", "zero-width", "nul", "too-long", "repeated",
         "negative-after", "fraction", "huge-after", "zero-limit", "big-limit",
         "full-width-digit", "foreign-field"],
)
async def test_a_malformed_query_gets_a_422_and_one_log_line(
    base_url: str, caplog: pytest.LogCaptureFixture, query: str, needle: str
) -> None:
    await post(base_url, "alice", "hello")
    caplog.clear()
    with caplog.at_level(logging.INFO):
        status, body = await history(base_url, query)
    assert status == 422, body
    assert needle in body["error"]
    refusals = [r for r in caplog.records if "422" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in caplog.records]
    assert not any(r.exc_info for r in caplog.records)


async def test_page_and_static_files_carry_a_csp_without_inline_code(base_url: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base_url}/") as r:
            page = await r.text()
            csp = r.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "style-src 'self'" in csp
        assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
        assert "<style" not in page and "style=" not in page
        assert page.count("<script") == page.count('<script src="/webchat/static/')
        for name, ctype in (("webchat.js", "text/javascript"), ("markdown.js", "text/javascript"),
                            ("webchat.css", "text/css")):
            async with http.get(f"{base_url}/webchat/static/{name}") as r:
                assert r.status == 200 and r.content_type == ctype
                assert r.headers["X-Content-Type-Options"] == "nosniff"
                assert len(await r.read()) > 1000
        for name in ("webchat.html", "..%2Fwebchat.py", "nope.js"):
            async with http.get(f"{base_url}/webchat/static/{name}") as r:
                assert r.status == 404, name
