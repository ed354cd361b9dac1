"""Cross-process locks on PostgreSQL: a session's lane and a leader, held by advisory locks."""

from __future__ import annotations

import asyncio

import pytest

from gateway.store import Store
from gateway.store.locks import LockBusyError
from tests.postgres import ThrowawayPostgres


async def _stores(postgres: ThrowawayPostgres) -> tuple[Store, Store]:
    url = postgres.new_database()
    one, two = Store(url), Store(url)  # two processes' stores
    await one.init()
    await two.init()
    return one, two


async def test_a_session_lock_is_held_by_one_store_at_a_time(postgres: ThrowawayPostgres) -> None:
    one, two = await _stores(postgres)
    order: list[str] = []
    try:
        async with one.session_lock("telegram:dm:1"):
            waiting = asyncio.create_task(_take(two, "telegram:dm:1", order))
            await asyncio.sleep(0.3)
            assert order == [], "the second store must wait for the first"
            async with two.session_lock("telegram:dm:2"):  # other sessions are not blocked
                order.append("other session")
            order.append("first released")
        await asyncio.wait_for(waiting, 5)
        assert order == ["other session", "first released", "second acquired"]
    finally:
        await one.close()
        await two.close()


async def _take(store: Store, key: str, order: list[str]) -> None:
    async with store.session_lock(key, poll=0.02):
        order.append("second acquired")


async def test_a_dead_holder_releases_its_lock(postgres: ThrowawayPostgres) -> None:
    one, two = await _stores(postgres)
    try:
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
    finally:
        await one.close()
        await two.close()


async def test_sqlite_needs_no_lock(tmp_path: object) -> None:
    store = Store(f"sqlite:///{tmp_path}/g.db")
    await store.init()
    assert await store.advisory_lock(1, wait=False) is None
    async with store.session_lock("k"):
        pass
    await store.close()
