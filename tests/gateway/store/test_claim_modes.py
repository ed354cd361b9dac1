"""What a turn claims in each queue mode (gateway/store/turns.py): one message a turn
(`followup`), the messages a running turn takes in at a boundary (`steer`), and, in every mode,
no further than a `/new` that others came before."""

from __future__ import annotations

from channels.base import InboundMessage
from context.types import Message
from gateway.store import MessageRow, SessionInfo, Store, TurnUsage
from gateway.store.messages import CONTEXT_STATUS
from gateway.store.turns import before_a_boundary, one_turns_worth, steerable_prefix

INFO = SessionInfo(key="k", platform="telegram", chat_type="direct", chat_id="42")


def inbound(text: str, mid: str) -> InboundMessage:
    return InboundMessage(
        platform="telegram", chat_type="direct", chat_id="42", sender_id="42", text=text,
        platform_message_id=mid,
    )


def row(text: str, seq: int | None = None, status: str | None = None) -> MessageRow:
    return MessageRow(session_id=1, role="user", content=text, seq=seq, status=status)


def texts(rows: list[MessageRow]) -> list[str]:
    return [str(r.content) for r in rows]


def not_a_command(r: MessageRow) -> bool:
    return not str(r.content).startswith("/")


def test_one_turns_worth_is_the_oldest_new_message_with_the_context_before_it() -> None:
    rows = [row("chatter", status=CONTEXT_STATUS), row("a"), row("b"), row("c")]
    assert texts(one_turns_worth(rows)) == ["chatter", "a"]


def test_one_turns_worth_resumes_a_stopped_turn_alone() -> None:
    rows = [row("a", seq=3), row("b", seq=4), row("c")]
    assert texts(one_turns_worth(rows)) == ["a", "b"]


def test_steerable_prefix_stops_at_a_command_and_keeps_context_only_before_a_message() -> None:
    rows = [row("x", status=CONTEXT_STATUS), row("a"), row("/compact"), row("b")]
    assert texts(steerable_prefix(rows, not_a_command)) == ["x", "a"]
    rows = [row("a"), row("y", status=CONTEXT_STATUS)]
    assert texts(steerable_prefix(rows, not_a_command)) == ["a"]
    assert steerable_prefix([row("/new"), row("a")], not_a_command) == []
    assert steerable_prefix([row("y", status=CONTEXT_STATUS)], not_a_command) == []


def is_new(r: MessageRow) -> bool:
    return str(r.content) == "/new"


def test_a_claim_stops_before_a_new_that_others_came_before() -> None:
    rows = [row("a"), row("b"), row("/new"), row("c"), row("/new"), row("d")]
    assert texts(before_a_boundary(rows, is_new)) == ["a", "b"]
    assert texts(before_a_boundary(rows[2:], is_new)) == ["/new", "c"]
    assert texts(before_a_boundary(rows[4:], is_new)) == ["/new", "d"]
    # Group context alone before it, or another `/new`, is no message to answer first.
    rows = [row("x", status=CONTEXT_STATUS), row("/new"), row("/new"), row("e")]
    assert texts(before_a_boundary(rows, is_new)) == ["x", "/new", "/new", "e"]
    # A stopped turn's messages (placed already) are resumed as they were.
    rows = [row("a", seq=3), row("/new", seq=4), row("f")]
    assert texts(before_a_boundary(rows, is_new)) == ["a", "/new", "f"]


async def _store(database_url: str) -> tuple[Store, int]:
    store = Store(database_url)
    await store.init()
    session = await store.ensure_session(INFO)
    assert session.id is not None
    return store, session.id


async def test_followup_claims_one_message_a_turn_in_order(database_url: str) -> None:
    store, sid = await _store(database_url)
    try:
        for i, text in enumerate(("a", "b", "c")):
            await store.accept_inbound(INFO, inbound(text, f"m{i}"))
        answered = []
        while True:
            _s, claimed, _r, _h = await store.claim_turn(
                "k", lambda _s: None, one_message=lambda _s: True
            )
            if not claimed:
                break
            answered.append(texts(claimed))
            reply = Message(role="assistant", content=f"re {claimed[-1].content}")
            await store.finish_turn(sid, reply, [r.id for r in claimed if r.id], TurnUsage())
        assert answered == [["a"], ["b"], ["c"]]
        history = [m.text for m in await store.history(sid)]
        assert history == ["a", "re a", "b", "re b", "c", "re c"]
    finally:
        await store.close()


async def test_arrivals_are_taken_in_after_what_the_turn_stored(database_url: str) -> None:
    store, sid = await _store(database_url)
    try:
        await store.accept_inbound(INFO, inbound("a", "m1"))
        _s, claimed, _r, _h = await store.claim_turn("k", lambda _s: None)
        assert texts(claimed) == ["a"]
        assert await store.arrivals(sid) == []  # the turn's own message is no arrival
        tool_round = [Message(role="assistant", content="thinking")]
        await store.append_messages(sid, tool_round)
        await store.accept_inbound(INFO, inbound("b", "m2"))
        await store.accept_inbound(INFO, inbound("/compact", "m3"))
        await store.accept_inbound(INFO, inbound("c", "m4"))
        assert texts(await store.arrivals(sid)) == ["b", "/compact", "c"]
        taken = await store.claim_arrivals(sid, not_a_command)
        assert texts(taken) == ["b"]  # the command and what came after wait their turn
        assert [r.seq for r in taken] == [3]
        assert texts(await store.arrivals(sid)) == ["/compact", "c"]
        ids = [r.id for r in (*claimed, *taken) if r.id]
        await store.finish_turn(sid, Message(role="assistant", content="re a+b"), ids, TurnUsage())
        assert [m.text for m in await store.history(sid)] == ["a", "thinking", "b", "re a+b"]
        _s, later, _r, _h = await store.claim_turn("k", lambda _s: None)
        assert texts(later) == ["/compact", "c"]
    finally:
        await store.close()


async def test_a_claim_held_back_before_a_new_says_so(database_url: str) -> None:
    store, sid = await _store(database_url)
    try:
        for i, text in enumerate(("a", "b", "/new", "c")):
            await store.accept_inbound(INFO, inbound(text, f"m{i}"))
        first = await store.claim_turn("k", lambda _s: None, ends_before=is_new)
        assert texts(first.messages) == ["a", "b"] and first.held_back
        ids = [r.id for r in first.messages if r.id]
        await store.finish_turn(sid, Message(role="assistant", content="re a+b"), ids, TurnUsage())
        second = await store.claim_turn("k", lambda _s: None, ends_before=is_new)
        assert texts(second.messages) == ["/new", "c"] and not second.held_back
        assert [r.seq for r in second.messages] == [4, 5]
    finally:
        await store.close()
