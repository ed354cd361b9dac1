"""The agent's `history_search` tool: this conversation's earlier, compacted messages.

A compaction's summary names only the most salient identifiers; every message it covered is
archived (secrets redacted) in the memory index with the identifiers found in it, so an order
number, a path or a URL from hours ago is one exact lookup away. The lookup is confined to the
calling session: another conversation's messages are never searched, whatever the query.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from context.compaction import ARCHIVE_TOOL
from gateway.tools.registry import Tool, ToolContext
from memory.index import HISTORY_LIMIT, HistoryHit, MemoryIndex

NO_MATCHES = "no matches in this conversation's archived messages"
DEFAULT_LIMIT = 5


def when(created_at: str | None, timezone: str) -> str:
    """An archived message's time for a reader: `YYYY-MM-DD HH:MM` in `timezone`."""
    if not created_at:
        return "time unknown"
    try:
        moment = datetime.fromisoformat(created_at)
    except ValueError:
        return created_at
    if moment.tzinfo is not None:
        try:
            moment = moment.astimezone(ZoneInfo(timezone))
        except (ZoneInfoNotFoundError, ValueError):
            pass
    return moment.strftime("%Y-%m-%d %H:%M")


def hit_heading(hit: HistoryHit, timezone: str) -> str:
    """`seq N · <time> · <role> (identifier|words)`; a tool result names its tool."""
    seq = f"seq {hit.seq}" if hit.last_seq is None else f"seq {hit.seq}-{hit.last_seq}"
    role = f"{hit.role} {hit.name}" if hit.role == "tool" and hit.name else hit.role
    return f"{seq} · {when(hit.created_at, timezone)} · {role} ({hit.via})"


def render_hits(hits: list[HistoryHit], timezone: str) -> str:
    if not hits:
        return NO_MATCHES
    return "\n\n".join(f"{hit_heading(h, timezone)}\n{h.excerpt}" for h in hits)


class HistoryTools:
    """`history_search` over one memory index's per-session archive."""

    def __init__(self, index: MemoryIndex) -> None:
        self.index = index

    def tools(self) -> list[Tool]:
        return [
            Tool(
                ARCHIVE_TOOL,
                "Search this conversation's earlier messages that were compacted out of the "
                "context (the summary lists only the most salient identifiers). Give an exact "
                "identifier (order id, path, URL, host, hash) to get every message it appears "
                "in, newest first, or a few words (Chinese and Japanese too). Returns each "
                "message's seq, time, role and an excerpt; secrets appear redacted.",
                {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "minLength": 1},
                        "limit": {"type": "integer", "minimum": 1, "maximum": HISTORY_LIMIT},
                    },
                    "required": ["query"],
                    "additionalProperties": False,
                },
                self._search,
            )
        ]

    async def _search(self, args: dict[str, Any], ctx: ToolContext) -> str:
        hits = await asyncio.to_thread(
            self.index.history_search,
            ctx.session_key,
            str(args["query"]),
            int(args.get("limit", DEFAULT_LIMIT)),
        )
        return render_hits(hits, ctx.timezone)
