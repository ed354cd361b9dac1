"""A tool result's own error flag is stored with it (messages.tool_error) and read back, with
the message's time, on every read path."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from alembic import command
from sqlalchemy import create_engine, inspect, text
from sqlmodel import Session, col, select

from channels.base import InboundMessage
from context.failures import tool_failure
from context.types import Message, ToolCall
from gateway.store import MessageRow, SessionInfo, Store, row_to_message
from gateway.store.schema import alembic_config, head_revision
from tests.conftest import RunningGateway
from tests.fakes import FakeOpenAI, reply, tool_call


def _recent(stamp: str) -> bool:
    when = datetime.fromisoformat(stamp)
    return when.tzinfo is not None and abs(datetime.now(UTC) - when) < timedelta(minutes=5)


async def _tool_round(store: Store, sid: int) -> list[MessageRow]:
    calls = (ToolCall("c1", "shell", '{"cmd": "false"}'), ToolCall("c2", "shell", "{}"))
    return await store.append_messages(
        sid,
        [
            Message(role="assistant", tool_calls=calls),
            Message(role="tool", content="boom", tool_call_id="c1", name="shell",
                    meta={"tool_error": True}),
            Message(role="tool", content="Error: 0 problems found", tool_call_id="c2",
                    name="shell", meta={"tool_error": False}),
            Message(role="tool", content="legacy", tool_call_id="c3", name="shell"),
        ],
    )


async def test_tool_error_flag_round_trips(database_url: str) -> None:
    store = Store(database_url)
    await store.init()
    sid = (await store.ensure_session(SessionInfo(key="k"))).id
    assert sid is not None
    rows = await _tool_round(store, sid)
    assert [r.tool_error for r in rows] == [None, True, False, None]

    # The hot path's read (every turn's history).
    history = await store.history(sid)
    assert [m.meta.get("tool_error", "absent") for m in history] == [
        "absent", True, False, "absent",
    ]
    assert all(_recent(m.meta["created_at"]) for m in history)
    assert tool_failure(history[1]) is not None
    assert tool_failure(history[2]) is None  # the tool said it succeeded: the text is no failure

    # The rows `append_messages` returns (the runner's cached history).
    from_rows = [row_to_message(r) for r in rows]
    assert [m.meta.get("tool_error") for m in from_rows] == [None, True, False, None]
    assert [m.meta["created_at"] for m in from_rows] == [m.meta["created_at"] for m in history]

    # The ORM's read (SQLite hands back naive datetimes: still UTC, still aware in meta).
    await store.close()
    engine = create_engine(store.url)
    with Session(engine) as db:
        orm_rows = db.exec(select(MessageRow).order_by(col(MessageRow.seq))).all()
        orm = [row_to_message(r) for r in orm_rows]
    engine.dispose()
    assert [m.meta.get("tool_error") for m in orm] == [None, True, False, None]
    assert [m.meta["created_at"] for m in orm] == [m.meta["created_at"] for m in history]


async def test_claimed_inbound_messages_carry_their_time(database_url: str) -> None:
    store = Store(database_url)
    await store.init()
    info = SessionInfo(key="k")
    sid, row = await store.accept_inbound(
        info,
        InboundMessage(platform="telegram", chat_type="direct", chat_id="1", sender_id="1",
                       text="hi", platform_message_id="m1"),
    )
    assert row is not None
    claimed = await store.claim_pending(sid)
    message = row_to_message(claimed[0])
    assert _recent(message.meta["created_at"])
    assert "tool_error" not in message.meta
    await store.close()


async def test_upgrade_keeps_older_messages_without_a_flag(database_url: str) -> None:
    """A database at revision 0004 gains the column; its messages read back without a flag."""
    url = Store(database_url).url
    target = Store(database_url)
    if target.path is not None:
        target.path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0004")
        assert "tool_error" not in {c["name"] for c in inspect(conn).get_columns("messages")}
        conn.execute(text(
            "INSERT INTO sessions (key, agent, platform, chat_type, chat_id, account, created_at, "
            "updated_at, next_seq, tokens_in, tokens_out, turns, compaction_cycle, "
            "ineffective_compactions) VALUES ('k', 'main', '', '', '', 'default', "
            "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, 2, 0, 0, 0, 0, 0)"
        ))
        conn.execute(text(
            "INSERT INTO messages (session_id, seq, role, content, tool_call_id, name, "
            "created_at, handled) SELECT id, 1, 'tool', '\"Error: old\"', 'c1', 'shell', "
            "CURRENT_TIMESTAMP, :yes FROM sessions WHERE key = 'k'"
        ), {"yes": True})
    engine.dispose()

    store = Store(database_url)
    await store.init()
    assert store.schema_status == f"upgraded from revision 0004 to {head_revision()}"
    session = await store.get_session("k")
    assert session is not None and session.id is not None
    [old] = await store.history(session.id)
    assert old.text == "Error: old" and "tool_error" not in old.meta
    assert tool_failure(old) is not None  # no flag: the text at its edges decides
    assert datetime.fromisoformat(old.meta["created_at"]).tzinfo is not None
    await store.close()


async def test_runner_stores_the_tool_flag(running: RunningGateway, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(
        tool_call("no_such_tool", {}),
        tool_call("current_time", {"timezone": "UTC"}),
        reply("done"),
    )
    out = await running.webchat.submit("alice", "what time is it?")
    assert out.replies == ["done"]
    store = running.gateway.store
    session = await store.get_session(out.session_key)
    assert session is not None and session.id is not None
    tools = [m for m in await store.history(session.id) if m.role == "tool"]
    assert [m.meta.get("tool_error") for m in tools] == [True, False]
    assert tool_failure(tools[0]) is not None
    assert tool_failure(tools[1]) is None
