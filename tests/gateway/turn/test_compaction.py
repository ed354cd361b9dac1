"""The compaction helpers a turn relies on: `/compact`, anti-thrash, what the user is told."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from context.compaction import CompactionResult
from context.quality import QualityReport
from context.types import Identifier
from gateway.store import CompactionRow, SessionRow
from gateway.turn.compaction import compact_command, compaction_blocked_reason, describe_compaction
from gateway.turn.history import is_reset


def test_compact_commands_and_their_instructions() -> None:
    assert compact_command("/compact") == ""
    assert compact_command("  /compact keep the deploy steps ") == "keep the deploy steps"
    assert compact_command("/compact\nfocus on db01") == "focus on db01"
    assert compact_command("/compacting") is None
    assert compact_command("please /compact") is None
    assert compact_command([{"type": "text", "text": "/compact"}]) is None


def session(**fields: object) -> SessionRow:
    return SessionRow.model_validate(
        {"key": "k", "platform": "webchat", "chat_type": "direct", "chat_id": "c", **fields}
    )


def test_a_cool_down_and_ineffective_compactions_block_automatic_compaction() -> None:
    assert compaction_blocked_reason(session(), 3) is None
    later = datetime.now(UTC) + timedelta(minutes=5)
    assert "cooling down" in (compaction_blocked_reason(session(compaction_cooldown_until=later), 3) or "")
    naive_past = (datetime.now(UTC) - timedelta(minutes=5)).replace(tzinfo=None)
    assert compaction_blocked_reason(session(compaction_cooldown_until=naive_past), 3) is None
    paused = compaction_blocked_reason(session(ineffective_compactions=3), 3)
    assert paused is not None and "paused" in paused


SECTIONS = ["Goal", "Decisions", "Open", "Identifiers", "Next"]


def result(
    summary: str, fallback: str | None = None, notes: tuple[str, ...] = (), in_summary: int = 0
) -> CompactionResult:
    quality = QualityReport(
        sections_present=SECTIONS, sections_missing=[], identifiers_total=2,
        identifiers_missing=[], identifier_retention=1.0, latest_ask_reflected=True,
        semantic_retention=1.0, compression_ratio=0.2, tokens_saved=8_000, in_ideal_range=True,
        passed=True,
    )
    return CompactionResult(
        summary=summary, first_seq=1, last_seq=9, kept=[], tokens_before=10_000,
        tokens_after=2_000, identifiers=[Identifier("db01", "host"), Identifier("c1", "id")],
        quality=quality, fallback=fallback, notes=notes, identifiers_in_summary=in_summary,
    )


def test_what_the_user_is_told() -> None:
    assert describe_compaction(None).startswith("Nothing to compact yet")
    refused = result("", fallback="none", notes=(
        "the compacted prompt would not be smaller; history kept, not compacted",
    ))
    assert describe_compaction(refused) == (
        "Not compacted: the compacted prompt would not be smaller. Nothing was lost: the "
        "conversation stays as it is."
    )
    done = result("## Goal\ndb01", in_summary=1)
    assert describe_compaction(done) == (
        "Compacted the conversation: 10,000 → 2,000 tokens, 1 identifiers in the summary, 1 "
        "more archived for history_search. Quality: sections 5/5."
    )


def test_a_reset_row_is_told_from_a_summary() -> None:
    reset = CompactionRow(session_id=1, first_seq=1, last_seq=4, summary="[reset]",
                          tokens_before=10, tokens_after=0, quality={"reason": "reset"})
    summary = CompactionRow(session_id=1, first_seq=1, last_seq=4, summary="## Goal",
                            tokens_before=10, tokens_after=5, quality={"reason": "overflow"})
    assert is_reset(reset) and not is_reset(summary) and not is_reset(None)
