"""What compaction and resets archive for `history_search`: outcomes, redaction, identifiers."""

from __future__ import annotations

from datetime import UTC, datetime

from context.engine import archive_identifiers
from context.salience import RankedIdentifier
from context.types import Identifier, Message, ToolCall
from gateway.turn.archive import archive_entries

KEY = "sk-" + "proj-" + "Q7fZ2kLm9XwR4tYp8VbN3cHd6JgS1aEu5"
CALL = ToolCall(id="c1", name="shell", arguments='{"cmd": "make deploy"}')
COVERED = [
    Message(role="user", content=f"deploy to db01.internal.example.com with {KEY}", seq=1,
            meta={"created_at": datetime(2024, 5, 1, 9, 30, tzinfo=UTC)}),
    Message(role="assistant", tool_calls=(CALL,), seq=2),
    Message(role="tool", content="make: *** [deploy] Error 2", tool_call_id="c1", name="shell",
            seq=3, meta={"tool_error": True}),
]


def test_each_message_is_archived_with_its_outcome_and_no_secret() -> None:
    archived, _ = archive_entries(COVERED, 3, (), archive_identifiers)
    assert [(a.seq, a.role) for a in archived] == [(1, "user"), (2, "assistant"), (3, "tool")]
    user, call, result = archived
    assert KEY not in user.text and "[REDACTED" in user.text
    assert user.created_at == "2024-05-01T09:30:00+00:00"
    assert call.text == '→ shell({"cmd": "make deploy"}) [failed]'
    assert result.text.startswith("[failed]") and result.name == "shell"


def test_without_a_ranking_identifiers_come_from_the_archived_texts() -> None:
    _, found = archive_entries(COVERED, 3, (), archive_identifiers)
    assert ("db01.internal.example.com", "host", [1]) in found
    assert all(KEY not in value for value, _kind, _seqs in found)


def test_a_ranking_is_used_as_is_up_to_the_last_covered_seq() -> None:
    ranked = (
        RankedIdentifier(Identifier("db01", "host"), (1, 5), 1.0, ()),
        RankedIdentifier(Identifier("[REDACTED:key]", "secret", secret=True), (1,), 1.0, ()),
        RankedIdentifier(Identifier("later", "id"), (7,), 1.0, ()),
    )

    def never(text: str) -> list[Identifier]:
        raise AssertionError("the ranking is enough")

    _, found = archive_entries(COVERED, 3, ranked, never)
    assert found == [("db01", "host", [1])]
