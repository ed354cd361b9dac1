"""memory_search: FTS5 trigram + BM25, CJK, incremental refresh, hostile queries, transcripts."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory.index import MemoryIndex
from memory.notes import append_note, read_lines
from memory.text import CHUNK_CHARS, chunk_markdown, query_terms, short_tokens
from memory.workspace import ensure_workspace

OLD = time.time() - 86_400
DAY1 = """# 2025-01-30

## 09:00:00 · agent:main:telegram:direct:42
明天下午三点开项目会议，讨论部署脚本的问题。

## 10:15:00 · agent:main:telegram:direct:42
会議は金曜日に延期されました。データベースの移行は来週です。

## 11:30:00 · agent:main:webchat:u1
Alice prefers deploys on Friday; the rollback runbook is ERR-4012-runbook.md.
We use Go for the gateway and Rust for the parser.
"""
DAY2 = """# 2025-01-31

## 08:00:00 · agent:main:webchat:u1
Bob is allergic to peanuts. Order lunch from the noodle place instead.

## 09:00:00 · agent:main:webchat:u1
Going forward, the staging database lives on db-staging-02.
"""


def age(path: Path) -> None:
    """Make a file look old, as notes from earlier days are (their stat is trusted)."""
    os.utime(path, (OLD, OLD))


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    ensure_workspace(root)
    (root / "memory" / "2025-01-30.md").write_text(DAY1, encoding="utf-8")
    (root / "memory" / "2025-01-31.md").write_text(DAY2, encoding="utf-8")
    for path in [*root.glob("*.md"), *root.glob("memory/*.md")]:
        age(path)
    return root


@pytest.fixture
def index(tmp_path: Path, ws: Path) -> Iterator[MemoryIndex]:
    with MemoryIndex(tmp_path / "data" / "memory-index.db", ws) as idx:
        idx.refresh()
        yield idx


def paths(hits: list) -> list[str]:  # type: ignore[type-arg]
    return [f"{h.path}:{h.start_line}" for h in hits]


# ---- chunking --------------------------------------------------------------------------


def test_chunks_are_note_entries_with_their_lines() -> None:
    chunks = chunk_markdown(DAY1)
    assert [(c.start_line, c.end_line) for c in chunks] == [(1, 4), (6, 7), (9, 11)]
    assert chunks[0].text.startswith("# 2025-01-30\n\n## 09:00:00")  # date header joins entry 1
    assert chunks[2].text.endswith("Rust for the parser.")


def test_long_sections_are_split_and_fenced_headings_ignored() -> None:
    para = "word " * 100  # 500 chars
    text = (
        "## big\n" + "\n\n".join(para.strip() for _ in range(8)) + "\n```\n# not a heading\n```\n"
    )
    chunks = chunk_markdown(text)
    assert len(chunks) > 1
    assert all(len(c.text) <= CHUNK_CHARS for c in chunks)
    assert chunks[0].start_line == 1 and chunks[-1].end_line == len(text.splitlines())
    assert "# not a heading" in chunks[-1].text
    huge = chunk_markdown("x" * (CHUNK_CHARS * 2 + 10))
    assert [len(c.text) for c in huge] == [CHUNK_CHARS, CHUNK_CHARS, 10]
    assert {(c.start_line, c.end_line) for c in huge} == {(1, 1)}


def test_short_tokens_cover_cjk_pairs_and_short_words() -> None:
    assert short_tokens("开会议。Go is ok") == " 开会 会议 go is ok "
    assert short_tokens("nothing-short-here") == ""


def test_query_terms_strip_punctuation_and_dupes() -> None:
    assert query_terms('"deploy" Deploy, 会议。 (ERR-4012)') == ["deploy", "会议", "ERR-4012"]
    assert query_terms("  \x00 \t ") == []


# ---- search ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "line"),
    [
        ("会议", 1),  # Chinese, 2 characters: the short-token column (entry 1 + date line)
        ("部署脚本", 1),  # Chinese, 4 characters: trigram
        ("会議", 6),  # Japanese kanji, 2 characters
        ("金曜日", 6),  # Japanese, 3 characters
        ("データベース", 6),  # katakana
        ("延期", 6),
        ("ERR-4012", 9),
        ("rollback", 9),
    ],
)
def test_cjk_and_identifier_search(index: MemoryIndex, query: str, line: int) -> None:
    hits = index.search(query)
    assert hits, query
    assert (hits[0].path, hits[0].start_line) == ("memory/2025-01-30.md", line)
    assert query.lower() in hits[0].snippet.lower()


def test_two_character_cjk_does_not_match_across_punctuation(index: MemoryIndex) -> None:
    assert index.search("议，") != []  # the comma is stripped: "议" alone, found by a scan
    assert index.search("会金") == []


def test_single_cjk_character_falls_back_to_a_scan(index: MemoryIndex) -> None:
    hits = index.search("移")
    assert paths(hits) == ["memory/2025-01-30.md:6"]


def test_short_latin_words_match_whole_words(index: MemoryIndex) -> None:
    assert paths(index.search("Go")) == ["memory/2025-01-30.md:9"]  # not "Going forward"
    assert index.search("go")[0].all_terms


@pytest.mark.parametrize("query", ["apples 梨子", "apples 梨", "APPLES pears"])
def test_all_term_matches_come_before_partial_ones(tmp_path: Path, query: str) -> None:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "a.md").write_text(
        "## a\napples and 梨子 pears\n\n## b\napples apples apples apples\n\n"
        "## c\npears only 梨子 梨子\n",
        encoding="utf-8",
    )
    with MemoryIndex(tmp_path / "i.db", ws) as idx:
        idx.refresh()
        hits = idx.search(query)  # FTS (trigram + short column) and the scan path alike
        assert hits[0].start_line == 1 and hits[0].all_terms
        assert {h.start_line for h in hits[1:]} == {4, 7}
        assert not any(h.all_terms for h in hits[1:])
        assert all(h.score > 0 for h in hits)


def test_bm25_prefers_dense_short_matches(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    filler = " ".join(f"filler{i}" for i in range(150))
    (ws / "memory" / "a.md").write_text(
        f"## one\nkubernetes upgrade notes. {filler}\n\n"
        "## two\nkubernetes kubernetes kubernetes: the cluster plan.\n\n"
        f"## three\n{filler}\n",
        encoding="utf-8",
    )
    with MemoryIndex(tmp_path / "i.db", ws) as idx:
        idx.refresh()
        hits = idx.search("kubernetes")
        assert [h.start_line for h in hits] == [4, 1]
        assert hits[0].score > hits[1].score > 0
        # Scan path (single CJK char alongside) uses the same formula and ordering.
        assert [h.start_line for h in idx.search("kubernetes 猫")] == [4, 1]


def test_rare_terms_outweigh_common_ones(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    sections = [f"## s{i}\ncommon words everywhere {i}\n" for i in range(20)]
    sections[7] = "## s7\ncommon words plus zebracorn\n"
    sections[3] = "## s3\ncommon common common words\n"
    (ws / "memory" / "a.md").write_text("\n".join(sections), encoding="utf-8")
    with MemoryIndex(tmp_path / "i.db", ws) as idx:
        idx.refresh()
        hits = idx.search("common zebracorn")
        assert hits[0].start_line == sections_line(sections, 7) and hits[0].all_terms


def sections_line(sections: list[str], n: int) -> int:
    return sum(s.count("\n") + 1 for s in sections[:n]) + 1


def test_hit_lines_point_at_the_entry(index: MemoryIndex, ws: Path) -> None:
    hit = index.search("peanuts")[0]
    got = read_lines(ws, hit.path, hit.start_line, hit.end_line - hit.start_line + 1)
    assert got.lines[0] == "# 2025-01-31"  # the date line travels with the first entry
    assert got.lines[2] == "## 08:00:00 · agent:main:webchat:u1"
    assert "peanuts" in got.lines[-1]
    assert hit.location == f"memory/2025-01-31.md:{hit.start_line}-{hit.end_line}"


def test_session_keys_are_searchable(index: MemoryIndex) -> None:
    hits = index.search("webchat:u1")
    assert {h.path for h in hits} == {"memory/2025-01-30.md", "memory/2025-01-31.md"}


def test_limit_and_bad_corpus(index: MemoryIndex) -> None:
    assert len(index.search("agent", limit=2)) == 2
    assert len(index.search("agent", limit=0)) == 1
    with pytest.raises(ValueError, match="corpus"):
        index.search("x", corpus="everything")  # type: ignore[arg-type]


HOSTILE = [
    '"',
    '""',
    "'",
    "AND(",
    "OR",
    "NOT",
    "NEAR(a b, 2)",
    "*",
    "a*",
    "^start",
    "body: x",
    "{body short}: x",
    "short : x",
    "chunks_fts",
    "(((",
    ")))",
    "a AND",
    "- x",
    "+",
    ":",
    "'; DROP TABLE files; --",
    "\x00",
    "\x00abc",
    "",
    "   ",
    "\u3000",
    "🙂",
    "🙂🙂🙂",
    '"unterminated',
    "x\"y'z",
    "%",
    "_",
    "%%%",
    "\\",
    "C#",
    "c++",
    '会"议',
    "a" * 500,
    " ".join(["term"] * 100),
    "NEAR",
    "rank",
    "bm25(chunks_fts)",
]


@pytest.mark.parametrize("query", HOSTILE)
@pytest.mark.parametrize("corpus", ["notes", "all"])
def test_hostile_queries_do_not_raise(index: MemoryIndex, query: str, corpus: str) -> None:
    hits = index.search(query, corpus=corpus)  # type: ignore[arg-type]
    assert isinstance(hits, list)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.text(max_size=40))
def test_any_query_string_is_safe(index: MemoryIndex, query: str) -> None:
    assert isinstance(index.search(query, corpus="all"), list)


def test_quotes_in_terms_are_literal(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "memory").mkdir(parents=True)
    (ws / "memory" / "a.md").write_text('## q\nthe flag is --name="prod" here\n', encoding="utf-8")
    with MemoryIndex(tmp_path / "i.db", ws) as idx:
        idx.refresh()
        assert idx.search('--name="prod"')[0].start_line == 1


# ---- incremental refresh ----------------------------------------------------------------


def test_hand_edit_is_picked_up(index: MemoryIndex, ws: Path) -> None:
    path = ws / "memory" / "2025-01-31.md"
    assert index.search("peanuts") and not index.search("cashews")
    path.write_text(
        path.read_text(encoding="utf-8").replace("peanuts", "cashews"), encoding="utf-8"
    )
    stats = index.refresh()
    assert (stats.files_changed, stats.chunks_written, stats.chunks_removed) == (1, 1, 1)
    assert not index.search("peanuts")
    assert index.search("cashews")[0].path == "memory/2025-01-31.md"


def test_same_size_edit_within_one_mtime_tick_is_caught(index: MemoryIndex, ws: Path) -> None:
    path = ws / "memory" / "2025-01-31.md"
    path.write_text(DAY2.replace("peanuts", "cashewz"), encoding="utf-8")  # same length
    index.refresh()
    stamp = path.stat().st_mtime_ns
    path.write_text(DAY2.replace("peanuts", "almondz"), encoding="utf-8")
    os.utime(path, ns=(stamp, stamp))  # same size, same mtime: stat alone cannot tell
    index.refresh()
    assert index.search("almondz") and not index.search("cashewz")


def test_deleted_file_disappears(index: MemoryIndex, ws: Path) -> None:
    assert index.search("金曜日")
    (ws / "memory" / "2025-01-30.md").unlink()
    stats = index.refresh()
    assert stats.files_removed == 1 and stats.chunks_removed == 3
    assert index.search("金曜日") == []
    assert index.search("会议") == []


def test_refresh_touches_only_the_changed_file(index: MemoryIndex, ws: Path) -> None:
    nothing = index.refresh()
    assert (nothing.files_hashed, nothing.files_changed, nothing.chunks_written) == (0, 0, 0)
    assert nothing.files_scanned == 4  # AGENTS.md, MEMORY.md, two notes
    entry = append_note(
        ws,
        "The 会议 moved to 周五.",
        session_key="agent:main:telegram:direct:42",
        tz="UTC",
        now=datetime(2025, 1, 31, 12, 0, tzinfo=UTC),
    )
    stats = index.refresh()
    assert (stats.files_hashed, stats.files_changed) == (1, 1)
    assert (stats.chunks_written, stats.chunks_removed) == (1, 0)  # earlier entries untouched
    hits = index.search("周五")
    assert [(h.path, h.start_line) for h in hits] == [(entry.path, entry.start_line)]


def test_editing_early_lines_renumbers_later_chunks(index: MemoryIndex, ws: Path) -> None:
    path = ws / "memory" / "2025-01-31.md"
    path.write_text(
        DAY2.replace("instead.\n", "instead.\nAdded by hand.\nAnd this.\n"), encoding="utf-8"
    )
    stats = index.refresh()
    assert (stats.chunks_written, stats.chunks_removed) == (1, 1)  # only the edited entry
    hit = index.search("db-staging-02")[0]
    assert (hit.start_line, hit.end_line) == (8, 9)  # was 6-7
    got = read_lines(ws, hit.path, hit.start_line, hit.end_line - hit.start_line + 1)
    assert got.lines[0].startswith("## 09:00:00") and "db-staging-02" in got.lines[-1]


def test_touch_without_change_rewrites_nothing(index: MemoryIndex, ws: Path) -> None:
    os.utime(ws / "memory" / "2025-01-30.md", None)
    stats = index.refresh()
    assert (stats.files_hashed, stats.files_changed, stats.chunks_written) == (1, 0, 0)


def test_artifacts_and_escaping_symlinks_are_not_indexed(
    index: MemoryIndex, ws: Path, tmp_path: Path
) -> None:
    (ws / "artifacts" / "big-output.md").write_text("secretword in a tool output", encoding="utf-8")
    outside = tmp_path / "outside.md"
    outside.write_text("secretword outside", encoding="utf-8")
    (ws / "memory" / "link.md").symlink_to(outside)
    index.refresh()
    assert index.search("secretword") == []


def test_reindex_and_reopen(index: MemoryIndex, ws: Path, tmp_path: Path) -> None:
    index.add_transcript("agent:main:webchat:u1", 1, 4, "we talked about the zebracorn")
    before = [(h.path, h.start_line, round(h.score, 6)) for h in index.search("会议 database")]
    stats = index.reindex()
    assert stats.files_changed == 4 and stats.chunks_written > 0
    after = [(h.path, h.start_line, round(h.score, 6)) for h in index.search("会议 database")]
    assert after == before
    assert index.search("zebracorn", corpus="transcripts")  # not derived from files: kept
    index.close()
    with MemoryIndex(tmp_path / "data" / "memory-index.db", ws) as again:
        assert again.search("peanuts")
        assert again.refresh().files_changed == 0


def test_concurrent_search_and_refresh(index: MemoryIndex, ws: Path) -> None:
    errors: list[BaseException] = []

    def searcher() -> None:
        try:
            for _ in range(50):
                index.search("会议 deploy")
        except BaseException as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=searcher) for _ in range(4)]
    for thread in threads:
        thread.start()
    for i in range(10):
        append_note(ws, f"fact {i}", session_key="k", tz="UTC")
        index.refresh()
    for thread in threads:
        thread.join()
    assert errors == []


# ---- transcripts ------------------------------------------------------------------------


def test_transcripts_corpus(index: MemoryIndex) -> None:
    key = "agent:main:telegram:direct:42"
    assert index.add_transcript(key, 10, 25, "user: 我们下周的会议改到周四\nassistant: 好的") == 1
    assert index.search("周四") == []  # notes only by default
    hits = index.search("周四", corpus="transcripts")
    assert [(h.corpus, h.path, h.start_line, h.end_line) for h in hits] == [
        ("transcripts", key, 10, 25)
    ]
    assert hits[0].location == f"transcript {key} #10-25"
    mixed = index.search("会议", corpus="all")
    assert {h.corpus for h in mixed} == {"notes", "transcripts"}
    # Archiving the same range again replaces it.
    index.add_transcript(key, 10, 25, "user: 会议取消了")
    assert index.search("周四", corpus="transcripts") == []
    assert len(index.search("会议", corpus="transcripts")) == 1
    with pytest.raises(ValueError, match="after last_seq"):
        index.add_transcript(key, 30, 29, "x")


def test_long_transcripts_are_chunked(index: MemoryIndex) -> None:
    text = "\n\n".join(f"user: message number {i} about topic{i}" for i in range(200))
    assert index.add_transcript("k", 1, 200, text) > 1
    hits = index.search("topic150", corpus="transcripts")
    assert hits and "topic150" in hits[0].snippet


def test_oversized_files_are_not_indexed(
    index: MemoryIndex, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memory.index

    monkeypatch.setattr(memory.index, "MAX_FILE_BYTES", 200)
    (ws / "memory" / "dump.md").write_text("hugeword " * 50, encoding="utf-8")
    index.refresh()
    assert index.search("hugeword") == []
    assert index.search("peanuts") == []  # DAY2 is over 200 bytes too: dropped


def test_processes_opening_a_new_index_at_once_each_open_it(tmp_path: Path) -> None:
    """Two `gatehouse run` on one workspace open its index file at the same moment; each
    checks and upgrades the schema in turn (both adding the same column failed one of them)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    failures: list[BaseException] = []

    def open_it(db_path: Path, start: threading.Barrier) -> None:
        start.wait()
        try:
            MemoryIndex(db_path, ws).close()
        except BaseException as exc:  # collected: a thread's exception would be lost
            failures.append(exc)

    for attempt in range(5):
        db_path = tmp_path / f"index-{attempt}.db"
        start = threading.Barrier(6)
        threads = [threading.Thread(target=open_it, args=(db_path, start)) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        with sqlite3.connect(db_path) as db:
            columns = {row[1] for row in db.execute("PRAGMA table_info(transcripts)")}
        assert {"role", "created_at", "name"} <= columns
