"""Messages that arrive while a turn runs: the queue modes (``queue_mode`` under ``[gateway]``,
overridden per channel under ``[channels.<name>]``).

Every inbound message is stored before any turn sees it (`Gateway.handle_inbound`), and a
session runs one turn at a time (gateway/inbound/lanes.py). The modes differ only in which turn
answers a message that arrived while another one ran:

``collect`` (the default)
    The lane runs one more turn after the running one; it claims everything that arrived
    meanwhile and answers it in one reply.
``followup``
    A turn claims one new message (`gateway.store.turns.one_turns_worth`) and says when more
    wait, so the lane runs turns until none is left: each message answered in order, one turn
    and one reply each.
``steer``
    Before each model call the running turn takes in what arrived (`Store.claim_arrivals`):
    the messages are placed after its latest tool results, so the model sees them as user
    messages before its next call, and the turn's reply answers them too (marked handled with
    it). A message that arrives during the turn's last model call has no boundary left: the
    next turn answers it, as with ``collect``.
``interrupt``
    An arrival stops the running turn: a model call in flight is cancelled (its stream closed);
    in a tool round, the tool already running finishes and the calls not started yet get a
    "not run" result, so the stored round stays whole. A compaction or memory flush in flight
    finishes first. The turn then ends with what the model had written so far (it streams for
    that), stored with status ``interrupted`` and sent with a note saying so; the next turn
    answers the new message. The model sees the cut reply in its history.

Commands (a message starting with ``/``) never steer or interrupt: they wait for a turn of their
own, and so does everything that arrived after them; what arrived after a `/new` does not
interrupt either (it belongs behind the boundary, and must not cut short the answer to what
was sent before the `/new`). Unmentioned group messages (kept as
context) never do either; they join the turn of the message after them.

In one process a turn learns of an arrival at once (`Arrivals`, told by the gateway). Across
processes (PostgreSQL) the arrival may have been accepted by another process: a ``steer`` turn
then looks in the store at every boundary, and an ``interrupt`` turn also every
`CROSS_PROCESS_POLL_SECONDS` while a model call runs; the other process's lane waits for the
session lock and finds the message answered (steer) or answers it (interrupt, followup).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

from channels.base import OutboundMessage
from channels.commands import parse_command
from gateway.config import Config, QueueMode
from gateway.store import MessageRow, Store
from gateway.turn.compaction import compact_command
from gateway.turn.previews import PreviewStream

T = TypeVar("T")
log = logging.getLogger(__name__)

CROSS_PROCESS_POLL_SECONDS = 1.0
"""PostgreSQL: how often an ``interrupt`` turn's model call looks for a message another process
accepted."""
INTERRUPTED_NOTE = "(interrupted by a newer message)"
NOT_STARTED_NOTE = "(interrupted by a newer message before replying)"
TOOL_NOT_RUN = "Not run: a newer message from the user interrupted this turn."


def queue_mode(config: Config, platform: str) -> QueueMode:
    """The channel's ``queue_mode``, else ``[gateway] queue_mode``."""
    try:
        mode = config.channels.get(platform).queue_mode
    except KeyError:
        mode = None
    return mode or config.gateway.queue_mode


def is_command(content: Any) -> bool:
    """A chat command (``/compact``, ``/status`` …): never steers or interrupts a turn. The
    same test as the runner's (`channels.commands.parse_command`): "/tmp/x is full" is not one."""
    return parse_command(content) is not None


def starts_fresh(row: MessageRow) -> bool:
    """A `/new` (`/reset`): a turn's claim stops before it when others came first, and what
    arrives after it never cuts that turn short."""
    found = parse_command(row.content)
    return found is not None and found[0].name == "new"


def takes_part(row: MessageRow) -> bool:
    """Whether an arrival may steer or interrupt a running turn."""
    return not is_command(row.content)


class Arrivals:
    """Wakes a session's running turn (in this process) when a message for it was accepted."""

    def __init__(self) -> None:
        self._turns: weakref.WeakValueDictionary[str, MidTurn] = weakref.WeakValueDictionary()

    def arrived(self, session_key: str) -> None:
        turn = self._turns.get(session_key)
        if turn is not None:
            turn.wake()

    def watch(self, session_key: str, turn: MidTurn) -> None:
        """`turn` is the session's running turn (until the next one, or until it is gone)."""
        self._turns[session_key] = turn

    def turn(self, session_key: str) -> MidTurn | None:
        """The session's latest turn, while it is alive."""
        return self._turns.get(session_key)


class MidTurn:
    """One turn's handling of the messages that arrive while it runs (``steer`` and
    ``interrupt``; nothing to do in the other modes)."""

    def __init__(
        self, mode: QueueMode, store: Store, session_id: int, *, cross_process: bool = False
    ) -> None:
        self.mode = mode
        self.store = store
        self.session_id = session_id
        self.cross_process = cross_process
        """PostgreSQL: another process may accept this session's messages; look in the store
        at every boundary instead of waiting to be told."""
        self.steered: list[MessageRow] = []
        """Messages this turn took in (``steer``): its reply answers them too."""
        self.interrupted = False
        self.partial = ""
        """What the model call in flight has written so far (``interrupt`` only)."""
        self._wake = asyncio.Event()
        self._look = True  # once at the start: arrivals before the turn could be told
        self._stop_due = False
        self._commands_due = False  # what waited before the turn is the turn's own to claim

    def wake(self) -> None:
        self._wake.set()
        self._commands_due = True

    async def compact_requests(self, rounds: int) -> list[MessageRow]:
        """`/compact` sent while this turn runs, in any queue mode, when it is the first
        message waiting: claimed at a round boundary, so a long tool loop compacts when asked
        rather than after it ends. Other commands wait for a turn of their own. Looked for
        when this process was told of an arrival, or (PostgreSQL: another process may have
        accepted it) at each boundary after the turn's first `rounds`, never before its first
        model call: a turn without tools costs no statement more."""
        if not (self._commands_due or (self.cross_process and rounds > 0)):
            return []
        self._commands_due = False
        waiting = await self.store.arrivals(self.session_id)
        if not waiting or compact_command(waiting[0].content) is None:
            return []
        return await self.store.claim_arrivals(
            self.session_id, lambda r: compact_command(r.content) is not None
        )

    def _due(self) -> bool:
        """Whether to look in the store for arrivals now."""
        return self._look or self._wake.is_set() or self.cross_process

    async def _arrivals(self) -> list[MessageRow]:
        """The arrivals that may steer or stop this turn: no command, and nothing sent after a
        `/new` (it belongs behind the boundary, and must not cut short the answer to what was
        sent before it)."""
        self._look = False
        self._wake.clear()
        waiting = await self.store.arrivals(self.session_id)
        before = itertools.takewhile(lambda r: not starts_fresh(r), waiting)
        return [r for r in before if takes_part(r)]

    async def steer(self) -> list[MessageRow]:
        """At a boundary (before a model call): place what arrived after everything so far and
        return it; the caller adds it to the history the next prompt is built from."""
        if self.mode != "steer" or not self._due() or not await self._arrivals():
            return []
        rows = await self.store.claim_arrivals(self.session_id, takes_part)
        self.steered.extend(rows)
        return rows

    async def stop_due(self) -> bool:
        """``interrupt``: whether a message waits that stops this turn."""
        if self.mode != "interrupt":
            return False
        if not self._stop_due and self._due():
            self._stop_due = bool(await self._arrivals())
        return self._stop_due

    def on_text(self, preview: PreviewStream | None) -> Callable[[str], None] | None:
        """The model call's ``on_text``: the preview's, and with ``interrupt`` one that keeps
        the text so far (so the call streams)."""
        self.partial = ""
        if self.mode != "interrupt":
            return preview.update if preview is not None else None

        def seen(text: str) -> None:
            self.partial = text
            if preview is not None:
                preview.update(text)

        return seen

    async def call(self, work: Awaitable[T]) -> T | None:
        """Run a model call; with ``interrupt``, None once an arrival cancelled it."""
        if self.mode != "interrupt":
            return await work
        task = asyncio.ensure_future(work)
        watch = asyncio.create_task(self._watch())
        try:
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done() and watch.exception() is not None:
                # Looking in the store failed: never stop a turn over that, let the call run.
                log.warning("could not look for new messages: %s", watch.exception())
                await asyncio.wait({task})
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
        except BaseException:  # the turn itself is cancelled (shutdown)
            task.cancel()
            watch.cancel()
            raise
        watch.cancel()
        if not task.cancelled() and task.exception() is None:
            self.partial = ""
            return task.result()  # done first (or as it was stopped): the answer stands
        if not self._stop_due:
            return task.result()  # the call failed on its own: raise its error
        return None

    async def _watch(self) -> None:
        """Return once a message that stops this turn has arrived."""
        while not await self.stop_due():
            if self.cross_process:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CROSS_PROCESS_POLL_SECONDS):
                        await self._wake.wait()
            else:
                await self._wake.wait()

    def interrupt(self) -> str:
        """End the turn here: the reply to store and send (the text so far and a note)."""
        self.interrupted = True
        said = self.partial.strip()
        return f"{said} …\n\n{INTERRUPTED_NOTE}" if said else NOT_STARTED_NOTE

    def addressed(self, reply: OutboundMessage) -> OutboundMessage:
        """The reply, also answering the messages this turn took in (and replying to the
        newest of them)."""
        ids = tuple(r.platform_message_id for r in self.steered if r.platform_message_id)
        if not ids:
            return reply
        answers = tuple(dict.fromkeys((*reply.answers, *ids)))
        return replace(reply, answers=answers, reply_to=ids[-1])
