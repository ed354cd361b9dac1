"""Retrieval where keyword search fails by construction (paraphrases, synonyms, English and
Chinese), the fusion that keeps weak BM25 hits from outvoting the vector side, and temporal
decay. The real model where installed; a tiny hand-made synonym encoder always."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

import memory.fusion
import memory.index
from memory.embeddings import Encoder, HashingEncoder, Vectors
from memory.fusion import (
    bm25_weights,
    decay_factors,
    decayed,
    informative_terms,
    note_date,
    rrf,
)
from memory.index import ArchivedMessage, Hit, MemoryIndex, SearchMode
from memory.notes import append_note
from memory.text import fts_term, query_terms
from memory.vectors import Table, embedding_text

MODES: tuple[SearchMode, ...] = ("bm25", "vector", "hybrid")
ALICE = "agent:main:webchat:direct:alice"


def where(hits: Sequence[Hit]) -> list[str]:
    return [h.path for h in hits]


def workspace(root: Path, notes: dict[str, str]) -> Path:
    ws = root / "ws"
    ws.mkdir(exist_ok=True)
    for name, text in notes.items():
        path = ws / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return ws


# ---- the real model: meaning where words fail ------------------------------------------------

PARAPHRASED = {
    # note file: (note, question sharing no keyword with it)
    "store.md": (
        "Decided on SQLite in WAL mode for the local store.",
        "Which database engine did we choose for on-device persistence?",
    ),
    "travel.md": (
        "My passport expires in August 2026; renew it three months before.",
        "When does my travel document run out?",
    ),
    "health.md": ("I'm allergic to penicillin.", "我对什么药物过敏？"),
    "deploy.md": ("我们决定每周五下午部署生产环境。", "When do we release to production?"),
    "diet.md": ("我不喝牛奶，乳糖不耐受。", "Can I drink dairy?"),
    "teeth.md": (
        "My dentist is Dr. Okafor on Harley Street, every six months.",
        "Who looks after my teeth?",
    ),
    "editor.md": (
        "I use Neovim with the LazyVim config for writing code.",
        "Which text editor do I program in?",
    ),
}
DISTRACTORS = (
    # The questions' common words, so BM25 ranks these first.
    "Which plants did we water for the party? Do it when you can.",
    "When do we pick up the dry cleaning? Can I do it on the way?",
    "Where and when is the school play? We need to pick the costumes for it.",
    "Did we choose the blue or the green paint for the hallway?",
    "Who is bringing the cake? I can do the drinks for the party.",
    "Which train do we take to the airport when the strike is on?",
    "How much do we owe for the concert tickets? I paid for mine.",
    "When does my library card run out? I renew it after work.",
    "Who looks after the garden when we are away? My neighbour does.",
    "Who looks after my plants when I travel? Ask Uma.",
    "Quentin said the chess club meets at the library on Mondays.",
    "Lent my ladder to Rosa; she will bring it back next week.",
    "Sven is moving to Oslo to work for a robotics startup.",
    "Yara recommended a podcast about volcanoes.",
    "The printer on the third floor is out of toner again.",
)


@pytest.fixture(scope="module")
def paraphrased(tmp_path_factory: pytest.TempPathFactory, use: Encoder) -> Iterator[MemoryIndex]:
    root = tmp_path_factory.mktemp("paraphrased")
    notes = {name: f"## note\n{note}\n" for name, (note, _) in PARAPHRASED.items()}
    notes |= {f"other-{i}.md": f"## note\n{text}\n" for i, text in enumerate(DISTRACTORS)}
    with MemoryIndex(root / "i.db", workspace(root, notes), encoder=use) as index:
        index.refresh()
        yield index


@pytest.mark.parametrize("name", list(PARAPHRASED))
def test_hybrid_finds_what_keywords_cannot(paraphrased: MemoryIndex, name: str) -> None:
    question = PARAPHRASED[name][1]
    assert name not in where(paraphrased.search(question, limit=5))
    hybrid = paraphrased.search(question, limit=5, mode="hybrid")
    assert name in where(hybrid)
    assert {h.mode_used for h in hybrid} == {"hybrid"}


# ---- a deterministic stand-in that knows a few synonyms, in both languages --------------------

SYNONYMS = (
    ("database", "sqlite", "postgres", "数据库"),
    ("release", "deploy", "部署", "发布"),
    ("production", "生产"),
    ("allergic", "allergy", "过敏"),
    ("peanut", "花生"),
    ("passport", "travel document", "护照"),
    ("pottery", "ceramics", "陶艺"),
)


class SynonymEncoder:
    """One dimension per synonym group (set when the text holds any of its words), plus a
    small constant one so that no vector is zero: texts mean the same when they share groups,
    in whatever language."""

    name = "test-synonyms-v1"
    dimensions = len(SYNONYMS) + 1

    def encode(self, texts: Sequence[str]) -> Vectors:
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        for row, text in enumerate(texts):
            folded = text.casefold()
            for column, group in enumerate(SYNONYMS):
                out[row, column] = float(any(word in folded for word in group))
            out[row, -1] = 0.2
        normalised: Vectors = out / np.linalg.norm(out, axis=1, keepdims=True)
        return normalised


COMMON = "When do we pick it up, and who can do it for us?"
"""Filler every distractor shares with the questions: in most rows, so it has no IDF."""
STAND_IN_NOTES = {
    "store.md": "## store\nDecided on SQLite for the local store.\n",
    "deploy.md": "## 部署\n我们决定每周五下午部署生产环境。\n",
    "lunch.md": "## lunch\nBob is allergic to peanuts.\n",
    "pottery.md": "## class\nThe pottery class in Verona is at nine.\n",
    "pottery-miss.md": "## course\nPottery course in Lisbon: fully booked.\n",
    **{f"errand-{i}.md": f"## errand {i}\n{COMMON} Errand number {i}.\n" for i in range(6)},
}


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[MemoryIndex]:
    ws = workspace(tmp_path, STAND_IN_NOTES)
    with MemoryIndex(tmp_path / "i.db", ws, encoder=SynonymEncoder()) as index:
        index.refresh()
        yield index


@pytest.mark.parametrize(
    ("question", "answer"),
    [
        ("When do we release to production?", "deploy.md"),  # English asks, Chinese note
        ("谁对花生过敏？", "lunch.md"),  # Chinese asks, English note
        ("which database do we pick for it?", "store.md"),  # a synonym
    ],
)
def test_stand_in_synonyms_beat_filler_words(
    stand_in: MemoryIndex, question: str, answer: str
) -> None:
    bm25 = stand_in.search(question)
    assert bm25 == [] or bm25[0].path != answer
    hybrid = stand_in.search(question, mode="hybrid")
    assert hybrid[0].path == answer and hybrid[0].mode_used == "hybrid"


@pytest.mark.parametrize(
    ("weighted", "informative", "first_path"),
    [
        (False, False, "errand-"),  # plain RRF: hits on "When do we" outvote the meaning
        (False, True, "lunch.md"),  # only informative terms: "to" is rare here, votes in full
        (True, False, "deploy.md"),  # votes by the share of the query's IDF matched
        (True, True, "deploy.md"),  # both, as search does
    ],
)
def test_weak_bm25_hits_do_not_outvote_the_meaning(
    stand_in: MemoryIndex,
    monkeypatch: pytest.MonkeyPatch,
    weighted: bool,
    informative: bool,
    first_path: str,
) -> None:
    if not weighted:
        monkeypatch.setattr(
            memory.fusion, "bm25_weights", lambda index, conn, bm25, *rest: [1.0] * len(bm25)
        )
    if not informative:
        monkeypatch.setattr(
            memory.index, "informative_terms", lambda index, conn, tables, terms, e: list(terms)
        )
    first = stand_in.search("When do we release to production?", mode="hybrid")[0]
    assert first.path.startswith(first_path)
    if first_path == "deploy.md":
        assert first.bm25_rank is None  # the vector side's alone
    else:
        assert first.bm25_rank is not None


def test_bm25_votes_follow_the_share_of_the_query_matched(stand_in: MemoryIndex) -> None:
    index, conn = stand_in, stand_in._conn
    assert index._vectors is not None
    rows = {path: rowid for rowid, path in conn.execute("SELECT id, path FROM chunks")}
    terms = query_terms("when is the pottery class in Verona?")
    expressions = [fts_term(term) for term in terms]
    bm25: list[tuple[Table, int, int]] = [
        ("notes", rows["pottery.md"], 1),  # all but "when", which is in most rows (no IDF)
        ("notes", rows["pottery-miss.md"], 1),  # "pottery" and "in": some of the information
        ("notes", rows["errand-0.md"], 1),  # "when" alone: none of it
        ("notes", rows["store.md"], 0),  # every term, as the BM25 side says: votes in full
    ]
    weights = bm25_weights(index._vectors, conn, bm25, terms, expressions)
    assert weights[0] == pytest.approx(1.0) and weights[3] == 1.0
    assert 0 < weights[1] < 0.1
    assert weights[2] == 0.0
    hit = stand_in.search("when is the pottery class in Verona?", mode="hybrid")[0]
    assert hit.path == "pottery.md" and hit.bm25_rank == 1


def test_no_idf_means_every_hit_votes_in_full(tmp_path: Path) -> None:
    # Two rows, both with both terms somewhere: no term is rarer than half the rows.
    notes = {"a.md": "## a\ndeploy checklist\n", "b.md": "## b\ndeploy notes, checklist later\n"}
    with MemoryIndex(
        tmp_path / "i.db", workspace(tmp_path, notes), encoder=HashingEncoder(64)
    ) as index:
        index.refresh()
        assert index._vectors is not None
        ids = [int(r[0]) for r in index._conn.execute("SELECT id FROM chunks ORDER BY id")]
        weights = bm25_weights(
            index._vectors, index._conn, [("notes", ids[0], 1), ("notes", ids[1], 1)],
            ["deploy", "zebra"], ['body : "deploy"', 'body : "zebra"'],
        )
        assert weights[0] < 1.0  # zebra is in no row: it has IDF, and neither holds it
        weights = bm25_weights(
            index._vectors, index._conn, [("notes", ids[0], 1)],
            ["deploy", "checklist"], ['body : "deploy"', 'body : "checklist"'],
        )
        assert weights == [1.0]


def test_hybrid_bm25_searches_the_informative_terms(stand_in: MemoryIndex) -> None:
    assert stand_in._vectors is not None
    terms = query_terms("When do we release to production?")
    expressions = [fts_term(term) for term in terms]
    informative = informative_terms(
        stand_in._vectors, stand_in._conn, ["notes"], terms, expressions
    )
    assert informative == ["release", "to", "production"]  # "When do we" is in most rows
    common = ["When", "do", "we"]
    every = informative_terms(
        stand_in._vectors, stand_in._conn, ["notes"], common, [fts_term(t) for t in common]
    )
    assert every == common  # none informative: all of them


def test_document_frequencies_follow_writes(tmp_path: Path) -> None:
    ws = workspace(tmp_path, {"a.md": "## a\nboiler\n", "b.md": "## b\nkettle\n"})
    with MemoryIndex(tmp_path / "i.db", ws, encoder=HashingEncoder(64)) as index:
        index.refresh()
        assert index._vectors is not None
        count = index._vectors.document_frequencies
        expressions = ['body : "boiler"', None, 'short : " a "']
        assert count(index._conn, "notes", expressions) == (2, [1, None, 1])
        (ws / "c.md").write_text("## c\nboiler again\n")
        index.refresh()
        assert count(index._conn, "notes", expressions) == (3, [2, None, 1])
        (ws / "a.md").write_text("## a\nnothing\n")  # same row count, new row id
        index.refresh()
        assert count(index._conn, "notes", expressions) == (3, [1, None, 1])


def test_weighted_rrf_unit() -> None:
    fused = rrf(
        [[("notes", 1), ("notes", 2)], [("notes", 2), ("notes", 3)]],
        weights=[[0.5, 0.1]],
    )
    assert fused[("notes", 1)] == pytest.approx(0.5 / 61)
    assert fused[("notes", 2)] == pytest.approx(0.1 / 62 + 1 / 61)
    assert fused[("notes", 3)] == pytest.approx(1 / 62)  # the second list unweighted
    assert rrf([[("notes", 1)]], weights=[None]) == rrf([[("notes", 1)]])


def test_embedding_leaves_out_the_note_frame(tmp_path: Path) -> None:
    seen: list[str] = []

    class Recording(HashingEncoder):
        def encode(self, texts: Sequence[str]) -> Vectors:
            seen.extend(texts)
            return super().encode(texts)

    ws = tmp_path / "ws"
    ws.mkdir()
    append_note(ws, "Bob is allergic to peanuts.", session_key=ALICE, tz="UTC")
    with MemoryIndex(tmp_path / "i.db", ws, encoder=Recording(64)) as index:
        index.refresh()
        assert seen == ["Bob is allergic to peanuts."]
        hit = index.search("peanuts", mode="hybrid")[0]
        assert hit.start_line == 1 and "agent:main" in hit.snippet  # BM25 indexes it all
    assert embedding_text("## 09:00:00 · x") == "## 09:00:00 · x"  # nothing else: kept
    assert embedding_text("## cache\nRedis") == "## cache\nRedis"


# ---- temporal decay --------------------------------------------------------------------------


def _day(days_ago: int) -> str:
    return f"memory/{date.today() - timedelta(days=days_ago):%Y-%m-%d}.md"


ENTRY = "## entry\nThe boiler service is booked with HeatWell.\n"


@pytest.fixture
def dated(tmp_path: Path) -> Iterator[MemoryIndex]:
    notes = {
        _day(400): ENTRY,  # written first: BM25 and vector ties go to it
        _day(1): ENTRY,
        "MEMORY.md": "## boiler\nThe boiler service is booked with HeatWell. Keep the receipt.\n",
    }
    with MemoryIndex(
        tmp_path / "i.db", workspace(tmp_path, notes), encoder=HashingEncoder(64)
    ) as index:
        index.refresh()
        yield index


@pytest.mark.parametrize("mode", MODES)
def test_decay_is_off_by_default(dated: MemoryIndex, mode: SearchMode) -> None:
    default = dated.search("boiler service HeatWell", mode=mode, corpus="notes")
    assert default == dated.search("boiler service HeatWell", mode=mode, half_life_days=None)
    daily = [h for h in default if h.path.startswith("memory/")]
    if mode != "hybrid":  # ranks differ by construction in RRF; the raw scores do not
        assert daily[0].score == pytest.approx(daily[1].score)


@pytest.mark.parametrize("mode", MODES)
def test_an_older_note_ranks_below_an_equally_good_newer_one(
    dated: MemoryIndex, mode: SearchMode
) -> None:
    # "HeatWell" looks like an identifier (camelCase): in hybrid both are pinned first, and
    # decay orders them too.
    hits = dated.search(
        "boiler service HeatWell", mode=mode, half_life_days=30, mmr_lambda=None
    )
    daily = [h for h in hits if h.path.startswith("memory/")]
    assert [h.path for h in daily] == [_day(1), _day(400)]
    assert daily[1].score < daily[0].score / 100  # 400 days at a 30-day half-life


def test_memory_md_never_decays(dated: MemoryIndex) -> None:
    plain = {h.path: h.score for h in dated.search("boiler service HeatWell")}
    decayed_hits = {
        h.path: h.score for h in dated.search("boiler service HeatWell", half_life_days=30)
    }
    assert decayed_hits["MEMORY.md"] == plain["MEMORY.md"]
    assert decayed_hits[_day(1)] == pytest.approx(plain[_day(1)] * 0.5 ** (1 / 30))
    assert decayed_hits[_day(400)] < plain[_day(400)] / 100


def test_decay_factors_of_notes_and_archived_messages(tmp_path: Path) -> None:
    notes = {"memory/2024-01-01.md": ENTRY, "MEMORY.md": ENTRY, "notes/misc.md": ENTRY}
    now = datetime(2024, 1, 31, 12, 0, tzinfo=UTC)
    with MemoryIndex(tmp_path / "i.db", workspace(tmp_path, notes)) as index:
        index.refresh()
        index.archive_messages(
            ALICE,
            [
                ArchivedMessage(1, "user", "old", (now - timedelta(days=60)).isoformat()),
                ArchivedMessage(2, "user", "naive", "2024-01-21T12:00:00"),  # UTC
                ArchivedMessage(3, "user", "unknown", None),
            ],
        )
        add_range = index.add_transcript(ALICE, 10, 12, "a range archived whole")
        assert add_range == 1
        conn = index._conn
        chunks = dict(conn.execute("SELECT path, id FROM chunks"))
        rows = [int(r[0]) for r in conn.execute("SELECT id FROM transcripts ORDER BY id")]
        keys: list[tuple[Table, int]] = [
            ("notes", chunks["memory/2024-01-01.md"]),
            ("notes", chunks["MEMORY.md"]),
            ("notes", chunks["notes/misc.md"]),
            *(("transcripts", rowid) for rowid in rows),
        ]
        factors = decay_factors(conn, keys, 30, now=now)
    assert factors == pytest.approx([0.5, 1.0, 1.0, 0.25, 0.5 ** (10 / 30), 1.0, 1.0])
    assert note_date("memory/2024-02-30.md") is None and note_date("MEMORY.md") is None
    assert decayed(0.8, 0.5) == 0.4 and decayed(-0.2, 0.5) == -0.4


def test_half_life_must_be_positive(dated: MemoryIndex) -> None:
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="half_life_days"):
            dated.search("boiler", half_life_days=bad)
