"""Cross-process locks on PostgreSQL: a session's lane and a leader, held by advisory locks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text

from gateway.store import Store
from gateway.store.locks import LockBusyError
from tests.postgres import ThrowawayPostgres


@pytest.fixture
async def stores(postgres: ThrowawayPostgres) -> AsyncIterator[tuple[Store, Store]]:
    """Two processes' stores on one fresh database."""
    url = postgres.new_database()
    one, two = Store(url), Store(url)
    try:
        await one.init()
        await two.init()
        yield one, two
    finally:
        await one.close()
        await two.close()


async def test_a_session_lock_is_held_by_one_store_at_a_time(stores: tuple[Store, Store]) -> None:
    one, two = stores
    order: list[str] = []
    async with one.session_lock("telegram:dm:1"):
        waiting = asyncio.create_task(_take(two, "telegram:dm:1", order))
        await asyncio.sleep(0.3)
        assert order == [], "the second store must wait for the first"
        async with two.session_lock("telegram:dm:2"):  # other sessions are not blocked
            order.append("other session")
        order.append("first released")
    await asyncio.wait_for(waiting, 5)
    assert order == ["other session", "first released", "second acquired"]


async def _take(store: Store, key: str, order: list[str]) -> None:
    async with store.session_lock(key, poll=0.02):
        order.append("second acquired")


async def test_a_dead_holder_releases_its_lock(stores: tuple[Store, Store]) -> None:
    one, two = stores
    lock = await one.advisory_lock(42, wait=False)
    assert lock is not None
    with pytest.raises(LockBusyError):
        await two.advisory_lock(42, wait=False)
    lock.conn.terminate()  # the holding process dies: its connection goes away
    # The server frees the lock once its backend sees the socket close: moments later, not
    # at once, so asking with wait=False right away can still find it held.
    taken = await asyncio.wait_for(two.advisory_lock(42, wait=True), 10)
    assert taken is not None and await taken.alive()
    await taken.release()


async def test_sqlite_needs_no_lock(tmp_path: object) -> None:
    store = Store(f"sqlite:///{tmp_path}/g.db")
    await store.init()
    assert await store.advisory_lock(1, wait=False) is None
    async with store.session_lock("k"):
        pass
    await store.close()


async def _advisory_holders(store: Store) -> list[int]:
    """The backend pids holding advisory locks in this store's database."""

    def read(db: Any) -> list[int]:
        rows = db.exec(text(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )).all()
        return [int(r[0]) for r in rows]

    return await store.database.read(read)


async def test_a_process_holds_its_session_locks_on_one_connection(
    stores: tuple[Store, Store],
) -> None:
    one, two = stores
    entered = asyncio.Event()
    leave = asyncio.Event()
    inside = 0

    async def turn(key: str) -> None:
        nonlocal inside
        async with one.session_lock(key):
            inside += 1
            if inside == 20:
                entered.set()
            await leave.wait()

    turns = [asyncio.create_task(turn(f"webchat:dm:{n}")) for n in range(20)]
    await asyncio.wait_for(entered.wait(), 10)
    holders = await _advisory_holders(one)
    assert len(holders) == 20 and len(set(holders)) == 1, "20 locks, one backend"
    with pytest.raises(asyncio.TimeoutError):  # another process still waits for each
        async with asyncio.timeout(0.3):
            async with two.session_lock("webchat:dm:7", poll=0.02):
                pass
    leave.set()
    await asyncio.wait_for(asyncio.gather(*turns), 10)
    assert await _advisory_holders(one) == [], "every lock released"
    async with two.session_lock("webchat:dm:7"):
        pass


async def test_askers_in_one_process_take_turns_for_the_same_session(
    stores: tuple[Store, Store],
) -> None:
    one, two = stores
    order: list[str] = []
    async def turn(name: str, hold: float) -> None:
        async with one.session_lock("telegram:dm:1"):
            order.append(f"{name} in")
            await asyncio.sleep(hold)
            order.append(f"{name} out")

    await asyncio.gather(turn("a", 0.2), turn("b", 0))
    assert order == ["a in", "a out", "b in", "b out"], "the shared connection re-enters"
    async with two.session_lock("telegram:dm:1"):  # released as often as taken
        pass


async def test_a_cancelled_waiter_leaves_no_lock_behind(stores: tuple[Store, Store]) -> None:
    one, two = stores
    async with two.session_lock("slack:dm:9"):
        waiting = asyncio.create_task(_take(one, "slack:dm:9", []))
        await asyncio.sleep(0.2)
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
    await asyncio.sleep(0.1)
    assert await _advisory_holders(one) == []
    async with asyncio.timeout(5), two.session_lock("slack:dm:9"):
        pass


async def test_a_lost_lock_connection_is_said_and_replaced(
    stores: tuple[Store, Store], caplog: pytest.LogCaptureFixture
) -> None:
    one, two = stores
    async with one.session_lock("discord:dm:3"):
        [pid] = await _advisory_holders(one)
        await one.database.read(
            lambda db: db.exec(text(f"SELECT pg_terminate_backend({pid})")).all()
        )
        # The server let the lock go with its connection: another process may take it.
        async with asyncio.timeout(5), two.session_lock("discord:dm:3", poll=0.02):
            pass
    async with asyncio.timeout(5), one.session_lock("discord:dm:4"):
        assert len(await _advisory_holders(one)) == 1
    assert "lost the connection holding this process's session locks" in caplog.text


def test_a_store_used_from_a_second_event_loop_takes_its_locks_there(
    postgres: ThrowawayPostgres,
) -> None:
    """The CLI runs one event loop per command; a connection is bound to the loop that made it."""
    store = Store(postgres.new_database())

    async def first() -> None:
        await store.init()
        async with store.session_lock("webchat:dm:1"):
            pass

    async def second() -> list[int]:
        async with store.session_lock("webchat:dm:1"):
            held = await _advisory_holders(store)
        await store.close()
        return held

    asyncio.run(first())
    assert len(asyncio.run(second())) == 1
