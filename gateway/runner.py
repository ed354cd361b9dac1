"""One turn: load the session, assemble the prompt, call the model, run tools, persist, reply.

The runner owns every side effect of a turn; the context engine only plans. Each tool round is
persisted as soon as it completes (the call and its results together, never one without the
other), so a crash or shutdown mid-turn loses nothing and the turn resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from channels.base import OutboundMessage
from context.engine import ContextEngine, TurnContext
from context.types import Message
from gateway.config import Config
from gateway.llm import LLMError, LLMProvider
from gateway.store import MessageRow, Store, TurnUsage
from gateway.tools import ToolContext, ToolRegistry

log = logging.getLogger(__name__)

Deliver = Callable[[OutboundMessage], Awaitable[None]]

ERROR_STATUS = "error"
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
    ) -> None:
        self.config = config
        self.store = store
        self.engine = engine
        self.llm = llm
        self.tools = tools
        self.deliver = deliver
        self.on_turn: Callable[[TurnStats], None] | None = None

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
            reply = await self._converse(session_key, session.id, claimed, stats)
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
        await self.store.finish_turn(
            session.id,
            Message(role="assistant", content=reply),
            (r.id for r in claimed if r.id is not None),
            TurnUsage(stats.prompt_tokens, stats.completion_tokens),
            reply_status=status,
            error=stats.error,
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

    async def _converse(
        self, session_key: str, session_id: int, claimed: list[MessageRow], stats: TurnStats
    ) -> str:
        first_seq = claimed[0].seq or 0
        stored = [
            m
            for m in await self.store.history(session_id)
            if m.meta.get("status") != ERROR_STATUS
        ]
        history = [m for m in stored if (m.seq or 0) < first_seq]
        incoming = [m for m in stored if (m.seq or 0) >= first_seq]
        ctx = ToolContext(session_key=session_key, timezone=self.config.gateway.timezone)
        tool_specs = self.tools.specs()
        for _round in range(self.config.llm.max_tool_rounds):
            turn = TurnContext(
                session_key=session_key,
                system_prompt=self.config.gateway.system_prompt,
                history=history,
                incoming=incoming,
                model=self.llm.model,
            )
            plan = self.engine.assemble(turn)
            completion = await self.llm.complete(plan.messages, tool_specs)
            stats.prompt_tokens = completion.usage.prompt_tokens
            stats.completion_tokens = (stats.completion_tokens or 0) + (
                completion.usage.completion_tokens or 0
            )
            message = completion.message
            if not message.tool_calls:
                return message.text.strip() or "(The model returned an empty reply.)"
            stats.tool_rounds += 1
            round_messages = [message]
            for call in message.tool_calls:
                result = await self.tools.call(call.name, call.arguments, ctx)
                round_messages.append(
                    Message(
                        role="tool",
                        content=result.content,
                        tool_call_id=call.id,
                        name=call.name,
                    )
                )
            await self.store.append_messages(session_id, round_messages)
            incoming = [*incoming, *round_messages]
        return (
            f"I stopped after {self.config.llm.max_tool_rounds} rounds of tool calls without "
            "finishing. Ask me to continue, or raise [llm] max_tool_rounds."
        )
