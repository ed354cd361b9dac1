"""History limits and turn importance (pure).

A *turn* is one user message and everything until the next one: the assistant's replies, its
tool calls and their results. Limits count user turns, and whole
turns are the unit the overflow tier drops, so a tool call is never cut from its result.

Limits resolve per conversation with the source that decided them, so `explain` can say *why*
a chat only sees 20 turns:

* DM: ``[channels.<p>.dms."<user>"] history_limit`` → ``[channels.<p>] dm_history_limit``
  → ``[context] history_limit``.
* group / channel / thread: ``[channels.<p>.channels."<id>"] history_limit`` →
  ``[channels.<p>.groups."<chat>"] history_limit`` → ``[channels.<p>] history_limit``
  → ``[context] history_limit``.

0 means unlimited at every level. The gateway builds `HistoryLimits` from its config; this
module does not import it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from context.failures import tool_failure
from context.pruning import looks_like_error
from context.tokens import TokenCounter
from context.types import Message

__all__ = [
    "SYSTEM_SOURCE",
    "HistoryCut",
    "HistoryLimits",
    "LimitResolution",
    "PlatformLimits",
    "Turn",
    "TurnScore",
    "apply_history_limit",
    "choose_turns_to_drop",
    "importance",
    "message_has_error",
    "resolve_history_limit",
    "score_turns",
    "split_turns",
    "turn_importance",
]

# --------------------------------------------------------------------------------- turns


def message_has_error(message: Message) -> bool:
    """A failed tool result (`context.failures.tool_failure`: the tool's flag, a structured
    exit code, else error lines at the output's head or tail), or a reply or pasted log that
    looks like a failure."""
    if message.role == "tool":
        return tool_failure(message) is not None
    return looks_like_error(message.text)


@dataclass(frozen=True, slots=True)
class Turn:
    """One user message and what followed it; the leading turn may have no user message."""

    messages: tuple[Message, ...]

    @property
    def user_message(self) -> Message | None:
        first = self.messages[0] if self.messages else None
        return first if first is not None and first.role == "user" else None

    @property
    def tokens(self) -> int:
        """Sum of cached counts (uncounted messages as 0; see `count_tokens`)."""
        return sum(m.tokens or 0 for m in self.messages)

    def count_tokens(self, counter: TokenCounter | None = None) -> int:
        """Tokens of the turn, counting uncached messages with `counter` when given."""
        return counter.count_messages(self.messages) if counter else self.tokens

    @property
    def has_tool_calls(self) -> bool:
        return any(m.tool_calls or m.role == "tool" for m in self.messages)

    @property
    def has_error(self) -> bool:
        return any(message_has_error(m) for m in self.messages)

    @property
    def first_seq(self) -> int | None:
        return min((m.seq for m in self.messages if m.seq is not None), default=None)

    @property
    def last_seq(self) -> int | None:
        return max((m.seq for m in self.messages if m.seq is not None), default=None)


def split_turns(messages: Sequence[Message]) -> list[Turn]:
    """Split `messages` into turns at user messages.

    Invariant: a turn boundary never falls between a tool call and its result. The runner
    persists a user message that arrives mid tool loop with a seq *between* a call and its
    result; such a message joins the open turn instead of starting a new one. (Calls that never
    got a result do not hold the turn open.) `apply_history_limit` re-checks this.
    """
    result_at = {
        m.tool_call_id: i for i, m in enumerate(messages) if m.role == "tool" and m.tool_call_id
    }
    turns: list[Turn] = []
    current: list[Message] = []
    open_until = -1  # index of the last pending result of a call seen so far
    for i, m in enumerate(messages):
        if m.role == "user" and current and i > open_until:
            turns.append(Turn(tuple(current)))
            current = []
        current.append(m)
        for call in m.tool_calls:
            open_until = max(open_until, result_at.get(call.id, -1))
    if current:
        turns.append(Turn(tuple(current)))
    return turns


# ------------------------------------------------------------------------- limit resolution


@dataclass(frozen=True, slots=True)
class PlatformLimits:
    """`[channels.<platform>]` history settings; None = not set, fall through."""

    dm_default: int | None = None
    group_default: int | None = None
    dms: Mapping[str, int | None] = field(default_factory=dict)
    groups: Mapping[str, int | None] = field(default_factory=dict)
    channels: Mapping[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class HistoryLimits:
    """All history-limit settings: `[context] history_limit` plus per-platform ones."""

    system_default: int = 0
    platforms: Mapping[str, PlatformLimits] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LimitResolution:
    """A history limit in user turns (0 = unlimited) and the config key that decided it."""

    limit: int
    source: str

    @property
    def unlimited(self) -> bool:
        return self.limit == 0

    def describe(self) -> str:
        """E.g. ``last 20 user turns (from [channels.telegram] history_limit)``."""
        amount = "unlimited" if self.unlimited else f"last {self.limit:,} user turns"
        return f"{amount} (from {self.source})"


SYSTEM_SOURCE = "[context] history_limit (default)"
DM_CHAT_TYPES = frozenset({"direct", "dm"})


def _key(chat: str) -> str:
    return json.dumps(chat, ensure_ascii=False)  # a TOML basic string for ids like "-100…"


def resolve_history_limit(
    limits: HistoryLimits,
    platform: str,
    chat_type: str,
    chat_id: str | None,
    user_id: str | None,
) -> LimitResolution:
    """The history limit for one conversation, with its source (see the module docstring).

    `chat_type` is ``direct`` (or ``dm``) for DMs; anything else (group, channel, thread) uses
    the group rules, looked up by `chat_id` (for a thread, pass the id the config names — its
    parent channel). An unknown platform gets the system default.
    """
    p = limits.platforms.get(platform)
    if p is not None:
        section = f"[channels.{platform}"
        if chat_type in DM_CHAT_TYPES:
            tables = [("dms", p.dms, user_id)]
            default_key, default = f"{section}] dm_history_limit", p.dm_default
        else:
            tables = [("channels", p.channels, chat_id), ("groups", p.groups, chat_id)]
            default_key, default = f"{section}] history_limit", p.group_default
        for name, table, ident in tables:
            value = table.get(ident) if ident is not None else None
            if value is not None:
                return LimitResolution(value, f"{section}.{name}.{_key(str(ident))}] history_limit")
        if default is not None:
            return LimitResolution(default, default_key)
    return LimitResolution(limits.system_default, SYSTEM_SOURCE)


# ------------------------------------------------------------------------- applying a limit


@dataclass(frozen=True, slots=True)
class HistoryCut:
    """`history` split into what is sent (`kept`, a suffix) and what the limit left out."""

    kept: list[Message]
    dropped: list[Message]
    kept_turns: int = 0
    dropped_turns: int = 0


def apply_history_limit(history: Sequence[Message], limit: int) -> HistoryCut:
    """Keep the last `limit` user turns of `history` (0 = keep everything).

    `history` is what came *before* the current turn; the caller always sends the current
    message. The leading user-less turn (a note or summary before the first user message) is
    older than every user turn, so it goes exactly when the limit drops at least one user turn,
    and stays whenever the whole history fits — "last N turns" never resurrects older content.
    """
    if limit < 0:
        raise ValueError("history limit must be >= 0 (0 = unlimited)")
    turns = split_turns(history)
    user_turns = sum(1 for t in turns if t.user_message is not None)
    if limit == 0 or user_turns <= limit:
        return HistoryCut(list(history), [], len(turns), 0)
    kept_turns = turns[len(turns) - limit :]
    dropped_turns = turns[: len(turns) - limit]
    kept = [m for t in kept_turns for m in t.messages]
    dropped = [m for t in dropped_turns for m in t.messages]
    _check_no_split_pairs(kept, dropped)
    return HistoryCut(kept, dropped, len(kept_turns), len(dropped_turns))


def _check_no_split_pairs(kept: Sequence[Message], dropped: Sequence[Message]) -> None:
    """Guard the `split_turns` invariant: no call on one side with its result on the other."""
    dropped_calls = {c.id for m in dropped for c in m.tool_calls}
    dropped_results = {m.tool_call_id for m in dropped if m.role == "tool"}
    kept_calls = {c.id for m in kept for c in m.tool_calls}
    kept_results = {m.tool_call_id for m in kept if m.role == "tool"}
    split = (dropped_calls & kept_results) | (kept_calls & dropped_results)
    if split:
        raise AssertionError(f"history cut separated tool calls from results: {sorted(split)}")


# ------------------------------------------------------------------------------ importance

#: The design weights: recency 0.3, message type 0.4, length 0.2, reference 0.1.
W_RECENCY, W_TYPE, W_LENGTH, W_REFERENCE = 0.3, 0.4, 0.2, 0.1
#: User asks and system notes (summaries) matter most, the assistant's prose half as much; tool
#: output is re-fetchable. A tool call records an action taken (forgetting it is how old tasks
#: get re-run) and a failure must not be retried blindly, so both raise a message's type.
TYPE_WEIGHTS: Mapping[str, float] = {"user": 1.0, "system": 1.0, "assistant": 0.5, "tool": 0.6}
TOOL_CALL_TYPE, FAILURE_TYPE = 0.8, 1.0
#: A message or turn this long (tokens) scores 0 on length: bulk is the cheapest thing to drop
#: per point of importance lost; short exchanges cost little to keep.
LENGTH_REF = 2_000
_REFERENCE_RE = re.compile(r"[A-Za-z0-9][\w./:#-]*\d[\w./:#-]*|[\w.-]+/[\w./-]+")


def _recency(index: int, total: int) -> float:
    return 1.0 if total <= 1 else min(max(index / (total - 1), 0.0), 1.0)


def _length(tokens: int | None) -> float:
    return 1.0 - min(1.0, (tokens or 0) / LENGTH_REF)


def _message_type(message: Message) -> float:
    if message_has_error(message):
        return FAILURE_TYPE
    weight = TYPE_WEIGHTS.get(message.role, 0.0)
    return max(weight, TOOL_CALL_TYPE) if message.tool_calls else weight


def importance(message: Message, index: int, total: int, referenced: bool = False) -> float:
    """Importance of `message` at position `index` of `total`, in [0, 1]: recency, type (user
    above assistant; tool calls and failures raised), length (shorter is cheaper to keep) and
    whether a later message refers to it."""
    return (
        W_RECENCY * _recency(index, total)
        + W_TYPE * _message_type(message)
        + W_LENGTH * _length(message.tokens)
        + W_REFERENCE * (1.0 if referenced else 0.0)
    )


def _turn_type(turn: Turn) -> float:
    """An ask (or a system note) is most of it (0.6), then tool activity (0.2) and a failure
    (0.2); a turn with neither (the assistant alone) gets half the ask's part."""
    asked = turn.user_message is not None or any(m.role == "system" for m in turn.messages)
    ask = 0.6 if asked else 0.3
    return ask + (0.2 if turn.has_tool_calls else 0.0) + (0.2 if turn.has_error else 0.0)


def turn_importance(turn: Turn, index: int, total: int, referenced: bool = False) -> float:
    """Importance of turn `index` of `total`, in [0, 1] (the weights of `importance`)."""
    return (
        W_RECENCY * _recency(index, total)
        + W_TYPE * _turn_type(turn)
        + W_LENGTH * _length(turn.tokens)
        + W_REFERENCE * (1.0 if referenced else 0.0)
    )


def _references(turns: Sequence[Turn]) -> list[bool]:
    """Whether a later turn mentions one of a turn's id-like tokens (ids, paths, versions)."""
    later: set[str] = set()
    out = [False] * len(turns)
    for i in range(len(turns) - 1, -1, -1):
        own: set[str] = set()
        for m in turns[i].messages:
            if m.role != "tool":  # bulk output is not what people refer back to
                own.update(_REFERENCE_RE.findall(m.text))
        out[i] = bool(own & later)
        later |= own
    return out


@dataclass(frozen=True, slots=True)
class TurnScore:
    """Why a turn ranks where it does, for `explain` and logs."""

    index: int
    importance: float
    tokens: int
    first_seq: int | None
    last_seq: int | None
    reasons: tuple[str, ...]

    def describe(self) -> str:
        """E.g. ``turn 3 (seq 10–14, 1,234 tokens, importance 0.62: user ask, tool calls)``."""
        seqs = f"seq {self.first_seq}–{self.last_seq}, " if self.first_seq is not None else ""
        why = f": {', '.join(self.reasons)}" if self.reasons else ""
        return (
            f"turn {self.index} ({seqs}{self.tokens:,} tokens, "
            f"importance {self.importance:.2f}{why})"
        )


def score_turns(turns: Sequence[Turn], counter: TokenCounter | None = None) -> list[TurnScore]:
    """A `TurnScore` per turn, in order."""
    out = []
    referenced = _references(turns)
    for i, turn in enumerate(turns):
        reasons = ["user ask" if turn.user_message is not None else "no user message"]
        if turn.has_tool_calls:
            reasons.append("tool calls")
        if turn.has_error:
            reasons.append("error")
        if referenced[i]:
            reasons.append("referenced later")
        out.append(
            TurnScore(
                index=i,
                importance=turn_importance(turn, i, len(turns), referenced[i]),
                tokens=turn.count_tokens(counter),
                first_seq=turn.first_seq,
                last_seq=turn.last_seq,
                reasons=tuple(reasons),
            )
        )
    return out


def choose_turns_to_drop(
    turns: Sequence[Turn],
    tokens_to_free: int,
    protect_last: int,
    counter: TokenCounter | None = None,
) -> list[int]:
    """Indices of turns to drop, in drop order: least important first, ties oldest first.

    The last `protect_last` turns are never chosen. Stops as soon as the chosen turns free
    `tokens_to_free`; if all candidates together free less, all are returned and the caller
    moves to the next overflow tier. Token counts come from the cache, or `counter`.
    """
    if tokens_to_free <= 0:
        return []
    candidates = score_turns(turns, counter)[: max(len(turns) - max(protect_last, 0), 0)]
    chosen: list[int] = []
    freed = 0
    # Rounded so float noise (0.3 * 1/3 vs 0.1) does not beat the oldest-first tie-break.
    for score in sorted(candidates, key=lambda s: (round(s.importance, 9), s.index)):
        chosen.append(score.index)
        freed += score.tokens
        if freed >= tokens_to_free:
            break
    return chosen
