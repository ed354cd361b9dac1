from __future__ import annotations

import sqlite3
from pathlib import Path

from channels.base import InboundMessage
from context.types import Message, ToolCall
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
