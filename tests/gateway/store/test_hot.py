"""The hot path's SQL, called directly on a driver cursor (SQLite file, or PostgreSQL with
GATEHOUSE_TEST_DB=postgres), and read back through the ORM: both must agree on every value."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import asyncpg
import pytest
from sqlmodel import select

from channels.base import OutboundMessage
from context.types import Message, ToolCall
from gateway.store import CompactionRow, SessionRow, Store, TurnRecordRow
from gateway.store.hot import Dialect, HotPath, TurnEnd, build, message_meta
from gateway.store.messages import reply_values
from gateway.store.models import MessageRow
from gateway.store.postgres import Cursor, asyncpg_dsn

NOON = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)


@dataclass
class Raw:
    """A migrated database, a driver connection of its own and the store's ORM next to it."""

    store: Store
    hot: HotPath
    conn: Any
    cursor: Any

    def commit(self) -> None:
        """Make the cursor's writes visible to the store's own connections."""
        self.conn.commit()

    def session(self, key: str = "k") -> int:
        session_id = self.hot.session_id(self.cursor, key, {**_SESSION, "key": key})
        assert session_id is not None
        return session_id

    def inbound(self, session_id: int, text: str, mid: str | None) -> dict[str, Any]:
        return {
            "session_id": session_id, "role": "user", "content": text, "sender_id": "u1",
            "platform": "telegram", "chat_id": "42", "platform_message_id": mid,
            "handled": False,
        }


_SESSION = {
    "agent": "main", "platform": "telegram", "chat_type": "direct", "chat_id": "42",
    "thread_id": None, "account": "default",
}


class AsyncpgTransaction:
    """PostgreSQL: the hot path's driver (asyncpg) in one open transaction, driven from
    synchronous test code through an event loop of its own in a thread."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.conn = self.wait(asyncpg.connect(asyncpg_dsn(url)))
        self.wait(self.conn.execute("BEGIN"))

    def wait(self, call: Awaitable[Any]) -> Any:
        async def run() -> Any:
            return await call

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def cursor(self) -> Cursor:
        return Cursor(self.conn, wait=self.wait)

    def commit(self) -> None:
        self.wait(self.conn.execute("COMMIT; BEGIN"))

    def close(self) -> None:
        self.wait(self.conn.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
async def raw(database_url: str) -> AsyncIterator[Raw]:
    store = Store(database_url)
    await store.init()
    conn: Any = (
        store.engine.raw_connection() if store.is_sqlite else AsyncpgTransaction(database_url)
    )
    cursor = conn.cursor()
    try:
        yield Raw(store, HotPath(Dialect(sqlite=store.is_sqlite)), conn, cursor)
    finally:
        cursor.close()
        if store.is_sqlite:
            conn.rollback()
        conn.close()
        await store.close()


# -- Dialect and row building (no database) ----------------------------------------------------


def test_postgres_statements_get_named_pyformat_parameters() -> None:
    statement = "SELECT a::text FROM t WHERE b = :b AND c LIKE '5%' AND d = :d_2"
    assert Dialect(sqlite=False).sql(statement) == (
        "SELECT a::text FROM t WHERE b = %(b)s AND c LIKE '5%%' AND d = %(d_2)s"
    )
    assert Dialect(sqlite=True).sql(statement) == statement


def test_sqlite_times_are_utc_text_and_come_back_aware() -> None:
    sqlite = Dialect(sqlite=True)
    two_hours_east = NOON.astimezone(timezone(timedelta(hours=2)))
    assert sqlite.dump_time(two_hours_east) == "2024-05-01 12:00:00.123456"
    assert sqlite.load_time("2024-05-01 12:00:00.123456") == NOON
    assert sqlite.load_time(NOON.replace(tzinfo=None)) == NOON
    assert sqlite.load_time(None) is None
    postgres = Dialect(sqlite=False)
    assert postgres.dump_time(two_hours_east) == NOON
    assert postgres.dump_time(two_hours_east).tzinfo is UTC


def test_json_and_booleans_decode_per_driver() -> None:
    sqlite, postgres = Dialect(sqlite=True), Dialect(sqlite=False)
    assert sqlite.dump_json(None) is None and sqlite.dump_json([1, "a"]) == '[1, "a"]'
    assert sqlite.load_json('{"a": 1}') == {"a": 1}
    assert postgres.load_json('"a text"') == "a text"  # asyncpg hands back the JSON text too
    decoded = sqlite.decode(
        ("handled", "tool_error", "content", "created_at", "role"),
        (0, None, '"hi"', "2024-05-01 12:00:00.123456", "user"),
    )
    assert decoded == {
        "handled": False, "tool_error": None, "content": "hi", "created_at": NOON, "role": "user",
    }


def test_build_fills_declared_defaults_and_keeps_the_given_values() -> None:
    values: dict[str, Any] = {"key": "k", "next_seq": 7}
    row = build(SessionRow, values)
    assert isinstance(row, SessionRow)
    assert (row.key, row.next_seq, row.agent, row.turns, row.last_error) == (
        "k", 7, "main", 0, None,
    )
    assert row.created_at.tzinfo is UTC  # from the default factory
    assert row.__dict__ is values  # the given dict becomes the row's state, no copy


def test_message_meta_is_the_same_shape_on_every_read_path() -> None:
    assert message_meta(1, "u1", None, None, None) == {"id": 1, "sender_id": "u1", "status": None}
    meta = message_meta(2, None, "error", 1, NOON.replace(tzinfo=None))
    assert meta["tool_error"] is True
    assert meta["created_at"] == "2024-05-01T12:00:00.123456+00:00"  # naive means UTC


# -- statements on a real database ---------------------------------------------------------


async def test_a_session_is_found_or_created_and_reads_back_through_the_orm(raw: Raw) -> None:
    assert raw.hot.session_id(raw.cursor, "k", None) is None  # no row, none made
    assert raw.hot.get_session(raw.cursor, "k") is None
    session_id = raw.session("k")
    assert raw.session("k") == session_id  # found, not inserted again
    row = raw.hot.get_session(raw.cursor, "k")
    assert row is not None
    assert (row.id, row.platform, row.next_seq, row.turns) == (session_id, "telegram", 1, 0)
    assert row.created_at.tzinfo is not None
    raw.commit()
    [orm] = await raw.store.list_sessions()
    assert (orm.id, orm.key, orm.created_at.replace(tzinfo=UTC)) == (
        session_id, "k", row.created_at,
    )


async def test_seqs_are_handed_out_in_consecutive_blocks(raw: Raw) -> None:
    session_id = raw.session()
    assert raw.hot.allocate_seqs(raw.cursor, session_id, 3) == 1
    assert raw.hot.allocate_seqs(raw.cursor, session_id, 2) == 4
    row = raw.hot.get_session(raw.cursor, "k")
    assert row is not None and row.next_seq == 6


async def test_a_redelivered_inbound_message_is_not_stored_twice(raw: Raw) -> None:
    session_id = raw.session()
    first = raw.hot.insert_inbound(raw.cursor, raw.inbound(session_id, "hello", "m1"))
    assert first is not None and first.id is not None
    assert (first.content, first.handled, first.seq) == ("hello", False, None)
    assert raw.hot.insert_inbound(raw.cursor, raw.inbound(session_id, "again", "m1")) is None
    # Without a platform message id there is nothing to deduplicate by.
    assert raw.hot.insert_inbound(raw.cursor, raw.inbound(session_id, "x", None)) is not None
    assert raw.hot.insert_inbound(raw.cursor, raw.inbound(session_id, "y", None)) is not None
    unhandled = raw.hot.unhandled(raw.cursor, session_id)
    assert [r.content for r in unhandled] == ["hello", "x", "y"]
    assert unhandled[0].created_at == first.created_at


async def test_claimed_messages_get_seqs_marks_and_token_counts(raw: Raw) -> None:
    session_id = raw.session()
    rows = [
        raw.hot.insert_inbound(raw.cursor, raw.inbound(session_id, text, text))
        for text in ("a", "b", "c")
    ]
    ids = [r.id for r in rows if r is not None and r.id is not None]
    raw.hot.set_seqs(raw.cursor, [(ids[0], 1), (ids[1], 2)])
    raw.hot.set_tokens(raw.cursor, {ids[0]: 5})
    raw.hot.mark_handled(raw.cursor, ids[:2], "done", {ids[1]: 9})
    assert [r.id for r in raw.hot.unhandled(raw.cursor, session_id)] == [ids[2]]
    history = raw.hot.history(raw.cursor, session_id, 0)  # only messages with a seq
    assert [(m.seq, m.text, m.tokens, m.meta["status"]) for m in history] == [
        (1, "a", 5, "done"),  # its earlier count kept: no count given with the mark
        (2, "b", 9, "done"),
    ]
    assert [m.seq for m in raw.hot.history(raw.cursor, session_id, 1)] == [2]
    raw.hot.set_seqs(raw.cursor, [])  # nothing to do is no statement at all
    raw.hot.mark_handled(raw.cursor, [], None)
    raw.hot.set_tokens(raw.cursor, {})


async def test_stored_replies_read_back_as_messages(raw: Raw) -> None:
    session_id = raw.session()
    call = ToolCall(id="call_1", name="current_time", arguments='{"timezone": "UTC"}')
    assistant = raw.hot.insert_message(raw.cursor, {
        "session_id": session_id, "seq": 1, "role": "assistant", "content": None,
        "tool_calls": [call.to_openai()],
    })
    assert assistant.handled is True and assistant.id is not None
    raw.hot.insert_message_only(raw.cursor, {
        "session_id": session_id, "seq": 2, "role": "tool", "content": "12:00",
        "tool_call_id": "call_1", "name": "current_time", "tool_error": False,
    })
    raw.commit()
    history = raw.hot.history(raw.cursor, session_id, 0)
    assert history[0].tool_calls == (call,) and history[0].content is None
    assert history[0].meta["id"] == assistant.id and "tool_error" not in history[0].meta
    assert (history[1].role, history[1].text, history[1].meta["tool_error"]) == (
        "tool", "12:00", False,
    )
    assert history == await raw.store.history(session_id)  # the same as the store's read


async def test_finishing_a_turn_counts_usage_once_and_keeps_unknowns(raw: Raw) -> None:
    session_id = raw.session()
    seq = raw.hot.finish_turn(
        raw.cursor, session_id, prompt_tokens=100, completion_tokens=20, error=None,
        token_ratio=1.25,
    )
    assert seq == 1
    seq = raw.hot.finish_turn(
        raw.cursor, session_id, prompt_tokens=None, completion_tokens=None, error="boom",
        token_ratio=None,
    )
    assert seq == 2
    row = raw.hot.get_session(raw.cursor, "k")
    assert row is not None
    assert (row.turns, row.next_seq, row.tokens_in, row.tokens_out) == (2, 3, 100, 20)
    assert (row.last_prompt_tokens, row.token_ratio, row.last_error) == (100, 1.25, "boom")


async def test_turn_records_and_outbox_rows_read_back_through_the_orm(raw: Raw) -> None:
    session_id = raw.session()
    record = TurnRecordRow(session_id=0, prompt_tokens=50, window=8000, seconds=1.5)
    raw.hot.insert_turn_record(raw.cursor, record, session_id, reply_seq=3)
    outbound = OutboundMessage(
        platform="telegram", chat_id="42", text="hi", session_key="k", answers=("m1", "m2"),
        sent_parts=1,
    )
    outbox_id = raw.hot.insert_outbox(raw.cursor, session_id, outbound)
    raw.commit()
    [stored] = await raw.store.turn_records(session_id)
    assert (stored.session_id, stored.reply_seq, stored.window, stored.seconds) == (
        session_id, 3, 8000, 1.5,
    )
    assert await raw.store.undelivered() == [(outbox_id, outbound)]


async def test_the_latest_compaction_skips_undone_ones(raw: Raw) -> None:
    session_id = raw.session()
    raw.commit()
    assert raw.hot.latest_compaction(raw.cursor, session_id) is None

    def compaction(last_seq: int) -> CompactionRow:
        return CompactionRow(
            session_id=session_id, first_seq=1, last_seq=last_seq, summary=f"to {last_seq}",
            tokens_before=100, tokens_after=10, quality={"score": 1},
        )

    await raw.store.add_compaction(compaction(4))
    await raw.store.add_compaction(compaction(8))
    raw.commit()  # a fresh snapshot for the cursor's next read
    latest = raw.hot.latest_compaction(raw.cursor, session_id)
    assert latest is not None
    assert (latest.last_seq, latest.quality, latest.undone) == (8, {"score": 1}, False)
    await raw.store.undo_latest_compaction(session_id)
    raw.commit()
    latest = raw.hot.latest_compaction(raw.cursor, session_id)
    assert latest is not None and latest.last_seq == 4


async def _rows(raw: Raw, session_id: int) -> list[MessageRow]:
    """The session's message rows through the ORM."""
    stmt = select(MessageRow).where(MessageRow.session_id == session_id)
    return await raw.store.database.read(lambda db: list(db.exec(stmt).all()))


class CountingCursor:
    """A driver cursor that counts the statements sent through it."""

    def __init__(self, cursor: Any) -> None:
        self.cursor, self.statements = cursor, 0

    def execute(self, *args: Any) -> Any:
        self.statements += 1
        return self.cursor.execute(*args)

    def executemany(self, *args: Any) -> Any:
        self.statements += 1
        return self.cursor.executemany(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cursor, name)


async def test_a_turns_end_writes_everything_in_one_statement_on_postgres(raw: Raw) -> None:
    session_id = raw.session()
    assert raw.hot.allocate_seqs(raw.cursor, session_id, 2) == 1
    ask = raw.hot.insert_message(raw.cursor, {**raw.inbound(session_id, "hi", "m1"), "seq": 1})
    command = raw.hot.insert_message(raw.cursor, {
        **raw.inbound(session_id, "/status", "m2"), "seq": 2, "status": "command",
    })
    older = raw.hot.insert_message(raw.cursor, {**raw.inbound(session_id, "old", "m0")})
    assert ask.id and command.id and older.id
    call = ToolCall(id="call_1", name="current_time", arguments="{}")
    end = TurnEnd(
        session_id=session_id,
        reply=reply_values(session_id, 0, Message(
            role="assistant", content="done ✓", tool_calls=(call,), tokens=7,
        ), None),
        usage={"prompt_tokens": 90, "completion_tokens": 7, "error": None, "token_ratio": 1.1,
               "cached_tokens": 64},
        handled=[ask.id, command.id],
        tokens={ask.id: 3, older.id: 11},
        outbound=OutboundMessage(platform="telegram", chat_id="42", text="done ✓",
                                 session_key="k", answers=("m1",)),
        record=TurnRecordRow(session_id=0, prompt_tokens=90, window=8000, seconds=0.5,
                             created_at=NOON),
    )
    counting = CountingCursor(raw.cursor)
    seq, outbox_id = raw.hot.end_turn(counting, end)
    raw.commit()
    assert counting.statements == (1 if not raw.store.is_sqlite else 6)
    assert seq == 3
    history = await raw.store.history(session_id)
    reply = history[-1]
    assert (reply.seq, reply.role, reply.content, reply.tool_calls, reply.tokens) == (
        3, "assistant", "done ✓", (call,), 7,
    )
    session = raw.hot.get_session(raw.cursor, "k")
    assert session is not None
    assert (session.turns, session.tokens_in, session.tokens_cached, session.next_seq) == (
        1, 90, 64, 4,
    )
    assert outbox_id is not None
    assert await raw.store.undelivered() == [(outbox_id, end.outbound)]
    [record] = await raw.store.turn_records(session_id)
    assert (record.reply_seq, record.window, record.seconds, record.created_at) == (
        3, 8000, 0.5, NOON,
    )
    rows = {r.id: r for r in await _rows(raw, session_id)}
    assert (rows[ask.id].handled, rows[ask.id].status, rows[ask.id].tokens) == (True, None, 3)
    assert (rows[command.id].handled, rows[command.id].status) == (True, "command")
    assert (rows[older.id].handled, rows[older.id].tokens) == (False, 11)


async def test_a_turns_end_without_outbox_or_record(raw: Raw) -> None:
    session_id = raw.session()
    end = TurnEnd(
        session_id=session_id,
        reply=reply_values(session_id, 0, Message(role="assistant", content="ok"), "error"),
        usage={"prompt_tokens": None, "completion_tokens": None, "error": "boom",
               "token_ratio": None},
        handled=[], tokens={},
    )
    assert raw.hot.end_turn(raw.cursor, end) == (1, None)
    raw.commit()
    [row] = await _rows(raw, session_id)
    assert (row.seq, row.status, row.content) == (1, "error", "ok")


async def test_placing_messages_gives_them_the_next_seqs_in_order(raw: Raw) -> None:
    session_id = raw.session()
    ids = []
    for n in range(3):
        row = raw.hot.insert_message(raw.cursor, raw.inbound(session_id, f"m{n}", f"p{n}"))
        assert row.id is not None
        ids.append(row.id)
    assert raw.hot.allocate_seqs(raw.cursor, session_id, 1) == 1  # a seq taken before
    counting = CountingCursor(raw.cursor)
    assert raw.hot.place(counting, session_id, [ids[2], ids[0]]) == 2
    assert counting.statements == (1 if not raw.store.is_sqlite else 2)
    raw.commit()
    rows = {r.id: r.seq for r in await _rows(raw, session_id)}
    assert rows == {ids[2]: 2, ids[0]: 3, ids[1]: None}
    session = raw.hot.get_session(raw.cursor, "k")
    assert session is not None and session.next_seq == 4


async def test_the_summary_and_the_history_after_it_read_alike_on_both_drivers(raw: Raw) -> None:
    """SQLite reads them in two statements, PostgreSQL in one: the same answers."""
    session_id = raw.session()
    for seq in range(1, 6):
        raw.hot.insert_message(raw.cursor, {**raw.inbound(session_id, f"m{seq}", None), "seq": seq})
    raw.commit()
    summary, end, history = raw.hot.summary_and_history(raw.cursor, session_id, None)
    assert (summary, end, [m.seq for m in history]) == (None, 0, [1, 2, 3, 4, 5])
    assert [m.content for m in history][:2] == ["m1", "m2"]

    await raw.store.add_compaction(CompactionRow(
        session_id=session_id, first_seq=1, last_seq=2, summary="the first two",
        tokens_before=100, tokens_after=10, quality={"score": 1, "kept": ["ID-7"]},
    ))
    raw.commit()
    summary, end, history = raw.hot.summary_and_history(raw.cursor, session_id, None)
    assert summary is not None and end == 2 and [m.seq for m in history] == [3, 4, 5]
    via_orm = raw.hot.latest_compaction(raw.cursor, session_id)
    assert summary.model_dump() == via_orm.model_dump()  # every column, the times aware
    assert summary.quality == {"score": 1, "kept": ["ID-7"]} and summary.created_at.tzinfo
    # The caller holds the history to seq 4 after this summary: only what follows.
    _s, _e, newer = raw.hot.summary_and_history(raw.cursor, session_id, (2, 4))
    assert [m.seq for m in newer] == [5]
    _s, _e, caught_up = raw.hot.summary_and_history(raw.cursor, session_id, (2, 5))
    assert caught_up == [] and _s is not None and _e == 2, "the summary still comes back"
    # What it holds ends at an older summary: the whole history after the new one.
    _s, _e, again = raw.hot.summary_and_history(raw.cursor, session_id, (0, 4))
    assert [m.seq for m in again] == [3, 4, 5]
