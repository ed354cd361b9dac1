"""The per-session history cache: new rows only, hidden statuses, counts, bounded size."""

from __future__ import annotations

from context.types import Message
from gateway.store import SessionInfo, Store
from gateway.turn.history import COMMAND_STATUS, HistoryCache


async def open_store(url: str) -> tuple[Store, int]:
    store = Store(url)
    await store.init()
    session = await store.ensure_session(SessionInfo(key="k"))
    assert session.id is not None
    return store, session.id


async def test_a_view_loads_only_what_is_new(database_url: str) -> None:
    store, sid = await open_store(database_url)
    try:
        await store.append_messages(sid, [Message(role="user", content="one")])
        cache = HistoryCache(store)
        first = await cache.view(sid)
        assert [m.text for m in first.history] == ["one"] and first.summary is None
        assert cache.known(sid) == (0, 1)
        rows = await store.append_messages(sid, [Message(role="assistant", content="two")])
        cache.append(sid, rows)
        assert cache.known(sid) == (0, 2), "a tool round joins the cache as it is stored"
        await store.append_messages(sid, [Message(role="user", content="/compact")],
                                    status=COMMAND_STATUS)
        await store.append_messages(sid, [Message(role="user", content="three")])
        second = await cache.view(sid)
        assert [m.text for m in second.history] == ["one", "two", "three"], "commands hidden"
        uncached = await cache.view(sid, use_cache=False)
        assert [m.text for m in uncached.history] == ["one", "two", "three"]
    finally:
        await store.close()


async def test_fresh_counts_reach_the_cache_and_the_store(database_url: str) -> None:
    store, sid = await open_store(database_url)
    try:
        await store.append_messages(sid, [Message(role="user", content="hello")])
        cache = HistoryCache(store)
        [m] = (await cache.view(sid)).history
        assert m.tokens is None
        counts = cache.remember_counts(sid, [m.with_tokens(7)])
        assert counts == {int(m.meta["id"]): 7}
        assert [h.tokens for h in (await cache.view(sid)).history] == [7]
    finally:
        await store.close()


async def test_the_least_recently_used_sessions_leave_first(database_url: str) -> None:
    store, sid = await open_store(database_url)
    try:
        other = await store.ensure_session(SessionInfo(key="other"))
        assert other.id is not None
        cache = HistoryCache(store, sessions=1)
        await cache.view(sid)
        await cache.view(other.id)
        assert cache.known(sid) is None and cache.known(other.id) is not None
        cache.forget(other.id)
        assert cache.known(other.id) is None
    finally:
        await store.close()
