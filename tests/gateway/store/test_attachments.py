"""A message waiting for its attachments: stored at once, out of every claim, made whole once."""

from __future__ import annotations

from channels.base import InboundMessage, OutboundMessage
from context.types import Message
from gateway.store import SessionInfo, Store
from gateway.store.messages import FETCHING_STATUS

INFO = SessionInfo(key="k", platform="telegram", chat_id="42")


def inbound(text: str, mid: str) -> InboundMessage:
    return InboundMessage(
        platform="telegram", chat_type="direct", chat_id="42", sender_id="42", text=text,
        platform_message_id=mid,
    )


async def make_store(url: str) -> tuple[Store, int]:
    store = Store(url)
    await store.init()
    session = await store.ensure_session(INFO)
    assert session.id is not None
    return store, session.id


PENDING = [{"type": "text", "text": "[attachment: photo: being downloaded]"},
           {"type": "gatehouse.attachments", "attachments": [{"type": "photo"}]}]


async def test_a_fetching_message_waits_out_of_every_claim(database_url: str) -> None:
    store, sid = await make_store(database_url)
    _sid, row = await store.accept_inbound(
        INFO, inbound("", "m1"), status=FETCHING_STATUS, content=PENDING
    )
    assert row is not None and row.id is not None
    assert row.content == PENDING
    assert await store.claim_pending(sid) == []
    assert await store.sessions_with_pending() == []
    [(waiting, session)] = await store.fetching_messages()
    assert waiting.id == row.id and session.key == "k"

    assert await store.complete_inbound(row.id, "[attachment: photo, saved]")
    assert not await store.complete_inbound(row.id, "again")  # once only
    assert await store.fetching_messages() == []
    [claimed] = await store.claim_pending(sid)
    assert claimed.id == row.id and claimed.content == "[attachment: photo, saved]"
    assert claimed.status is None and not claimed.handled
    await store.close()


async def test_answered_without_a_turn_in_one_step(database_url: str) -> None:
    store, sid = await make_store(database_url)
    await store.accept_inbound(INFO, inbound("earlier", "m0"))
    await store.claim_pending(sid)
    _sid, row = await store.accept_inbound(
        INFO, inbound("", "m1"), status=FETCHING_STATUS, content=PENDING
    )
    assert row is not None and row.id is not None
    reply = Message(role="assistant", content="I received your photo", tokens=7)
    outbound = OutboundMessage(
        platform="telegram", chat_id="42", text="I received your photo", session_key="k",
        reply_to="m1", answers=("m1",),
    )
    outbox_id = await store.answer_inbound(sid, row.id, "[attachment: photo]", reply, outbound)
    assert outbox_id is not None
    assert await store.answer_inbound(sid, row.id, "x", reply, outbound) is None
    history = await store.history(sid)
    assert [(m.seq, m.role, m.text) for m in history] == [
        (1, "user", "earlier"),
        (2, "user", "[attachment: photo]"),
        (3, "assistant", "I received your photo"),
    ]
    assert await store.claim_pending(sid) != []  # "earlier" still waits for its own turn
    [(queued_id, queued)] = await store.undelivered()
    assert queued_id == outbox_id and queued.text == "I received your photo"
    await store.close()
