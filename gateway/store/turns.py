"""A turn's two writes: claiming the inbound messages it answers, and finishing with its reply.

A turn claims what waits for an answer (placing each message in the conversation), and
finishes in one transaction: the reply, the handled marks, the usage counters, the turn record
and, with a channel to deliver to, the outbox row. Messages claimed by a turn that never
finished (a crash, a shutdown) are claimed again, so each is answered exactly once; the
pending queries here find them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple

from sqlalchemy import func, or_
from sqlmodel import Session, col, select

from channels.base import OutboundMessage
from context.types import Message
from gateway.store.engine import Database
from gateway.store.hot import HotPath, TurnEnd
from gateway.store.messages import CONTEXT_STATUS, HistoryRead, Known, reply_values
from gateway.store.models import MessageRow, SessionRow, TurnRecordRow, utcnow


@dataclass(frozen=True, slots=True)
class TurnUsage:
    """The tokens a turn's model calls used, as the provider reported them (None: unknown)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    """Of `prompt_tokens`, what the provider read from its prompt cache."""


def _awaiting_answer() -> tuple[Any, ...]:
    """Inbound messages no turn has answered yet (context-only group messages excluded)."""
    return (
        col(MessageRow.handled).is_(False),
        or_(col(MessageRow.status).is_(None), col(MessageRow.status) != CONTEXT_STATUS),
    )


def _new_ask(row: MessageRow) -> bool:
    """An inbound message no turn has placed yet, other than group context."""
    return row.seq is None and row.status != CONTEXT_STATUS


def _place(hot: HotPath, cursor: Any, session_id: int, rows: list[MessageRow]) -> None:
    """Give `rows` (stored, not yet placed) the session's next seqs, in their order."""
    ids = [r.id for r in rows if r.id is not None]
    if ids:
        first = hot.place(cursor, session_id, ids)
        for n, row in enumerate(r for r in rows if r.id is not None):
            row.seq = first + n


def one_turns_worth(rows: list[MessageRow]) -> list[MessageRow]:
    """Of a session's unanswered messages (arrival order), what one `followup` turn answers:
    those a stopped turn had placed already (it is resumed as it was), else the oldest new
    message with the group context that came before it."""
    placed = [r for r in rows if r.seq is not None]
    if any(r.status != CONTEXT_STATUS for r in placed):
        return placed
    taken = list(placed)
    for row in rows:
        if row.seq is None:
            taken.append(row)
            if row.status != CONTEXT_STATUS:
                break
    return taken


def before_a_boundary(
    rows: list[MessageRow], starts_fresh: Callable[[MessageRow], bool]
) -> list[MessageRow]:
    """Of what a turn would claim (arrival order), the messages before the first new one that
    `starts_fresh` (a `/new`) when another message came before it (group context aside): those
    are answered first, in the context they were sent in, and the boundary's turn comes next, so
    nothing is left behind it unanswered."""
    earlier = False
    for n, row in enumerate(rows):
        fresh = starts_fresh(row)
        if fresh and earlier and row.seq is None:
            return rows[:n]
        earlier = earlier or (row.status != CONTEXT_STATUS and not fresh)
    return rows


def steerable_prefix(
    waiting: list[MessageRow], joins: Callable[[MessageRow], bool]
) -> list[MessageRow]:
    """Of the unplaced messages (arrival order), those a running turn may take in (`steer`):
    up to the first one `joins` refuses, group context only before a message it takes."""
    taken: list[MessageRow] = []
    for row in waiting:
        if row.status != CONTEXT_STATUS and not joins(row):
            break
        taken.append(row)
    while taken and taken[-1].status == CONTEXT_STATUS:
        taken.pop()
    return taken


class TurnClaim(NamedTuple):
    """What `claim_turn` gives a turn."""

    session: SessionRow | None
    messages: list[MessageRow]
    """The claimed messages, in conversation order."""
    read: HistoryRead | None
    """The turn's history, read in the same step (with `known`)."""
    held_back: bool
    """The claim stopped before a boundary (`ends_before`): another turn is due right after."""


class TurnRepository:
    """Claim a turn's messages, finish the turn, find what still waits; read turn records."""

    def __init__(self, database: Database) -> None:
        self._db = database

    async def claim_pending(
        self, session_id: int, context_limit: int | None = None
    ) -> list[MessageRow]:
        """Give unanswered inbound messages their conversation position; return them in order.

        Messages claimed by a turn that never finished (crash, shutdown) are returned again, so
        every inbound message is answered exactly once. Group messages kept as context join the
        next turn; beyond the newest `context_limit` of them, older ones stay stored but out of
        the conversation.
        """

        return await self._db.fast(
            lambda cursor: self._claim(cursor, session_id, context_limit)[0],
            write=True,
            autocommit=True,
        )

    async def claim_turn(
        self,
        key: str,
        context_limit: Callable[[SessionRow], int | None],
        known: Callable[[int], Known] | None = None,
        *,
        one_message: Callable[[SessionRow], bool] | None = None,
        ends_before: Callable[[MessageRow], bool] | None = None,
    ) -> TurnClaim:
        """The session and its claimed messages (see `claim_pending`) in one step; with
        `known` (session id → what the caller's cached history holds, called inside the step),
        also the turn's `summary_and_history`, saving the turn a transaction of its own. When
        `one_message(session)` says so (queue mode `followup`), only one new message is
        claimed (`one_turns_worth`); the claim stops before a message `ends_before` accepts
        (a `/new`) that others came before (`before_a_boundary`)."""
        hot = self._db.hot

        def op(cursor: Any) -> TurnClaim:
            session, unhandled = hot.session_and_unhandled(cursor, key)
            if session is None or session.id is None:
                return TurnClaim(None, [], None, held_back=False)
            single = one_message is not None and one_message(session)
            claimed, held_back = self._claim(
                cursor, session.id, context_limit(session), single, unhandled, ends_before
            )
            read = None
            if known is not None and claimed:
                state = known(session.id)
                read = HistoryRead(state, *hot.summary_and_history(cursor, session.id, state))
            return TurnClaim(session, claimed, read, held_back)

        # Autocommit (PostgreSQL): the reads take a snapshot each anyway, and the one write that
        # must be atomic, placing the messages, is one statement (`HotPath.place`); a turn that
        # stops after it finds them placed and resumes them (`one_turns_worth`).
        return await self._db.fast(op, write=True, autocommit=True)

    def _claim(
        self,
        cursor: Any,
        session_id: int,
        context_limit: int | None,
        single: bool = False,
        unhandled: list[MessageRow] | None = None,
        ends_before: Callable[[MessageRow], bool] | None = None,
    ) -> tuple[list[MessageRow], bool]:
        """The messages a turn claims, placed, and whether it stopped before a boundary."""
        hot = self._db.hot
        rows = hot.unhandled(cursor, session_id) if unhandled is None else unhandled
        if single:
            rows = one_turns_worth(rows)
        held_back = False
        if ends_before is not None:
            taken = before_a_boundary(rows, ends_before)
            held_back, rows = len(taken) < len(rows), taken
        unplaced = [r for r in rows if r.seq is None]
        context = [r for r in unplaced if r.status == CONTEXT_STATUS]
        if context_limit is not None and len(context) > context_limit:
            expired = context[: len(context) - context_limit]
            hot.mark_handled(cursor, (r.id for r in expired if r.id), "context-expired")
            gone = {id(r) for r in expired}
            unplaced = [r for r in unplaced if id(r) not in gone]
            rows = [r for r in rows if id(r) not in gone]
        _place(hot, cursor, session_id, unplaced)
        return sorted(rows, key=lambda r: r.seq or 0), held_back

    async def arrivals(self, session_id: int) -> list[MessageRow]:
        """Messages that arrived since the running turn's claim (no place yet, not answered,
        group context left out), oldest first: what may steer or interrupt that turn."""
        hot = self._db.hot

        def op(cursor: Any) -> list[MessageRow]:
            return [r for r in hot.unhandled(cursor, session_id) if _new_ask(r)]

        return await self._db.fast(op)

    async def claim_arrivals(
        self, session_id: int, joins: Callable[[MessageRow], bool]
    ) -> list[MessageRow]:
        """Place the messages that arrived since the running turn's claim after everything
        stored so far, for that turn to answer too (queue mode `steer`); returns them in order.

        Taken in arrival order up to the first one `joins` refuses (a command: it waits for a
        turn of its own, and so does everything after it); group context only along with a
        message after it. The caller marks them handled with its reply (`finish_turn`).
        """
        hot = self._db.hot

        def op(cursor: Any) -> list[MessageRow]:
            waiting = [r for r in hot.unhandled(cursor, session_id) if r.seq is None]
            taken = steerable_prefix(waiting, joins)
            _place(hot, cursor, session_id, taken)
            return taken

        return await self._db.fast(op, write=True, autocommit=True)

    async def finish_turn(
        self,
        session_id: int,
        reply: Message,
        handled_ids: Iterable[int],
        usage: TurnUsage,
        *,
        reply_status: str | None = None,
        error: str | None = None,
        token_ratio: float | None = None,
        token_ratio_samples: int | None = None,
        token_counts: dict[int, int] | None = None,
        record: TurnRecordRow | None = None,
        outbound: OutboundMessage | None = None,
    ) -> int | None:
        """Store the reply, mark the turn's inbound messages answered and count usage: atomically.

        `token_counts` ({message id: tokens}) rides along so counting costs no extra transaction;
        `record` (the turn's token pressure, for the admin UI) is stored with the reply. With
        `outbound`, the reply also enters the outbox in the same transaction; the returned
        outbox id goes to `gateway.turn.outbox.DeliveryLog` once the channel sent it.
        """
        hot = self._db.hot
        end = TurnEnd(
            session_id=session_id,
            reply=reply_values(session_id, 0, reply, reply_status),
            usage={
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "error": error,
                "token_ratio": token_ratio,
                "token_ratio_samples": token_ratio_samples,
                "cached_tokens": usage.cached_tokens,
            },
            handled=list(handled_ids),
            tokens=dict(token_counts or {}),
            outbound=outbound,
            record=record,
        )
        # One statement on PostgreSQL (`HotPath.end_turn`): atomic in autocommit.
        _seq, outbox_id = await self._db.fast(
            lambda cursor: hot.end_turn(cursor, end), write=True, autocommit=True
        )
        return outbox_id

    async def sessions_with_pending(self, older_than: float | None = None) -> list[SessionRow]:
        """Sessions with inbound messages no turn has answered yet (e.g. after a crash).

        `older_than` (seconds) skips messages that just arrived: their own process is on them.
        """

        def op(db: Session) -> list[SessionRow]:
            pending = select(MessageRow.session_id).where(*_awaiting_answer())
            if older_than is not None:
                cutoff = utcnow() - timedelta(seconds=older_than)
                pending = pending.where(col(MessageRow.created_at) < cutoff)
            return list(db.exec(select(SessionRow).where(col(SessionRow.id).in_(pending))).all())

        return await self._db.read(op)

    async def has_pending(self, session_id: int) -> bool:
        """Whether inbound messages of this session still wait for a turn's answer."""
        stmt = select(MessageRow.id).where(MessageRow.session_id == session_id, *_awaiting_answer())
        return await self._db.read(lambda db: db.exec(stmt).first() is not None)

    async def turn_records(self, session_id: int, limit: int = 500) -> list[TurnRecordRow]:
        """The session's latest `limit` turn records, oldest first."""
        stmt = (
            select(TurnRecordRow)
            .where(TurnRecordRow.session_id == session_id)
            .order_by(col(TurnRecordRow.id).desc())
            .limit(limit)
        )
        return await self._db.read(lambda db: list(db.exec(stmt).all())[::-1])

    async def latest_turn_records(self) -> dict[int, TurnRecordRow]:
        """Each session's latest turn record, by session id, in one query."""
        latest = select(func.max(TurnRecordRow.id)).group_by(col(TurnRecordRow.session_id))
        stmt = select(TurnRecordRow).where(col(TurnRecordRow.id).in_(latest))
        return await self._db.read(lambda db: {r.session_id: r for r in db.exec(stmt).all()})
