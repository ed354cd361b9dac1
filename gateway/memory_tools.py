"""The agent's memory tools (`memory_write`, `memory_search`, `memory_get`) and the silent
pre-compaction memory flush turn.

The tools wrap the `memory` package (files and the FTS5 index, synchronous) in threads. Every
path is confined to the workspace by that package; MEMORY.md and AGENTS.md are read-only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from context.compaction import redact_messages
from context.identifiers import redact_secrets
from context.types import Message
from gateway.llm import LLMError, LLMProvider
from gateway.store import SessionRow, Store
from gateway.tools import Tool, ToolContext, ToolError, ToolRegistry
from memory.index import MemoryIndex
from memory.notes import append_note, read_lines
from memory.workspace import WorkspacePathError

log = logging.getLogger(__name__)

NO_REPLY = "NO_REPLY"


class MemoryTools:
    """The three memory tools bound to one workspace and index."""

    def __init__(self, workspace: Path, index: MemoryIndex, timezone: str) -> None:
        self.workspace = workspace
        self.index = index
        self.timezone = timezone

    def tools(self) -> list[Tool]:
        return [
            Tool(
                "memory_write",
                "Append a durable note (decision, preference, identifier, open task) to today's "
                "memory file memory/YYYY-MM-DD.md. Append-only; attributed to this session.",
                {
                    "type": "object",
                    "properties": {"text": {"type": "string", "minLength": 1}},
                    "required": ["text"],
                    "additionalProperties": False,
                },
                self._write,
            ),
            Tool(
                "memory_search",
                "Full-text search over the workspace memory (notes, MEMORY.md; Chinese and "
                "Japanese too). Returns file paths with line ranges and snippets.",
                {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "minLength": 1},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 20},
                        "corpus": {"type": "string", "enum": ["notes", "transcripts", "all"]},
                    },
                    "required": ["query"],
                    "additionalProperties": False,
                },
                self._search,
            ),
            Tool(
                "memory_get",
                "Read lines of a workspace file (e.g. memory/2026-12-02.md, MEMORY.md).",
                {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "minLength": 1},
                        "start": {"type": "integer", "minimum": 1},
                        "count": {"type": "integer", "minimum": 1, "maximum": 400},
                    },
                    "required": ["path"],
                    "additionalProperties": False,
                },
                self._get,
            ),
        ]

    async def _write(self, args: dict[str, Any], ctx: ToolContext) -> str:
        text, secrets = redact_secrets(str(args["text"]))
        try:
            entry = await asyncio.to_thread(
                append_note,
                self.workspace,
                text,
                session_key=ctx.session_key,
                tz=self.timezone,
            )
        except (ValueError, OSError) as exc:
            raise ToolError(str(exc)) from None
        redacted = f"; {len(secrets)} secret(s) redacted" if secrets else ""
        return f"saved to {entry.path} (lines {entry.start_line}-{entry.end_line}){redacted}"

    async def _search(self, args: dict[str, Any], _ctx: ToolContext) -> str:
        def run() -> list[Any]:
            self.index.refresh()  # follows file changes, hand edits included
            return list(
                self.index.search(
                    str(args["query"]),
                    limit=int(args.get("limit", 8)),
                    corpus=str(args.get("corpus", "notes")),  # type: ignore[arg-type]
                )
            )

        hits = await asyncio.to_thread(run)
        if not hits:
            return "no matches"
        return "\n\n".join(f"{h.location} (score {h.score:.2f})\n{h.snippet}" for h in hits)

    async def _get(self, args: dict[str, Any], _ctx: ToolContext) -> str:
        try:
            result = await asyncio.to_thread(
                read_lines,
                self.workspace,
                str(args["path"]),
                int(args.get("start", 1)),
                args.get("count"),
            )
        except (WorkspacePathError, ValueError, OSError) as exc:
            raise ToolError(str(exc)) from None
        return result.render()


FLUSH_PROMPT = (
    "[Memory flush — silent, the user does not see this turn] The conversation is about to be "
    "compacted. Before that, use memory_write to append any durable facts worth keeping to "
    "today's memory note: decisions and their reasons, preferences, exact identifiers (ids, "
    "paths, URLs, hosts), and open tasks with their progress. Write short, self-contained "
    "entries; do not repeat what memory_search shows is already saved. If there is nothing "
    f"worth keeping, answer exactly {NO_REPLY}."
)


class MemoryFlush:
    """One silent agent turn with only the memory tools, once per compaction cycle."""

    def __init__(
        self, llm: LLMProvider, tools: ToolRegistry, store: Store, timezone: str, max_rounds: int = 4
    ) -> None:
        self.llm = llm
        self.tools = tools
        self.store = store
        self.timezone = timezone
        self.max_rounds = max_rounds
        self.on_flush: Callable[[bool], None] | None = None
        """Told whether each flush succeeded (the gateway's metrics)."""

    @staticmethod
    def due(session: SessionRow) -> bool:
        """Not yet flushed in this compaction cycle (None — never flushed — is not flushed)."""
        return session.flushed_cycle is None or session.flushed_cycle < session.compaction_cycle

    async def run(self, session: SessionRow, prompt: Sequence[Message]) -> bool:
        """Run the flush; True when it completed (and the cycle is marked flushed)."""
        assert session.id is not None
        ctx = ToolContext(session_key=session.key, timezone=self.timezone)
        # Secrets never reach the flush turn (nor, through it, the notes): redacted as in
        # summaries; the stored messages keep them.
        messages = [*redact_messages(prompt), Message(role="user", content=FLUSH_PROMPT)]
        writes = 0
        try:
            for _round in range(self.max_rounds):
                completion = await self.llm.complete(messages, self.tools.specs(), stream=False)
                reply = completion.message
                if not reply.tool_calls:
                    break
                messages.append(reply)
                for call in reply.tool_calls:
                    result = await self.tools.call(call.name, call.arguments, ctx)
                    writes += call.name == "memory_write" and not result.is_error
                    messages.append(
                        Message(
                            role="tool",
                            content=result.content,
                            tool_call_id=call.id,
                            name=call.name,
                        )
                    )
        except (TimeoutError, LLMError) as exc:
            log.warning("memory flush failed for %s (cycle not marked): %s", session.key, exc)
            await self._record(session, False, writes)
            return False
        await self._record(session, True, writes)
        log.info(
            "memory flush for %s (cycle %d): %d notes written",
            session.key, session.compaction_cycle, writes,
        )
        return True

    async def _record(self, session: SessionRow, ok: bool, writes: int) -> None:
        """Store the flush (a success also marks its cycle) and tell the metrics."""
        assert session.id is not None
        await self.store.record_flush(session.id, session.compaction_cycle, ok, writes)
        if self.on_flush is not None:
            self.on_flush(ok)
