"""`/healthz` reports the database (SQLite and PostgreSQL): failing after a store step failed,
ok again once a write succeeds. Cheap: the store remembers its last failure, probes write
nothing. A SQLite file replaced under the running gateway fails it for good, the old file's
content saved beside it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sqlalchemy import create_engine, make_url, text

from gateway.config import sync_url
from tests.conftest import RunningGateway, on_postgres
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


@pytest.mark.skipif(on_postgres(), reason="a SQLite file")
async def test_a_database_file_replaced_while_running_is_refused_and_its_copy_kept(
    base_url: str, running: RunningGateway, fake_llm: FakeOpenAI, database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake_llm.script(reply("hi"))
    assert await post(base_url, "alice", "hello") == 200
    db = Path(make_url(database_url).database or "")
    other = db.with_name("restored-from-a-backup.db")
    with contextlib.closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE t (x)")
    for name in ("gatehouse.db-wal", "gatehouse.db-shm"):  # the old file's, as they must go
        db.with_name(name).unlink(missing_ok=True)
    other.replace(db)  # `mv backup.db data/gatehouse.db` under the running gateway
    status, body = await health(base_url)
    assert status == 503
    named = re.search(r"move (gatehouse\.db\.rescued-\S+) \(what it had open\)", body["database"])
    assert named is not None, body
    assert body["database"] == f"failing: {db} was replaced by another file while the gateway " \
        "ran: it takes no more turns; restart the gateway to use the new gatehouse.db, or stop " \
        f"it and move {named.group(1)} (what it had open) into its place first to keep the old one"
    assert await post(base_url, "bob", "anyone?") == 503, "not written into the old file"
    rescued = db.parent / named.group(1)
    def said() -> list[logging.LogRecord]:  # the store's own line (others quote the fault)
        return [r for r in caplog.records
                if r.name == "gateway.store.engine" and "was replaced by another file" in
                r.getMessage()]

    for _ in range(200):  # the copy is saved on the database thread, then the line is logged
        if said():
            break
        await asyncio.sleep(0.05)
    with contextlib.closing(sqlite3.connect(rescued)) as conn:
        assert conn.execute("SELECT count(*) FROM sessions").fetchone() == (1,)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("t",)]
    assert len(said()) == 1
    status, again = await health(base_url)  # for good: no write clears it
    assert (status, again["database"]) == (503, body["database"])
