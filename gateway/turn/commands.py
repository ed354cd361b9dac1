"""The chat commands, answered by the gateway itself: `/status`, `/context`, `/new` (`/reset`),
`/compact [instructions]`, `/help` (the list and the parsing: `channels/commands.py`).

A command arrives as an ordinary message: it is stored like every inbound message, claimed by a
turn, then marked ``command`` so the model never sees it, and answered here without a model
call (`/compact` calls the summarizer, as compaction always does). Its answer is stored too,
marked the same way. Other messages of the same turn are answered by the model as usual, after
the commands. None is left unanswered behind a `/new`: a turn's claim stops before a `/new`
that other messages came before (`gateway.store.turns.before_a_boundary`), so those are
answered first, in the context they were sent in, and the `/new` that comes next says how many
were; a turn that still holds some before its `/new` (one a stopped run had claimed) carries
them over into the fresh context and says so.

- `/status` and `/context` read the facts `gatehouse context explain` prints (`Describe`, given
  by the Gateway: `gateway/operations/chat.py`), so a chat and the CLI never disagree.
- `/new` is the reset the daily reset uses (`Compactor.reset_session`): a boundary row, nothing
  deleted, everything before it archived for `history_search`, undone by `gatehouse sessions
  uncompact`. It skips the memory flush: a command never waits for the model.
- `/compact` is `Compactor.compact_session`, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from channels.commands import help_text, parse_command
from context.compaction import CompactionResult
from gateway.store import CompactionRow, HistoryRead, MessageRow, Store
from gateway.store.messages import CONTEXT_STATUS
from gateway.turn.compaction import describe_compaction
from gateway.turn.history import COMMAND_STATUS, SessionView

log = logging.getLogger(__name__)

Describe = Callable[[str, str], Awaitable[str]]
"""(session key, "status" or "context") -> that command's answer."""


class CommandHost(Protocol):
    """What the commands need from the runner (the caller holds the session's lane)."""

    @property
    def store(self) -> Store: ...

    async def view(
        self, session_id: int, *, use_cache: bool = True, read: HistoryRead | None = None
    ) -> SessionView: ...

    async def compact_session(
        self, session_key: str, instructions: str = "", reason: str = "manual"
    ) -> CompactionResult | None: ...

    async def reset_session(
        self, session_key: str, why: str, *, flush: bool = True, through: int | None = None
    ) -> CompactionRow | None: ...


async def run_commands(
    host: CommandHost,
    describe: Describe | None,
    session_key: str,
    claimed: list[MessageRow],
    *,
    answered_first: int = 0,
) -> tuple[list[str], list[MessageRow]]:
    """Answer the commands among a turn's claimed messages, in order: their answers, and the
    messages left for the model (those before a `/new` carried over into the fresh context;
    none when only unmentioned group messages are left: they stay in the history as context).
    `answered_first`: how many messages sent before this turn's `/new` the previous turn
    answered (its claim stopped before the `/new`)."""
    parsed = [(row, parse_command(row.content)) for row in claimed]
    if not any(found for _row, found in parsed):
        return [], claimed
    await host.store.mark_status(
        [row.id for row, found in parsed if found and row.id is not None], COMMAND_STATUS
    )
    answers: list[str] = []
    asked: list[MessageRow] = []
    for row, found in parsed:
        if found is None:
            asked.append(row)
            continue
        command, text = found
        if command.name == "new":
            carried = [r for r in asked if r.status != CONTEXT_STATUS]
            answers.append(await _new(host, session_key, row, answered_first, carried))
            asked, answered_first = carried, 0
        elif command.name == "compact":
            result = await host.compact_session(session_key, text, reason="command")
            answers.append(describe_compaction(result))
        elif command.name == "help":
            answers.append(help_text())
        else:
            answers.append(await _describe(describe, session_key, command.name))
    if all(row.status == CONTEXT_STATUS for row in asked):
        asked = []  # group chatter a command brought along is context, not a question
    return answers, asked


async def _describe(describe: Describe | None, session_key: str, name: str) -> str:
    if describe is None:
        return f"/{name} is not available in this process."
    try:
        return await describe(session_key, name)
    except Exception as exc:
        log.exception("/%s failed for %s", name, session_key)
        return f"/{name} failed: {exc}"


async def _new(
    host: CommandHost,
    session_key: str,
    row: MessageRow,
    answered_first: int = 0,
    carried: list[MessageRow] | None = None,
) -> str:
    """A fresh context from this message on, or from the first of `carried` (messages of this
    turn sent before it, answered after it): see the module docstring."""
    session = await host.store.get_session(session_key)
    if session is None or session.id is None or row.seq is None:
        return "Nothing to reset."
    seqs = [r.seq for r in carried or () if r.seq is not None]
    through = min(seqs) - 1 if seqs else row.seq
    first = _answered_first(answered_first)
    view = await host.view(session.id)
    earlier = [m for m in view.history if m.seq is not None and m.seq <= through]
    fresh = "Already a fresh context: nothing earlier is sent to the model."
    if not earlier and view.summary is None:
        return first + fresh + _carried_over(seqs)
    reset = await host.reset_session(session_key, "/new in the chat", flush=False, through=through)
    if reset is None:
        return first + fresh + _carried_over(seqs)
    what = f"{len(earlier):,} earlier message{'s' if len(earlier) != 1 else ''}"
    if view.summary is not None:
        what += " and the summary before them"
    return (
        f"{first}Started a fresh context: the {what} stay stored (searchable with "
        "history_search) but are no longer sent to the model. An operator can undo this with "
        f"`gatehouse sessions uncompact {session_key}`.{_carried_over(seqs)}"
    )


def _answered_first(count: int) -> str:
    """How `/new` names the messages sent before it that the previous turn answered."""
    if not count:
        return ""
    if count == 1:
        return "Your message sent before /new was answered first, in the earlier context. "
    return f"Your {count:,} messages sent before /new were answered first, in the earlier context. "


def _carried_over(seqs: list[int]) -> str:
    """How `/new` names the messages sent before it that this turn answers after it."""
    if not seqs:
        return ""
    if len(seqs) == 1:
        return " Your message sent just before /new is answered in the fresh context."
    return f" Your {len(seqs):,} messages sent just before /new are answered in the fresh context."
