"""Compacting a session now, every session, or undoing the last compaction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from context.compaction import CompactionResult
from context.quality import QualityReport
from gateway.app import Gateway
from gateway.config import Config
from gateway.operations.common import opened
from gateway.turn.runner import describe_compaction


@dataclass(frozen=True, slots=True)
class CompactionReport:
    """What one compaction produced, as the operator reads it (the summary, its identifiers,
    the quality audit and how the model calls went)."""

    committed: bool
    summary: str
    tokens_before: int
    tokens_after: int
    identifiers: tuple[str, ...]
    identifiers_in_summary: int
    quality: QualityReport
    model_identifier_retention: float
    attempts: int
    errors: tuple[str, ...]
    notes: tuple[str, ...]

    @classmethod
    def of(cls, result: CompactionResult) -> CompactionReport:
        return cls(
            committed=result.committed,
            summary=result.summary,
            tokens_before=result.tokens_before,
            tokens_after=result.tokens_after,
            identifiers=tuple(i.value for i in result.identifiers),
            identifiers_in_summary=result.identifiers_in_summary,
            quality=result.quality,
            model_identifier_retention=result.model_identifier_retention,
            attempts=result.attempts,
            errors=tuple(result.errors),
            notes=tuple(result.notes),
        )

    @property
    def identifiers_archived(self) -> int:
        """Identifiers the summary does not list: one `history_search` lookup away."""
        return len(self.identifiers) - self.identifiers_in_summary

    def quality_json(self) -> dict[str, Any]:
        return {
            **self.quality.to_dict(),
            "model_identifier_retention": self.model_identifier_retention,
            "attempts": self.attempts,
            "errors": list(self.errors),
            "notes": list(self.notes),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "committed": self.committed,
            "summary": self.summary,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "identifiers": list(self.identifiers),
            "identifiers_in_summary": self.identifiers_in_summary,
            "identifiers_archived": self.identifiers_archived,
            "quality": self.quality_json(),
        }


@dataclass(frozen=True, slots=True)
class SessionCompaction:
    """The outcome of compacting one session: `message` is what the operator is told."""

    session: str
    message: str
    report: CompactionReport | None
    """None: nothing to compact yet."""

    @property
    def committed(self) -> bool:
        return self.report is not None and self.report.committed

    @property
    def nothing_to_compact(self) -> bool:
        return self.report is None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "session": self.session,
            "committed": self.committed,
            "nothing_to_compact": self.nothing_to_compact,
            "message": self.message,
        }
        if self.report is not None:
            # A session compaction shows no prompt: `messages` stays empty in this form.
            out.update(messages=[], **self.report.to_json())
        return out


async def compact(gateway: Gateway, key: str, instructions: str = "") -> SessionCompaction:
    """Compact a session now, holding its lane so no turn runs meanwhile (KeyError: no such
    session)."""
    if await gateway.store.get_session(key) is None:
        raise KeyError(key)
    async with gateway.lanes.hold(key):
        result = await gateway.runner.compact_session(key, instructions, reason="manual")
    return SessionCompaction(
        session=key,
        message=describe_compaction(result),
        report=None if result is None else CompactionReport.of(result),
    )


async def compact_session(config: Config, key: str, instructions: str = "") -> SessionCompaction:
    async with opened(config, fetch_metadata=True) as gateway:
        return await compact(gateway, key, instructions)


async def compact_all(
    config: Config,
    instructions: str = "",
    progress: Callable[[int, int, SessionCompaction], None] | None = None,
) -> list[SessionCompaction]:
    """Compact every session, one after another; `progress(done, total, outcome)` hears of
    each as it completes."""
    async with opened(config, fetch_metadata=True) as gateway:
        sessions = await gateway.store.list_sessions()
        results: list[SessionCompaction] = []
        for row in sessions:
            outcome = await compact(gateway, row.key, instructions)
            results.append(outcome)
            if progress is not None:
                progress(len(results), len(sessions), outcome)
        return results


@dataclass(frozen=True, slots=True)
class UndoneCompaction:
    id: int | None
    first_seq: int
    last_seq: int


@dataclass(frozen=True, slots=True)
class Uncompaction:
    """The outcome of undoing a session's last compaction (`undone` None: there was none)."""

    session: str
    undone: UndoneCompaction | None
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "undone": None if self.undone is None else {
                "id": self.undone.id,
                "first_seq": self.undone.first_seq,
                "last_seq": self.undone.last_seq,
            },
            "message": self.message,
        }


async def uncompact_session(config: Config, key: str) -> Uncompaction:
    """Restore the state before the last compaction (KeyError: no such session)."""
    async with opened(config) as gateway:
        if await gateway.store.get_session(key) is None:
            raise KeyError(key)
        undone = await gateway.runner.uncompact(key)
        if undone is None:
            return Uncompaction(key, None, "No compaction to undo.")
        return Uncompaction(
            key,
            UndoneCompaction(undone.id, undone.first_seq, undone.last_seq),
            f"Undid the compaction of seq {undone.first_seq}-{undone.last_seq}; the "
            "original messages are in the prompt again.",
        )
