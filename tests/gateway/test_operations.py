"""The operations the CLI and the admin share return typed results; their `to_json()` is the
`--json` output, so its keys (and their order) are what scripts read."""

from __future__ import annotations

import json
from pathlib import Path

from context.compaction import CompactionResult
from context.quality import QualityReport
from context.types import Identifier
from gateway.operations import (
    CompactionReport,
    SessionCompaction,
    TranscriptCompaction,
    compact,
    export_messages,
    import_messages,
    next_trigger,
    session_detail,
    session_explanation,
    session_overview,
)
from tests.conftest import RunningGateway

KEY = "agent:main:webchat:direct:tester"


def _result(committed: bool = True) -> CompactionResult:
    quality = QualityReport(
        sections_present=["Decisions"], sections_missing=[], identifiers_total=2,
        identifiers_missing=[], identifier_retention=1.0, latest_ask_reflected=True,
        semantic_retention=0.91234, compression_ratio=0.25, tokens_saved=300,
        in_ideal_range=True, passed=True,
    )
    return CompactionResult(
        summary="## Decisions\n- ship" if committed else "", first_seq=1, last_seq=4, kept=[],
        tokens_before=400, tokens_after=100,
        identifiers=[Identifier("ORD-1", "ticket"), Identifier("ORD-2", "ticket")],
        quality=quality, attempts=1, identifiers_in_summary=1,
    )


def test_a_session_compaction_keeps_its_json_shape() -> None:
    nothing = SessionCompaction("k", "Nothing to compact yet.", None)
    assert nothing.to_json() == {
        "session": "k", "committed": False, "nothing_to_compact": True,
        "message": "Nothing to compact yet.",
    }
    done = SessionCompaction("k", "Compacted.", CompactionReport.of(_result()))
    out = done.to_json()
    assert list(out) == [
        "session", "committed", "nothing_to_compact", "message", "messages", "summary",
        "tokens_before", "tokens_after", "identifiers", "identifiers_in_summary",
        "identifiers_archived", "quality",
    ]
    assert out["committed"] is True and out["messages"] == []
    assert out["identifiers"] == ["ORD-1", "ORD-2"] and out["identifiers_archived"] == 1
    assert out["quality"]["semantic_retention"] == 0.9123, "rounded like the stored report"
    assert list(out["quality"])[-4:] == [
        "model_identifier_retention", "attempts", "errors", "notes",
    ]


def test_a_transcript_compaction_reports_its_own_token_counts() -> None:
    uncommitted = TranscriptCompaction((), 400, 380, CompactionReport.of(_result(False)))
    out = uncommitted.to_json()
    assert out["committed"] is False
    assert (out["tokens_before"], out["tokens_after"]) == (400, 380)
    assert list(out)[:3] == ["messages", "committed", "summary"]
    nothing = TranscriptCompaction((), 50, 50, None, "Nothing to compact yet.")
    assert list(nothing.to_json()) == [
        "messages", "summary", "tokens_before", "tokens_after", "identifiers", "quality", "note",
    ]


def test_next_trigger_is_the_flush_then_compaction() -> None:
    assert next_trigger(100, 500, 800, flush_due=True).to_json() == {
        "name": "memory flush", "at": 500, "to_go": 400,
    }
    assert next_trigger(None, 500, 800, flush_due=False).to_go is None
    assert next_trigger(900, 500, 800, flush_due=True).to_go == 0


async def test_a_session_read_through_the_operations(
    running: RunningGateway, tmp_path: Path
) -> None:
    await running.ask("hello ORD-7")
    gateway = running.gateway

    (row,) = await session_overview(gateway)
    assert row.key == KEY and row.messages == 2 and row.prompt_tokens
    assert list(row.to_json())[:3] == ["key", "platform", "chat_type"]
    assert row.to_json()["next_trigger"] == row.next_trigger.to_json()

    detail = await session_detail(gateway, KEY)
    assert detail is not None and detail.summary is None
    first = detail.messages[0].to_json()
    assert list(first) == ["seq", "role", "content", "status", "tokens", "compacted"]
    assert first["content"] == "hello ORD-7" and first["compacted"] is False
    assert await session_detail(gateway, "agent:main:nope") is None

    facts = await session_explanation(gateway, KEY, fetch_metadata=False)
    assert facts is not None and facts.plan is not None
    out = facts.to_json()
    assert list(out)[: len(facts.plan.to_dict())] == list(facts.plan.to_dict())
    assert out["session"] == KEY and out["last_compaction"] is None

    outcome = await compact(gateway, KEY)
    assert outcome.nothing_to_compact and not outcome.committed

    exported = [m.to_openai() for m in await export_messages(gateway, KEY)]
    transcript = tmp_path / "copy.jsonl"
    transcript.write_text("".join(json.dumps(m) + "\n" for m in exported), encoding="utf-8")
    report = await import_messages(gateway, transcript)
    assert report.to_json() == {
        "session": "agent:main:import:direct:copy", "imported": 2,
        "skipped_system_messages": 0, "tokens": report.tokens,
    }
    copied = [m.to_openai() for m in await export_messages(gateway, report.session)]
    assert copied == exported
