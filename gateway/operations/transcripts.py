"""Transcript files (OpenAI-format JSONL): compact one as a live turn would, export a session
to one, import one as a new session."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from context.engine import TurnContext
from context.types import Message
from context.window import WindowResolution
from gateway.app import Gateway
from gateway.config import Config
from gateway.inbound.session_keys import encode_part
from gateway.model.sizing import Conversation
from gateway.operations.common import opened
from gateway.operations.compaction import CompactionReport
from gateway.store import SessionInfo
from gateway.turn.runner import HIDDEN_STATUSES, describe_compaction


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


@dataclass(frozen=True, slots=True)
class TranscriptCompaction:
    """A compacted transcript: the prompt the next model call would carry, and its size before
    and after. Without a report nothing was compacted, and `note` says why."""

    prompt: tuple[Message, ...]
    tokens_before: int
    tokens_after: int
    report: CompactionReport | None
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        messages = [m.to_openai() for m in self.prompt]
        if self.report is None:
            return {
                "messages": messages,
                "summary": None,
                "tokens_before": self.tokens_before,
                "tokens_after": self.tokens_after,
                "identifiers": [],
                "quality": None,
                "note": self.note,
            }
        out = {"messages": messages, **self.report.to_json()}
        out.update(tokens_before=self.tokens_before, tokens_after=self.tokens_after)
        return out


async def compact_transcript(
    config: Config, path: Path, window: int | None = None
) -> TranscriptCompaction:
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
        # The transcript's last turn (from its last ask) is the turn in progress, as a live
        # turn's own messages and tool rounds are: its ask is pinned, its rounds budgeted.
        split = _last_ask(body)
        turn = TurnContext(
            session_key="transcript",
            system_prompt=f"{base_prompt}\n\n{red_lines}" if red_lines else base_prompt,
            history=body[:split],
            incoming=body[split:],
            model=gateway.llm.model,
            settings=replace(settings, tools_tokens=runner.tools_tokens()),
            compaction_refresh=runner.refresh_block(),
        )
        # The whole transcript with the system prompt and the tool schemas: what the model
        # would be sent without compaction (the plan's own totals stop counting past the window).
        whole = round(
            (counter.count_message(Message(role="system", content=turn.system_prompt))
             + runner.tools_tokens() + sum(m.tokens or 0 for m in body))
            * settings.calibration_ratio
        )
        result = await gateway.engine.compact(turn, runner.summarize)
        if result is None or not result.committed:
            plan = gateway.engine.assemble(turn)
            tokens = plan.tokens
            after = ((tokens.prompt or 0) if tokens else 0) or whole
            if result is None:
                return TranscriptCompaction(
                    tuple(plan.messages), whole, after, None, describe_compaction(None)
                )
            return TranscriptCompaction(
                tuple(plan.messages), whole, after, CompactionReport.of(result)
            )
        return TranscriptCompaction(
            result.prompt, whole, result.tokens_after, CompactionReport.of(result)
        )
    finally:
        await gateway.close()


def _last_ask(messages: list[Message]) -> int:
    """Where the last turn starts: its ask (the user messages before its first reply)."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            while i > 0 and messages[i - 1].role == "user":
                i -= 1
            return i
    return len(messages)


async def export_messages(gateway: Gateway, key: str) -> list[Message]:
    """Every stored message of the conversation, compacted ones included (error notices and
    `/compact` commands, which the model never sees, are left out). KeyError: no such
    session."""
    row = await gateway.store.get_session(key)
    if row is None or row.id is None:
        raise KeyError(key)
    history = await gateway.store.history(row.id)
    return [m for m in history if m.meta.get("status") not in HIDDEN_STATUSES]


async def export_session(config: Config, key: str) -> list[Message]:
    async with opened(config) as gateway:
        return await export_messages(gateway, key)


def import_key(agent: str, path: Path) -> str:
    """The default key for an imported transcript: `agent:<agent>:import:direct:<file stem>`."""
    return f"agent:{encode_part(agent)}:import:direct:{encode_part(path.stem)}"


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What an import stored: the session, its messages and their tokens."""

    session: str
    imported: int
    skipped_system_messages: int
    """The transcript's system prompts: the gateway's own prompt is used instead."""
    tokens: int

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "imported": self.imported,
            "skipped_system_messages": self.skipped_system_messages,
            "tokens": self.tokens,
        }


async def import_messages(
    gateway: Gateway,
    path: Path,
    key: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    batch: int = 200,
) -> ImportReport:
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
    return ImportReport(key, done, len(system), tokens)


async def import_session(
    config: Config, path: Path, key: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ImportReport:
    async with opened(config) as gateway:
        return await import_messages(gateway, path, key, progress)
