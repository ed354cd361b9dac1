"""Operations on sessions that the CLI and the admin UI share, so each has one home: list
sessions with their token pressure, show a session, explain its limits, compact it, undo a
compaction, compact a transcript file, export and import sessions, search a session's
archived (compacted) messages.

Each operation takes an open `Gateway` (the admin UI passes the live one); the `*_session`
wrappers open a gateway from a config for one CLI command.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from context.budget import make_budget
from context.compaction import CompactionResult
from context.engine import TurnContext
from context.types import Message
from context.window import WindowResolution
from gateway.app import Gateway
from gateway.config import Config
from gateway.inbound.session_keys import encode_part
from gateway.model.sizing import Conversation
from gateway.store import SessionInfo, SessionRow, TurnRecordRow
from gateway.tools.memory import MemoryFlush
from gateway.turn.runner import HIDDEN_STATUSES, compaction_blocked_reason, describe_compaction


class TranscriptError(ValueError):
    """A transcript file that is not OpenAI-format JSONL, with the line that is wrong."""


def read_transcript(path: Path) -> list[Message]:
    """One OpenAI chat message per line: role, content, tool_calls, tool_call_id, name."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TranscriptError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise TranscriptError(f"{path}: not valid UTF-8") from None
    messages: list[Message] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TranscriptError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        if not isinstance(raw, dict):
            raise TranscriptError(f"{path}:{number}: expected a JSON object")
        try:
            message = Message.from_openai(raw)
        except (ValueError, TypeError, AttributeError) as exc:
            raise TranscriptError(f"{path}:{number}: {exc}") from None
        messages.append(replace(message, seq=len(messages) + 1))
    if not messages:
        raise TranscriptError(f"{path}: no messages")
    return messages


def result_json(
    result: CompactionResult | None, prompt: list[Message], tokens_before: int
) -> dict[str, Any]:
    if result is None:
        return {
            "messages": [m.to_openai() for m in prompt],
            "summary": None,
            "tokens_before": tokens_before,
            "tokens_after": tokens_before,
            "identifiers": [],
            "quality": None,
            "note": describe_compaction(None),
        }
    return {
        "messages": [m.to_openai() for m in prompt],
        "committed": result.committed,
        "summary": result.summary,
        "tokens_before": result.tokens_before,
        "tokens_after": result.tokens_after,
        "identifiers": [i.value for i in result.identifiers],
        "identifiers_in_summary": result.identifiers_in_summary,
        "identifiers_archived": len(result.identifiers) - result.identifiers_in_summary,
        "quality": {
            **result.quality.to_dict(),
            "model_identifier_retention": result.model_identifier_retention,
            "attempts": result.attempts,
            "errors": list(result.errors),
            "notes": list(result.notes),
        },
    }


async def compact_transcript(
    config: Config, path: Path, window: int | None = None
) -> dict[str, Any]:
    """Compact an OpenAI-format JSONL transcript through the live compaction code path."""
    messages = read_transcript(path)
    gateway = Gateway(config)
    await gateway.open(fetch_metadata=window is None)
    try:
        runner = gateway.runner
        if window is None and gateway.llm.configured:
            await gateway.resolver.fetch_metadata_now()
        resolved = gateway.resolver.window()
        if window is not None:
            resolved = WindowResolution(tokens=window, source="--window", model=gateway.llm.model)
        counter = gateway.resolver.counter
        system = [m for m in messages if m.role == "system"][:1]
        body = counter.ensure_counted([m for m in messages if not (system and m is system[0])])
        settings = replace(
            gateway.resolver.settings_for("transcript", Conversation("", "direct", "", None)),
            window=resolved,
            compaction=runner.compaction_settings(resolved.tokens),
        )
        # The same system prompt (with AGENTS.md's red lines), refresh block and tool schemas
        # as a live turn: what is printed is what the next model call would carry.
        base_prompt = system[0].text if system else config.gateway.system_prompt
        red_lines = runner.agents.red_lines()
        turn = TurnContext(
            session_key="transcript",
            system_prompt=f"{base_prompt}\n\n{red_lines}" if red_lines else base_prompt,
            history=body,
            incoming=[],
            model=gateway.llm.model,
            settings=replace(settings, tools_tokens=runner.tools_tokens()),
            compaction_refresh=runner.refresh_block(),
        )
        result = await gateway.engine.compact(turn, runner.summarize)
        if result is None or not result.committed:
            plan = gateway.engine.assemble(turn)
            before = int(plan.facts.get("tokens", {}).get("calibrated_total", 0)) or (
                counter.count_messages(body)
            )
            out = result_json(result, plan.messages, before)
            out["tokens_after"] = int(plan.facts.get("tokens", {}).get("prompt", 0)) or before
            return out
        return result_json(result, list(result.prompt), result.tokens_before)
    finally:
        await gateway.close()


@contextlib.asynccontextmanager
async def opened(config: Config, *, fetch_metadata: bool = False) -> AsyncIterator[Gateway]:
    """A gateway with its store and workspace open, for one CLI command."""
    gateway = Gateway(config)
    await gateway.open(fetch_metadata=fetch_metadata)
    try:
        yield gateway
    finally:
        await gateway.close()


async def compact(gateway: Gateway, key: str, instructions: str = "") -> dict[str, Any]:
    """Compact a session now, holding its lane so no turn runs meanwhile (KeyError: no such
    session)."""
    if await gateway.store.get_session(key) is None:
        raise KeyError(key)
    async with gateway.lanes.hold(key):
        result = await gateway.runner.compact_session(key, instructions, reason="manual")
    return {
        "session": key,
        "committed": bool(result and result.committed),
        "nothing_to_compact": result is None,
        "message": describe_compaction(result),
        **({} if result is None else result_json(result, [], result.tokens_before)),
    }


async def compact_session(config: Config, key: str, instructions: str = "") -> dict[str, Any]:
    async with opened(config, fetch_metadata=True) as gateway:
        return await compact(gateway, key, instructions)


async def compact_all(
    config: Config,
    instructions: str = "",
    progress: Callable[[int, int, dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Compact every session, one after another; `progress(done, total, outcome)` hears of
    each as it completes."""
    async with opened(config, fetch_metadata=True) as gateway:
        sessions = await gateway.store.list_sessions()
        results = []
        for row in sessions:
            outcome = await compact(gateway, row.key, instructions)
            results.append(outcome)
            if progress is not None:
                progress(len(results), len(sessions), outcome)
        return results


async def uncompact_session(config: Config, key: str) -> dict[str, Any]:
    gateway = Gateway(config)
    await gateway.open(fetch_metadata=False)
    try:
        if await gateway.store.get_session(key) is None:
            raise KeyError(key)
        undone = await gateway.runner.uncompact(key)
        if undone is None:
            return {"session": key, "undone": None, "message": "No compaction to undo."}
        return {
            "session": key,
            "undone": {"id": undone.id, "first_seq": undone.first_seq, "last_seq": undone.last_seq},
            "message": (
                f"Undid the compaction of seq {undone.first_seq}-{undone.last_seq}; the "
                "original messages are in the prompt again."
            ),
        }
    finally:
        await gateway.close()


async def show_session(config: Config, key: str, show_all: bool = False) -> dict[str, Any] | None:
    async with opened(config) as gateway:
        return await session_detail(gateway, key, show_all)


async def session_detail(
    gateway: Gateway, key: str, show_all: bool = False
) -> dict[str, Any] | None:
    """The prompt view (latest summary + later messages) or, with `show_all`, every original."""
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
    return {
        "key": row.key,
        "platform": row.platform,
        "chat_type": row.chat_type,
        "turns": row.turns,
        "compaction_cycle": row.compaction_cycle,
        "automatic_compaction": compaction_blocked_reason(
            row, config.context.max_ineffective_compactions
        )
        or "allowed",
        "summary": None if show_all or latest is None else latest.summary,
        "compactions": [
            {
                "id": c.id,
                "first_seq": c.first_seq,
                "last_seq": c.last_seq,
                "tokens_before": c.tokens_before,
                "tokens_after": c.tokens_after,
                "model": c.model,
                "undone": c.undone,
                "created_at": c.created_at.isoformat(timespec="seconds"),
                "quality": c.quality,
                **({"summary": c.summary} if show_all else {}),
            }
            for c in compactions
        ],
        "messages": [
            {
                "seq": m.seq,
                **m.to_openai(),
                "status": m.meta.get("status"),
                "tokens": m.tokens,
                "compacted": any(a <= (m.seq or 0) <= b for a, b in covered),
            }
            for m in messages
        ],
    }


async def explain_session(
    config: Config, session_key: str, *, fetch_metadata: bool = True
) -> dict[str, Any] | None:
    async with opened(config) as gateway:
        return await explain(gateway, session_key, fetch_metadata=fetch_metadata)


async def explain(
    gateway: Gateway, session_key: str, *, fetch_metadata: bool = True
) -> dict[str, Any] | None:
    """The facts `gatehouse context explain` prints: the same resolution and engine as a turn."""
    config = gateway.config
    session = await gateway.store.get_session(session_key)
    if session is None or session.id is None:
        return None
    if fetch_metadata and gateway.llm.configured:
        await gateway.resolver.fetch_metadata_now()
    runner = gateway.runner
    view = await runner.view(session.id, use_cache=False)
    user_id = next(
        (str(m.meta["sender_id"]) for m in reversed(view.history)
         if m.role == "user" and m.meta.get("sender_id")),
        session.chat_id or None,
    )
    settings = runner.settings_for(session, user_id)
    plan = gateway.engine.assemble(runner.turn_context(session_key, view, 1 << 62, settings))
    compactions = await gateway.store.compactions(session.id)
    latest = next((c for c in reversed(compactions) if not c.undone), None)
    limit = settings.history_limit
    facts = dict(plan.facts)
    facts.update(
        session=session_key,
        platform=session.platform,
        chat_type=session.chat_type,
        stored_messages=await gateway.store.message_count(session.id),
        messages_after_summary=len(view.history),
        messages_in_prompt=len(plan.messages),
        last_reported_prompt_tokens=session.last_prompt_tokens,
        calibration=gateway.resolver.calibration(session_key, session.token_ratio).describe(),
        history_limit_text="unlimited" if limit.unlimited else f"last {limit.limit:,} user turns",
        history_limit_order=(
            "applied before compaction: turns outside the limit are neither sent nor summarized"
        ),
        notes=list(plan.notes),
        window_too_small=settings.window.too_small,
        automatic_compaction=compaction_blocked_reason(
            session, config.context.max_ineffective_compactions
        )
        or "allowed",
        compactions=len([c for c in compactions if not c.undone]),
        last_compaction=None
        if latest is None
        else {
            "id": latest.id,
            "covers": [latest.first_seq, latest.last_seq],
            "tokens_before": latest.tokens_before,
            "tokens_after": latest.tokens_after,
            "quality": latest.quality,
        },
    )
    return facts


# -- the sessions list: token pressure at a glance ------------------------------------------


def next_trigger(
    tokens: int | None, flush_at: int, compact_at: int, flush_due: bool
) -> dict[str, Any]:
    """What the session's token pressure reaches next: the memory flush, then compaction."""
    if flush_due and (tokens is None or tokens < flush_at):
        return {"name": "memory flush", "at": flush_at,
                "to_go": None if tokens is None else flush_at - tokens}
    return {"name": "compaction", "at": compact_at,
            "to_go": None if tokens is None else max(0, compact_at - tokens)}


def pressure_tokens(session: SessionRow, record: TurnRecordRow | None) -> int | None:
    """The latest prompt size: the provider's count when it gave one, else the gateway's."""
    if record is not None:
        return record.prompt_tokens or record.local_prompt_tokens
    return session.last_prompt_tokens


async def list_sessions(config: Config) -> list[dict[str, Any]]:
    async with opened(config) as gateway:
        return await session_overview(gateway)


async def session_overview(gateway: Gateway) -> list[dict[str, Any]]:
    """Every session, most recent first, with its token pressure against the window, the next
    trigger and where its history limit comes from (for a DM, the peer's own limit)."""
    store, resolver = gateway.store, gateway.resolver
    sessions = await store.list_sessions()
    counts = await store.message_counts()
    records = await store.latest_turn_records()
    window = resolver.window()
    budget = make_budget(window.tokens, resolver.budget)
    out = []
    for row in sessions:
        assert row.id is not None
        tokens = pressure_tokens(row, records.get(row.id))
        peer = row.chat_id if row.chat_type == "direct" else None
        limit = resolver.history_limit(Conversation(row.platform, row.chat_type, row.chat_id, peer))
        out.append(
            {
                "key": row.key,
                "platform": row.platform,
                "chat_type": row.chat_type,
                "turns": row.turns,
                "messages": counts.get(row.id, 0),
                "prompt_tokens": tokens,
                "last_prompt_tokens": row.last_prompt_tokens,
                "window": window.tokens,
                "window_source": window.source,
                "flush_at": budget.flush_at,
                "compact_at": budget.compact_at,
                "next_trigger": next_trigger(
                    tokens, budget.flush_at, budget.compact_at, MemoryFlush.due(row)
                ),
                "history_limit": limit.limit,
                "history_limit_source": limit.source,
                "compaction_cycle": row.compaction_cycle,
                "updated_at": row.updated_at.isoformat(timespec="seconds"),
            }
        )
    return out


async def token_history(gateway: Gateway, key: str) -> dict[str, Any] | None:
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
    return {
        "window": records[-1].window if records and records[-1].window else window.tokens,
        "compact_at": records[-1].compact_at if records and records[-1].compact_at
        else budget.compact_at,
        "flush_at": records[-1].flush_at if records and records[-1].flush_at else budget.flush_at,
        "turns": [
            {
                "at": r.created_at,
                "reply_seq": r.reply_seq,
                "prompt_tokens": r.prompt_tokens,
                "local_prompt_tokens": r.local_prompt_tokens,
                "tokens": r.prompt_tokens or r.local_prompt_tokens,
                "error": r.error,
            }
            for r in records
        ],
        "compactions": [
            {"at": c.created_at, "id": c.id, "tokens_before": c.tokens_before,
             "tokens_after": c.tokens_after}
            for c in compactions
        ],
        "flushes": [
            {"at": f.created_at, "cycle": f.cycle, "ok": f.ok, "notes": f.notes_written}
            for f in flushes
        ],
    }


# -- export and import ----------------------------------------------------------------------


async def export_messages(gateway: Gateway, key: str) -> list[dict[str, Any]]:
    """Every stored message of the conversation in OpenAI format, compacted ones included
    (error notices and `/compact` commands, which the model never sees, are left out).
    KeyError: no such session."""
    row = await gateway.store.get_session(key)
    if row is None or row.id is None:
        raise KeyError(key)
    history = await gateway.store.history(row.id)
    return [m.to_openai() for m in history if m.meta.get("status") not in HIDDEN_STATUSES]


async def export_session(config: Config, key: str) -> list[dict[str, Any]]:
    async with opened(config) as gateway:
        return await export_messages(gateway, key)


def import_key(agent: str, path: Path) -> str:
    """The default key for an imported transcript: `agent:<agent>:import:direct:<file stem>`."""
    return f"agent:{encode_part(agent)}:import:direct:{encode_part(path.stem)}"


async def import_messages(
    gateway: Gateway,
    path: Path,
    key: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    batch: int = 200,
) -> dict[str, Any]:
    """Store an OpenAI-format JSONL transcript as a new session (counted, in batches).

    A transcript is validated whole before anything is written (TranscriptError), and an
    existing session with messages is never appended to (ValueError)."""
    messages = read_transcript(path)
    system = [m for m in messages if m.role == "system"]
    body = [m for m in messages if m.role != "system"]
    key = key or import_key(gateway.config.gateway.agent, path)
    existing = await gateway.store.get_session(key)
    if existing is not None and existing.id is not None:
        count = await gateway.store.message_count(existing.id)
        if count:
            raise ValueError(
                f"session {key!r} already has {count:,} messages; import under another --key"
            )
    info = SessionInfo(
        key=key, agent=gateway.config.gateway.agent, platform="import", chat_type="direct",
        chat_id=path.stem,
    )
    session = await gateway.store.ensure_session(info)
    assert session.id is not None
    counter = gateway.resolver.counter
    done = tokens = 0
    for start in range(0, len(body), batch):
        part = counter.ensure_counted(body[start : start + batch])
        await gateway.store.append_messages(session.id, part)
        done += len(part)
        tokens += sum(m.tokens or 0 for m in part)
        if progress is not None:
            progress(done, len(body))
    return {
        "session": key,
        "imported": done,
        "skipped_system_messages": len(system),
        "tokens": tokens,
    }


async def import_session(
    config: Config, path: Path, key: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    async with opened(config) as gateway:
        return await import_messages(gateway, path, key, progress)


async def search_history(
    gateway: Gateway, key: str, query: str, limit: int = 5
) -> list[dict[str, Any]] | None:
    """`history_search` as the agent would run it in session `key` (its archived, compacted
    messages only); None when there is no such session."""
    row = await gateway.store.get_session(key)
    if row is None:
        return None
    hits = await asyncio.to_thread(gateway.memory_index.history_search, key, query, limit)
    return [asdict(h) for h in hits]


async def search_session_history(
    config: Config, key: str, query: str, limit: int = 5
) -> list[dict[str, Any]] | None:
    async with opened(config) as gateway:
        return await search_history(gateway, key, query, limit)
