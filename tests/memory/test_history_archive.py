"""The per-session history archive: archived messages and identifiers, `history_search`."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory.index import ArchivedMessage, MemoryIndex
from memory.text import CHUNK_CHARS

ALICE = "agent:main:webchat:direct:alice"
BOB = "agent:main:webchat:direct:bob"
T = "2026-03-01T10:{:02d}:00+00:00"


@pytest.fixture
def index(tmp_path: Path) -> Iterator[MemoryIndex]:
    (tmp_path / "ws").mkdir()
    with MemoryIndex(tmp_path / "data" / "memory-index.db", tmp_path / "ws") as idx:
        yield idx


def msg(seq: int, role: str, text: str, name: str | None = None) -> ArchivedMessage:
    return ArchivedMessage(seq, role, text, T.format(seq), name)


def alice_history(index: MemoryIndex) -> None:
    index.archive_messages(ALICE, [
        msg(1, "user", "Please look up order ORD-88123 for me, it never shipped."),
        msg(2, "assistant", "Checking ORD-88123 now.\n→ orders_get({\"id\": \"ORD-88123\"})"),
        msg(3, "tool", "status: payment_failed; order ORD-88123; card declined", "orders_get"),
        msg(4, "user", "我们需要在周五之前完成数据库迁移，别忘了 /srv/app/config.yaml"),
        msg(5, "assistant", "The deploy host is Build-07.internal; the rollout waits for QA."),
        msg(6, "user", "Also keep build-07.internal in mind — no, that was another one."),
    ])
    index.archive_identifiers(ALICE, [
        ("ORD-88123", "ticket", [1, 2, 3]),
        ("/srv/app/config.yaml", "path", [4]),
        ("Build-07.internal", "host", [5]),
        ("build-07.internal", "host", [6]),
    ])


def test_exact_identifier_finds_every_message_newest_first(index: MemoryIndex) -> None:
    alice_history(index)
    hits = index.history_search(ALICE, "ORD-88123")
    assert [(h.seq, h.via) for h in hits[:3]] == [
        (3, "identifier"), (2, "identifier"), (1, "identifier")
    ]
    assert all("ORD-88123" in h.excerpt for h in hits[:3])
    assert hits[0].role == "tool" and hits[0].name == "orders_get"
    assert hits[0].created_at == T.format(3)
    assert hits[0].score == 1.0
    # Quotes and backticks around the query are not part of it.
    for typed in ("`ORD-88123`", ' "ORD-88123" ', "'ORD-88123'"):
        assert [h.seq for h in index.history_search(ALICE, typed)][:3] == [3, 2, 1]


def test_excerpt_is_centred_on_the_identifier(index: MemoryIndex) -> None:
    text = "x" * 2_000 + " the key file is /etc/ssl/private/app.pem, keep it " + "y" * 2_000
    index.archive_messages(ALICE, [msg(9, "user", text)])
    index.archive_identifiers(ALICE, [("/etc/ssl/private/app.pem", "path", [9])])
    [hit] = index.history_search(ALICE, "/etc/ssl/private/app.pem", limit=1)
    assert hit.via == "identifier"
    assert "/etc/ssl/private/app.pem" in hit.excerpt
    assert hit.excerpt.startswith("…") and hit.excerpt.endswith("…")
    assert 250 <= len(hit.excerpt) <= 310
    middle = hit.excerpt.index("/etc/ssl")
    assert 100 < middle < 200, "the identifier sits in the middle of the excerpt"


def test_exact_case_first_then_any_case(index: MemoryIndex) -> None:
    alice_history(index)
    exact = index.history_search(ALICE, "build-07.internal")
    assert (exact[0].seq, exact[0].via, exact[0].score) == (6, "identifier", 1.0)
    assert 5 not in [h.seq for h in exact if h.via == "identifier"], "exact case wins"
    folded = index.history_search(ALICE, "BUILD-07.INTERNAL")
    assert [(h.seq, h.via) for h in folded[:2]] == [(6, "identifier"), (5, "identifier")]
    assert folded[0].score == 0.5
    ord_lower = index.history_search(ALICE, "ord-88123")
    assert [h.seq for h in ord_lower if h.via == "identifier"] == [3, 2, 1]


def test_identifiers_inside_a_question_come_first(index: MemoryIndex) -> None:
    alice_history(index)
    hits = index.history_search(ALICE, "what failed on ORD-88123?", limit=5)
    assert [h.via for h in hits[:3]] == ["identifier"] * 3
    assert [h.seq for h in hits[:3]] == [3, 2, 1]
    assert len({h.seq for h in hits}) == len(hits), "one hit per message"
    glued = index.history_search(ALICE, "配置文件/srv/app/config.yaml在哪里")
    assert (glued[0].seq, glued[0].via) == (4, "identifier")


def test_words_in_english_and_chinese(index: MemoryIndex) -> None:
    alice_history(index)
    hits = index.history_search(ALICE, "rollout waits")
    assert (hits[0].seq, hits[0].via, hits[0].role) == (5, "words", "assistant")
    assert "rollout" in hits[0].excerpt and hits[0].score > 0
    for query in ("数据库", "迁移", "周五 数据库", "库"):
        hits = index.history_search(ALICE, query)
        assert hits and hits[0].seq == 4 and hits[0].via == "words", query
    assert index.history_search(ALICE, "payment_failed")[0].seq == 3
    assert index.history_search(ALICE, "zeppelin") == []
    assert index.history_search(ALICE, "   ") == []


def test_confined_to_the_session(index: MemoryIndex) -> None:
    alice_history(index)
    index.archive_messages(BOB, [
        msg(1, "user", "bob's own order ORD-88123 and 数据库 backup plan"),
        msg(2, "user", "the rollout waits for nothing here"),
    ])
    index.archive_identifiers(BOB, [("ORD-88123", "ticket", [1])])
    bob = index.history_search(BOB, "ORD-88123", limit=20)
    assert [h.seq for h in bob] == [1] and "bob's own order" in bob[0].excerpt
    assert {h.seq for h in index.history_search(BOB, "rollout waits", limit=20)} == {2}
    assert [h.seq for h in index.history_search(BOB, "数据库", limit=20)] == [1]
    alice = index.history_search(ALICE, "ORD-88123", limit=20)
    assert all("bob" not in h.excerpt for h in alice)
    assert index.history_search(BOB, "/srv/app/config.yaml") == []
    assert index.history_search(BOB, "payment_failed") == []
    assert index.history_search("agent:main:webchat:direct:carol", "ORD-88123") == []


def test_re_archiving_is_idempotent(index: MemoryIndex, tmp_path: Path) -> None:
    alice_history(index)
    before = index.history_search(ALICE, "ORD-88123", limit=20)
    alice_history(index)
    alice_history(index)
    assert index.history_search(ALICE, "ORD-88123", limit=20) == before
    with sqlite3.connect(tmp_path / "data" / "memory-index.db") as db:
        assert db.execute("SELECT count(*) FROM transcripts").fetchone()[0] == 6
        assert db.execute("SELECT count(*) FROM history_identifiers").fetchone()[0] == 6
    # A message archived again with other text replaces the old text.
    index.archive_messages(ALICE, [msg(5, "assistant", "the deploy moved to Friday")])
    assert index.history_search(ALICE, "rollout waits") == []
    assert index.history_search(ALICE, "deploy moved")[0].seq == 5


def test_long_messages_are_chunked_under_one_seq(index: MemoryIndex) -> None:
    text = "\n\n".join(f"paragraph {i} mentions topic{i:03d}" for i in range(300))
    assert len(text) > 3 * CHUNK_CHARS
    written = index.archive_messages(ALICE, [msg(7, "tool", text, "logs")])
    assert written > 3
    hit = index.history_search(ALICE, "topic250")
    assert [h.seq for h in hit] == [7] and "topic250" in hit[0].excerpt
    assert [h.seq for h in index.history_search(ALICE, "paragraph mentions", limit=20)] == [7]


def test_limit_is_capped(index: MemoryIndex) -> None:
    index.archive_messages(ALICE, [msg(i, "user", f"ticket spam {i}") for i in range(1, 40)])
    assert len(index.history_search(ALICE, "ticket spam", limit=100)) == 20
    assert len(index.history_search(ALICE, "ticket spam", limit=0)) == 1
    assert len(index.history_search(ALICE, "ticket spam")) == 5


def test_messages_serve_the_transcripts_corpus(index: MemoryIndex, tmp_path: Path) -> None:
    alice_history(index)
    hits = index.search("rollout", corpus="transcripts")
    assert [(h.path, h.start_line, h.end_line, h.role) for h in hits] == [
        (ALICE, 5, 5, "assistant")
    ]
    assert hits[0].location == f"transcript {ALICE} #5 (assistant)"
    assert index.search("rollout") == [], "notes only by default"
    hidden = MemoryIndex(
        tmp_path / "data" / "memory-index.db", tmp_path / "ws", search_transcripts=False
    )
    with hidden:
        assert hidden.search("rollout", corpus="transcripts") == []
        assert hidden.search("rollout", corpus="all") == []
        assert hidden.history_search(ALICE, "rollout")[0].seq == 5, "history_search unaffected"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=60))
def test_any_query_is_safe(index: MemoryIndex, query: str) -> None:
    assert index.history_search(ALICE, query) == []  # nothing archived: no error, no hit


@pytest.mark.parametrize(
    "query", ['"', "ORD-88123 OR *", "NEAR(a b)", "C#", "' OR 1=1 --", "``", "body : x", "\x00"]
)
def test_hostile_queries(index: MemoryIndex, query: str) -> None:
    """FTS5 syntax, SQL and NULs are text to search, never an error or another session."""
    alice_history(index)
    index.archive_messages(BOB, [msg(9, "user", f"bob's text {query} ORD-88123 C# NEAR")])
    hits = index.history_search(ALICE, query)
    assert len(hits) <= 5
    assert all(1 <= h.seq <= 6 for h in hits), "only Alice's archived messages"


# ---- upgrading an index file from before the archive ------------------------------------

OLD_SCHEMA = """
CREATE TABLE files(path TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
    sha256 TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE chunks(id INTEGER PRIMARY KEY, path TEXT NOT NULL, start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL, body TEXT NOT NULL, short TEXT NOT NULL);
CREATE INDEX chunks_by_path ON chunks(path);
CREATE VIRTUAL TABLE chunks_fts USING fts5(
    body, short, content='chunks', content_rowid='id', tokenize='trigram');
CREATE TABLE transcripts(id INTEGER PRIMARY KEY, session_key TEXT NOT NULL,
    first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL, body TEXT NOT NULL,
    short TEXT NOT NULL);
CREATE INDEX transcripts_by_range ON transcripts(session_key, first_seq, last_seq);
CREATE VIRTUAL TABLE transcripts_fts USING fts5(
    body, short, content='transcripts', content_rowid='id', tokenize='trigram');
PRAGMA user_version=1;
"""


def old_index_file(path: Path) -> None:
    """An index file as the previous release wrote it, with one archived range per session."""
    path.parent.mkdir(parents=True)
    db = sqlite3.connect(path)
    db.executescript(OLD_SCHEMA)
    for rowid, key, first, last, body in [
        (1, ALICE, 1, 4, "USER: the locker code is 4471-KX\n\nASSISTANT: noted, 4471-KX"),
        (2, BOB, 1, 2, "USER: bob parks on level 3, locker 4471-KX too"),
    ]:
        db.execute("INSERT INTO transcripts VALUES (?, ?, ?, ?, ?, '')", (rowid, key, first, last, body))
        db.execute("INSERT INTO transcripts_fts(rowid, body, short) VALUES (?, ?, '')", (rowid, body))
    db.commit()
    db.close()


def test_an_old_index_file_keeps_its_transcripts(tmp_path: Path) -> None:
    db_path = tmp_path / "data" / "memory-index.db"
    old_index_file(db_path)
    (tmp_path / "ws").mkdir()
    with MemoryIndex(db_path, tmp_path / "ws") as index:
        hits = index.search("4471-KX", corpus="transcripts")
        assert {(h.path, h.start_line, h.end_line) for h in hits} == {(ALICE, 1, 4), (BOB, 1, 2)}
        assert hits[0].location.endswith(("#1-4", "#1-2"))
        # The old ranges answer history_search by words, for their own session only.
        [old] = index.history_search(ALICE, "4471-KX")
        assert (old.seq, old.last_seq, old.role, old.via) == (1, 4, "transcript", "words")
        assert "bob" not in old.excerpt
        # New archiving works on the upgraded file.
        index.archive_messages(ALICE, [msg(5, "user", "new message about 4471-KX")])
        index.archive_identifiers(ALICE, [("4471-KX", "ticket", [5])])
        assert [(h.seq, h.via) for h in index.history_search(ALICE, "4471-KX")] == [
            (5, "identifier"), (1, "words")
        ]
        # An identifier recorded for seqs only the old range holds is shown from that range,
        # once.
        index.archive_identifiers(ALICE, [("4471-KX", "ticket", [2, 3])])
        hits2 = index.history_search(ALICE, "4471-KX")
        assert [(h.seq, h.last_seq, h.via, h.role) for h in hits2] == [
            (5, None, "identifier", "user"), (1, 4, "identifier", "transcript")
        ]
        # add_transcript still works for its callers.
        assert index.add_transcript(BOB, 3, 4, "USER: bob's later zebracorn") == 1
        assert index.search("zebracorn", corpus="transcripts")[0].path == BOB
    with sqlite3.connect(db_path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 1, "older builds can open it"
    # Reopening the upgraded file changes nothing.
    with MemoryIndex(db_path, tmp_path / "ws") as again:
        assert len(again.search("4471-KX", corpus="transcripts", limit=10)) == 3
        assert again.history_search(BOB, "zebracorn")[0].seq == 3


def test_messages_archived_per_message_replace_an_old_range_they_cover(tmp_path: Path) -> None:
    db_path = tmp_path / "data" / "memory-index.db"
    old_index_file(db_path)
    (tmp_path / "ws").mkdir()
    with MemoryIndex(db_path, tmp_path / "ws") as index:
        # `sessions uncompact` then a compaction again: the same messages, now one by one.
        index.archive_messages(ALICE, [
            msg(1, "user", "the locker code is 4471-KX"),
            msg(2, "assistant", "noted, 4471-KX"),
            msg(3, "user", "thanks"),
            msg(4, "assistant", "you're welcome"),
        ])
        hits = index.search("4471-KX", corpus="transcripts", limit=10)
        assert sorted((h.path, h.start_line, h.end_line) for h in hits) == [
            (ALICE, 1, 1), (ALICE, 2, 2), (BOB, 1, 2)
        ]


def test_unknown_layout_keeps_the_archive(tmp_path: Path) -> None:
    db_path = tmp_path / "data" / "memory-index.db"
    (tmp_path / "ws").mkdir()
    with MemoryIndex(db_path, tmp_path / "ws") as index:
        alice_history(index)
    with sqlite3.connect(db_path) as db:
        db.execute("PRAGMA user_version=7")
    with MemoryIndex(db_path, tmp_path / "ws") as index:
        assert [h.seq for h in index.history_search(ALICE, "ORD-88123")][:3] == [3, 2, 1]
