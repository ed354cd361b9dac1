"""The hot path on PostgreSQL: asyncpg on the event loop (gateway/store/postgres.py)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.store.engine import Database
from gateway.store.faults import StorageError
from gateway.store.postgres import dollar
from tests.postgres import ThrowawayPostgres


def test_psycopg_parameters_become_numbered_ones() -> None:
    sql, names = dollar("SELECT %(a)s, %(b)s::json, %(a)s + 1 WHERE x LIKE 'a%%'")
    assert sql == "SELECT $1, $2::json, $1 + 1 WHERE x LIKE 'a%'"
    assert names == ("a", "b")


@pytest.fixture
async def db(postgres: ThrowawayPostgres) -> AsyncIterator[Database]:
    """An open Database on a fresh throwaway database."""
    database = Database(postgres.new_database())
    try:
        await database.open()
        yield database
    finally:
        await database.close()


async def test_a_step_reads_json_and_times_as_the_orm_does(db: Database) -> None:
    def step(cursor: Any) -> Any:
        cursor.execute(
            "SELECT %(doc)s::json, now(), %(n)s::bigint + %(n)s", {"doc": '{"a": [1]}', "n": 2}
        )
        return cursor.fetchone()

    doc, now, four = await db.fast(step)
    assert db.hot.d.load_json(doc) == {"a": [1]} and four == 4  # JSON comes as its text
    assert now.utcoffset() is not None and now.utcoffset().total_seconds() == 0


async def test_a_failed_transaction_rolls_back_and_its_connection_is_reused(db: Database) -> None:
    forgotten: list[str] = []
    db.on_rollback(lambda: forgotten.append("cache"))

    def write_then_fail(cursor: Any) -> None:
        cursor.execute("CREATE TABLE t (id int PRIMARY KEY)")
        cursor.execute("INSERT INTO t VALUES (1), (1)")

    with pytest.raises(db.integrity_errors):
        await db.fast(write_then_fail, write=True)
    assert forgotten == ["cache"], "a repository's cache forgets what the rollback undid"

    def exists(cursor: Any) -> Any:
        cursor.execute("SELECT to_regclass('t')")
        return cursor.fetchone()[0]

    assert await db.fast(exists) is None, "the CREATE TABLE was rolled back with the rest"


async def test_a_cancelled_step_never_hands_on_its_transaction(db: Database) -> None:
    def slow(cursor: Any) -> None:
        cursor.execute("CREATE TABLE IF NOT EXISTS t (id int)")
        cursor.execute("SELECT pg_sleep(30)")

    step = asyncio.create_task(db.fast(slow, write=True))
    await asyncio.sleep(0.5)
    step.cancel()
    with pytest.raises(asyncio.CancelledError):
        await step

    def in_transaction(cursor: Any) -> Any:
        cursor.execute("SELECT to_regclass('t')")  # the cancelled transaction's table
        return cursor.fetchone()[0]

    for _ in range(3):  # whichever connection answers is outside that transaction
        assert await asyncio.wait_for(db.fast(in_transaction), 10) is None


async def test_an_unreachable_server_is_one_clear_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket closes
    db = Database(f"postgresql://gatehouse:s3cret-pw@127.0.0.1:{port}/gatehouse")
    try:
        with pytest.raises(StorageError) as caught:
            await db.fast(lambda cursor: cursor.execute("SELECT 1"))
        message = str(caught.value)
        assert message.startswith("cannot reach the database"), message
        assert "s3cret-pw" not in message and "s3cret-pw" not in (db.failure or "")
        assert db.failure is not None, "/healthz reports it without touching the database"
    finally:
        await db.close()


def test_a_database_used_from_a_second_event_loop_opens_its_own_connections(
    postgres: ThrowawayPostgres,
) -> None:
    """The CLI runs one event loop per command; the first loop's connections stay behind."""
    db = Database(postgres.new_database())

    def one(cursor: Any) -> Any:
        cursor.execute("SELECT 1")
        return cursor.fetchone()[0]

    async def first() -> Any:
        await db.open()
        return await db.fast(one)

    async def second() -> Any:
        try:
            return await asyncio.wait_for(db.fast(one), 10)
        finally:
            await db.close()

    assert asyncio.run(first()) == 1
    assert asyncio.run(second()) == 1
