from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import gateway.store.engine as store_engine
from channels.base import InboundMessage
from context.types import Message, ToolCall
from gateway.app import Gateway
from gateway.config import ConfigError
from gateway.store import SessionInfo, Store, TurnUsage


def inbound(text: str, mid: str | None = None) -> InboundMessage:
    return InboundMessage(
        platform="telegram",
        chat_type="direct",
        chat_id="42",
        sender_id="42",
        text=text,
        platform_message_id=mid,
    )


async def make_store(url: str) -> Store:
    store = Store(url)
    await store.init()
    return store


async def test_sqlite_file_uses_wal(tmp_path: Path) -> None:
    store = await make_store(f"sqlite:///{tmp_path / 'g.db'}")
    await store.ensure_session(SessionInfo(key="k"))
    await store.close()
    with sqlite3.connect(tmp_path / "g.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_inbound_is_deduplicated_by_platform_message_id(database_url: str) -> None:
    store = await make_store(database_url)
    session = await store.ensure_session(SessionInfo(key="k"))
    assert session.id is not None
    info = SessionInfo(key="k")
    assert (await store.accept_inbound(info, inbound("a", "m1")))[1] is not None
    assert (await store.accept_inbound(info, inbound("a again", "m1")))[1] is None
    assert (await store.accept_inbound(info, inbound("b", "m2")))[1] is not None
    assert await store.message_count(session.id) == 2
    await store.close()


async def test_claim_orders_conversation_by_turn_not_arrival(database_url: str) -> None:
    store = await make_store(database_url)
    session = await store.ensure_session(SessionInfo(key="k"))
    sid = session.id
    assert sid is not None
    await store.accept_inbound(SessionInfo(key="k"), inbound("first", "m1"))
    claimed = await store.claim_pending(sid)
    assert [r.content for r in claimed] == ["first"]
    # A message arrives while the first turn is still running...
    await store.accept_inbound(SessionInfo(key="k"), inbound("second", "m2"))
    await store.finish_turn(
        sid, Message(role="assistant", content="answer 1"),
        (r.id for r in claimed if r.id is not None), TurnUsage(10, 2),
    )
    # ...and is placed after the answer to the first, not before it.
    claimed = await store.claim_pending(sid)
    assert [r.content for r in claimed] == ["second"]
    history = await store.history(sid)
    assert [(m.seq, m.text) for m in history] == [(1, "first"), (2, "answer 1"), (3, "second")]
    await store.close()


async def test_claim_reads_the_turns_history_in_the_same_step(database_url: str) -> None:
    store = await make_store(database_url)
    info = SessionInfo(key="k")
    _sid, row = await store.accept_inbound(info, inbound("hello", "m1"))
    assert row is not None and row.id is not None
    asked: list[int] = []

    def nothing_cached(session_id: int) -> None:
        asked.append(session_id)

    session, claimed, read, _held = await store.claim_turn("k", lambda _s: None, nothing_cached)
    assert session is not None and asked == [session.id]
    assert read is not None and read.known is None and read.summary is None
    assert [(m.seq, m.text) for m in read.messages] == [(1, "hello")]
    await store.finish_turn(
        row.session_id, Message(role="assistant", content="hi"), [row.id], TurnUsage(5, 1)
    )
    await store.accept_inbound(info, inbound("again", "m2"))
    # A caller holding seqs 1-2 gets only what came after them, as `summary_and_history` would.
    _session, claimed, read, _held = await store.claim_turn("k", lambda _s: None, lambda _id: (0, 2))
    assert [r.content for r in claimed] == ["again"]
    assert read is not None and read.known == (0, 2)
    assert [(m.seq, m.text) for m in read.messages] == [(3, "again")]
    await store.finish_turn(
        row.session_id, Message(role="assistant", content="hi again"),
        [r.id for r in claimed if r.id], TurnUsage(5, 1),
    )
    # Nothing claimed, nothing read; and without `known` no read at all.
    _s, none_claimed, no_read, _held = await store.claim_turn("k", lambda _s: None, lambda _id: (0, 4))
    assert none_claimed == [] and no_read is None
    await store.accept_inbound(info, inbound("third", "m3"))
    assert (await store.claim_turn("k", lambda _s: None))[2] is None
    await store.close()


async def test_unfinished_claims_are_returned_again(database_url: str) -> None:
    store = await make_store(database_url)
    sid = (await store.ensure_session(SessionInfo(key="k"))).id
    assert sid is not None
    await store.accept_inbound(SessionInfo(key="k"), inbound("lost?", "m1"))
    first = await store.claim_pending(sid)
    await store.close()
    store = await make_store(database_url)  # a restart
    assert [s.key for s in await store.sessions_with_pending()] == ["k"]
    again = await store.claim_pending(sid)
    assert [r.id for r in again] == [r.id for r in first]
    assert again[0].seq == first[0].seq
    await store.close()


async def test_tool_calls_round_trip(database_url: str) -> None:
    store = await make_store(database_url)
    sid = (await store.ensure_session(SessionInfo(key="k"))).id
    assert sid is not None
    call = ToolCall(id="call_1", name="current_time", arguments='{"timezone": "UTC"}')
    await store.append_messages(
        sid,
        [
            Message(role="assistant", content=None, tool_calls=(call,)),
            Message(role="tool", content="12:00", tool_call_id="call_1", name="current_time"),
        ],
    )
    history = await store.history(sid)
    assert history[0].tool_calls == (call,)
    assert history[1].tool_call_id == "call_1"
    await store.close()


async def test_concurrent_session_creation_yields_one_row(database_url: str) -> None:
    import asyncio

    store = await make_store(database_url)
    rows = await asyncio.gather(*(store.ensure_session(SessionInfo(key="same")) for _ in range(5)))
    assert len({r.id for r in rows}) == 1
    await store.close()


# -- SQLite: hot-path steps on the event loop ------------------------------------------------


def _count_thread_steps(store: Store) -> list[int]:
    """Count the steps the store hands to its database thread."""
    calls: list[int] = []
    run = store.database.run

    async def counting(fn):  # type: ignore[no-untyped-def]
        calls.append(1)
        return await run(fn)

    store.database.run = counting  # type: ignore[method-assign]
    return calls


async def test_sqlite_hot_steps_run_on_the_loop_while_the_database_thread_is_idle(
    tmp_path: Path,
) -> None:
    store = await make_store(f"sqlite:///{tmp_path / 'g.db'}")
    thread_steps = _count_thread_steps(store)
    info = SessionInfo(key="k")
    _sid, row = await store.accept_inbound(info, inbound("hello", "m1"))
    assert row is not None and row.session_id is not None
    session, claimed, _read, _held = await store.claim_turn("k", lambda _s: None)
    assert session is not None and [r.content for r in claimed] == ["hello"]
    await store.finish_turn(
        row.session_id, Message(role="assistant", content="hi"), [row.id or 0], TurnUsage(5, 1)
    )
    assert thread_steps == []
    _summary, _after, history = await store.summary_and_history(row.session_id)
    assert [m.content for m in history] == ["hello", "hi"]
    await store.close()


async def test_sqlite_hot_step_waits_on_the_thread_not_the_loop_when_another_process_writes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "g.db"
    store = await make_store(f"sqlite:///{path}")
    await store.accept_inbound(SessionInfo(key="k"), inbound("first", "m1"))
    thread_steps = _count_thread_steps(store)
    other = sqlite3.connect(path, isolation_level=None)  # e.g. `gatehouse pairing approve`
    other.execute("BEGIN IMMEDIATE")
    accepting = asyncio.create_task(store.accept_inbound(SessionInfo(key="k"), inbound("x", "m2")))
    ticks = 0
    for _ in range(5):  # the loop keeps running while the step waits for the lock
        await asyncio.sleep(0.01)
        ticks += 1
    assert not accepting.done() and ticks == 5
    other.execute("COMMIT")
    other.close()
    _sid, row = await asyncio.wait_for(accepting, 10)
    assert row is not None and row.content == "x"
    assert thread_steps == [1]
    await store.close()


async def test_sqlite_hot_steps_wait_for_a_busy_database_thread_in_arrival_order(
    tmp_path: Path,
) -> None:
    store = await make_store(f"sqlite:///{tmp_path / 'g.db'}")
    thread_steps = _count_thread_steps(store)
    started, finished = threading.Event(), threading.Event()

    def slow() -> None:  # an ORM step or a checkpoint holding the thread
        started.set()
        time.sleep(0.2)
        finished.set()

    busy = asyncio.create_task(store.database.run(slow))
    await asyncio.to_thread(started.wait, 5)
    info = SessionInfo(key="k")
    first = asyncio.create_task(store.accept_inbound(info, inbound("first", "m1")))
    doomed = asyncio.create_task(store.accept_inbound(info, inbound("never", "m2")))
    second = asyncio.create_task(store.accept_inbound(info, inbound("second", "m3")))
    await asyncio.sleep(0.05)
    assert not first.done() and not second.done()  # waiting, not overtaking the thread
    doomed.cancel()  # a waiter that gives up does not hold up the ones behind it
    (_s1, row1), (_s2, row2) = await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert finished.is_set()
    assert row1 is not None and row2 is not None and (row1.id or 0) < (row2.id or 0)
    assert thread_steps == [1]  # then they ran on the loop, the thread's hop no longer paid
    await busy
    assert [r.content for r in (await store.claim_turn("k", lambda _s: None))[1]] == [
        "first",
        "second",
    ]
    await store.close()


async def test_sqlite_steps_let_go_together_still_run_before_later_ones(tmp_path: Path) -> None:
    """A queue behind a busy thread is let go at once (draining it one step per loop turn kept
    it from ever emptying under load); a step arriving before they ran still queues behind."""
    store = await make_store(f"sqlite:///{tmp_path / 'g.db'}")
    loop = asyncio.get_running_loop()
    info = SessionInfo(key="k")
    started = threading.Event()
    late: list[asyncio.Task[Any]] = []

    def slow() -> None:
        started.set()
        time.sleep(0.1)
        # Scheduled before the thread reports idle: this step's task starts before the waiters
        # let go below have run.
        loop.call_soon_threadsafe(
            lambda: late.append(asyncio.ensure_future(
                store.accept_inbound(info, inbound("third", "m3"))
            ))
        )

    busy = asyncio.create_task(store.database.run(slow))
    await asyncio.to_thread(started.wait, 5)
    waiting = [
        asyncio.create_task(store.accept_inbound(info, inbound(text, mid)))
        for text, mid in (("first", "m1"), ("second", "m2"))
    ]
    await asyncio.wait_for(asyncio.gather(busy, *waiting), 10)
    await asyncio.wait_for(late[0], 10)
    assert store.database._released == 0 and not store.database._waiting
    assert [r.content for r in (await store.claim_turn("k", lambda _s: None))[1]] == [
        "first", "second", "third",
    ]
    await store.close()


async def test_sqlite_inline_writes_leave_wal_checkpoints_to_the_database_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_engine, "CHECKPOINT_EVERY", 3)
    path = tmp_path / "g.db"
    store = await make_store(f"sqlite:///{path}")
    thread_steps = _count_thread_steps(store)
    for i in range(3):
        await store.accept_inbound(SessionInfo(key="k"), inbound(f"m{i}", f"m{i}"))
    await asyncio.gather(*store.database._checkpoints)
    assert thread_steps == [1]
    await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 3


async def test_database_threads_set_the_postgresql_pool_and_sqlite_keeps_one(
    database_url: str, make_config: Any
) -> None:
    """`[gateway] database_threads` is how many steps wait on PostgreSQL at once; SQLite keeps
    its one database thread whatever it says."""
    gateway = Gateway(make_config(gateway={"database_threads": 3}))
    await gateway.store.init()
    try:
        threads = {gateway.store.database._workers}
        seen: set[str] = set()
        for _ in range(12):  # steps at once: they spread over the pool's threads
            await asyncio.gather(*(
                gateway.store.database.run(lambda: seen.add(threading.current_thread().name))
                for _ in range(6)
            ))
        assert threads == {1 if gateway.store.is_sqlite else 3}
        assert 1 <= len(seen) <= (1 if gateway.store.is_sqlite else 3)
    finally:
        await gateway.store.close()
    with pytest.raises(ConfigError, match="database_threads"):
        make_config(gateway={"database_threads": 0})
