"""What a turn tells the chat besides its reply: compaction progress and a reply cut short.

A compaction can take minutes with a small local model; the person waiting sees "compacting
earlier messages…" when it starts and one line with what was kept when it ends
(``[context] notify_compaction``, on by default). The notices are sent to the chat at once,
outside the outbox: they are progress, not part of the conversation (neither stored nor sent
to the model), and one lost in a crash is not sent again. A notice answers no message (no
`answers`, no `reply_to`), so a request/response channel (webchat, console) keeps waiting for
the reply and hands the notices to its caller beside it (`channels.base.ReplyWaiters`).

A reply the model stopped at the output cap (``finish_reason == "length"``) says so, and how to
get the rest, instead of ending mid-sentence.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from channels.base import OutboundMessage
from context.compaction import CompactionResult
from context.types import Message
from gateway.turn.outbox import Deliver

log = logging.getLogger(__name__)

COMPACTING = "Compacting earlier messages…"
CUT_NOTICE = "\n\n[reply cut at the output limit — say “continue” for the rest]"
_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+\S", re.MULTILINE)


def with_cut_notice(text: str, finish_reason: str | None) -> str:
    """`text`, with the cut notice when the model stopped at its output limit."""
    return text + CUT_NOTICE if finish_reason == "length" and text else text


def compacted_line(result: CompactionResult | None, messages: int) -> str:
    """One line on what a compaction of `messages` stored messages kept (or why it did not)."""
    if result is None:
        return "Nothing was compacted; the conversation stays as it is."
    if not result.committed:
        why = result.notes[-1] if result.notes else "no summary could fit"
        why = why.removesuffix("; history kept, not compacted")
        return f"Not compacted ({why}); nothing was lost, the conversation stays as it is."
    kept = [
        _count(result.summary, "Decisions", "decision"),
        _count(result.summary, "Open TODOs", "TODO"),
        f"{len(result.identifiers):,} identifier{'s' if len(result.identifiers) != 1 else ''}",
    ]
    q = result.quality
    if q.passed:
        quality = "quality ok"
    else:
        quality = f"quality: {len(q.problems)} problem{'s' if len(q.problems) != 1 else ''}"
    if result.fallback:
        quality += f", {result.fallback} fallback"
    plural = "s" if messages != 1 else ""
    return (
        f"Compacted {messages:,} message{plural} into a summary ({', '.join(kept)} kept; "
        f"{quality}); {result.tokens_before:,} → {result.tokens_after:,} tokens."
    )


def _count(summary: str, heading: str, noun: str) -> str:
    """'3 decisions': the list items under the summary's `## heading` section."""
    section = re.search(rf"^##\s*{re.escape(heading)}[^\n]*\n(.*?)(?=^##\s|\Z)", summary,
                        re.MULTILINE | re.DOTALL | re.IGNORECASE)
    n = len(_BULLET.findall(section[1])) if section else 0
    return f"{n} {noun}{'s' if n != 1 else ''}"


def covered(messages: Sequence[Message], result: CompactionResult | None) -> int:
    """How many of `messages` the compaction's summary now stands for."""
    if result is None or result.last_seq is None:
        return 0
    first = result.first_seq or 0
    return sum(1 for m in messages if m.seq is not None and first <= m.seq <= result.last_seq)


@dataclass(eq=False)
class TurnNotices:
    """The notices of one turn, sent to the chat its reply goes to."""

    deliver: Deliver
    target: OutboundMessage
    """The turn's reply (its chat and thread); a notice answers no message of it."""
    compactions: int = 0
    """Compactions this turn has announced: a long tool loop may compact many times, and only
    its first compaction is told to the chat (the others are logged)."""

    async def say(self, text: str) -> None:
        notice = replace(self.target, text=text, reply_to=None, answers=(), preview_id=None)
        try:
            delivery = await self.deliver(notice)
        except Exception as exc:  # progress is cosmetic: never fail the turn over it
            log.warning("notice to %s not sent: %s", self.target.session_key, exc)
            return
        if not delivery.sent:
            log.info("notice to %s not sent: %s", self.target.session_key, delivery.error)

    async def compacting(self) -> None:
        self.compactions += 1
        if self.compactions == 1:
            await self.say(COMPACTING)

    async def compacted(
        self, reason: str, result: CompactionResult | None, messages: Sequence[Message]
    ) -> None:
        """The line after a compaction; `/compact` answers with its own reply instead."""
        if reason != "command" and self.compactions <= 1:
            await self.say(compacted_line(result, covered(messages, result)))
