"""Issue 20: a webchat `message_id` belongs to its sender, and ids are never merged.

Over a real socket (aiohttp server + aiohttp client), like web/test_server.py: reply waiters are keyed by
(user, message_id) as the store dedupes by (platform, chat_id, platform_message_id); a repeat of
a message waits for (or gets) the one stored reply; ids that cannot be stored as they are, blank
ids and invisible text are refused with a 422.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gateway.app import Gateway
from gateway.web.server import WebServer, build_app
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import FakeOpenAI, echo


async def post(url: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """POST one JSON body (json.dumps escapes NUL and lone surrogates as \\u0000 / \\ud800)."""
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{url}/api/messages",
            data=json.dumps(payload),
            headers={"Content-Type": "application/json"},
        ) as r:
            return r.status, await r.json()


def answer(user: str, text: str) -> tuple[int, dict[str, Any]]:
    return 200, {"session_key": f"agent:main:webchat:direct:{user}", "replies": [f"echo: {text}"]}


async def test_a_shared_message_id_never_carries_another_users_reply(
    base_url: str, fake_llm: FakeOpenAI
) -> None:
    fake_llm.latency = 0.5  # Alice's turn is still running when Bob's message arrives
    secret = "my password is hunter2"
    alice = asyncio.create_task(
        post(base_url, {"user_id": "alice", "text": secret, "message_id": "shared-1"})
    )
    await fake_llm.wait_for_requests(1)
    bob = await post(base_url, {"user_id": "bob", "text": "hi", "message_id": "shared-1"})
    assert bob == answer("bob", "hi")
    assert await asyncio.wait_for(alice, 5) == answer("alice", secret)  # not left hanging


async def test_a_retry_in_flight_waits_for_the_same_reply(
    base_url: str, fake_llm: FakeOpenAI
) -> None:
    fake_llm.latency = 0.5
    payload = {"user_id": "alice", "text": "hello", "message_id": "m-1"}
    first = asyncio.create_task(post(base_url, payload))
    await fake_llm.wait_for_requests(1)
    assert await post(base_url, payload) == answer("alice", "hello")  # not a 409
    assert await asyncio.wait_for(first, 5) == answer("alice", "hello")
    assert len(fake_llm.requests) == 1


async def test_a_retry_after_the_answer_gets_the_stored_reply(
    base_url: str, running: RunningGateway, fake_llm: FakeOpenAI
) -> None:
    payload = {"user_id": "alice", "text": "hello", "message_id": "m-1"}
    assert await post(base_url, payload) == answer("alice", "hello")
    assert await post(base_url, {"user_id": "alice", "text": "next"}) == answer("alice", "next")
    started = time.monotonic()
    assert await post(base_url, payload) == answer("alice", "hello")  # its own reply, not "next"'s
    assert time.monotonic() - started < 2
    assert len(fake_llm.requests) == 2
    # The same id from another user is another message.
    assert await post(base_url, {**payload, "user_id": "bob"}) == answer("bob", "hello")
    assert await running.gateway.store.message_count() == 6


async def test_fifty_parallel_posts_of_one_message_get_one_answer_quickly(
    base_url: str, fake_llm: FakeOpenAI
) -> None:
    fake_llm.latency = 0.5
    payload = {"user_id": "alice", "text": "once", "message_id": "burst-1"}
    started = time.monotonic()
    results = await asyncio.gather(*(post(base_url, payload) for _ in range(50)))
    elapsed = time.monotonic() - started
    assert results == [answer("alice", "once")] * 50
    assert len(fake_llm.requests) == 1  # one turn, one answer
    assert elapsed < 5  # the turn's time, never the reply timeout (10 s here, 300 s by default)


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        ({"user_id": "   ", "text": "hi"}, "user_id"),
        ({"user_id": "\u200b\u2060", "text": "hi"}, "user_id"),
        ({"user_id": "ev\x00il", "text": "hi"}, "user_id"),
        ({"user_id": "ev\ud800il", "text": "hi"}, "user_id"),
        ({"user_id": "a", "text": "hi", "message_id": " \t"}, "message_id"),
        ({"user_id": "a", "text": "\u200b\u200c\u200d\u2060\ufeff"}, "text is empty"),
        ({"user_id": "a", "text": " \u200b\n\ufeff "}, "text is empty"),
    ],
    ids=["blank-user", "zero-width-user", "nul-user", "surrogate-user", "blank-message-id",
         "zero-width-text", "zero-width-and-spaces"],
)
async def test_blank_and_unstorable_fields_get_a_clear_422(
    base_url: str,
    running: RunningGateway,
    fake_llm: FakeOpenAI,
    payload: dict[str, Any],
    needle: str,
) -> None:
    status, body = await post(base_url, payload)
    assert status == 422, body
    assert needle in body["error"]
    assert await running.gateway.store.message_count() == 0
    assert fake_llm.requests == []


async def test_a_nul_id_never_shares_the_session_of_its_escaped_look_alike(
    base_url: str, running: RunningGateway
) -> None:
    plain = "ev\\x00il"  # a backslash, x, 0, 0: an ordinary id
    assert await post(base_url, {"user_id": plain, "text": "my secret"}) == (
        200,
        {"session_key": "agent:main:webchat:direct:ev%5Cx00il", "replies": ["echo: my secret"]},
    )
    for evil in ("ev\x00il", "ev\ud800il"):
        status, body = await post(base_url, {"user_id": evil, "text": "what did I say?"})
        assert status == 422, body
    assert await running.gateway.store.message_count() == 2  # plain's message and reply only


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


async def test_a_turn_answering_several_users_of_a_shared_session_answers_each(
    shared_url: str, fake_llm: FakeOpenAI
) -> None:
    # One turn collects Alice's and Bob's messages; its reply is addressed to the last sender's
    # chat, so the other waiter (keyed by its own user) finds the reply in the store.
    fake_llm.latency = 0.5
    first = asyncio.create_task(post(shared_url, {"user_id": "carol", "text": "first"}))
    await fake_llm.wait_for_requests(1)
    started = time.monotonic()
    alice, bob = await asyncio.gather(
        post(shared_url, {"user_id": "alice", "text": "from alice", "message_id": "x"}),
        post(shared_url, {"user_id": "bob", "text": "from bob", "message_id": "x"}),
    )
    assert time.monotonic() - started < 5  # never the reply timeout
    assert (await first)[0] == 200
    assert len(fake_llm.requests) == 2  # one turn for both
    assert alice[0] == bob[0] == 200
    assert alice[1]["replies"] == bob[1]["replies"] == [fake_llm_reply(fake_llm.requests[1])]


def fake_llm_reply(body: dict[str, Any]) -> str:
    return str(echo(body).text)
