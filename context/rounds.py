"""Tool rounds: the unit inside a turn (pure).

A turn is its *ask* (the user message or messages that open it) followed by *rounds* and
replies. A round is an assistant message with tool calls plus every result answering them;
it is never split, since providers reject a call without its result and a result without its
call. One ask followed by hundreds of rounds is the commonest shape of real agent work, and
such a turn alone can outgrow the window: it then keeps its ask pinned verbatim and its newest
rounds, and the rounds between are compacted (or, when compaction cannot run, left out of the
prompt — never out of the store).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from context.types import Message

UnitKind = Literal["ask", "round", "reply", "other"]


@dataclass(frozen=True, slots=True)
class Unit:
    """Messages that are kept or left out together."""

    kind: UnitKind
    messages: tuple[Message, ...]

    @property
    def tokens(self) -> int:
        return sum(m.tokens or 0 for m in self.messages)


def split_units(messages: Sequence[Message]) -> list[Unit]:
    """`messages` as asks, rounds, replies and other messages (system notes, stray results).

    A round runs from its assistant message to its last result: a message stored between a
    call and its result (a user message that arrived mid-round) stays inside it. Calls that
    never got a result do not hold a round open.
    """
    result_at = {
        m.tool_call_id: i for i, m in enumerate(messages) if m.role == "tool" and m.tool_call_id
    }
    units: list[Unit] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        if m.role == "assistant" and m.tool_calls:
            end = max((result_at.get(c.id, i) for c in m.tool_calls), default=i)
            j = i + 1
            while j <= end or (j < len(messages) and _answers(messages[j], m)):
                j += 1
            units.append(Unit("round", tuple(messages[i:j])))
            i = j
        elif m.role == "user":
            j = i + 1
            while j < len(messages) and messages[j].role == "user":
                j += 1
            units.append(Unit("ask", tuple(messages[i:j])))
            i = j
        else:
            units.append(Unit("reply" if m.role == "assistant" else "other", (m,)))
            i += 1
    return units


def _answers(message: Message, call: Message) -> bool:
    return message.role == "tool" and any(c.id == message.tool_call_id for c in call.tool_calls)


def ask_start(messages: Sequence[Message], index: int) -> int | None:
    """Where the ask of the turn holding `messages[index]` starts: the first of the user
    messages nearest before it (None when no user message precedes it)."""
    at = index - 1
    while at >= 0 and messages[at].role != "user":
        at -= 1
    if at < 0:
        return None
    while at > 0 and messages[at - 1].role == "user":
        at -= 1
    return at


def ask_of(messages: Sequence[Message], index: int) -> list[int]:
    """Indices of the ask of the turn holding `messages[index]` ([] when it has none)."""
    start = ask_start(messages, index)
    if start is None:
        return []
    end = start
    while end < index and messages[end].role == "user":
        end += 1
    return list(range(start, end))


__all__ = ["Unit", "UnitKind", "ask_of", "ask_start", "split_units"]
