"""`/healthz` reports the database (SQLite and PostgreSQL): failing after a store step failed,
ok again once a write succeeds. Cheap: the store remembers its last failure, probes write
nothing."""

from __future__ import annotations

from typing import Any

import aiohttp
from sqlalchemy import create_engine, text

from gateway.config import sync_url
from tests.conftest import RunningGateway
from tests.fakes import FakeOpenAI, reply


async def health(url: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/healthz") as resp:
        return resp.status, await resp.json()


async def post(url: str, user: str, text_: str) -> int:
    async with aiohttp.ClientSession() as http, http.post(
        f"{url}/api/messages", json={"user_id": user, "text": text_}
    ) as resp:
        return resp.status


def rename_messages(database_url: str, old: str, new: str) -> None:
    engine = create_engine(sync_url(database_url))
    try:
        with engine.begin() as conn:
            conn.execute(text(f"ALTER TABLE {old} RENAME TO {new}"))
    finally:
        engine.dispose()


async def test_healthz_follows_the_database(
    base_url: str, running: RunningGateway, fake_llm: FakeOpenAI, database_url: str
) -> None:
    fake_llm.script(reply("hi"))
    assert await post(base_url, "alice", "hello") == 200
    status, body = await health(base_url)
    assert (status, body["status"], body["database"]) == (200, "ok", "ok")

    rename_messages(database_url, "messages", "messages_away")  # every message write fails
    try:
        assert await post(base_url, "bob", "anyone there?") == 500
        status, body = await health(base_url)
        assert status == 503
        assert body["status"] == "failing"
        assert body["database"].startswith("failing: ") and "messages" in body["database"]
        status, again = await health(base_url)  # a probe changes nothing
        assert (status, again["database"]) == (503, body["database"])
    finally:
        rename_messages(database_url, "messages_away", "messages")

    fake_llm.script(reply("back"))
    assert await post(base_url, "carol", "and now?") == 200
    status, body = await health(base_url)
    assert (status, body["database"]) == (200, "ok")
