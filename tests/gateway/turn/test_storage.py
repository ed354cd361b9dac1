"""A turn the database cannot store (gateway/turn/storage.py), through a real Gateway, its web
server and the real SQLite driver: SQLite's own "database or disk is full" (`PRAGMA
max_page_count`, `tests/helpers/storage.py`; `tests/e2e/test_storage_faults.py` fills a real
filesystem under `gatehouse run`). The waiting request gets a 503 within seconds, the message
stays unanswered in the store, and once the database takes writes again the reply the model
already gave is stored and sent, without the user writing again and without a second model
call."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from gateway.app import Gateway
from gateway.store import MessageRow
from gateway.store.faults import StorageError
from gateway.turn.storage import StorageBlocks
from gateway.web.server import WebServer, build_app
from tests.conftest import MakeConfig, RunningGateway, on_postgres
from tests.fakes import FakeOpenAI, Reply, last_user_text
from tests.helpers.storage import PageLimit

pytestmark = pytest.mark.skipif(on_postgres(), reason="SQLite's own page limit")

BIG = "x" * 400_000
"""A reply of ~100 pages: more than the room the database is left."""


@dataclass
class Web:
    gateway: Gateway
    limit: PageLimit
    url: str

    async def post(self, text: str, message_id: str) -> tuple[int, dict[str, Any], float]:
        began = time.monotonic()
        async with aiohttp.ClientSession() as http, http.post(
            f"{self.url}/api/messages",
            json={"user_id": "alice", "text": text, "message_id": message_id},
        ) as resp:
            return resp.status, await resp.json(), time.monotonic() - began

    async def health(self) -> tuple[int, dict[str, Any]]:
        async with aiohttp.ClientSession() as http, http.get(f"{self.url}/healthz") as resp:
            return resp.status, await resp.json()

    async def reply_to(self, message_id: str) -> list[str] | None:
        return await self.gateway.store.reply_to("webchat", "alice", message_id)


@pytest.fixture
async def web(make_config: MakeConfig, fake_llm: FakeOpenAI) -> AsyncIterator[Web]:
    gateway = Gateway(make_config(fake_llm))
    limit = PageLimit(gateway.store.engine)  # before the store opens a connection
    gateway.runner.blocked.delays = (0.2, 0.5, 1.0)  # tries come sooner (default: 1 s … 15 s)
    chat = RunningGateway(gateway)
    await gateway.start()
    server = WebServer(build_app(gateway, chat.webchat), "127.0.0.1", 0)
    url = await server.start()
    try:
        yield Web(gateway, limit, url)
    finally:
        await server.stop()
        await gateway.stop()


async def until(check: Any, within: float = 10.0) -> None:
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def test_a_reply_that_cannot_be_stored_is_a_503_then_answered_once_space_returns(
    web: Web, fake_llm: FakeOpenAI
) -> None:
    def answer(body: dict[str, Any]) -> Reply:
        text = last_user_text(body)
        return Reply(BIG if text == "the long one" else f"re: {text}")

    fake_llm.default = answer
    status, body, _s = await web.post("hello", "m1")
    assert (status, body["replies"]) == (200, ["re: hello"])

    web.limit.set(web.limit.page_count() + 10)  # room for a message, not for a long reply
    status, body, seconds = await web.post("the long one", "m2")
    assert status == 503 and seconds < 5, (status, body, seconds)
    assert body["error"].startswith("the database is failing: the reply could not be stored")
    assert "disk is full" in body["error"] and "answered once the database works" in body["error"]
    assert body["pending"] is True
    status, health = await web.health()
    assert status == 503 and "disk is full" in health["database"]
    assert health["unstored_turns"] == 1
    assert await web.reply_to("m2") is None, "the message stays unanswered"
    key = "agent:main:webchat:direct:alice"
    session = await web.gateway.store.get_session(key)
    assert session is not None and session.id is not None
    assert await web.gateway.store.has_pending(session.id)
    # Asked again with the same id, the answer is the same 503, at once.
    status, body, seconds = await web.post("the long one", "m2")
    assert status == 503 and seconds < 1.5 and body["pending"] is True
    tries = web.gateway.runner.blocked.tries(key)
    await asyncio.sleep(1.5)  # tries while the disk is still full: still nothing
    assert await web.reply_to("m2") is None
    assert web.gateway.runner.blocked.tries(key) > tries, "it was tried again"

    web.limit.set(None)  # space is back
    await until(lambda: web.reply_to("m2"), within=20)
    assert await web.reply_to("m2") == [BIG]
    assert not await web.gateway.store.has_pending(session.id)
    asked = [b for b in fake_llm.requests if last_user_text(b) == "the long one"]
    assert len(asked) == 1, "the model's answer was kept, not asked for again"
    status, health = await web.health()
    assert (status, health["database"], health["unstored_turns"]) == (200, "ok", 0)
    fault = web.gateway.store.health
    assert fault.failing is None and fault.last_fault is not None
    assert "disk is full" in fault.last_fault and fault.recovered_at is not None
    status, body, _s = await web.post("the long one", "m2")  # the stored reply, as for any repeat
    assert (status, body["replies"]) == (200, [BIG])
    status, body, _s = await web.post("and now?", "m3")
    assert (status, body["replies"]) == (200, ["re: and now?"])


def test_blocked_sessions_wait_their_delay_or_go_at_once_after_a_write() -> None:
    blocks = StorageBlocks(delays=(30.0, 60.0))
    fault = StorageError("cannot write data/gatehouse.db: the disk is full", "free some space")
    row = MessageRow(
        session_id=1, role="user", content="hi", platform="webchat", chat_id="alice",
        platform_message_id="m1",
    )
    blocks.block("k", fault, [row])
    assert blocks.reason_for("webchat", "alice", "m1") == str(fault)
    assert blocks.reason_for("webchat", "bob", "m1") is None, "keyed by chat too"
    assert blocks.due() == [] and blocks.tries("k") == 1
    blocks.hurry()  # a write succeeded somewhere
    assert blocks.due() == ["k"]
    assert blocks.due() == [], "due again only after its delay"
    blocks.block("k", fault)
    assert blocks.tries("k") == 2 and blocks.reason_for("webchat", "alice", "m1") is not None
    blocks.stored("k")
    assert "k" not in blocks and blocks.reason_for("webchat", "alice", "m1") is None
