"""Compaction, reset and undo of a session's prompt, and the memory flush that precedes them.

Compaction never deletes: it stores a summary and the seq range it covers, and the prompt
becomes "latest summary + messages after that range". A reset is the same kind of row with an
empty summary; undoing either brings the messages back. What leaves the prompt is archived, so
`history_search` still finds it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from context.compaction import CompactionResult, SummaryCall
from context.engine import ContextEngine, ContextPlan, TurnContext
from context.pruning import artifact_path
from context.salience import RankedIdentifier
from context.types import Identifier, Message
from gateway.config import Config
from gateway.model.llm import LLMProvider
from gateway.store import CompactionRow, SessionRow, Store
from gateway.tools.memory import MemoryFlush
from gateway.turn.archive import Archive, archive_entries
from gateway.turn.history import PINNED_KEY, RESET_REASON, HistoryCache, is_reset
from gateway.turn.notices import TurnNotices
from gateway.turn.prompt import TurnPrompts

log = logging.getLogger(__name__)

OnCompaction = Callable[[str, CompactionResult | None], None]
"""Told of each compaction attempt's reason and result (None: it crashed)."""
LATEST = 1 << 62
"""A first seq past every stored message: the whole history counts as before the turn."""


@dataclass(eq=False)
class Compactor:
    """Runs compactions, resets and undos for the runner; the caller holds the session's lane."""

    config: Config
    store: Store
    engine: ContextEngine
    llm: LLMProvider
    summarize: SummaryCall
    histories: HistoryCache
    prompts: TurnPrompts
    flush: MemoryFlush | None = None
    archive: Archive | None = None
    on_compaction: OnCompaction | None = None
    notices: dict[str, TurnNotices] = field(default_factory=dict)
    """By session key: the chat to tell when a compaction starts and what it kept, set by the
    runner for the turn in progress (`[context] notify_compaction`); none for idle and CLI ones."""

    async def blocked(self, session_key: str) -> str | None:
        """Why automatic compaction may not run now (anti-thrash), or None."""
        session = await self.store.get_session(session_key)
        if session is None:
            return "no session"
        return compaction_blocked_reason(session, self.config.context.max_ineffective_compactions)

    async def automatic(self, session_key: str, turn: TurnContext) -> CompactionResult | None:
        """The compaction a turn's prompt asks for when it crosses the trigger (before any of
        its model calls). Skipped while paused after ineffective compactions; during the
        cool-down after a failed summary it runs on the extractive summary alone, without
        calling the summarizer again, so a long tool loop keeps compacting (and archiving)
        whatever the summarizer does."""
        session = await self.store.get_session(session_key)
        if session is None:
            return None
        paused = compaction_paused_reason(
            session, self.config.context.max_ineffective_compactions
        )
        if paused is not None:
            log.info("context %s: automatic compaction skipped: %s", session_key, paused)
            return None
        cooling = cooldown_reason(session)
        summarize = self.summarize if cooling is None else summarizer_unavailable(cooling)
        return await self.compact(session_key, turn, "", reason="overflow", summarize=summarize)

    async def archive_left_out(self, session_key: str, messages: Sequence[Message]) -> None:
        """Archive stored messages a prompt left out or sent pruned without a compaction (a
        cut at rounds or turns, cleared tool results), so `history_search` finds them."""
        if messages:
            last = max(m.seq or 0 for m in messages)
            await self._archive_covered(session_key, messages, last)

    async def flush_if_due(self, session_key: str, plan: ContextPlan) -> None:
        """The silent memory flush, once per compaction cycle, before compaction can run."""
        if self.flush is None:
            return
        session = await self.store.get_session(session_key)
        if session is None or not self.flush.due(session):
            return
        await self.flush.run(session, plan.messages)

    async def compact_session(
        self, session_key: str, instructions: str = "", reason: str = "manual"
    ) -> CompactionResult | None:
        """Compact a session now (`/compact`, `gatehouse sessions compact`, idle compaction)."""
        session = await self.store.get_session(session_key)
        if session is None or session.id is None:
            return None
        settings = self.prompts.settings_for(session, None)
        view = await self.histories.view(session.id)
        turn = self.prompts.turn_context(session_key, view, LATEST, settings)
        return await self.compact(
            session_key, turn, instructions, reason=reason, flush=self.engine.assemble(turn)
        )

    async def compact(
        self, session_key: str, turn: TurnContext, instructions: str, *, reason: str,
        summarize: SummaryCall | None = None, flush: ContextPlan | None = None,
    ) -> CompactionResult | None:
        """Compact `turn`'s history and store the summary; a failure starts a cool-down.
        `summarize`: instead of the configured summarizer (the extractive-only one). `flush`:
        the prompt the memory flush sees, run (when due) once the summary is ready and before
        it is stored — never for a compaction that is refused or finds nothing to do."""
        session = await self.store.get_session(session_key)
        assert session is not None and session.id is not None
        started = time.perf_counter()
        notices = self.notices.get(session_key)
        if notices is not None:
            await notices.compacting()
        try:
            result = await self.engine.compact(turn, summarize or self.summarize, instructions)
        except Exception:
            log.exception("compaction crashed for %s; history kept", session_key)
            await self.store.set_compaction_state(session.id, cooldown_until=self._cooldown())
            if self.on_compaction is not None:
                self.on_compaction(reason, None)
            if notices is not None:
                await notices.compacted(reason, None, ())
            return None
        if notices is not None:
            await notices.compacted(reason, result, [*turn.history, *turn.incoming])
        if result is None:
            return None
        if self.on_compaction is not None:
            self.on_compaction(reason, result)
        for note in result.notes:
            log.info("compaction %s: %s", session_key, note)
        if not result.committed:
            log.warning("compaction %s: nothing committed; history kept (%s)", session_key,
                        "; ".join(result.notes))
            await self.store.set_compaction_state(session.id, cooldown_until=self._cooldown())
            return result
        if flush is not None:
            await self.flush_if_due(session_key, flush)
        threshold = None
        if turn.settings is not None:
            threshold = self.engine.compaction_threshold(turn.settings)
        ineffective = (
            threshold is not None and reason == "overflow" and result.tokens_after > threshold
        )
        quality: dict[str, Any] = result.quality.to_dict()
        quality.update(
            reason=reason,
            attempts=result.attempts,
            errors=list(result.errors),
            notes=list(result.notes),
            model_identifier_retention=result.model_identifier_retention,
            # The identifiers the summary lists; all of them are in the archive (by seq).
            identifiers=[i.value for i in result.identifiers if i.value in result.summary],
            identifiers_archived=len(result.identifiers) - result.identifiers_in_summary,
            seconds=round(time.perf_counter() - started, 3),
        )
        if result.pinned_seqs:
            quality[PINNED_KEY] = list(result.pinned_seqs)
        row = CompactionRow(
            session_id=session.id,
            first_seq=result.first_seq or 0,
            last_seq=result.last_seq or 0,
            summary=result.summary,
            tokens_before=result.tokens_before,
            tokens_after=result.tokens_after,
            quality=quality,
            model=self.config.context.summary_model or self.llm.model,
        )
        await self.store.add_compaction(
            row,
            ineffective=ineffective if reason == "overflow" else False,
            cooldown_until=self._cooldown() if result.fallback else None,
        )
        self.histories.forget(session.id)
        if result.last_seq is not None:
            await self._archive_covered(
                session_key, [*turn.history, *turn.incoming], result.last_seq,
                result.ranked_identifiers,
            )
        log.info(
            "compaction %s (%s): seq %s-%s, %d -> %d tokens, fallback=%s, quality passed=%s",
            session_key, reason, row.first_seq, row.last_seq, row.tokens_before,
            row.tokens_after, result.fallback, result.quality.passed,
        )
        return result

    async def reset_session(
        self, session_key: str, why: str, *, flush: bool = True, through: int | None = None
    ) -> CompactionRow | None:
        """Start a fresh context: later turns see neither the messages so far nor any summary.

        Nothing is deleted. The boundary is a compaction-like row (reason "reset", empty for the
        prompt) covering every message so far, so `sessions show --all` still shows them,
        `memory_search` finds them (archived transcript) and `sessions uncompact` undoes the
        reset. With `flush`, the silent memory flush runs first, as before a compaction.
        Returns None when there is nothing to reset or a turn's messages are still unanswered.
        With `through` (a turn's `/new`: the caller holds the lane mid-turn), the boundary ends
        at that seq, whatever else the turn holds: the turn's later messages stay after it.
        """
        session = await self.store.get_session(session_key)
        if session is None or session.id is None:
            return None
        if through is None and await self.store.has_pending(session.id):
            log.info("not resetting %s: it has unanswered messages", session_key)
            return None
        latest = await self.store.latest_compaction(session.id)
        last_seq = session.next_seq - 1 if through is None else through
        if last_seq < 1 or (latest is not None and is_reset(latest) and latest.last_seq >= last_seq):
            return None  # nothing said since the last reset
        view = await self.histories.view(session.id)
        if flush and self.flush is not None and self.flush.due(session):
            settings = self.prompts.settings_for(session, None)
            plan = self.engine.assemble(
                self.prompts.turn_context(session_key, view, LATEST, settings)
            )
            await self.flush.run(session, plan.messages)
        first_seq = min((latest.last_seq + 1) if latest else 1, last_seq)
        row = CompactionRow(
            session_id=session.id,
            first_seq=first_seq,
            last_seq=last_seq,
            summary=(
                f"[Session reset: {why}. Messages up to seq {last_seq} stay stored but are no "
                "longer sent to the model.]"
            ),
            tokens_before=sum(m.tokens or 0 for m in view.history if (m.seq or 0) <= last_seq),
            tokens_after=0,
            quality={"reason": RESET_REASON, "why": why},
            model=None,
        )
        await self.store.add_compaction(row, ineffective=False)
        self.histories.forget(session.id)
        await self._archive_covered(session_key, view.history, last_seq)
        log.info("session %s reset (%s): seq %d-%d out of the prompt", session_key, why,
                 first_seq, last_seq)
        return row

    async def uncompact(self, session_key: str) -> CompactionRow | None:
        """Undo the latest compaction or reset: its messages are sent again."""
        session = await self.store.get_session(session_key)
        if session is None or session.id is None:
            return None
        undone = await self.store.undo_latest_compaction(session.id)
        self.histories.forget(session.id)
        return undone

    def _cooldown(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self.config.context.compaction_cooldown_seconds)

    async def _archive_covered(
        self,
        session_key: str,
        messages: Sequence[Message],
        last_seq: int,
        ranked: Sequence[RankedIdentifier] = (),
    ) -> None:
        """Archive the messages leaving the prompt, one by one, with their identifiers, so
        `history_search` finds each of them again (and memory_search, in this session)."""
        if self.archive is None:
            return
        covered = [m for m in messages if m.seq is not None and m.seq <= last_seq]
        if not covered:
            return
        patterns = tuple(self.config.context.identifier_patterns)

        def identifiers(text: str) -> list[Identifier]:
            return self.engine.identifiers(text, patterns)

        try:
            archived, found = await asyncio.to_thread(
                archive_entries, covered, last_seq, ranked, identifiers, self._artifact_text
            )
            await self.archive(session_key, archived, found)
        except Exception:
            log.exception("could not archive the compacted messages of %s", session_key)


    def _artifact_text(self, message: Message) -> str | None:
        """The whole output a capped tool result names (its artifact), up to
        `ARTIFACT_ARCHIVE_CHARS`; None when it names none or the file is gone."""
        relative = artifact_path(message.text)
        if relative is None:
            return None
        root = (self.config.workspace / "artifacts").resolve()
        path = (self.config.workspace / relative).resolve()
        if not path.is_relative_to(root):
            return None
        try:
            with path.open(encoding="utf-8", errors="replace") as f:
                return f.read(ARTIFACT_ARCHIVE_CHARS)
        except OSError:
            return None


ARTIFACT_ARCHIVE_CHARS = 2_000_000
"""The most of one tool output's artifact the archive keeps (searchable by history_search)."""


def compaction_blocked_reason(session: SessionRow, max_ineffective: int) -> str | None:
    """Anti-thrash: a cool-down after a failed summary; a stop after ineffective compactions."""
    return cooldown_reason(session) or compaction_paused_reason(session, max_ineffective)


def automatic_compaction_state(session: SessionRow, max_ineffective: int) -> str:
    """What a turn that crosses the trigger does now, for `explain` and `/status`."""
    paused = compaction_paused_reason(session, max_ineffective)
    if paused is not None:
        return paused
    cooling = cooldown_reason(session)
    if cooling is not None:
        return f"on the extractive summary alone (the summarizer is {cooling})"
    return "allowed"


def cooldown_reason(session: SessionRow) -> str | None:
    """Why the summarizer is not asked now (a cool-down after a failed summary), or None."""
    until = session.compaction_cooldown_until
    if until is not None:
        if until.tzinfo is None:
            until = until.replace(tzinfo=UTC)
        if until > datetime.now(UTC):
            return f"cooling down after a failed summary until {until:%H:%M:%S} UTC"
    return None


def compaction_paused_reason(session: SessionRow, max_ineffective: int) -> str | None:
    """Why automatic compaction is paused (ineffective ones in a row), or None."""
    if session.ineffective_compactions >= max_ineffective:
        return (
            f"{session.ineffective_compactions} automatic compactions in a row did not get "
            "under the threshold; automatic compaction is paused (use /compact or "
            "`gatehouse sessions compact`)"
        )
    return None


def summarizer_unavailable(why: str) -> SummaryCall:
    """A summarizer that is not asked (`why`): compaction uses its extractive summary."""

    async def unavailable(prompt: list[Message]) -> str:
        raise SummarizerUnavailableError(why)

    return unavailable


class SummarizerUnavailableError(RuntimeError):
    """The summarizer is not asked now; compaction says why and uses the extractive summary."""


def describe_compaction(result: CompactionResult | None) -> str:
    """What the user is told after `/compact`, and the operator after `sessions compact`."""
    if result is None:
        return "Nothing to compact yet: the conversation is within the recent turns kept verbatim."
    if not result.committed:
        why = result.notes[-1] if result.notes else "no summary could fit"
        why = why.removesuffix("; history kept, not compacted")
        return f"Not compacted: {why}. Nothing was lost: the conversation stays as it is."
    q = result.quality
    extra = f" (fallback: {result.fallback})" if result.fallback else ""
    archived = len(result.identifiers) - result.identifiers_in_summary
    where = (
        f"{result.identifiers_in_summary:,} identifiers in the summary, {archived:,} more "
        "archived for history_search"
        if archived
        else f"{len(result.identifiers):,} identifiers kept"
    )
    return (
        f"Compacted the conversation: {result.tokens_before:,} → {result.tokens_after:,} tokens, "
        f"{where}{extra}. Quality: sections {len(q.sections_present)}/5."
    )


def compact_command(content: Any) -> str | None:
    """`/compact [instructions]` -> the instructions ('' when none); None for other text."""
    if not isinstance(content, str):
        return None
    text = content.strip()
    if text == "/compact" or text.startswith(("/compact ", "/compact\n")):
        return text[len("/compact") :].strip()
    return None
