"""One turn: load the session, assemble the prompt, compact if needed, call the model, run
tools, persist, reply.

The runner owns every side effect of a turn; the context engine only plans, and every context
policy (flush and compaction thresholds, tool-result caps) is asked of it. Each tool round is
persisted as soon as it completes (the call and its results together, never one without the
other), so a crash or shutdown mid-turn loses nothing and the turn resumes where it stopped.
The history cache (`history.py`), the prompt's parts (`prompt.py`), compaction and resets
(`compaction.py`), the typing indicator and the tool-output artifacts live beside it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

from channels.base import OutboundMessage
from context.compaction import CompactionResult, CompactionSettings, SummaryCall
from context.engine import ContextEngine, ContextPlan, ContextSettings, TurnContext
from context.rounds import split_units
from context.types import Message
from context.window import WindowTooSmallError
from gateway.config import Config
from gateway.model.llm import ContextOverflowError, LLMError, LLMProvider, prompt_cache_key
from gateway.model.sizing import ContextResolver
from gateway.store import CompactionRow, HistoryRead, MessageRow, SessionRow, Store, TurnUsage
from gateway.store.faults import StorageError
from gateway.store.messages import CONTEXT_STATUS
from gateway.tools.memory import MemoryFlush
from gateway.tools.registry import ToolContext, ToolRegistry
from gateway.tools.scope import Scopes
from gateway.turn.archive import Archive
from gateway.turn.artifacts import cap_tool_output
from gateway.turn.commands import Describe, run_commands
from gateway.turn.compaction import (
    Compactor,
    OnCompaction,
    compact_command,
    compaction_blocked_reason,
    describe_compaction,
)
from gateway.turn.history import (
    COMMAND_STATUS,
    ERROR_STATUS,
    HIDDEN_STATUSES,
    INTERRUPTED_STATUS,
    RESET_REASON,
    HistoryCache,
    SessionView,
    is_reset,
)
from gateway.turn.loop import ArchivedSeqs, ToolLoop
from gateway.turn.midturn import (
    TOOL_NOT_RUN,
    Arrivals,
    MidTurn,
    is_command,
    queue_mode,
    starts_fresh,
)
from gateway.turn.notices import TurnNotices, with_cut_notice
from gateway.turn.outbox import Deliver, DeliveryLog
from gateway.turn.previews import PreviewStream
from gateway.turn.prompt import HISTORY_HINT, TurnPrompts
from gateway.turn.stats import TurnStats
from gateway.turn.storage import HeldReply, StorageBlocks
from gateway.turn.typing_indicator import Typing, typing_later
from memory.agents_md import AgentsFile

__all__ = [
    "COMMAND_STATUS",
    "ERROR_STATUS",
    "HIDDEN_STATUSES",
    "HISTORY_HINT",
    "INTERRUPTED_STATUS",
    "RESET_REASON",
    "Archive",
    "Runner",
    "SessionView",
    "TurnHooks",
    "TurnRefusedError",
    "TurnStats",
    "Typing",
    "compaction_blocked_reason",
    "describe_compaction",
    "is_reset",
]

log = logging.getLogger(__name__)

Previews = Callable[[OutboundMessage], PreviewStream | None]
"""Opens a streamed preview for a reply, when its channel has one (gateway/turn/previews.py)."""


class TurnRefusedError(LLMError):
    """The turn cannot be sent at all (window below the floor, a message larger than it)."""

    def __init__(self, user_message: str) -> None:
        super().__init__(user_message, kind="refused")


@dataclass(frozen=True, slots=True)
class TurnHooks:
    """The runner's optional collaborators: each one the gateway (or a test) may leave out."""

    typing: Typing | None = None
    previews: Previews | None = None
    delivery: DeliveryLog | None = None
    """Sends a reply stored in the outbox and forgets it once sent (retries, crash recovery)."""
    archive: Archive | None = None
    """Keeps what compaction and resets take out of the prompt findable (`history_search`)."""
    on_turn: Callable[[TurnStats], None] | None = None
    on_compaction: OnCompaction | None = None
    """Told of each compaction attempt's reason and result (None: it crashed)."""
    describe: Describe | None = None
    """Answers `/status` and `/context` (the Gateway: gateway/operations/chat.py)."""


@dataclass(eq=False)
class Runner:
    config: Config
    store: Store
    engine: ContextEngine
    llm: LLMProvider
    tools: ToolRegistry
    deliver: Deliver
    resolver: ContextResolver
    summarize: SummaryCall
    flush: MemoryFlush | None = None
    hooks: TurnHooks = field(default_factory=TurnHooks)
    scopes: Scopes | None = None
    """Who each turn's tool calls are for (None: a guest of the session)."""
    last_plan: dict[str, ContextPlan] = field(init=False, default_factory=dict)
    archived: ArchivedSeqs = field(init=False, default_factory=ArchivedSeqs)
    """What this process archived of each session outside compactions (`_archive_left_out`)."""

    def __post_init__(self) -> None:
        self.agents = AgentsFile(self.config.workspace / "AGENTS.md")
        self.histories = HistoryCache(self.store)
        self.arrivals = Arrivals()
        """Told of each accepted message, so a running turn can steer or stop (midturn.py)."""
        self.blocked = StorageBlocks()
        """Sessions whose turn the database refused, tried again by the gateway (storage.py)."""
        self._answered_first: dict[str, int] = {}
        """Sessions whose claim stopped before a `/new`: how many messages the model answered
        first, for the `/new` to say so (`before_a_boundary`)."""
        self.prompts = TurnPrompts(self.config, self.llm, self.tools, self.resolver, self.agents)
        self.compactions = Compactor(
            self.config, self.store, self.engine, self.llm, self.summarize, self.histories,
            self.prompts, self.flush, self.hooks.archive, self.hooks.on_compaction,
        )

    # -- a turn -----------------------------------------------------------------------------

    async def run_turn(self, session_key: str) -> bool:
        """Answer what waits in the session; True when more waits for another turn (queue mode
        `followup` answers one message a turn: gateway/turn/midturn.py; a claim stopped before
        a `/new`). A storage fault blocks the session instead of failing the lane (storage.py):
        the gateway runs it again, and a reply kept from before is stored first."""
        held = self.blocked.held(session_key)
        try:
            if held is not None and not await self._store_held(session_key, held):
                return False
            # The claim reads the turn's history too (one transaction fewer): see `view`.
            claim = await self.store.claim_turn(
                session_key, self._group_buffer, self.histories.known,
                one_message=self._one_per_turn, ends_before=starts_fresh,
            )
        except StorageError as exc:
            await self._not_stored(session_key, exc)
            return False
        session, claimed, read = claim.session, claim.messages, claim.read
        if session is None or session.id is None or not claimed:
            self.blocked.stored(session_key)  # nothing of it waits any more (answered elsewhere)
            return False
        try:
            more = await self._run_claimed(session_key, session, claimed, read)
        except StorageError as exc:
            await self._not_stored(session_key, exc, claimed)
            return False
        if claim.held_back:  # the `/new` after these says they were answered first
            asks = [r for r in claimed if r.status != CONTEXT_STATUS and not is_command(r.content)]
            if asks:
                self._answered_first[session_key] = len(asks)
            return True
        return more

    async def _run_claimed(
        self,
        session_key: str,
        session: SessionRow,
        claimed: list[MessageRow],
        read: HistoryRead | None,
    ) -> bool:
        """The turn, once its messages are claimed: answer them, store the reply, send it."""
        assert session.id is not None
        mid = MidTurn(
            queue_mode(self.config, session.platform), self.store, session.id,
            cross_process=not self.store.is_sqlite,
        )
        self.arrivals.watch(session_key, mid)
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
        hooks = self.hooks
        if self.config.context.notify_compaction:  # "compacting…" and what it kept
            self.compactions.notices[session_key] = TurnNotices(self.deliver, outbound)
        preview = hooks.previews(outbound) if hooks.previews is not None else None
        stop_typing = typing_later(
            hooks.typing, self.config.gateway.typing_delay_ms / 1000,
            outbound.platform, outbound.chat_id, outbound.thread_id,
        )
        try:
            notices, asked = await self._run_commands(session_key, claimed)
            if asked:
                # A command's compaction moved the summary: the claim's read is stale then.
                notices.append(
                    await self._answer(
                        session, asked, stats, preview, None if notices else read, mid
                    )
                )
            else:
                status = COMMAND_STATUS  # commands only: their answer is hidden from the model
            reply = "\n\n".join(notices)
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
            self.compactions.notices.pop(session_key, None)
            if preview is not None:
                preview.close()
        if mid.interrupted:
            status = INTERRUPTED_STATUS  # the cut reply stays in the history, marked
        answered = [*claimed, *mid.steered]
        reply_message = Message(role="assistant", content=reply)
        reply_message = reply_message.with_tokens(
            self.resolver.counter.count_message(reply_message)
        )
        stats.seconds = time.perf_counter() - started
        # The preview's id (once an edit in flight has landed) is stored with the reply, so a
        # reply sent after a crash still replaces its preview instead of appearing beside it.
        preview_id = await preview.finish() if preview is not None else None
        final = mid.addressed(replace(outbound, text=reply, preview_id=preview_id))
        # The reply enters the outbox with the turn's commit and leaves it once sent: a crash in
        # between never loses it (`Gateway.start` sends what is left; see gateway/turn/outbox.py).
        finish = partial(
            self.store.finish_turn,
            session.id,
            reply_message,
            [r.id for r in answered if r.id is not None],
            TurnUsage(stats.prompt_tokens, stats.completion_tokens, stats.cached_tokens),
            reply_status=status,
            error=stats.error,
            token_ratio=_calibrated_ratio(self.resolver, session_key),
            token_ratio_samples=self.resolver.calibration(session_key).samples or None,
            token_counts=stats.token_counts,
            record=stats.record(),
            outbound=final,
        )
        try:
            outbox_id = await finish()
        except StorageError as exc:  # the model's answer is kept: stored on the next try
            self.blocked.block(session_key, exc, answered, HeldReply(finish, final, stats))
            return False
        self.blocked.stored(session_key)
        await self._stored(outbox_id, final, stats)
        return self._one_per_turn(session) and await self.store.has_pending(session.id)

    async def _stored(self, outbox_id: int | None, final: OutboundMessage, stats: TurnStats) -> None:
        """A turn was stored: count it, and send its reply."""
        hooks = self.hooks
        if hooks.on_turn is not None:
            hooks.on_turn(stats)
        if outbox_id is not None and hooks.delivery is not None:
            await hooks.delivery.send(outbox_id, final)
        elif (await self.deliver(final)).sent and outbox_id is not None:
            await self.store.forget_outbox([outbox_id])

    async def _store_held(self, session_key: str, held: HeldReply) -> bool:
        """Store (and send) the reply a turn finished while the database refused it; False
        while it still refuses."""
        try:
            outbox_id = await held.store()
        except StorageError as exc:
            self.blocked.block(session_key, exc)
            return False
        self.blocked.stored(session_key)
        await self._stored(outbox_id, held.outbound, held.stats)
        return True

    async def _not_stored(
        self, session_key: str, fault: StorageError, rows: list[MessageRow] | None = None
    ) -> None:
        """A step of the session's turn failed on a storage fault: the session is blocked and
        tried again (storage.py). Without the turn's messages (its claim failed), those still
        waiting are read (a read usually works when writes do not)."""
        if rows is None:
            try:
                session = await self.store.get_session(session_key)
                if session is not None and session.id is not None:
                    rows = await self.store.arrivals(session.id)
            except Exception as exc:  # cannot read either: the retry finds them
                log.debug("could not read the waiting messages of %s: %s", session_key, exc)
        self.blocked.block(session_key, fault, rows or ())

    def _one_per_turn(self, session: SessionRow) -> bool:
        return queue_mode(self.config, session.platform) == "followup"

    async def _run_commands(
        self, session_key: str, claimed: list[MessageRow]
    ) -> tuple[list[str], list[MessageRow]]:
        """Answer the chat commands among the claimed messages (`/status`, `/new`, `/compact`…:
        gateway/turn/commands.py): their answers, and the messages left for the model."""
        answered_first = self._answered_first.pop(session_key, 0)
        return await run_commands(
            self, self.hooks.describe, session_key, claimed, answered_first=answered_first
        )

    async def _answer(
        self,
        session: SessionRow,
        claimed: list[MessageRow],
        stats: TurnStats,
        preview: PreviewStream | None = None,
        read: HistoryRead | None = None,
        mid: MidTurn | None = None,
    ) -> str:
        assert session.id is not None
        session_key = session.key
        mid = mid or MidTurn("collect", self.store, session.id)
        first_seq = claimed[0].seq or 0
        platform = claimed[-1].platform or session.platform
        caller = None
        if self.scopes is not None:
            caller = await self.scopes.caller(
                session_key, platform, session.chat_type, claimed[-1].sender_id
            )
        ctx = ToolContext(
            session_key=session_key,
            timezone=self.config.gateway.timezone,
            platform=platform,
            chat_id=claimed[-1].chat_id or session.chat_id,
            thread_id=session.thread_id,
            chat_type=session.chat_type,
            account=session.account,
            caller=caller,
        )
        all_specs, _tokens, fresh_specs = self.prompts.tool_specs()
        settings = self.settings_for(session, claimed[-1].sender_id)
        if settings.window.too_small:
            raise TurnRefusedError(
                str(WindowTooSmallError(settings.window.tokens, self.llm.model, settings.window.source))
            )
        compactions = self.compactions
        view = await self.view(session.id, read=read)
        limits = self.config.llm
        loop = ToolLoop(limits.max_turn_seconds, settings)
        overflow_retries = 0
        for _round in range(limits.max_tool_rounds):
            # What arrived meanwhile, in queue modes steer and interrupt (midturn.py).
            self.histories.append(session.id, await mid.steer())
            if await mid.stop_due():
                return mid.interrupt()
            turn = self.turn_context(session_key, view, first_seq, settings)
            asked = await mid.compact_requests(stats.tool_rounds)
            if asked:
                result = await self._compact_mid_loop(session_key, turn, asked)
                if result is not None:
                    stats.compactions.append(result)
                view = await self.view(session.id)
                turn = self.turn_context(session_key, view, first_seq, settings)
            plan = self.engine.assemble(turn)
            if plan.wants_flush:
                await compactions.flush_if_due(session_key, plan)
            # Before every model call of the turn, not only its first: a long tool loop
            # compacts its earlier rounds as often as it needs to (its ask stays pinned).
            if plan.wants_compaction and loop.may_compact(plan):
                result = await compactions.automatic(session_key, turn)
                loop.compacted(plan, result)
                if result is not None:
                    stats.compactions.append(result)
                view = await self.view(session.id)
                turn = self.turn_context(session_key, view, first_seq, settings)
                plan = self.engine.assemble(turn)
            stats.token_counts.update(self.histories.remember_counts(session.id, plan.counted))
            if log.isEnabledFor(logging.DEBUG):
                log.debug("context %s: %s", session_key, _facts_line(plan))
            for note in plan.notes:
                log.info("context %s: %s", session_key, note)
            if plan.error:
                raise TurnRefusedError(plan.error)
            await self._archive_left_out(session_key, view, plan)
            self.last_plan[session_key] = plan
            stats.note_pressure(plan)
            lookup = view.summary is not None or self.archived.holds(session_key)
            try:
                completion = await mid.call(
                    self.llm.complete(
                        plan.messages,
                        all_specs if lookup else fresh_specs,
                        on_text=mid.on_text(preview),
                        cache_key=prompt_cache_key(session.agent, session_key),
                    )
                )
                if completion is None:
                    return mid.interrupt()
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
                await compactions.flush_if_due(session_key, plan)
                result = await compactions.compact(
                    session_key, turn, "", reason="provider-overflow"
                )
                if result is None or not result.committed:
                    raise self._overflow_error(plan, settings, exc) from exc
                stats.compactions.append(result)
                view = await self.view(session.id)
                continue
            stats.prompt_tokens = completion.usage.prompt_tokens
            stats.cached_tokens = completion.usage.cached_tokens
            stats.completion_tokens = (stats.completion_tokens or 0) + (
                completion.usage.completion_tokens or 0
            )
            sent = plan.tokens.sent_local if plan.tokens is not None else None
            if sent and not lookup:  # the budget counts the lookup tool, this call lacked it
                sent -= self.prompts.lookup_tool_tokens()
            if completion.usage.prompt_tokens and sent:
                self.resolver.calibration(session_key).observe(
                    sent, completion.usage.prompt_tokens
                )
            message = completion.message
            if not message.tool_calls:
                text = with_cut_notice(message.text.strip(), completion.finish_reason)
                return loop.with_notes(text or "(The model returned an empty reply.)")
            stats.tool_rounds += 1
            round_messages = [message]
            for index, call in enumerate(message.tool_calls):
                not_run = (
                    TOOL_NOT_RUN if await mid.stop_due()  # the round stays whole
                    else loop.too_many(index, limits.max_tool_calls_per_round)
                )
                if not_run is not None:
                    round_messages.append(
                        Message(
                            role="tool", content=not_run, tool_call_id=call.id,
                            name=call.name, meta={"tool_error": True},
                        )
                    )
                    continue
                tool_result = await self.tools.call(call.name, call.arguments, ctx)
                content = await cap_tool_output(
                    self.engine, settings, self.config.workspace,
                    tool_result.content, call.name, call.id, session_key,
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
            self.histories.append(session.id, rows)
            if loop.out_of_time():
                return loop.with_notes(loop.time_limit_reply(stats.tool_rounds))
        return loop.with_notes(
            f"I stopped after {limits.max_tool_rounds:,} rounds of tool calls without "
            "finishing (the turn's limit, [llm] max_tool_rounds). Ask me to continue, or raise "
            "it."
        )

    async def _compact_mid_loop(
        self, session_key: str, turn: TurnContext, asked: list[MessageRow]
    ) -> CompactionResult | None:
        """`/compact` sent during this turn's tool loop: compact the rounds so far now (flush
        first) and answer the command at once; the loop then goes on."""
        await self.store.mark_handled([r.id for r in asked if r.id is not None], COMMAND_STATUS)
        instructions = compact_command(asked[-1].content) or ""
        result = await self.compactions.compact(
            session_key, turn, instructions, reason="command", flush=self.engine.assemble(turn)
        )
        answer = describe_compaction(result)
        for row in asked:
            target = OutboundMessage(
                platform=row.platform or "", chat_id=row.chat_id or "", text=answer,
                session_key=session_key, reply_to=row.platform_message_id,
                answers=(row.platform_message_id,) if row.platform_message_id else (),
            )
            delivery = await self.deliver(target)
            if not delivery.sent:
                log.warning("answer to /compact in %s not sent: %s", session_key, delivery.error)
        return result

    async def _archive_left_out(
        self, session_key: str, view: SessionView, plan: ContextPlan
    ) -> None:
        """Archive what the plan left out of the prompt (or sent pruned) and no summary
        covers, the first time it is left out: a prompt cut without a compaction (paused,
        or a tool result cleared by its share) still keeps every message one lookup away."""
        if not plan.left_out and plan.left_out_through is None:
            return
        done = self.archived.seqs(session_key)
        wanted = set(plan.left_out)
        through = plan.left_out_through if plan.left_out_through is not None else -1
        if wanted <= done and (through < 0 or through in done):
            return  # all archived already (what lies before `through` goes with it)
        todo = [
            m for m in view.history
            if m.seq is not None and m.seq not in done and (m.seq <= through or m.seq in wanted)
        ]
        if todo:
            await self.compactions.archive_left_out(session_key, todo)
            done.update(m.seq for m in todo if m.seq is not None)

    def _overflow_error(
        self, plan: ContextPlan, settings: ContextSettings, exc: ContextOverflowError
    ) -> LLMError:
        prompt = plan.tokens.prompt if plan.tokens is not None else None
        tokens = f"{prompt:,}" if prompt is not None else "?"
        largest = largest_part(plan.messages)
        return LLMError(
            f"This conversation no longer fits model {self.llm.model!r}: about {tokens} "
            f"tokens against a {settings.window.tokens:,}-token window ({settings.window.source})"
            + (f"; the largest part is {largest}" if largest else "")
            + f", and compacting did not help after {self.config.context.overflow_retries} "
            "tries. Start a new topic or raise the model's window.",
            kind="context_overflow",
            detail=exc.detail,
        )

    def _group_buffer(self, session: SessionRow) -> int | None:
        """How many unmentioned group messages the next mention brings along."""
        if session.chat_type == "direct":
            return None
        try:
            return self.config.channels.get(session.platform).group_buffer
        except KeyError:
            return None

    # -- the prompt's parts (gateway/turn/prompt.py) ----------------------------------------

    def settings_for(self, session: SessionRow, user_id: str | None) -> ContextSettings:
        return self.prompts.settings_for(session, user_id)

    def turn_context(
        self, session_key: str, view: SessionView, first_seq: int, settings: ContextSettings
    ) -> TurnContext:
        """History before this turn, and this turn's messages (its tool rounds included)."""
        return self.prompts.turn_context(session_key, view, first_seq, settings)

    def compaction_settings(self, window: int) -> CompactionSettings:
        return self.prompts.compaction_settings(window)

    def tools_tokens(self) -> int:
        """Tokens of every tool schema sent with a call."""
        return self.prompts.tools_tokens()

    def refresh_block(self) -> str | None:
        return self.prompts.refresh_block()

    def critical_rules(self) -> str:
        return self.prompts.critical_rules()

    def system_prompt(self) -> str:
        return self.prompts.system_prompt()

    # -- history, compaction, reset (gateway/turn/history.py, compaction.py) -----------------

    async def view(
        self, session_id: int, *, use_cache: bool = True, read: HistoryRead | None = None
    ) -> SessionView:
        """Latest summary + the stored messages after its range (see `HistoryCache.view`)."""
        return await self.histories.view(session_id, use_cache=use_cache, read=read)

    async def compact_session(
        self, session_key: str, instructions: str = "", reason: str = "manual"
    ) -> CompactionResult | None:
        """Compact a session now (`/compact`, `gatehouse sessions compact`)."""
        return await self.compactions.compact_session(session_key, instructions, reason)

    async def reset_session(
        self, session_key: str, why: str, *, flush: bool = True, through: int | None = None
    ) -> CompactionRow | None:
        """Start a fresh context (see `Compactor.reset_session`); the caller holds the lane."""
        return await self.compactions.reset_session(session_key, why, flush=flush, through=through)

    async def uncompact(self, session_key: str) -> CompactionRow | None:
        return await self.compactions.uncompact(session_key)


def largest_part(messages: list[Message]) -> str | None:
    """The largest unit of a prompt, named for an overflow error: a tool round ("the tool
    results of the round at seq 40-52 (grep, run_command; 9,120 tokens)") or a message."""
    best: tuple[int, str] | None = None
    for unit in split_units(messages[1:]):
        tokens = unit.tokens
        seqs = [m.seq for m in unit.messages if m.seq is not None]
        where = f"seq {min(seqs)}-{max(seqs)}, " if seqs else ""
        if unit.kind == "round":
            tools = ", ".join(sorted({c.name for c in unit.messages[0].tool_calls}))
            at = f" at seq {min(seqs)}-{max(seqs)}" if seqs else ""
            name = f"the tool results of the round{at} ({tools}; {tokens:,} tokens)"
        elif unit.kind == "ask":
            name = f"the new message ({where}{tokens:,} tokens)"
        else:
            name = f"a {unit.messages[0].role} message ({where}{tokens:,} tokens)"
        if best is None or tokens > best[0]:
            best = (tokens, name)
    return best[1] if best is not None and best[0] > 0 else None


def _calibrated_ratio(resolver: ContextResolver, session_key: str) -> float | None:
    cal = resolver.calibration(session_key)
    return cal.ratio if cal.samples else None


def _facts_line(plan: ContextPlan) -> str:
    f = plan.facts
    if f is None:
        return ", ".join(plan.notes)
    return (
        f"window={f.window} ({f.window_source}) counter={f.counter} "
        f"history_limit={f.history_limit} ({f.history_limit_source}) "
        f"prompt={f.tokens.prompt} flush_in={f.to_flush} "
        f"compact_in={f.to_compaction} tier={f.tier.value}"
    )
