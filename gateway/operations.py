"""Operations on sessions that the CLI (and later the admin UI) share, so each has one home:
show a session, compact it, undo a compaction, compact a transcript file."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from context.compaction import CompactionResult
from context.engine import TurnContext, summary_message
from context.types import Message
from context.window import WindowResolution
from gateway.app import Gateway
from gateway.config import Config
from gateway.context_setup import Conversation
from gateway.runner import compaction_blocked_reason, describe_compaction


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
        "summary": result.summary,
        "tokens_before": result.tokens_before,
        "tokens_after": result.tokens_after,
        "identifiers": [i.value for i in result.identifiers],
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
        turn = TurnContext(
            session_key="transcript",
            system_prompt=system[0].text if system else config.gateway.system_prompt,
            history=body,
            incoming=[],
            model=gateway.llm.model,
            settings=settings,
        )
        tokens_before = counter.count_messages(body)
        result = await gateway.engine.compact(turn, runner.summarize)
        head = [Message(role="system", content=turn.system_prompt)]
        if result is None or not result.committed:
            return result_json(result, [*head, *body], tokens_before)
        prompt = [*head, summary_message(result.summary), *result.kept]
        return result_json(result, prompt, tokens_before)
    finally:
        await gateway.close()


async def compact_session(config: Config, key: str, instructions: str = "") -> dict[str, Any]:
    gateway = Gateway(config)
    await gateway.open()
    try:
        if await gateway.store.get_session(key) is None:
            raise KeyError(key)
        result = await gateway.runner.compact_session(key, instructions, reason="manual")
        return {
            "session": key,
            "committed": bool(result and result.committed),
            "message": describe_compaction(result),
            **({} if result is None else result_json(result, [], result.tokens_before)),
        }
    finally:
        await gateway.close()


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
    """The prompt view (latest summary + later messages) or, with `show_all`, every original."""
    gateway = Gateway(config)
    await gateway.open(fetch_metadata=False)
    try:
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
    finally:
        await gateway.close()


async def explain_session(
    config: Config, session_key: str, *, fetch_metadata: bool = True
) -> dict[str, Any] | None:
    """The facts `gatehouse context explain` prints: the same resolution and engine as a turn."""
    gateway = Gateway(config)
    await gateway.open(fetch_metadata=False)
    try:
        session = await gateway.store.get_session(session_key)
        if session is None or session.id is None:
            return None
        if fetch_metadata and gateway.llm.configured:
            await gateway.resolver.fetch_metadata_now()
        runner = gateway.runner
        view = await runner.view(session.id)
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
    finally:
        await gateway.close()
