"""Which process fires scheduled jobs, against a real store and no gateway: two stores on one
database stand for two `gatehouse run` processes. On PostgreSQL the leader holds an advisory
lock on a connection of its own; on SQLite (one process per database) everyone leads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text

from gateway.jobs.leader import Leadership
from gateway.store import Store
from tests.conftest import on_postgres

POLL = 0.05
"""How often a contender asks for the lock (`[scheduler] leader_poll_seconds`)."""
WAIT = 5.0
"""How long a test waits for something that should happen within a few polls."""

postgres_only = pytest.mark.skipif(
    not on_postgres(), reason="advisory locks: GATEHOUSE_TEST_DB=postgres"
)


@pytest.fixture
async def stores(database_url: str) -> AsyncIterator[tuple[Store, Store]]:
    """Two processes' stores on one database."""
    first, second = Store(database_url), Store(database_url)
    await first.init()
    await second.init()
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


async def still_waiting(task: asyncio.Task[None]) -> bool:
    """Give the contender several polls; True if it is still waiting for the lock."""
    await asyncio.sleep(POLL * 6)
    return not task.done()


def kill_backend(store: Store, leader: Leadership) -> None:
    """End the leader's lock connection from another connection, as when its process dies or
    its network goes: PostgreSQL drops the lock with the connection."""
    lock = leader._lock
    assert lock is not None
    pid = lock.conn.get_server_pid()
    with store.engine.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})


@pytest.mark.skipif(on_postgres(), reason="SQLite only")
async def test_on_sqlite_every_process_leads_at_once(stores: tuple[Store, Store]) -> None:
    first, second = (Leadership(s, POLL) for s in stores)
    assert first.leading and second.leading, "one process per SQLite database: it leads"
    await asyncio.wait_for(first.wait(), WAIT)
    await asyncio.wait_for(second.wait(), WAIT)
    await first.release()
    assert first.leading, "nothing to release: still the only process"


@postgres_only
async def test_the_first_contender_leads_and_the_next_waits_for_its_release(
    stores: tuple[Store, Store],
) -> None:
    first, second = (Leadership(s, POLL) for s in stores)
    assert not first.leading and not second.leading
    await asyncio.wait_for(first.wait(), WAIT)
    assert first.leading

    contending = asyncio.create_task(second.wait())
    assert await still_waiting(contending), "the lock is held: the second process waits"
    assert not second.leading

    await first.release()
    assert not first.leading
    await asyncio.wait_for(contending, WAIT)
    assert second.leading, "a released lock passes to the process asking"

    again = asyncio.create_task(first.wait())
    assert await still_waiting(again), "the former leader now waits its turn"
    await second.release()
    await asyncio.wait_for(again, WAIT)
    assert first.leading and not second.leading
    await first.release()


@postgres_only
async def test_leadership_passes_when_the_leader_connection_is_gone(
    stores: tuple[Store, Store],
) -> None:
    first, second = (Leadership(s, POLL) for s in stores)
    await asyncio.wait_for(first.wait(), WAIT)
    contending = asyncio.create_task(second.wait())
    assert await still_waiting(contending)

    stepped_down = asyncio.Event()

    async def step_down() -> None:
        stepped_down.set()

    watching = asyncio.create_task(first.watch(step_down))
    try:
        await asyncio.to_thread(kill_backend, stores[1], first)
        await asyncio.wait_for(stepped_down.wait(), WAIT)
        assert not first.leading, "a leader that lost its connection stops firing"
        await asyncio.wait_for(contending, WAIT)
        assert second.leading
    finally:
        watching.cancel()
        await second.release()


@postgres_only
async def test_a_contender_that_gives_up_holds_nothing(stores: tuple[Store, Store]) -> None:
    first, second = (Leadership(s, POLL) for s in stores)
    await asyncio.wait_for(first.wait(), WAIT)
    contending = asyncio.create_task(second.wait())
    assert await still_waiting(contending)
    contending.cancel()  # e.g. `gatehouse run` stopped before it ever led
    with pytest.raises(asyncio.CancelledError):
        await contending
    assert not second.leading

    await first.release()
    third = Leadership(stores[1], POLL)
    await asyncio.wait_for(third.wait(), WAIT)
    assert third.leading, "the cancelled contender left no lock behind"
    await third.release()
