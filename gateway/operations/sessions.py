"""Reading sessions: the list with token pressure, one session's messages and compactions,
its per-turn token history, and a search of its archived messages."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from context.budget import make_budget
from context.types import Message
from gateway.model.sizing import Conversation
from gateway.operations.common import StoreView, opened, opened_store

if TYPE_CHECKING:
    from gateway.app import Gateway
    from gateway.config import Config
    from gateway.store import CompactionRow, SessionRow, TurnRecordRow
    from memory.index import HistoryHit

# -- the sessions list: token pressure at a glance ------------------------------------------


@dataclass(frozen=True, slots=True)
class NextTrigger:
    """What a session's token pressure reaches next, at how many tokens, and how far off
    (`to_go` None: the session's prompt size is not known yet)."""

    name: str
    at: int
    to_go: int | None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "at": self.at, "to_go": self.to_go}


def next_trigger(
    tokens: int | None, flush_at: int, compact_at: int, flush_due: bool
) -> NextTrigger:
    """What the session's token pressure reaches next: the memory flush, then compaction."""
    if flush_due and (tokens is None or tokens < flush_at):
        return NextTrigger("memory flush", flush_at, None if tokens is None else flush_at - tokens)
    return NextTrigger(
        "compaction", compact_at, None if tokens is None else max(0, compact_at - tokens)
    )


def pressure_tokens(session: SessionRow, record: TurnRecordRow | None) -> int | None:
    """The latest prompt size: the provider's count when it gave one, else the gateway's."""
    if record is not None:
        return record.prompt_tokens or record.local_prompt_tokens
    return session.last_prompt_tokens


@dataclass(frozen=True, slots=True)
class PromptCache:
    """Of a session's prompt tokens (the provider's counts, turn by turn), those the provider
    read from its prompt cache: billed at a fraction of the price, and answered faster."""

    prompt_tokens: int
    cached_tokens: int | None
    """None: the endpoint never reported cached tokens for this session."""

    @classmethod
    def of(cls, session: SessionRow) -> PromptCache:
        return cls(session.tokens_in, session.tokens_cached)

    @property
    def share(self) -> float | None:
        """cached / prompt tokens; None when unknown."""
        if self.cached_tokens is None or self.prompt_tokens <= 0:
            return None
        return min(1.0, self.cached_tokens / self.prompt_tokens)

    def describe(self) -> str:
        """E.g. `92% of 1,234,567 prompt tokens` or `not reported by the endpoint`."""
        share = self.share
        if share is None:
            return "not reported by the endpoint" if self.cached_tokens is None else "none yet"
        return f"{share:.0%} of {self.prompt_tokens:,} prompt tokens"

    def to_json(self) -> dict[str, Any]:
        share = self.share
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "cached_share": None if share is None else round(share, 4),
        }


@dataclass(frozen=True, slots=True)
class SessionOverview:
    """One row of the sessions list."""

    key: str
    platform: str
    chat_type: str
    turns: int
    messages: int
    prompt_tokens: int | None
    last_prompt_tokens: int | None
    window: int
    window_source: str
    flush_at: int
    compact_at: int
    next_trigger: NextTrigger
    history_limit: int
    """0: unlimited."""
    history_limit_source: str
    compaction_cycle: int
    updated_at: str
    """ISO 8601, to the second."""
    prompt_cache: PromptCache | None = None
    """The share of the session's prompt tokens read from the provider's prompt cache."""

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "platform": self.platform,
            "chat_type": self.chat_type,
            "turns": self.turns,
            "messages": self.messages,
            "prompt_tokens": self.prompt_tokens,
            "last_prompt_tokens": self.last_prompt_tokens,
            "window": self.window,
            "window_source": self.window_source,
            "flush_at": self.flush_at,
            "compact_at": self.compact_at,
            "next_trigger": self.next_trigger.to_json(),
            "history_limit": self.history_limit,
            "history_limit_source": self.history_limit_source,
            "compaction_cycle": self.compaction_cycle,
            "updated_at": self.updated_at,
            "prompt_cache": None if self.prompt_cache is None else self.prompt_cache.to_json(),
        }


async def list_sessions(config: Config) -> list[SessionOverview]:
    async with opened_store(config) as view:
        return await session_overview(view)


async def session_overview(gateway: Gateway | StoreView) -> list[SessionOverview]:
    """Every session, most recent first, with its token pressure against the window, the next
    trigger and where its history limit comes from (for a DM, the peer's own limit)."""
    store, resolver = gateway.store, gateway.resolver
    sessions = await store.list_sessions()
    counts = await store.message_counts()
    senders = await store.latest_senders()
    records = await store.latest_turn_records()
    window = resolver.window()
    budget = make_budget(window.tokens, resolver.budget)
    out = []
    for row in sessions:
        assert row.id is not None
        tokens = pressure_tokens(row, records.get(row.id))
        peer = senders.get(row.id, row.chat_id) if row.chat_type == "direct" else None
        limit = resolver.history_limit(Conversation(row.platform, row.chat_type, row.chat_id, peer))
        out.append(SessionOverview(
            key=row.key,
            platform=row.platform,
            chat_type=row.chat_type,
            turns=row.turns,
            messages=counts.get(row.id, 0),
            prompt_tokens=tokens,
            last_prompt_tokens=row.last_prompt_tokens,
            window=window.tokens,
            window_source=window.source,
            flush_at=budget.flush_at,
            compact_at=budget.compact_at,
            next_trigger=next_trigger(
                tokens, budget.flush_at, budget.compact_at, row.flush_due()
            ),
            history_limit=limit.limit,
            history_limit_source=limit.source,
            compaction_cycle=row.compaction_cycle,
            updated_at=row.updated_at.isoformat(timespec="seconds"),
            prompt_cache=PromptCache.of(row),
        ))
    return out


# -- one session ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompactionEntry:
    """One stored compaction of a session (undone ones included)."""

    id: int | None
    first_seq: int
    last_seq: int
    tokens_before: int
    tokens_after: int
    model: str | None
    undone: bool
    created_at: str
    """ISO 8601, to the second."""
    quality: dict[str, Any] | None
    """The quality report as stored (JSON)."""
    summary: str | None = None
    """Only when every message is shown: the prompt view has the latest one on its own."""

    @classmethod
    def of(cls, row: CompactionRow, with_summary: bool) -> CompactionEntry:
        return cls(
            id=row.id,
            first_seq=row.first_seq,
            last_seq=row.last_seq,
            tokens_before=row.tokens_before,
            tokens_after=row.tokens_after,
            model=row.model,
            undone=row.undone,
            created_at=row.created_at.isoformat(timespec="seconds"),
            quality=row.quality,
            summary=row.summary if with_summary else None,
        )

    def to_json(self) -> dict[str, Any]:
        out = {
            "id": self.id,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "model": self.model,
            "undone": self.undone,
            "created_at": self.created_at,
            "quality": self.quality,
        }
        if self.summary is not None:
            out["summary"] = self.summary
        return out


@dataclass(frozen=True, slots=True)
class ShownMessage:
    """A stored message, and whether a (not undone) compaction covers it."""

    message: Message
    compacted: bool

    @property
    def status(self) -> str | None:
        """Why the model never sees it ("error", "command"...), or None."""
        status = self.message.meta.get("status")
        return None if status is None else str(status)

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.message.seq,
            **self.message.to_openai(),
            "status": self.message.meta.get("status"),
            "tokens": self.message.tokens,
            "compacted": self.compacted,
        }


@dataclass(frozen=True, slots=True)
class SessionDetail:
    """A session as `sessions show` and the admin page present it."""

    key: str
    platform: str
    chat_type: str
    turns: int
    compaction_cycle: int
    automatic_compaction: str
    """"allowed", or why automatic compaction is paused."""
    summary: str | None
    """The latest summary (sent instead of the messages it covers); None with every message."""
    compactions: tuple[CompactionEntry, ...]
    messages: tuple[ShownMessage, ...]
    prompt_cache: PromptCache | None = None
    """The share of the session's prompt tokens read from the provider's prompt cache."""

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "platform": self.platform,
            "chat_type": self.chat_type,
            "turns": self.turns,
            "compaction_cycle": self.compaction_cycle,
            "automatic_compaction": self.automatic_compaction,
            "prompt_cache": None if self.prompt_cache is None else self.prompt_cache.to_json(),
            "summary": self.summary,
            "compactions": [c.to_json() for c in self.compactions],
            "messages": [m.to_json() for m in self.messages],
        }


async def show_session(config: Config, key: str, show_all: bool = False) -> SessionDetail | None:
    async with opened_store(config) as view:
        return await session_detail(view, key, show_all)


async def session_detail(
    gateway: Gateway | StoreView, key: str, show_all: bool = False
) -> SessionDetail | None:
    """The prompt view (latest summary + later messages) or, with `show_all`, every original."""
    from gateway.turn.compaction import automatic_compaction_state

    config = gateway.config
    store = gateway.store
    row = await store.get_session(key)
    if row is None or row.id is None:
        return None
    compactions = await store.compactions(row.id)
    latest = next((c for c in reversed(compactions) if not c.undone), None)
    after = 0 if show_all or latest is None else latest.last_seq
    messages = await store.history(row.id, after_seq=after)
    covered = [(c.first_seq, c.last_seq) for c in compactions if not c.undone]
    return SessionDetail(
        key=row.key,
        platform=row.platform,
        chat_type=row.chat_type,
        turns=row.turns,
        compaction_cycle=row.compaction_cycle,
        automatic_compaction=automatic_compaction_state(
            row, config.context.max_ineffective_compactions
        ),
        summary=None if show_all or latest is None else latest.summary,
        compactions=tuple(CompactionEntry.of(c, show_all) for c in compactions),
        messages=tuple(
            ShownMessage(m, any(a <= (m.seq or 0) <= b for a, b in covered)) for m in messages
        ),
        prompt_cache=PromptCache.of(row),
    )


# -- the token chart ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TurnTokens:
    """One turn's prompt size: the provider's count, and the gateway's own."""

    at: datetime
    reply_seq: int | None
    prompt_tokens: int | None
    local_prompt_tokens: int | None
    error: str | None
    cached_tokens: int | None = None
    """Of `prompt_tokens`, what the provider read from its prompt cache (None: not reported)."""

    @property
    def tokens(self) -> int | None:
        """The provider's count when it gave one, else the gateway's."""
        return self.prompt_tokens or self.local_prompt_tokens


@dataclass(frozen=True, slots=True)
class CompactionMark:
    at: datetime
    id: int | None
    tokens_before: int
    tokens_after: int


@dataclass(frozen=True, slots=True)
class FlushMark:
    at: datetime
    cycle: int
    ok: bool
    notes: int
    """Notes written."""


@dataclass(frozen=True, slots=True)
class TokenHistory:
    """A session's prompt tokens turn by turn, with the compactions (not undone) and memory
    flushes between them, against the thresholds of its latest turn."""

    window: int
    compact_at: int
    flush_at: int
    turns: tuple[TurnTokens, ...]
    compactions: tuple[CompactionMark, ...]
    flushes: tuple[FlushMark, ...]


async def token_history(gateway: Gateway, key: str) -> TokenHistory | None:
    """Per-turn prompt tokens with the compactions and memory flushes between them."""
    store = gateway.store
    row = await store.get_session(key)
    if row is None or row.id is None:
        return None
    records = await store.turn_records(row.id)
    compactions = [c for c in await store.compactions(row.id) if not c.undone]
    flushes = await store.memory_flushes(row.id)
    window = gateway.resolver.window()
    budget = make_budget(window.tokens, gateway.resolver.budget)
    last = records[-1] if records else None
    return TokenHistory(
        window=last.window if last and last.window else window.tokens,
        compact_at=last.compact_at if last and last.compact_at else budget.compact_at,
        flush_at=last.flush_at if last and last.flush_at else budget.flush_at,
        turns=tuple(
            TurnTokens(
                r.created_at, r.reply_seq, r.prompt_tokens, r.local_prompt_tokens, r.error,
                r.cached_tokens,
            )
            for r in records
        ),
        compactions=tuple(
            CompactionMark(c.created_at, c.id, c.tokens_before, c.tokens_after)
            for c in compactions
        ),
        flushes=tuple(FlushMark(f.created_at, f.cycle, f.ok, f.notes_written) for f in flushes),
    )


# -- history search -------------------------------------------------------------------------


async def search_history(
    gateway: Gateway, key: str, query: str, limit: int = 5
) -> list[HistoryHit] | None:
    """`history_search` as the agent would run it in session `key` (its archived, compacted
    messages only); None when there is no such session."""
    row = await gateway.store.get_session(key)
    if row is None:
        return None
    return await asyncio.to_thread(gateway.memory_index.history_search, key, query, limit)


async def search_session_history(
    config: Config, key: str, query: str, limit: int = 5
) -> list[HistoryHit] | None:
    async with opened(config) as gateway:
        return await search_history(gateway, key, query, limit)
