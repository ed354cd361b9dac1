"""The per-message path in plain SQL on a driver's own connection (sqlite3, or asyncpg through
the DB-API cursor of gateway/store/postgres.py).

Every message costs a handful of statements: accept, claim, read the summary and new history,
finish the turn. Through the ORM each statement pays for sessions, events and instrumented
objects, many times the statement itself; on the driver's cursor it pays for the statement. So
these few statements are written once here, portable between SQLite and PostgreSQL, and
everything else keeps using SQLModel. Rows come back as SQLModel objects built without
validation (`build`: the values come from our own tables).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache, lru_cache
from typing import Any, TypeVar, cast

from pydantic_core import PydanticUndefined
from sqlalchemy.orm import configure_mappers
from sqlalchemy.orm.instrumentation import manager_of_class
from sqlmodel import SQLModel

from channels.base import OutboundMessage
from context.types import Message, ToolCall
from gateway.store.models import (
    CompactionRow,
    MessageRow,
    OutboxRow,
    SessionRow,
    TurnRecordRow,
    utcnow,
)

SESSION_COLUMNS = tuple(SessionRow.model_fields)
MESSAGE_COLUMNS = tuple(MessageRow.model_fields)
COMPACTION_COLUMNS = tuple(CompactionRow.model_fields)

R = TypeVar("R", bound=SQLModel)

_DATETIMES = frozenset(
    {"created_at", "updated_at", "compaction_cooldown_until", "expires_at", "decided_at"}
)
_BOOLEANS = frozenset({"handled", "undone", "refreshed", "tool_error"})
_JSON = frozenset({"content", "tool_calls", "quality"})


@dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between the two drivers: parameter style, dates, JSON and booleans."""

    sqlite: bool

    def sql(self, statement: str) -> str:
        return statement if self.sqlite else _pyformat(statement)

    def dump_time(self, value: datetime) -> Any:
        # SQLAlchemy's SQLite DATETIME text format (UTC, no offset), so ORM reads keep working;
        # PostgreSQL columns are timestamptz.
        utc = value.astimezone(UTC)
        return utc.replace(tzinfo=None).isoformat(" ", "microseconds") if self.sqlite else utc

    def load_time(self, value: Any) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        assert isinstance(value, datetime)
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)

    def dump_json(self, value: Any) -> Any:
        return None if value is None else json.dumps(value)

    def load_json(self, value: Any) -> Any:
        # Both drivers hand back a JSON column's text (asyncpg with no codec set: setting one
        # costs every new connection a catalog query).
        return json.loads(value) if isinstance(value, str) else value

    def decode(self, columns: Sequence[str], values: Sequence[Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in zip(columns, values, strict=True):
            if name in _DATETIMES:
                value = self.load_time(value)
            elif name in _JSON:
                value = self.load_json(value)
            elif name in _BOOLEANS and value is not None:
                value = bool(value)
            out[name] = value
        return out


def build(cls: type[R], values: dict[str, Any]) -> R:
    """A detached row from trusted values (`values` becomes its state: pass a dict of your
    own): no validation, but a normal ORM object otherwise.

    What `model_construct` does, minus its per-field alias checks and its per-call default
    lookup (which inspects the default factory's signature every time), which cost more than
    the statement that read the row. Missing fields get their declared defaults."""
    defaults = _defaults(cls)
    if len(values) != len(defaults):
        for name, (factory, default) in defaults.items():
            if name not in values:
                values[name] = factory() if factory is not None else copy.copy(default)
    obj: R = cls.__new__(cls)
    _set(obj, "__dict__", values)
    _set(obj, "__pydantic_fields_set__", set(values))
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)
    manager_of_class(cls).setup_instance(obj)
    return obj


_set = object.__setattr__


@cache
def _defaults(cls: type[SQLModel]) -> dict[str, tuple[Callable[[], Any] | None, Any]]:
    """Each field's default factory (taking no arguments) or default value. First use: the
    mappers are configured too (an instrumented `__init__` would do it; `build` skips it)."""
    configure_mappers()
    out: dict[str, tuple[Callable[[], Any] | None, Any]] = {}
    for name, info in cls.model_fields.items():
        if info.default_factory_takes_validated_data:
            raise TypeError(f"{cls.__name__}.{name}: a default factory taking data")
        factory = cast("Callable[[], Any] | None", info.default_factory)
        out[name] = (factory, None if info.default is PydanticUndefined else info.default)
    return out


@lru_cache(maxsize=256)
def _pyformat(statement: str) -> str:
    """`:name` → `%(name)s`, the DB-API style the PostgreSQL cursor numbers (`postgres.dollar`;
    literal `%` doubled)."""
    return re.sub(r"(?<![:\w]):([A-Za-z_]\w*)", r"%(\1)s", statement.replace("%", "%%"))


def _select(table: str, columns: Sequence[str], where: str) -> str:
    return f"SELECT {', '.join(columns)} FROM {table} WHERE {where}"


GET_SESSION = _select("sessions", SESSION_COLUMNS, "key = :key")
SESSION_ID = "SELECT id FROM sessions WHERE key = :key"
INSERT_SESSION = (
    "INSERT INTO sessions (key, agent, platform, chat_type, chat_id, thread_id, account, "
    "created_at, updated_at, next_seq, tokens_in, tokens_out, turns, compaction_cycle, "
    "ineffective_compactions) VALUES (:key, :agent, :platform, :chat_type, :chat_id, "
    ":thread_id, :account, :now, :now, 1, 0, 0, 0, 0, 0) RETURNING id"
)
ALLOCATE_SEQS = (
    "UPDATE sessions SET next_seq = next_seq + :count, updated_at = :now WHERE id = :id "
    "RETURNING next_seq"
)
PLACE = (
    f"WITH a AS ({ALLOCATE_SEQS} - :count AS first), "
    "p AS (UPDATE messages SET seq = (SELECT first FROM a) "
    "+ array_position(CAST(:ids AS bigint[]), messages.id) - 1 "
    "WHERE messages.id = ANY(CAST(:ids AS bigint[]))) "
    "SELECT first FROM a"
)
"""PostgreSQL: `ALLOCATE_SEQS` and the messages' seqs in one statement (`HotPath.place`)."""
FORGET_OUTBOX = "DELETE FROM outbox WHERE id = ANY(CAST(:ids AS bigint[])) RETURNING id"
_INSERTED = [c for c in MESSAGE_COLUMNS if c != "id"]
_INSERT_MESSAGE = (
    f"INSERT INTO messages ({', '.join(_INSERTED)}) "
    f"VALUES ({', '.join(':' + c for c in _INSERTED)})"
)
INSERT_MESSAGE = f"{_INSERT_MESSAGE} RETURNING id"
INSERT_UNLESS_DUPLICATE = (
    f"{_INSERT_MESSAGE} ON CONFLICT (platform, chat_id, platform_message_id) DO NOTHING "
    "RETURNING id"
)
"""An inbound message, unless the platform delivered it before (no row comes back then)."""
UNHANDLED = _select(
    "messages", MESSAGE_COLUMNS, "session_id = :session_id AND handled = :no ORDER BY id"
)
SESSION_AND_UNHANDLED = (
    f"SELECT {', '.join('s.' + c for c in SESSION_COLUMNS)}, "
    f"{', '.join('m.' + c for c in MESSAGE_COLUMNS)} FROM sessions AS s "
    "LEFT JOIN messages AS m ON m.session_id = s.id AND m.handled = :no "
    "WHERE s.key = :key ORDER BY m.id"
)
"""`GET_SESSION` and `UNHANDLED` in one statement: a row per unanswered message (the session's
columns repeated), or one with the message's columns NULL when none waits."""
SET_SEQ = "UPDATE messages SET seq = :seq WHERE id = :id"
SET_HANDLED = (
    # A chat command (`/status`...: gateway/turn/commands.py) stays marked: the model never sees it.
    "UPDATE messages SET handled = :yes, "
    "status = CASE WHEN status = 'command' THEN status ELSE :status END, "
    "tokens = COALESCE(:tokens, tokens) WHERE id = :id"
)
SET_TOKENS = "UPDATE messages SET tokens = :tokens WHERE id = :id"
HISTORY = _select(
    "messages",
    MESSAGE_COLUMNS,
    "session_id = :session_id AND seq IS NOT NULL AND seq > :after ORDER BY seq",
)
_RECORDED = [c for c in TurnRecordRow.model_fields if c != "id"]


def _quoted(column: str) -> str:
    """A column name as an SQL identifier (`window` is reserved in PostgreSQL)."""
    return f'"{column}"'


INSERT_TURN_RECORD = (
    f"INSERT INTO turn_records ({', '.join(map(_quoted, _RECORDED))}) "
    f"VALUES ({', '.join(':' + c for c in _RECORDED)})"
)
_OUTBOX = [c for c in OutboxRow.model_fields if c != "id"]
INSERT_OUTBOX = (
    f"INSERT INTO outbox ({', '.join(map(_quoted, _OUTBOX))}) "
    f"VALUES ({', '.join(':' + c for c in _OUTBOX)}) RETURNING id"
)
FINISH_TURN = (
    "UPDATE sessions SET next_seq = next_seq + 1, updated_at = :now, turns = turns + 1, "
    "last_error = :error, "
    "token_ratio = COALESCE(:ratio, token_ratio), "
    "token_ratio_samples = COALESCE(:samples, token_ratio_samples), "
    "last_prompt_tokens = COALESCE(:prompt, last_prompt_tokens), "
    "tokens_in = tokens_in + COALESCE(:prompt, 0), "
    # None + n is None: a session starts counting cached tokens at its first report.
    "tokens_cached = COALESCE(tokens_cached + :cached, tokens_cached, :cached), "
    "tokens_out = tokens_out + COALESCE(:completion, 0) WHERE id = :id RETURNING next_seq"
)
LATEST_COMPACTION = _select(
    "compactions",
    COMPACTION_COLUMNS,
    "session_id = :session_id AND undone = :no ORDER BY id DESC LIMIT 1",
)
_SUMMARY_END = "COALESCE((SELECT last_seq FROM c), 0)"
_LATEST = "session_id = :session_id AND undone = false ORDER BY id DESC LIMIT 1"
SUMMARY_AND_HISTORY = _pyformat(
    f"WITH c AS ({_select('compactions', COMPACTION_COLUMNS, _LATEST)}) "
    "SELECT CASE WHEN row_number() OVER (ORDER BY m.seq) = 1 "
    "THEN (SELECT row_to_json(c) FROM c) END, "
    f"{', '.join('m.' + c for c in MESSAGE_COLUMNS)} FROM (SELECT 1) AS one "
    "LEFT JOIN messages AS m ON m.session_id = :session_id AND m.seq IS NOT NULL AND m.seq > "
    f"CASE WHEN {_SUMMARY_END} = :known_end THEN :known_last ELSE {_SUMMARY_END} END "
    "ORDER BY m.seq"
)
"""PostgreSQL: `LATEST_COMPACTION` and the `HISTORY` after it (after what the caller holds when
the summary still ends where it did: `known_end`, `known_last`) in one statement."""


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """What a finished turn writes (see `HotPath.end_turn`)."""

    session_id: int
    reply: dict[str, Any]
    """The reply's row values (`reply_values`; its seq is allocated by the write)."""
    usage: dict[str, Any]
    """`finish_turn`'s keyword arguments: tokens, error, token ratio."""
    handled: list[int]
    tokens: dict[int, int]
    """Token counts by message id: of handled messages, and of history counted the first
    time."""
    outbound: OutboundMessage | None = None
    record: TurnRecordRow | None = None


class HotPath:
    """The per-message statements, run inside a transaction the store opened on `cursor`."""

    def __init__(self, dialect: Dialect) -> None:
        self.d = dialect

    def _each(self, cursor: Any, statement: str, params: list[dict[str, Any]]) -> None:
        """`statement` once per parameter set. One set (a turn answering one message, the
        usual case) is a plain execute: a driver's `executemany` (asyncpg's batches its rows)
        costs more than that one statement."""
        if len(params) == 1:
            cursor.execute(self.d.sql(statement), params[0])
        elif params:
            cursor.executemany(self.d.sql(statement), params)

    def _one(self, cursor: Any, statement: str, params: dict[str, Any]) -> Any:
        cursor.execute(self.d.sql(statement), params)
        return cursor.fetchone()

    def get_session(self, cursor: Any, key: str) -> SessionRow | None:
        row = self._one(cursor, GET_SESSION, {"key": key})
        if row is None:
            return None
        return build(SessionRow, self.d.decode(SESSION_COLUMNS, row))

    def session_and_unhandled(
        self, cursor: Any, key: str
    ) -> tuple[SessionRow | None, list[MessageRow]]:
        """`get_session` and its `unhandled` messages, in one statement."""
        cursor.execute(self.d.sql(SESSION_AND_UNHANDLED), {"key": key, "no": False})
        rows = cursor.fetchall()
        if not rows:
            return None, []
        split = len(SESSION_COLUMNS)
        session = build(SessionRow, self.d.decode(SESSION_COLUMNS, rows[0][:split]))
        return session, [self._message_row(r[split:]) for r in rows if r[split] is not None]

    def summary_and_history(
        self, cursor: Any, session_id: int, known: tuple[int, int] | None
    ) -> tuple[CompactionRow | None, int, list[Message]]:
        """The latest summary, the seq it ends at, and the history after it (after `known`'s
        last seq when the summary still ends at `known`'s first: what the caller holds)."""
        if not self.d.sqlite:
            return self._summary_and_history(cursor, session_id, known)
        summary = self.latest_compaction(cursor, session_id)
        end = summary.last_seq if summary is not None else 0
        start = known[1] if known is not None and known[0] == end else end
        return summary, end, self.history(cursor, session_id, start)

    def _summary_and_history(
        self, cursor: Any, session_id: int, known: tuple[int, int] | None
    ) -> tuple[CompactionRow | None, int, list[Message]]:
        """`summary_and_history` on PostgreSQL: one statement, the summary as JSON on the first
        row only (a row with the message's columns NULL when no history follows it)."""
        known_end, known_last = known if known is not None else (-1, 0)
        cursor.execute(
            SUMMARY_AND_HISTORY,
            {"session_id": session_id, "known_end": known_end, "known_last": known_last},
        )
        rows = cursor.fetchall()
        found = self.d.load_json(rows[0][0])
        summary = None
        if found is not None:
            summary = build(CompactionRow, self.d.decode(COMPACTION_COLUMNS, [
                found[c] for c in COMPACTION_COLUMNS
            ]))
        end = summary.last_seq if summary is not None else 0
        return summary, end, [self._message(r[1:]) for r in rows if r[1] is not None]

    def session_id(self, cursor: Any, key: str, create: dict[str, Any] | None) -> int | None:
        found = self._one(cursor, SESSION_ID, {"key": key})
        if found is not None:
            return int(found[0])
        if create is None:
            return None
        made = self._one(cursor, INSERT_SESSION, {**create, "now": self.d.dump_time(utcnow())})
        return int(made[0])

    def allocate_seqs(self, cursor: Any, session_id: int, count: int) -> int:
        """Reserve `count` consecutive seqs atomically (safe across processes); the first."""
        params = {"count": count, "now": self.d.dump_time(utcnow()), "id": session_id}
        return int(self._one(cursor, ALLOCATE_SEQS, params)[0]) - count

    def place(self, cursor: Any, session_id: int, ids: Sequence[int]) -> int:
        """Give the stored messages `ids` the next seqs of their session, in that order; the
        first. PostgreSQL: one statement (atomic in autocommit); SQLite: `allocate_seqs` and
        `set_seqs` in the store's transaction."""
        if self.d.sqlite:
            first = self.allocate_seqs(cursor, session_id, len(ids))
            self.set_seqs(cursor, ((i, first + n) for n, i in enumerate(ids)))
            return first
        now = self.d.dump_time(utcnow())
        params = {"count": len(ids), "now": now, "id": session_id, "ids": list(ids)}
        return int(self._one(cursor, PLACE, params)[0])

    def insert_message(self, cursor: Any, values: dict[str, Any]) -> MessageRow:
        row = self._insert(cursor, values, INSERT_MESSAGE)
        assert row is not None
        return row

    def insert_inbound(self, cursor: Any, values: dict[str, Any]) -> MessageRow | None:
        """`insert_message`, or None when the same platform message is stored already (a
        redelivery): the unique constraint decides, in the same statement."""
        return self._insert(cursor, values, INSERT_UNLESS_DUPLICATE)

    def insert_message_only(self, cursor: Any, values: dict[str, Any]) -> None:
        """`insert_message` for a caller that needs no row back (a turn's reply)."""
        self._write_message(cursor, self._message_values(values), INSERT_MESSAGE)

    def _insert(self, cursor: Any, values: dict[str, Any], statement: str) -> MessageRow | None:
        row = self._message_values(values)
        new_id = self._write_message(cursor, row, statement)
        return None if new_id is None else build(MessageRow, {"id": new_id, **row})

    def _message_values(self, values: dict[str, Any]) -> dict[str, Any]:
        row = {c: values.get(c) for c in _INSERTED}
        row["created_at"] = row["created_at"] or utcnow()
        row["handled"] = values.get("handled", True)
        return row

    def _write_message(self, cursor: Any, row: dict[str, Any], statement: str) -> int | None:
        params = dict(row)
        params["created_at"] = self.d.dump_time(row["created_at"])
        params["content"] = self.d.dump_json(row["content"])
        params["tool_calls"] = self.d.dump_json(row["tool_calls"])
        inserted = self._one(cursor, statement, params)
        return None if inserted is None else int(inserted[0])

    def unhandled(self, cursor: Any, session_id: int) -> list[MessageRow]:
        cursor.execute(self.d.sql(UNHANDLED), {"session_id": session_id, "no": False})
        return [self._message_row(r) for r in cursor.fetchall()]

    def set_seqs(self, cursor: Any, seqs: Iterable[tuple[int, int]]) -> None:
        self._each(cursor, SET_SEQ, [{"id": i, "seq": s} for i, s in seqs])

    def mark_handled(
        self,
        cursor: Any,
        ids: Iterable[int],
        status: str | None,
        tokens: dict[int, int] | None = None,
    ) -> None:
        """Mark messages answered (with `status`); with their token counts from `tokens`, if
        there (one statement a message instead of two)."""
        counts = tokens or {}
        params = [{"id": i, "yes": True, "status": status, "tokens": counts.get(i)} for i in ids]
        self._each(cursor, SET_HANDLED, params)

    def set_tokens(self, cursor: Any, counts: dict[int, int]) -> None:
        self._each(cursor, SET_TOKENS, [{"id": i, "tokens": t} for i, t in counts.items()])

    def insert_turn_record(
        self, cursor: Any, record: TurnRecordRow, session_id: int, reply_seq: int
    ) -> None:
        params = {c: getattr(record, c) for c in _RECORDED}
        params["session_id"], params["reply_seq"] = session_id, reply_seq
        params["created_at"] = self.d.dump_time(record.created_at)
        cursor.execute(self.d.sql(INSERT_TURN_RECORD), params)

    def insert_outbox(self, cursor: Any, session_id: int, message: OutboundMessage) -> int:
        params = self._outbox_values(session_id, message)
        params["answers"] = self.d.dump_json(params["answers"])
        params["created_at"] = self.d.dump_time(params["created_at"])
        return int(self._one(cursor, INSERT_OUTBOX, params)[0])

    def _outbox_values(self, session_id: int, message: OutboundMessage) -> dict[str, Any]:
        return {
            "session_id": session_id,
            "session_key": message.session_key,
            "platform": message.platform,
            "chat_id": message.chat_id,
            "thread_id": message.thread_id,
            "account": message.account,
            "reply_to": message.reply_to,
            "answers": list(message.answers),
            "text": message.text,
            "created_at": utcnow(),
            "attempts": 0,
            "sent_parts": message.sent_parts,
            "preview_id": message.preview_id,
            "last_error": None,
            "given_up_at": None,
        }

    def forget_outbox(self, cursor: Any, ids: Sequence[int]) -> int:
        """Delete these outbox rows (their replies were sent); how many there were. PostgreSQL
        gets one statement text whatever the count (batches vary: a text a count would be
        prepared anew and crowd the statement caches)."""
        if self.d.sqlite:
            marks = ", ".join(f":id{n}" for n in range(len(ids)))
            statement = f"DELETE FROM outbox WHERE id IN ({marks}) RETURNING id"
            params: dict[str, Any] = {f"id{n}": i for n, i in enumerate(ids)}
        else:
            statement, params = FORGET_OUTBOX, {"ids": list(ids)}
        cursor.execute(self.d.sql(statement), params)
        return len(cursor.fetchall())

    def finish_turn(self, cursor: Any, session_id: int, **usage: Any) -> int:
        """The reply's seq (allocated atomically) and the turn's usage counters and outcome, in
        one statement on the session row (`usage`: `_finish_params`'s keywords); unknown usage
        leaves the counters alone."""
        return int(self._one(cursor, FINISH_TURN, self._finish_params(session_id, **usage))[0]) - 1

    def _finish_params(
        self,
        session_id: int,
        *,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        error: str | None,
        token_ratio: float | None,
        token_ratio_samples: int | None = None,
        cached_tokens: int | None = None,
    ) -> dict[str, Any]:
        return {
            "id": session_id,
            "now": self.d.dump_time(utcnow()),
            "error": error,
            "ratio": token_ratio,
            "samples": token_ratio_samples,
            "prompt": prompt_tokens,
            "completion": completion_tokens,
            "cached": cached_tokens,
        }

    def end_turn(self, cursor: Any, end: TurnEnd) -> tuple[int, int | None]:
        """Everything a finished turn writes: the session's counters and the reply's seq
        (`finish_turn`), the reply, its outbox row, the turn record, the handled marks and
        token counts; returns the reply's seq and the outbox id (None without `outbound`).

        SQLite: statement by statement, in the transaction the store opened. PostgreSQL: one
        statement (data-modifying CTEs), atomic on its own in autocommit: one round trip where
        the statements and a transaction's BEGIN and COMMIT were seven or more."""
        if self.d.sqlite:
            seq = self.finish_turn(cursor, end.session_id, **end.usage)
            self.insert_message_only(cursor, {**end.reply, "seq": seq})
            outbox_id = None
            if end.outbound is not None:
                outbox_id = self.insert_outbox(cursor, end.session_id, end.outbound)
            if end.record is not None:
                self.insert_turn_record(cursor, end.record, end.session_id, seq)
            handled = set(end.handled)
            self.mark_handled(cursor, end.handled, None, end.tokens)
            self.set_tokens(cursor, {i: t for i, t in end.tokens.items() if i not in handled})
            return seq, outbox_id
        statement, params = self._end_turn_statement(end)
        cursor.execute(statement, params)
        seq, outbox_id = cursor.fetchone()
        return int(seq), None if outbox_id is None else int(outbox_id)

    def _end_turn_statement(self, end: TurnEnd) -> tuple[str, dict[str, Any]]:
        """`end_turn` on PostgreSQL: every write a CTE of one statement. The reply's seq comes
        from the session's UPDATE (`s`); the CTEs touch disjoint rows, as they must. Each new
        row travels as one JSON parameter (`json_populate_record`): few parameters and a short
        text keep the driver's prepared-statement cache in use."""
        params = self._finish_params(end.session_id, **end.usage)
        seq = "(SELECT next_seq - 1 FROM s)"
        parts = [f"s AS ({_pyformat(FINISH_TURN)})"]
        reply = self._message_values({**end.reply, "seq": None})
        params["m"] = _json_row(reply)
        parts.append(f"m AS ({_insert_from_json('messages', _INSERTED, 'm', {'seq': seq})})")
        outbox = "NULL"
        if end.outbound is not None:
            params["o"] = _json_row(self._outbox_values(end.session_id, end.outbound))
            parts.append(f"o AS ({_insert_from_json('outbox', _OUTBOX, 'o')} RETURNING id)")
            outbox = "(SELECT id FROM o)"
        if end.record is not None:
            record = {c: getattr(end.record, c) for c in _RECORDED}
            params["t"] = _json_row({**record, "session_id": end.session_id})
            parts.append(
                f"t AS ({_insert_from_json('turn_records', _RECORDED, 't', {'reply_seq': seq})})"
            )
        handled = list(dict.fromkeys(end.handled))
        if handled:
            params["h_ids"] = handled
            params["h_tokens"] = [end.tokens.get(i) for i in handled]
            parts.append(
                "h AS (UPDATE messages SET handled = true, "
                "status = CASE WHEN messages.status = 'command' THEN messages.status ELSE NULL END, "
                "tokens = COALESCE((%(h_tokens)s::bigint[])"
                "[array_position(%(h_ids)s::bigint[], messages.id)], messages.tokens) "
                "WHERE messages.id = ANY(%(h_ids)s::bigint[]))"
            )
        earlier = {i: t for i, t in end.tokens.items() if i not in set(handled)}
        if earlier:
            params["k_ids"], params["k_tokens"] = list(earlier), list(earlier.values())
            parts.append(
                "k AS (UPDATE messages SET tokens = (%(k_tokens)s::bigint[])"
                "[array_position(%(k_ids)s::bigint[], messages.id)] "
                "WHERE messages.id = ANY(%(k_ids)s::bigint[]))"
            )
        return f"WITH {', '.join(parts)} SELECT next_seq - 1, {outbox} FROM s", params

    def history(self, cursor: Any, session_id: int, after_seq: int) -> list[Message]:
        cursor.execute(self.d.sql(HISTORY), {"session_id": session_id, "after": after_seq})
        return [self._message(r) for r in cursor.fetchall()]

    def latest_compaction(self, cursor: Any, session_id: int) -> CompactionRow | None:
        row = self._one(cursor, LATEST_COMPACTION, {"session_id": session_id, "no": False})
        if row is None:
            return None
        return build(CompactionRow, self.d.decode(COMPACTION_COLUMNS, row))

    def _message_row(self, values: Sequence[Any]) -> MessageRow:
        return build(MessageRow, self.d.decode(MESSAGE_COLUMNS, values))

    def _message(self, values: Sequence[Any]) -> Message:
        r = dict(zip(MESSAGE_COLUMNS, values, strict=True))
        calls = self.d.load_json(r["tool_calls"])
        return Message(
            role=r["role"],
            content=self.d.load_json(r["content"]),
            tool_calls=tuple(ToolCall.from_openai(tc) for tc in calls or ()),
            tool_call_id=r["tool_call_id"],
            name=r["name"],
            seq=r["seq"],
            tokens=r["tokens"],
            meta=message_meta(
                r["id"], r["sender_id"], r["status"], r["tool_error"],
                self.d.load_time(r["created_at"]),
            ),
        )


def message_meta(
    row_id: int | None,
    sender_id: str | None,
    status: str | None,
    tool_error: Any,
    created_at: datetime | None,
) -> dict[str, Any]:
    """A stored message's `Message.meta`, the same on every read path: its row id, sender and
    status; `tool_error` (a tool result's own flag) when stored; `created_at` (ISO 8601, UTC)."""
    meta: dict[str, Any] = {"id": row_id, "sender_id": sender_id, "status": status}
    if tool_error is not None:
        meta["tool_error"] = bool(tool_error)
    if created_at is not None:
        aware = created_at if created_at.tzinfo is not None else created_at.replace(tzinfo=UTC)
        meta["created_at"] = aware.astimezone(UTC).isoformat()
    return meta


def _json_row(values: dict[str, Any]) -> str:
    """A row's values as one JSON object for `json_populate_record` (times in ISO 8601)."""
    return json.dumps(values, default=_iso, separators=(",", ":"))


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _insert_from_json(
    table: str, columns: Sequence[str], param: str, computed: dict[str, str] | None = None
) -> str:
    """PostgreSQL: INSERT one row of `table` from the JSON object in `param`; a column in
    `computed` takes that SQL expression instead."""
    given = computed or {}
    picked = ", ".join(given.get(c, f"r.{_quoted(c)}") for c in columns)
    return (
        f"INSERT INTO {table} ({', '.join(map(_quoted, columns))}) SELECT {picked} "
        f"FROM json_populate_record(NULL::{table}, %({param})s::json) AS r"
    )
