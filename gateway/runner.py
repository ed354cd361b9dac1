"""One turn: load the session, assemble the prompt, call the model, run tools, persist, reply.

The runner owns every side effect of a turn; the context engine only plans. Each tool round is
persisted as soon as it completes (the call and its results together, never one without the
other), so a crash or shutdown mid-turn loses nothing and the turn resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from channels.base import OutboundMessage
from context.engine import ContextEngine, ContextPlan, TurnContext
from context.pruning import cap_tool_output, tool_result_cap_chars
from context.types import Message
from context.window import WindowTooSmallError
from gateway.config import Config
from gateway.context_setup import ContextResolver, Conversation
from gateway.llm import LLMError, LLMProvider
from gateway.store import MessageRow, SessionRow, Store, TurnUsage, row_to_message
from gateway.tools import ToolContext, ToolRegistry

log = logging.getLogger(__name__)

Deliver = Callable[[OutboundMessage], Awaitable[None]]

ERROR_STATUS = "error"


class TurnRefusedError(LLMError):
    """The turn cannot be sent at all (window below the floor, a message larger than it)."""

    def __init__(self, user_message: str) -> None:
        super().__init__(user_message, kind="refused")

INTERRUPTED_STATUS = "interrupted"


@dataclass
class TurnStats:
    session_key: str
    messages_in: int
    tool_rounds: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    seconds: float = 0.0
    error: str | None = None


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
    ) -> None:
        self.config = config
        self.store = store
        self.engine = engine
        self.llm = llm
        self.tools = tools
        self.deliver = deliver
        self.resolver = resolver
        self.on_turn: Callable[[TurnStats], None] | None = None
        self.last_plan: dict[str, ContextPlan] = {}
        self.history_cache_sessions = 256
        self._histories: dict[int, list[Message]] = {}

    async def run_turn(self, session_key: str) -> None:
        session = await self.store.get_session(session_key)
        if session is None or session.id is None:
            return
        claimed = await self.store.claim_pending(session.id)
        if not claimed:
            return
        started = time.perf_counter()
        stats = TurnStats(session_key, len(claimed))
        status: str | None = None
        try:
            reply = await self._converse(session_key, session, claimed, stats)
        except asyncio.CancelledError:
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
        reply_message = Message(role="assistant", content=reply)
        reply_message = reply_message.with_tokens(
            self.resolver.counter.count_message(reply_message)
        )
        await self.store.finish_turn(
            session.id,
            reply_message,
            (r.id for r in claimed if r.id is not None),
            TurnUsage(stats.prompt_tokens, stats.completion_tokens),
            reply_status=status,
            error=stats.error,
            token_ratio=_calibrated_ratio(self.resolver, session_key),
        )
        stats.seconds = time.perf_counter() - started
        if self.on_turn is not None:
            self.on_turn(stats)
        last = claimed[-1]
        await self.deliver(
            OutboundMessage(
                platform=last.platform or session.platform,
                chat_id=last.chat_id or session.chat_id,
                thread_id=session.thread_id,
                text=reply,
                session_key=session_key,
                reply_to=last.platform_message_id,
                answers=tuple(r.platform_message_id for r in claimed if r.platform_message_id),
            )
        )

    async def _history(self, session_id: int) -> list[Message]:
        """The stored conversation, loading only messages newer than what is cached."""
        cached = self._histories.pop(session_id, None) or []
        last_seq = cached[-1].seq or 0 if cached else 0
        fresh = await self.store.history(session_id, after_seq=last_seq)
        history = cached + [m for m in fresh if m.meta.get("status") != ERROR_STATUS]
        self._histories[session_id] = history  # re-inserted last: most recently used
        while len(self._histories) > self.history_cache_sessions:
            self._histories.pop(next(iter(self._histories)))
        return history

    def _remember_counts(self, session_id: int, counted: Sequence[Message]) -> dict[int, int]:
        """Update the cached history with fresh counts; return {message id: tokens} to store."""
        by_seq = {m.seq: m.tokens for m in counted if m.seq is not None and m.tokens is not None}
        history = self._histories.get(session_id)
        if history and by_seq:
            for i, m in enumerate(history):
                if m.seq in by_seq and m.tokens is None:
                    history[i] = m.with_tokens(by_seq[m.seq] or 0)
        return {
            int(m.meta["id"]): m.tokens
            for m in counted
            if m.meta.get("id") is not None and m.tokens is not None
        }

    async def _converse(
        self,
        session_key: str,
        session: SessionRow,
        claimed: list[MessageRow],
        stats: TurnStats,
    ) -> str:
        assert session.id is not None
        session_id = session.id
        first_seq = claimed[0].seq or 0
        stored = await self._history(session_id)
        history = [m for m in stored if (m.seq or 0) < first_seq]
        incoming = [m for m in stored if (m.seq or 0) >= first_seq]
        ctx = ToolContext(session_key=session_key, timezone=self.config.gateway.timezone)
        tool_specs = self.tools.specs()
        counter = self.resolver.counter
        where = Conversation(
            platform=session.platform,
            chat_type=session.chat_type,
            chat_id=session.chat_id,
            user_id=claimed[-1].sender_id,
        )
        settings = self.resolver.settings_for(
            session_key,
            where,
            tools_tokens=counter.count_tools(tool_specs),
            stored_ratio=session.token_ratio,
        )
        if settings.window.too_small:
            raise TurnRefusedError(str(WindowTooSmallError(
                settings.window.tokens, self.llm.model, settings.window.source
            )))
        for _round in range(self.config.llm.max_tool_rounds):
            turn = TurnContext(
                session_key=session_key,
                system_prompt=self.config.gateway.system_prompt,
                history=history,
                incoming=incoming,
                model=self.llm.model,
                settings=settings,
            )
            plan = self.engine.assemble(turn)
            await self.store.cache_token_counts(self._remember_counts(session_id, plan.counted))
            log.debug("context %s: %s", session_key, _facts_line(plan))
            for note in plan.notes:
                log.info("context %s: %s", session_key, note)
            if plan.error:
                raise TurnRefusedError(plan.error)
            self.last_plan[session_key] = plan
            completion = await self.llm.complete(plan.messages, tool_specs)
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
                result = await self.tools.call(call.name, call.arguments, ctx)
                content = await self._cap_tool_output(
                    result.content, call.name, call.id, settings.window.tokens
                )
                round_messages.append(
                    Message(role="tool", content=content, tool_call_id=call.id, name=call.name)
                )
            round_messages = counter.ensure_counted(round_messages)
            rows = await self.store.append_messages(session_id, round_messages)
            round_messages = [row_to_message(r) for r in rows]
            incoming = [*incoming, *round_messages]
            self._histories.get(session_id, []).extend(round_messages)
        return (
            f"I stopped after {self.config.llm.max_tool_rounds} rounds of tool calls without "
            "finishing. Ask me to continue, or raise [llm] max_tool_rounds."
        )

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
