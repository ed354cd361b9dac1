"""The agent's memory tools (`memory_write`, `memory_search`, `memory_get`) and the silent
pre-compaction memory flush turn.

The tools wrap the `memory` package (files and the FTS5 index, synchronous) in threads. Every
path is confined to the workspace by that package; MEMORY.md and AGENTS.md are read-only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from context.compaction import ARCHIVE_TOOL, redact_messages, salient_sentences
from context.identifiers import inline_code
from context.salience import rank_identifiers
from context.secrets import redact_secrets
from context.types import Message
from gateway.model.llm import LLMError, LLMProvider
from gateway.store import SessionRow, Store
from gateway.tools.registry import Tool, ToolContext, ToolError, ToolRegistry
from gateway.tools.scope import Caller, Scopes, guest
from memory.dedupe import Duplicate, find_duplicate
from memory.index import Corpus, Hit, MemoryIndex, SearchMode
from memory.notes import MAX_ENTRY_CHARS, LinesResult, NoteEntry, append_note, read_lines
from memory.visibility import Visibility, visible_lines
from memory.workspace import (
    WorkspacePathError,
    relative_name,
    resolve_in_workspace,
    split_lines,
)

log = logging.getLogger(__name__)

NO_REPLY = "NO_REPLY"

CORPORA: dict[str, Corpus] = {"all": "all", "notes": "notes", "history": "transcripts"}
"""memory_search's `corpus` argument → the index's corpus."""
ARCHIVE_TOOL_HINT = f"{ARCHIVE_TOOL} shows the messages around it"


def cite(hit: Hit, timezone: str) -> str:
    """Where a hit comes from, in the form the agent can follow up: a note's `path:lines`
    (memory_get takes it) or an archived message's seq in this conversation."""
    if hit.corpus == "notes":
        return hit.location
    seq = (
        f"seq {hit.start_line}" if hit.start_line == hit.end_line
        else f"seq {hit.start_line}-{hit.end_line}"
    )
    role = f", {hit.role}" if hit.role else ""
    return f"earlier in this conversation ({seq}{role}; {ARCHIVE_TOOL_HINT})"

class MemoryTools:
    """The three memory tools bound to one workspace and index."""

    def __init__(
        self, workspace: Path, index: MemoryIndex, timezone: str,
        search_mode: SearchMode = "hybrid",
        half_life_days: float | None = None,
    ) -> None:
        self.workspace = workspace
        self.index = index
        self.timezone = timezone
        self.search_mode = search_mode
        """How memory_search ranks when the index has an encoder (BM25 without one)."""
        self.half_life_days = half_life_days
        """Temporal decay of the scores ([memory] half_life_days; None: none)."""

    def tools(self) -> list[Tool]:
        return [
            Tool(
                "memory_write",
                "Append a durable note (decision, preference, identifier, open task) to today's "
                "memory file memory/YYYY-MM-DD.md. Append-only; attributed to this conversation "
                "and its person, who alone find it again (an owner may set shared: true for a "
                "note everyone may see).",
                {
                    "type": "object",
                    "properties": {
                        "text": {"type": "string", "minLength": 1},
                        "shared": {"type": "boolean"},
                    },
                    "required": ["text"],
                    "additionalProperties": False,
                },
                self._write,
            ),
            Tool(
                "memory_search",
                "Search what you remember: the workspace notes (memory/*.md, MEMORY.md) and "
                "this conversation's earlier messages that were compacted out of the context, "
                "by meaning and by keyword (any language; an exact identifier such as an order "
                "id, path or host is matched verbatim and listed first). corpus: all "
                "(default), notes, or history (this conversation only). Returns note paths "
                "with line ranges (for memory_get) or message seqs, with snippets.",
                {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "minLength": 1},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 20},
                        "corpus": {"type": "string", "enum": list(CORPORA)},
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
        caller = ctx.who
        shared = bool(args.get("shared", False))
        if shared and not caller.owner:
            raise ToolError(
                "only the gateway's owners can share a note with everyone; write it without "
                "shared (it stays this conversation's)"
            )
        text, secrets = redact_secrets(str(args["text"]))

        def write() -> Duplicate | NoteEntry:
            self.index.refresh()  # a hand edit since the last search counts as said
            earlier = find_duplicate(self.index, self.workspace, text, caller.notes)
            if earlier is not None:
                return earlier
            return append_note(
                self.workspace, text, session_key=ctx.session_key, tz=self.timezone,
                person=caller.person, shared=shared,
            )

        try:
            entry = await asyncio.to_thread(write)
        except (ValueError, OSError) as exc:
            raise ToolError(str(exc)) from None
        if isinstance(entry, Duplicate):
            log.info(
                "memory note from %s skipped: already in %s", ctx.session_key, entry.describe()
            )
            return f"not saved again: {entry.describe()} already holds it"
        redacted = f"; {len(secrets)} secret(s) redacted" if secrets else ""
        return f"saved to {entry.path} (lines {entry.start_line}-{entry.end_line}){redacted}"

    async def _search(self, args: dict[str, Any], ctx: ToolContext) -> str:
        corpus = str(args.get("corpus", "all"))
        if corpus not in CORPORA:
            raise ToolError(f"corpus must be one of {', '.join(CORPORA)}, not {corpus!r}")

        def run() -> list[Hit]:
            self.index.refresh()  # follows file changes, hand edits included
            return self.index.search(
                str(args["query"]),
                limit=int(args.get("limit", 8)),
                corpus=CORPORA[corpus],
                # No encoder (yet, or at all): BM25, without the index's fallback warning.
                mode=self.search_mode if self.index.encoder is not None else "bm25",
                # Archived messages of this conversation only: never another session's; and
                # the notes this caller may see (gateway/tools/scope.py).
                session_key=ctx.session_key,
                half_life_days=self.half_life_days,
                notes=ctx.who.notes,
            )

        hits = await asyncio.to_thread(run)
        if not hits:
            return "no matches"
        text = "\n\n".join(f"{cite(h, ctx.timezone)} (score {h.score:.2f})\n{h.snippet}" for h in hits)
        mode_used = hits[0].mode_used
        return text if mode_used == "bm25" else f"{text}\n\n(ranked by {mode_used} search)"

    async def _get(self, args: dict[str, Any], ctx: ToolContext) -> str:
        caller = ctx.who

        def read() -> LinesResult:
            # The canonical name (no `..`, no symlink, no case trick) is what is checked.
            shown = relative_name(
                self.workspace, resolve_in_workspace(self.workspace, str(args["path"]))
            )
            refused = caller.refuses(shown)
            if refused is not None:
                raise WorkspacePathError(refused)
            return read_lines(
                self.workspace, shown, int(args.get("start", 1)), args.get("count"),
                caller.notes,
            )

        try:
            result = await asyncio.to_thread(read)
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


AUTO_SOURCE = "automatic flush"
"""The heading mark of a note the gateway extracted itself (the model wrote none)."""
NOTE_IDENTIFIERS = 20
RECENT_NOTE_FILES = 7
"""Earlier notes an extracted note is deduplicated against: the last week's files."""


def extracted_note(messages: Sequence[Message], earlier: str) -> str | None:
    """A note quoted from the conversation itself: decisions, open TODOs, constraints, pending
    asks and the most salient identifiers, without what `earlier` notes already hold.

    For the flush whose model wrote nothing (or could not call tools): durable facts are
    saved whether or not the model cooperates. Redacted; None when nothing new is left.
    """
    said = redact_messages([m for m in messages if m.role != "system"])
    latest = next((m.text for m in reversed(said) if m.role == "user" and m.text), None)
    # What the people said or decided: the assistant's restatements ("Agreed, we will…") are
    # no decisions of theirs, so only their messages are quoted.
    found = salient_sentences([m for m in said if m.role == "user"], latest)
    ranked = rank_identifiers(said)

    def new(items: Sequence[str]) -> list[str]:
        return [i for i in dict.fromkeys(items) if i not in earlier]

    sections = [
        ("Decisions", new(found.decisions)),
        ("Open TODOs", new(found.todos)),
        ("Constraints", new(found.constraints)),
        ("Pending asks", new(found.asks[-2:])),
    ]
    ids = [
        r.value for r in ranked
        if not r.identifier.secret and "bulk tool output" not in r.reasons
    ]
    fresh_ids = [v for v in ids if v not in earlier][:NOTE_IDENTIFIERS]
    lines = [f"{title}:\n" + "\n".join(f"- {i}" for i in items) for title, items in sections if items]
    if fresh_ids:
        lines.append("Identifiers: " + ", ".join(inline_code(v) for v in fresh_ids))
    if not lines:
        return None
    note = "Quoted from the conversation (the model wrote no note).\n\n" + "\n\n".join(lines)
    return note[:MAX_ENTRY_CHARS]


@dataclass(eq=False)
class MemoryFlush:
    """One silent agent turn with only the memory tools, once per compaction cycle; when the
    model writes no note, a note extracted from the conversation itself."""

    llm: LLMProvider
    tools: ToolRegistry
    store: Store
    timezone: str
    max_rounds: int = 4
    workspace: Path | None = None
    """Where an extracted note goes (None: no extracted notes)."""
    on_flush: Callable[[bool], None] | None = None
    """Told whether each flush succeeded (the gateway's metrics)."""
    on_notes: Callable[[str, int], None] | None = None
    """Told how many notes each source wrote: ("model" | "extracted", count)."""
    scopes: Scopes | None = None
    """Whose notes the flush turn may search and write (gateway/tools/scope.py); None: a
    guest of the session."""

    @staticmethod
    def due(session: SessionRow) -> bool:
        """Not yet flushed in this compaction cycle (`SessionRow.flush_due`)."""
        return session.flush_due()

    async def run(self, session: SessionRow, prompt: Sequence[Message]) -> bool:
        """Run the flush; True when it completed (and the cycle is marked flushed)."""
        assert session.id is not None
        caller = await self._caller(session)
        ctx = ToolContext(
            session_key=session.key, timezone=self.timezone, platform=session.platform,
            chat_id=session.chat_id, chat_type=session.chat_type, caller=caller,
        )
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
            extracted = 0 if writes else await self._extract(session, prompt, caller)
            log.warning(
                "memory flush failed for %s (cycle not marked): %s; model wrote %d / extracted "
                "%d", session.key, exc, writes, extracted,
            )
            await self._record(session, False, writes + extracted, writes, extracted)
            return False
        extracted = 0 if writes else await self._extract(session, prompt, caller)
        await self._record(session, True, writes + extracted, writes, extracted)
        log.info(
            "memory flush for %s (cycle %d): model wrote %d / extracted %d",
            session.key, session.compaction_cycle, writes, extracted,
        )
        return True

    async def _caller(self, session: SessionRow) -> Caller:
        """The session's person (its latest sender) as `Scopes` sees them."""
        if self.scopes is None:
            return guest(session.key)
        assert session.id is not None
        sender = (await self.store.latest_senders(session.id)).get(session.id)
        if sender is None and session.chat_type == "direct":
            sender = session.chat_id  # nobody named yet: a direct chat is its person's
        return await self.scopes.caller(session.key, session.platform, session.chat_type, sender)

    async def _extract(self, session: SessionRow, prompt: Sequence[Message], caller: Caller) -> int:
        """Write the extracted note (1) unless there is nothing new (0); never raises."""
        workspace = self.workspace
        if workspace is None:
            return 0

        def write() -> int:
            earlier = _recent_notes(workspace, caller.notes)
            note = extracted_note(prompt, earlier)
            if note is None:
                return 0
            append_note(
                workspace, note, session_key=session.key, tz=self.timezone, source=AUTO_SOURCE,
                person=caller.person,
            )
            return 1

        try:
            return await asyncio.to_thread(write)
        except (ValueError, OSError) as exc:
            log.warning("could not write the extracted memory note for %s: %s", session.key, exc)
            return 0

    async def _record(
        self, session: SessionRow, ok: bool, notes: int, by_model: int = 0, extracted: int = 0
    ) -> None:
        """Store the flush (a success also marks its cycle) and tell the metrics."""
        assert session.id is not None
        await self.store.record_flush(session.id, session.compaction_cycle, ok, notes)
        if self.on_flush is not None:
            self.on_flush(ok)
        if self.on_notes is not None:
            self.on_notes("model", by_model)
            self.on_notes("extracted", extracted)


def _recent_notes(workspace: Path, visibility: Visibility | None) -> str:
    """What the last week's note files show this caller, for deduplication (an entry another
    conversation holds does not make this one's note redundant; unreadable files skipped)."""
    folder = workspace / "memory"
    try:
        files = sorted(folder.glob("*.md"))[-RECENT_NOTE_FILES:]
    except OSError:
        return ""
    parts = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        parts.append("\n".join(visible_lines(split_lines(text), visibility)))
    return "\n".join(parts)
