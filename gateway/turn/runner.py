"""One turn: load the session, assemble the prompt, compact if needed, call the model, run
tools, persist, reply.

The runner owns every side effect of a turn; the context engine only plans. Each tool round is
persisted as soon as it completes (the call and its results together, never one without the
other), so a crash or shutdown mid-turn loses nothing and the turn resumes where it stopped.
Compaction never deletes: it stores a summary and the seq range it covers, and the prompt
becomes "latest summary + messages after that range".
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from channels.base import OutboundMessage
from context.compaction import (
    ARCHIVE_TOOL,
    CompactionResult,
    CompactionSettings,
    SummaryCall,
)
from context.engine import ContextEngine, ContextPlan, ContextSettings, TurnContext
from context.failures import tool_failure
from context.identifiers import extract_identifiers
from context.pruning import cap_tool_output, tool_result_cap_chars
from context.secrets import redact_secrets
from context.types import Message
from context.window import WindowTooSmallError
from gateway.config import Config
from gateway.model.llm import ContextOverflowError, LLMError, LLMProvider
from gateway.model.sizing import ContextResolver, Conversation
from gateway.store import (
    CompactionRow,
    HistoryRead,
    MessageRow,
    SessionRow,
    Store,
    TurnRecordRow,
    TurnUsage,
    row_to_message,
)
from gateway.store.hot import build
from gateway.tools.memory import MemoryFlush
from gateway.tools.registry import ToolContext, ToolRegistry
from gateway.turn.outbox import Deliver, DeliveryLog
from gateway.turn.previews import PreviewStream
from memory.agents_md import AgentsFile
from memory.index import ArchivedMessage

log = logging.getLogger(__name__)

Typing = Callable[[str, str, str | None], Awaitable[None]]
Archive = Callable[
    [str, Sequence[ArchivedMessage], Sequence[tuple[str, str, Sequence[int]]]], Awaitable[None]
]
"""(session key, the messages leaving the prompt with secrets redacted, their identifiers as
(value, kind, seqs)): keeps every compacted message one lookup away (`history_search`)."""
TYPING_REFRESH_SECONDS = 5.0
HISTORY_HINT = (
    f"Earlier messages of this conversation are archived, not deleted: call {ARCHIVE_TOOL} with "
    "an exact identifier (an id, path, URL, host) or a few words to read them, with their seq "
    "and time. The summary lists the most salient identifiers and says how many more are "
    "archived."
)

ERROR_STATUS = "error"
COMMAND_STATUS = "command"
INTERRUPTED_STATUS = "interrupted"
HIDDEN_STATUSES = (ERROR_STATUS, COMMAND_STATUS)
"""Stored but never sent to the model: error notices and `/compact` commands."""


class TurnRefusedError(LLMError):
    """The turn cannot be sent at all (window below the floor, a message larger than it)."""

    def __init__(self, user_message: str) -> None:
        super().__init__(user_message, kind="refused")


@dataclass
class TurnStats:
    session_key: str
    messages_in: int
    tool_rounds: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    seconds: float = 0.0
    error: str | None = None
    compactions: list[CompactionResult] = field(default_factory=list)
    # {message id: tokens} counted this turn, stored with the turn's result (no extra write).
    token_counts: dict[int, int] = field(default_factory=dict)
    platform: str = ""
    local_prompt_tokens: int | None = None
    """The gateway's own count of the last prompt sent (the provider's is `prompt_tokens`)."""
    window: int | None = None
    compact_at: int | None = None
    flush_at: int | None = None

    def record(self) -> TurnRecordRow:
        """The stored form of these stats (the admin UI's token-pressure chart).

        Built without validation (our own typed values): validating cost ~0.5 ms a turn."""
        return build(
            TurnRecordRow,
            dict(
                session_id=0,  # set by the store
                prompt_tokens=self.prompt_tokens,
                local_prompt_tokens=self.local_prompt_tokens,
                completion_tokens=self.completion_tokens,
                window=self.window,
                compact_at=self.compact_at,
                flush_at=self.flush_at,
                seconds=round(self.seconds, 3),
                tool_rounds=self.tool_rounds,
                compactions=len([c for c in self.compactions if c.committed]),
                error=self.error,
            ),
        )


@dataclass
class _Cached:
    after_seq: int
    messages: list[Message]


@dataclass
class SessionView:
    """What the prompt is built from: the latest summary and the messages after its range."""

    summary: CompactionRow | None
    history: list[Message]


class Runner:
    def __init__(
        self,
        config: Config,
        store: Store,
        engine: ContextEngine,
        llm: LLMProvider,
        tools: ToolRegistry,
        deliver: Deliver,
        resolver: ContextResolver,
        summarize: SummaryCall,
        flush: MemoryFlush | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.engine = engine
        self.llm = llm
        self.tools = tools
        self.deliver = deliver
        self.resolver = resolver
        self.summarize = summarize
        self.flush = flush
        self.typing: Typing | None = None
        self.archive: Archive | None = None
        self.previews: Callable[[OutboundMessage], PreviewStream | None] | None = None
        """Opens a streamed preview for a reply, when its channel has one (gateway/turn/previews.py)."""
        self.delivery: DeliveryLog | None = None
        self.agents = AgentsFile(config.workspace / "AGENTS.md")
        self.on_turn: Callable[[TurnStats], None] | None = None
        self.on_compaction: Callable[[str, CompactionResult | None], None] | None = None
        """Told of each compaction attempt's reason and result (None: it crashed)."""
        self.last_plan: dict[str, ContextPlan] = {}
        self.history_cache_sessions = 256
        self._histories: dict[int, _Cached] = {}
        self._specs_cache: (
            tuple[tuple[str, ...], list[dict[str, Any]], int, list[dict[str, Any]]] | None
        ) = None
        self._compaction_settings: tuple[tuple[int, str], CompactionSettings] | None = None

    # -- a turn -----------------------------------------------------------------------------

    async def run_turn(self, session_key: str) -> None:
        # The claim reads the turn's history too (one transaction fewer): see `view`.
        session, claimed, read = await self.store.claim_turn(
            session_key, self._group_buffer, self._known
        )
        if session is None or session.id is None or not claimed:
            return
        started = time.perf_counter()
        stats = TurnStats(session_key, len(claimed), platform=session.platform)
        status: str | None = None
        last = claimed[-1]
        outbound = OutboundMessage(
            platform=last.platform or session.platform,
            chat_id=last.chat_id or session.chat_id,
            thread_id=session.thread_id,
            text="",
            session_key=session_key,
            reply_to=last.platform_message_id,
            answers=tuple(r.platform_message_id for r in claimed if r.platform_message_id),
        )
        preview = self.previews(outbound) if self.previews is not None else None
        stop_typing = self._typing_later(outbound.platform, outbound.chat_id, outbound.thread_id)
        try:
            reply = await self._converse(session, claimed, stats, preview, read)
        except asyncio.CancelledError:
            if preview is not None:
                preview.abort()
            await asyncio.shield(
                self.store.mark_interrupted([r.id for r in claimed if r.id is not None])
            )
            log.warning("turn interrupted for %s; it resumes on restart", session_key)
            raise
        except LLMError as exc:
            log.warning("turn failed for %s: %s", session_key, exc)
            stats.error = str(exc)
            reply = exc.user_message
            status = ERROR_STATUS
        finally:
            stop_typing()
            if preview is not None:
                preview.close()
        reply_message = Message(role="assistant", content=reply)
        reply_message = reply_message.with_tokens(
            self.resolver.counter.count_message(reply_message)
        )
        stats.seconds = time.perf_counter() - started
        # The preview's id (once an edit in flight has landed) is stored with the reply, so a
        # reply sent after a crash still replaces its preview instead of appearing beside it.
        preview_id = await preview.finish() if preview is not None else None
        final = replace(outbound, text=reply, preview_id=preview_id)
        # The reply enters the outbox with the turn's commit and leaves it once sent: a crash in
        # between never loses it (`Gateway.start` sends what is left; see gateway/turn/outbox.py).
        outbox_id = await self.store.finish_turn(
            session.id,
            reply_message,
            (r.id for r in claimed if r.id is not None),
            TurnUsage(stats.prompt_tokens, stats.completion_tokens),
            reply_status=status,
            error=stats.error,
            token_ratio=_calibrated_ratio(self.resolver, session_key),
            token_counts=stats.token_counts,
            record=stats.record(),
            outbound=final,
        )
        if self.on_turn is not None:
            self.on_turn(stats)
        if outbox_id is not None and self.delivery is not None:
            await self.delivery.send(outbox_id, final)
        elif (await self.deliver(final)).sent and outbox_id is not None:
            await self.store.forget_outbox([outbox_id])

    async def _converse(
        self,
        session: SessionRow,
        claimed: list[MessageRow],
        stats: TurnStats,
        preview: PreviewStream | None = None,
        read: HistoryRead | None = None,
    ) -> str:
        assert session.id is not None
        session_key = session.key
        commands = [r for r in claimed if _compact_command(r.content) is not None]
        notices: list[str] = []
        if commands:
            await self.store.mark_status([r.id for r in commands if r.id is not None], COMMAND_STATUS)
            instructions = _compact_command(commands[-1].content) or ""
            result = await self.compact_session(session_key, instructions, reason="command")
            notices.append(describe_compaction(result))
            claimed = [r for r in claimed if r not in commands]
            if not claimed:
                return notices[0]
            read = None  # the compaction moved the summary
        text = await self._answer(session, claimed, stats, preview, read)
        return "\n\n".join([*notices, text])

    async def _answer(
        self,
        session: SessionRow,
        claimed: list[MessageRow],
        stats: TurnStats,
        preview: PreviewStream | None = None,
        read: HistoryRead | None = None,
    ) -> str:
        assert session.id is not None
        session_key = session.key
        first_seq = claimed[0].seq or 0
        ctx = ToolContext(
            session_key=session_key,
            timezone=self.config.gateway.timezone,
            platform=claimed[-1].platform or session.platform,
            chat_id=claimed[-1].chat_id or session.chat_id,
            thread_id=session.thread_id,
            chat_type=session.chat_type,
            account=session.account,
        )
        tool_specs = self._tool_specs()[0]
        settings = self.settings_for(session, claimed[-1].sender_id)
        if settings.window.too_small:
            raise TurnRefusedError(
                str(WindowTooSmallError(settings.window.tokens, self.llm.model, settings.window.source))
            )
        view = await self.view(session.id, read=read)
        overflow_retries = 0
        compacted_this_turn = False
        for _round in range(self.config.llm.max_tool_rounds):
            turn = self.turn_context(session_key, view, first_seq, settings)
            plan = self.engine.assemble(turn)
            if plan.facts.get("to_flush", 1) <= 0 or plan.wants_compaction:
                await self._flush_if_due(session_key, plan)
            if plan.wants_compaction and not compacted_this_turn:
                blocked = await self._compaction_blocked(session_key)
                if blocked is None:
                    compacted_this_turn = True
                    result = await self._compact(session_key, turn, "", reason="overflow")
                    if result is not None:
                        stats.compactions.append(result)
                    view = await self.view(session.id)
                    turn = self.turn_context(session_key, view, first_seq, settings)
                    plan = self.engine.assemble(turn)
                else:
                    log.info("context %s: automatic compaction skipped: %s", session_key, blocked)
            stats.token_counts.update(self._remember_counts(session.id, plan.counted))
            if log.isEnabledFor(logging.DEBUG):
                log.debug("context %s: %s", session_key, _facts_line(plan))
            for note in plan.notes:
                log.info("context %s: %s", session_key, note)
            if plan.error:
                raise TurnRefusedError(plan.error)
            self.last_plan[session_key] = plan
            _note_pressure(stats, plan)
            try:
                completion = await self.llm.complete(
                    plan.messages,
                    tool_specs if view.summary is not None else self._tool_specs()[2],
                    on_text=preview.update if preview else None,
                )
                if turn.refresh and view.summary is not None and view.summary.id is not None:
                    await self.store.mark_refreshed(view.summary.id)
                    view.summary.refreshed = True
            except ContextOverflowError as exc:
                overflow_retries += 1
                if overflow_retries > self.config.context.overflow_retries:
                    raise self._overflow_error(plan, settings, exc) from exc
                log.warning(
                    "context %s: provider says the prompt overflows (%s); compacting "
                    "(attempt %d of %d)",
                    session_key, exc.detail, overflow_retries, self.config.context.overflow_retries,
                )
                await self._flush_if_due(session_key, plan)
                result = await self._compact(session_key, turn, "", reason="provider-overflow")
                if result is None or not result.committed:
                    raise self._overflow_error(plan, settings, exc) from exc
                stats.compactions.append(result)
                view = await self.view(session.id)
                continue
            stats.prompt_tokens = completion.usage.prompt_tokens
            stats.completion_tokens = (stats.completion_tokens or 0) + (
                completion.usage.completion_tokens or 0
            )
            sent = plan.facts.get("tokens", {}).get("sent_local")
            if completion.usage.prompt_tokens and sent:
                self.resolver.calibration(session_key).observe(
                    int(sent), completion.usage.prompt_tokens
                )
            message = completion.message
            if not message.tool_calls:
                return message.text.strip() or "(The model returned an empty reply.)"
            stats.tool_rounds += 1
            round_messages = [message]
            for call in message.tool_calls:
                tool_result = await self.tools.call(call.name, call.arguments, ctx)
                content = await self._cap_tool_output(
                    tool_result.content, call.name, call.id, settings.window.tokens
                )
                round_messages.append(
                    Message(
                        role="tool",
                        content=content,
                        tool_call_id=call.id,
                        name=call.name,
                        meta={"tool_error": tool_result.is_error},
                    )
                )
            round_messages = self.resolver.counter.ensure_counted(round_messages)
            rows = await self.store.append_messages(session.id, round_messages)
            cached = self._histories.get(session.id)
            if cached is not None:
                cached.messages.extend(row_to_message(r) for r in rows)
        return (
            f"I stopped after {self.config.llm.max_tool_rounds} rounds of tool calls without "
            "finishing. Ask me to continue, or raise [llm] max_tool_rounds."
        )

    def turn_context(
        self, session_key: str, view: SessionView, first_seq: int, settings: ContextSettings
    ) -> TurnContext:
        """History before this turn, and this turn's messages (its tool rounds included)."""
        history = view.history
        split = bisect.bisect_left(history, first_seq, key=lambda m: m.seq or 0)
        summary = view.summary
        after_compaction = self.refresh_block()
        refresh = None
        if summary is not None and not summary.refreshed:
            refresh = after_compaction
        return TurnContext(
            session_key=session_key,
            system_prompt=self.system_prompt(),
            refresh=refresh,
            compaction_refresh=after_compaction,
            history=history[:split],
            incoming=history[split:],
            model=self.llm.model,
            settings=settings,
            summary=view.summary.summary if view.summary else None,
            summary_first_seq=view.summary.first_seq if view.summary else None,
        )

    def _overflow_error(
        self, plan: ContextPlan, settings: ContextSettings, exc: ContextOverflowError
    ) -> LLMError:
        tokens = plan.facts.get("tokens", {}).get("prompt", "?")
        return LLMError(
            f"This conversation no longer fits model {self.llm.model!r}: about {tokens:,} "
            f"tokens against a {settings.window.tokens:,}-token window ({settings.window.source}), "
            f"and compacting did not help after {self.config.context.overflow_retries} tries. "
            "Start a new topic or raise the model's window.",
            kind="context_overflow",
            detail=exc.detail,
        )

    def _typing_later(
        self, platform: str, chat_id: str, thread_id: str | None
    ) -> Callable[[], None]:
        """Show "typing…" once the turn has run `typing_delay_ms`; returns what stops it.

        Not for a reply that is ready sooner: the indicator would only flash, and it costs one
        platform API call per message. A timer, not a task, until then: most turns never need
        one.
        """
        if self.typing is None:
            return _nothing
        loop = asyncio.get_running_loop()
        shown: list[asyncio.Task[None]] = []

        def start() -> None:
            shown.append(loop.create_task(self._keep_typing(platform, chat_id, thread_id)))

        timer = loop.call_later(self.config.gateway.typing_delay_ms / 1000, start)

        def stop() -> None:
            timer.cancel()
            for task in shown:
                task.cancel()

        return stop

    async def _keep_typing(self, platform: str, chat_id: str, thread_id: str | None) -> None:
        """Show "typing…" until cancelled (platforms expire it after ~5 s, so it is renewed)."""
        assert self.typing is not None
        while True:
            try:
                await self.typing(platform, chat_id, thread_id)
            except Exception as exc:  # typing is cosmetic: never fail a turn over it
                log.debug("typing indicator failed on %s: %s", platform, exc)
                return
            await asyncio.sleep(TYPING_REFRESH_SECONDS)

    def _group_buffer(self, session: SessionRow) -> int | None:
        """How many unmentioned group messages the next mention brings along."""
        if session.chat_type == "direct":
            return None
        try:
            return self.config.channels.get(session.platform).group_buffer
        except KeyError:
            return None

    # -- context settings and state ---------------------------------------------------------

    def settings_for(self, session: SessionRow, user_id: str | None) -> ContextSettings:
        where = Conversation(session.platform, session.chat_type, session.chat_id, user_id)
        settings = self.resolver.settings_for(
            session.key,
            where,
            tools_tokens=self._tool_specs()[1],
            stored_ratio=session.token_ratio,
        )
        return replace(settings, compaction=self.compaction_settings(settings.window.tokens))

    def _tool_specs(self) -> tuple[list[dict[str, Any]], int, list[dict[str, Any]]]:
        """The tools' JSON schemas, their token count, and the schemas for a session with
        nothing compacted yet (without the lookup over compacted messages), built once per set
        of tools rather than on every turn. The count is of every tool: a budget that holds
        after a compaction, when the lookup is offered too."""
        names = tuple(self.tools.tools)
        if self._specs_cache is None or self._specs_cache[0] != names:
            specs = self.tools.specs()
            fresh = [s for s in specs if s.get("function", {}).get("name") != ARCHIVE_TOOL]
            self._specs_cache = (names, specs, self.resolver.counter.count_tools(specs), fresh)
        return self._specs_cache[1], self._specs_cache[2], self._specs_cache[3]

    def compaction_settings(self, window: int) -> CompactionSettings:
        rules = self.critical_rules()
        cached = self._compaction_settings
        if cached is not None and cached[0] == (window, rules):
            return cached[1]  # the same every turn until the window or AGENTS.md changes
        c = self.config.context
        made = CompactionSettings(
            window=window,
            recent_turns=c.recent_turns,
            parts=c.compaction_parts,
            identifier_policy=c.identifier_policy,
            custom_patterns=tuple(c.identifier_patterns),
            quality_guard=c.quality_guard,
            quality_retries=c.quality_retries,
            summary_max_chars=c.summary_max_chars,
            critical_rules=rules,
        )
        self._compaction_settings = ((window, rules), made)
        return made

    def tools_tokens(self) -> int:
        """Tokens of every tool schema sent with a call."""
        return self._tool_specs()[1]

    def refresh_block(self) -> str | None:
        """The block the first model call after a compaction carries: AGENTS.md's sections and,
        when the lookup tool is there, how to reach the compacted messages."""
        block = self.agents.refresh_block(self.config.memory.post_compaction_sections)
        if ARCHIVE_TOOL not in self.tools.tools:
            return block
        return f"{block}\n\n{HISTORY_HINT}" if block else HISTORY_HINT

    def critical_rules(self) -> str:
        """AGENTS.md's configured sections (default "Session Startup" and "Red Lines")."""
        return self.agents.sections(self.config.memory.post_compaction_sections, 3_000)

    def system_prompt(self) -> str:
        """The configured system prompt, plus AGENTS.md's red lines on every turn."""
        red_lines = self.agents.red_lines()
        base = self.config.gateway.system_prompt
        return f"{base}\n\n{red_lines}" if red_lines else base

    async def _flush_if_due(self, session_key: str, plan: ContextPlan) -> None:
        """The silent memory flush, once per compaction cycle, before compaction can run."""
        if self.flush is None:
            return
        session = await self.store.get_session(session_key)
        if session is None or not self.flush.due(session):
            return
        await self.flush.run(session, plan.messages)

    async def view(
        self, session_id: int, *, use_cache: bool = True, read: HistoryRead | None = None
    ) -> SessionView:
        """Latest summary + the stored messages after its range (only new rows are loaded).

        Readers outside the session's lane (the admin UI) pass `use_cache=False`: the cache
        belongs to the turn in progress. `read` is what the turn's claim already read (for
        `_known` at that time); used when the cache has not changed since."""
        if not use_cache:
            summary, _after, rows = await self.store.summary_and_history(session_id)
            return SessionView(
                None if is_reset(summary) else summary,
                [m for m in rows if m.meta.get("status") not in HIDDEN_STATUSES],
            )
        known = self._known(session_id)
        cached = self._histories.pop(session_id, None)
        if read is not None and read.known == known:
            summary, after, fresh = read.summary, read.after, read.messages
        else:
            summary, after, fresh = await self.store.summary_and_history(session_id, known)
        if cached is None or cached.after_seq != after:
            cached = _Cached(after, [])
        cached.messages.extend(m for m in fresh if m.meta.get("status") not in HIDDEN_STATUSES)
        self._histories[session_id] = cached  # re-inserted last: most recently used
        while len(self._histories) > self.history_cache_sessions:
            self._histories.pop(next(iter(self._histories)))
        return SessionView(None if is_reset(summary) else summary, cached.messages)

    def _known(self, session_id: int) -> tuple[int, int] | None:
        """What the cached history holds: (the seq it starts after, its last seq)."""
        cached = self._histories.get(session_id)
        if cached is None:
            return None
        last = cached.messages[-1].seq if cached.messages else None
        return (cached.after_seq, last or cached.after_seq)

    def _remember_counts(self, session_id: int, counted: Sequence[Message]) -> dict[int, int]:
        """Update the cached history with fresh counts; return {message id: tokens} to store."""
        cached = self._histories.get(session_id)
        if cached is not None:
            history = cached.messages
            for m in counted:
                if m.seq is None or m.tokens is None:
                    continue
                i = bisect.bisect_left(history, m.seq, key=lambda h: h.seq or 0)
                if i < len(history) and history[i].seq == m.seq and history[i].tokens is None:
                    history[i] = history[i].with_tokens(m.tokens)
        return {
            int(m.meta["id"]): m.tokens
            for m in counted
            if m.meta.get("id") is not None and m.tokens is not None
        }

    # -- compaction -------------------------------------------------------------------------

    async def _compaction_blocked(self, session_key: str) -> str | None:
        """Why automatic compaction may not run now (anti-thrash), or None."""
        session = await self.store.get_session(session_key)
        if session is None:
            return "no session"
        return compaction_blocked_reason(session, self.config.context.max_ineffective_compactions)

    async def compact_session(
        self, session_key: str, instructions: str = "", reason: str = "manual"
    ) -> CompactionResult | None:
        """Compact a session now (`/compact`, `gatehouse sessions compact`)."""
        session = await self.store.get_session(session_key)
        if session is None or session.id is None:
            return None
        settings = self.settings_for(session, None)
        view = await self.view(session.id)
        turn = self.turn_context(session_key, view, 1 << 62, settings)
        await self._flush_if_due(session_key, self.engine.assemble(turn))
        return await self._compact(session_key, turn, instructions, reason=reason)

    async def _compact(
        self, session_key: str, turn: TurnContext, instructions: str, *, reason: str
    ) -> CompactionResult | None:
        session = await self.store.get_session(session_key)
        assert session is not None and session.id is not None
        started = time.perf_counter()
        try:
            result = await self.engine.compact(turn, self.summarize, instructions)
        except Exception:
            log.exception("compaction crashed for %s; history kept", session_key)
            await self.store.set_compaction_state(session.id, cooldown_until=self._cooldown())
            if self.on_compaction is not None:
                self.on_compaction(reason, None)
            return None
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
        settings = turn.settings
        threshold = None
        if settings is not None:
            from context.budget import make_budget

            threshold = make_budget(settings.window.tokens, settings.budget).compact_at
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
        self._histories.pop(session.id, None)
        if result.last_seq is not None:
            await self._archive_covered(
                session_key, [*turn.history, *turn.incoming], result.last_seq,
                getattr(result, "ranked_identifiers", ()),
            )
        log.info(
            "compaction %s (%s): seq %s-%s, %d -> %d tokens, fallback=%s, quality passed=%s",
            session_key, reason, row.first_seq, row.last_seq, row.tokens_before,
            row.tokens_after, result.fallback, result.quality.passed,
        )
        return result

    async def _archive_covered(
        self,
        session_key: str,
        messages: Sequence[Message],
        last_seq: int,
        ranked: Sequence[Any] = (),
    ) -> None:
        """Archive the messages leaving the prompt, one by one, with their identifiers, so
        `history_search` finds each of them again (and memory_search's transcripts corpus).

        `ranked` is the compaction's `ranked_identifiers` (each with `.identifier` and `.seqs`);
        without it (a reset) the identifiers are extracted from the archived texts. Secrets are
        redacted as in summaries: a hit goes back into a prompt, and the archive is a copy (the
        messages themselves stay whole in the database); a secret is never an identifier here.
        """
        if self.archive is None:
            return
        covered = [m for m in messages if m.seq is not None and m.seq <= last_seq]
        if not covered:
            return
        patterns = list(self.config.context.identifier_patterns)

        def prepare() -> tuple[list[ArchivedMessage], list[tuple[str, str, list[int]]]]:
            archived: list[ArchivedMessage] = []
            # Each call and its result carry the outcome, so the excerpt that matches the
            # command (or the output) says how it ended.
            calls = {c.id: c for m in covered for c in m.tool_calls}
            outcome: dict[str, str] = {}
            for m in covered:
                if m.role == "tool" and m.tool_call_id:
                    failure = tool_failure(m, calls.get(m.tool_call_id))
                    if failure is not None:
                        code = failure.exit_code
                        outcome[m.tool_call_id] = (
                            f"[failed, exit code {code}]" if code is not None else "[failed]"
                        )
            for m in covered:
                assert m.seq is not None
                text = m.text
                if m.role == "tool" and m.tool_call_id in outcome:
                    text = f"{outcome[m.tool_call_id]} {text}"
                body = "\n".join(
                    [text, *(
                        f"→ {c.name}({c.arguments}) {outcome.get(c.id, '')}".rstrip()
                        for c in m.tool_calls
                    )]
                ).strip()
                created = m.meta.get("created_at")
                if isinstance(created, datetime):
                    created = created.isoformat(timespec="seconds")
                archived.append(
                    ArchivedMessage(
                        m.seq, m.role, redact_secrets(body)[0],
                        created if isinstance(created, str) else None, m.name,
                    )
                )
            found: dict[tuple[str, str], set[int]] = {}
            for item in ranked:
                ident = getattr(item, "identifier", None)
                if ident is None or getattr(ident, "secret", False):
                    continue
                seqs = {int(s) for s in getattr(item, "seqs", ()) if int(s) <= last_seq}
                if seqs:
                    found.setdefault((str(ident.value), str(ident.kind)), set()).update(seqs)
            if not ranked:
                for a in archived:
                    for ident in extract_identifiers([a.text], custom_patterns=patterns):
                        if not ident.secret:
                            found.setdefault((ident.value, ident.kind), set()).add(a.seq)
            return archived, [(v, k, sorted(seqs)) for (v, k), seqs in found.items()]

        try:
            archived, identifiers = await asyncio.to_thread(prepare)
            await self.archive(session_key, archived, identifiers)
        except Exception:
            log.exception("could not archive the compacted messages of %s", session_key)

    async def reset_session(
        self, session_key: str, why: str, *, flush: bool = True
    ) -> CompactionRow | None:
        """Start a fresh context: later turns see neither the messages so far nor any summary.

        Nothing is deleted. The boundary is a compaction-like row (reason "reset", empty for the
        prompt) covering every message so far, so `sessions show --all` still shows them,
        `memory_search` finds them (archived transcript) and `sessions uncompact` undoes the
        reset. With `flush`, the silent memory flush runs first, as before a compaction.
        Returns None when there is nothing to reset or a turn's messages are still unanswered.
        The caller holds the session's lane.
        """
        session = await self.store.get_session(session_key)
        if session is None or session.id is None:
            return None
        if await self.store.has_pending(session.id):
            log.info("not resetting %s: it has unanswered messages", session_key)
            return None
        latest = await self.store.latest_compaction(session.id)
        last_seq = session.next_seq - 1
        if last_seq < 1 or (latest is not None and is_reset(latest) and latest.last_seq >= last_seq):
            return None  # nothing said since the last reset
        view = await self.view(session.id)
        if flush and self.flush is not None and self.flush.due(session):
            settings = self.settings_for(session, None)
            plan = self.engine.assemble(self.turn_context(session_key, view, 1 << 62, settings))
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
            tokens_before=sum(m.tokens or 0 for m in view.history),
            tokens_after=0,
            quality={"reason": RESET_REASON, "why": why},
            model=None,
        )
        await self.store.add_compaction(row, ineffective=False)
        self._histories.pop(session.id, None)
        await self._archive_covered(session_key, view.history, last_seq)
        log.info("session %s reset (%s): seq %d-%d out of the prompt", session_key, why,
                 first_seq, last_seq)
        return row

    def _cooldown(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self.config.context.compaction_cooldown_seconds)

    async def uncompact(self, session_key: str) -> CompactionRow | None:
        session = await self.store.get_session(session_key)
        if session is None or session.id is None:
            return None
        undone = await self.store.undo_latest_compaction(session.id)
        self._histories.pop(session.id, None)
        return undone

    # -- tool outputs -----------------------------------------------------------------------

    async def _cap_tool_output(
        self, text: str, tool: str, call_id: str, window_tokens: int
    ) -> str:
        """Cap a tool result before it is stored or sent; the full output goes to artifacts/."""
        limit = tool_result_cap_chars(window_tokens, share=self.config.context.tool_result_share)
        if len(text) <= limit:
            return text
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in f"{tool}-{call_id}")[:80]
        relative = f"artifacts/{stamp}-{safe}.txt"
        target = self.config.workspace / relative
        try:
            await asyncio.to_thread(_write_text, target, text)
        except OSError as exc:
            log.warning("could not save tool output to %s: %s", target, exc)
            return cap_tool_output(text, limit).text
        return cap_tool_output(text, limit, artifact=relative).text


def compaction_blocked_reason(session: SessionRow, max_ineffective: int) -> str | None:
    """Anti-thrash: a cool-down after a failed summary; a stop after ineffective compactions."""
    until = session.compaction_cooldown_until
    if until is not None:
        if until.tzinfo is None:
            until = until.replace(tzinfo=UTC)
        if until > datetime.now(UTC):
            return f"cooling down after a failed summary until {until:%H:%M:%S} UTC"
    if session.ineffective_compactions >= max_ineffective:
        return (
            f"{session.ineffective_compactions} automatic compactions in a row did not get "
            "under the threshold; automatic compaction is paused (use /compact or "
            "`gatehouse sessions compact`)"
        )
    return None


RESET_REASON = "reset"


def is_reset(row: CompactionRow | None) -> bool:
    """A reset boundary (see `Runner.reset_session`), not a summary."""
    return row is not None and isinstance(row.quality, dict) and (
        row.quality.get("reason") == RESET_REASON
    )


def describe_compaction(result: CompactionResult | None) -> str:
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


def _compact_command(content: Any) -> str | None:
    """`/compact [instructions]` -> the instructions ('' when none); None for other text."""
    if not isinstance(content, str):
        return None
    text = content.strip()
    if text == "/compact" or text.startswith(("/compact ", "/compact\n")):
        return text[len("/compact") :].strip()
    return None


def _note_pressure(stats: TurnStats, plan: ContextPlan) -> None:
    """Keep the token pressure of the prompt about to be sent, for the turn's record."""
    facts = plan.facts
    tokens = facts.get("tokens", {})
    sent = tokens.get("prompt")
    stats.local_prompt_tokens = int(sent) if sent is not None else None
    stats.window = facts.get("window")
    stats.compact_at = facts.get("compaction_threshold")
    stats.flush_at = facts.get("flush_threshold")


def _calibrated_ratio(resolver: ContextResolver, session_key: str) -> float | None:
    cal = resolver.calibration(session_key)
    return cal.ratio if cal.samples else None


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", errors="replace")


def _facts_line(plan: ContextPlan) -> str:
    f = plan.facts
    if not f:
        return ", ".join(plan.notes)
    tokens = f.get("tokens", {})
    return (
        f"window={f.get('window')} ({f.get('window_source')}) counter={f.get('counter')} "
        f"history_limit={f.get('history_limit')} ({f.get('history_limit_source')}) "
        f"prompt={tokens.get('prompt')} flush_in={f.get('to_flush')} "
        f"compact_in={f.get('to_compaction')} tier={f.get('tier')}"
    )


def _nothing() -> None:
    """Nothing to stop."""
