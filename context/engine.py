"""The ContextEngine protocol and the simplest engine, which sends the full history.

The runner owns all I/O: it loads the session, hands the engine messages and settings, and gets
a plan back. Engines are chosen by name through the `gatehouse.context_engines` entry points.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from context.types import Message

Summarizer = Callable[[Sequence[Message], str], Awaitable[str]]
"""An async callable: (messages to summarize, instructions) -> summary text."""


@dataclass(frozen=True, slots=True)
class TurnContext:
    """Everything an engine may look at for one turn."""

    session_key: str
    system_prompt: str
    history: Sequence[Message]
    """The conversation before this turn, in order (stored messages, counts cached)."""
    incoming: Sequence[Message]
    """This turn's new user messages; always sent."""
    model: str = ""


@dataclass(frozen=True, slots=True)
class ContextPlan:
    """The prompt to send, and why it looks the way it does."""

    messages: list[Message]
    notes: tuple[str, ...] = ()
    facts: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class ContextEngine(Protocol):
    name: str

    def assemble(self, turn: TurnContext) -> ContextPlan: ...

    async def compact(self, turn: TurnContext, summarizer: Summarizer) -> ContextPlan | None: ...

    def after_turn(self, turn: TurnContext, prompt_tokens: int | None) -> None: ...


def drop_orphaned_tool_messages(messages: Sequence[Message]) -> list[Message]:
    """Keep tool calls and their results together: providers reject either one alone.

    An assistant message whose tool calls lack results (a turn cut short) keeps its text but
    loses the calls; a tool result whose call is not in the prompt is left out.
    """
    answered: set[str] = {m.tool_call_id for m in messages if m.role == "tool" and m.tool_call_id}
    offered: set[str] = set()
    out: list[Message] = []
    for m in messages:
        if m.role == "assistant" and m.tool_calls:
            if all(tc.id in answered for tc in m.tool_calls):
                offered.update(tc.id for tc in m.tool_calls)
                out.append(m)
            elif m.text:
                out.append(Message(role="assistant", content=m.content, seq=m.seq, tokens=None))
        elif m.role == "tool":
            if m.tool_call_id in offered:
                out.append(m)
        else:
            out.append(m)
    return out


class FullHistoryEngine:
    """Sends the system prompt, the whole history and the new messages. No limits, no compaction."""

    name = "full-history"

    def assemble(self, turn: TurnContext) -> ContextPlan:
        system = Message(role="system", content=turn.system_prompt)
        body = drop_orphaned_tool_messages([*turn.history, *turn.incoming])
        return ContextPlan(messages=[system, *body], notes=("full history",))

    async def compact(self, turn: TurnContext, summarizer: Summarizer) -> ContextPlan | None:
        return None

    def after_turn(self, turn: TurnContext, prompt_tokens: int | None) -> None:
        return None
