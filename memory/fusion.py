"""How hybrid search ranks: the BM25 list and the vector list fused into one.

Apart from `memory.vectors` because ranking is a policy over ranked lists (votes, fusion,
de-duplication, decay) and the vectors are storage (tables, in-memory matrices, top-k). This
module owns no table and writes nothing: the scoring helpers (`rrf`, `mmr`, `decayed`) are pure,
and what the rest needs of a row (its text, path, time or vector) it reads through the caller's
connection and `VectorIndex`.

Hybrid ranking is weighted reciprocal rank fusion of the BM25 list and the vector list (ranks
need no calibration between BM25 scores and cosines), then optional MMR so that near-identical
chunks do not fill the top. A BM25 hit's vote is weighted by how much of the query it matched
(`bm25_weights`): a hit with every term votes in full; a hit that matched only some terms votes
with the share of the query's IDF (its information) it holds, cubed. A question whose words
are not in its answer ("which database did we pick for the cache?") still gets a full BM25
list, matched on "which", "did", "the"; unweighted, those hits outvote the vector side's real
answer. A keyword question with filler ("when is the pottery class in Verona?") matches
"pottery" and "Verona", most of its IDF, and keeps most of its vote.

Optional temporal decay (`decay_factors`) multiplies each score by 0.5 ** (age / half-life),
the age taken from a daily note's file name (memory/YYYY-MM-DD.md) or an archived message's
time; MEMORY.md and other undated files never decay.
"""

from __future__ import annotations

import math
import re
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime

import numpy as np

from memory.embeddings import Vectors
from memory.vectors import SOURCE_TABLE, Table, VectorIndex
from memory.visibility import SearchScope

RRF_K = 60
"""The constant of reciprocal rank fusion (Cormack et al.): damps the weight of the top ranks."""
CANDIDATES_PER_RESULT = 4
"""Each list contributes `limit * 4` candidates to the fusion."""
MMR_LAMBDA = 0.7
NEAR_DUPLICATE = 0.5
"""MMR penalises only similarity above this cosine, scaled to 0..1: it is there to stop
near-identical chunks filling the top, not to push a relevant chunk out for sharing a topic
(fused scores are close together, so a full-range penalty reorders almost everything)."""
PARTIAL_MATCH_POWER = 3.0
"""A BM25 hit missing some query terms votes with weight coverage ** this, where coverage is
the share of the query's IDF it matched (1 for a hit with every term). Cubed because with
RRF's k = 60 the top vector ranks are close (1/61 against 1/63: a gap of ~0.03 of a vote), so
a hit on a question's common words (coverage ~0.3) must vote less than that not to reorder
them (0.3 ** 3 = 0.027), while one on its rare words (coverage ~0.8) keeps half its vote."""
_DAILY_NOTE = re.compile(r"(?:^|/)(\d{4})-(\d{2})-(\d{2})\.md$")

_IDENTIFIER = re.compile(r"\S*(?:\d|[A-Za-z][_/.:#@-][A-Za-z0-9]|[a-z][A-Z])\S*")
"""A query term an embedding cannot be trusted with: digits, inner `_/.:#@-`, or camelCase."""


def identifier_terms(terms: Iterable[str]) -> list[str]:
    return [term for term in terms if len(term) >= 3 and _IDENTIFIER.fullmatch(term)]


def rrf(
    ranked_lists: Sequence[Sequence[tuple[Table, int]]],
    k: int = RRF_K,
    weights: Sequence[Sequence[float] | None] | None = None,
) -> dict[tuple[Table, int], float]:
    """Reciprocal rank fusion: each list adds weight / (k + rank) to the keys it holds (rank
    1-based); `weights[i]` gives list i's weight per rank (None or missing: 1 for every key)."""
    fused: dict[tuple[Table, int], float] = {}
    for n, ranked in enumerate(ranked_lists):
        weight = weights[n] if weights is not None and n < len(weights) else None
        for rank, key in enumerate(ranked, start=1):
            vote = 1.0 if weight is None else weight[rank - 1]
            fused[key] = fused.get(key, 0.0) + vote / (k + rank)
    return fused


def _idf(rows: int, matching: int) -> float:
    """FTS5's BM25 IDF, floored at 0 (FTS5 floors at 1e-6): a term in half the rows or more
    says nothing."""
    return max(0.0, math.log((rows - matching + 0.5) / (matching + 0.5)))


def _holds(body: str, short: str, term: str, expression: str | None) -> bool:
    """Whether a row matches one query term as its FTS5 expression would: a substring of the
    body (the trigram index, case-insensitive), or a whole token of the short column."""
    if expression is not None and expression.startswith("short"):
        return f" {term.lower()} " in short
    return term.lower() in body.lower()


def bm25_weights(
    index: VectorIndex,
    conn: sqlite3.Connection,
    bm25: Sequence[tuple[Table, int, int]],
    terms: Sequence[str],
    expressions: Sequence[str | None],
) -> list[float]:
    """Each BM25 hit's vote in the fusion: 1 with every term (tier 0), else coverage **
    `PARTIAL_MATCH_POWER`, where coverage is the IDF of the terms the hit holds over the IDF of
    all the query's terms (IDF from the hit's corpus, as BM25 computes it). A term no FTS5
    expression answers counts with the mean IDF of the others. When every term is common (in
    half the rows or more: no IDF at all, as in a tiny corpus) there is nothing to judge the
    match by, and every hit votes in full, as in plain RRF."""
    weights = [1.0] * len(bm25)
    partial = [i for i, (_, _, tier) in enumerate(bm25) if tier]
    if not partial or not terms:
        return weights
    exprs = list(expressions) if len(expressions) == len(terms) else [None] * len(terms)
    for table in ("notes", "transcripts"):
        mine = [i for i in partial if bm25[i][0] == table]
        if not mine:
            continue
        rows, counts = index.document_frequencies(conn, table, exprs)
        known = [_idf(rows, c) for c in counts if c is not None]
        fill = sum(known) / len(known) if known else 1.0
        idf = [fill if c is None else _idf(rows, c) for c in counts]
        total = sum(idf)
        ids = [bm25[i][1] for i in mine]
        marks = ",".join("?" * len(ids))
        texts = {
            int(rowid): (str(body), str(short))
            for rowid, body, short in conn.execute(
                f"SELECT id, body, short FROM {SOURCE_TABLE[table]} WHERE id IN ({marks})", ids
            )
        }
        for i in mine:
            body, short = texts.get(bm25[i][1], ("", ""))
            held = [_holds(body, short, t, e) for t, e in zip(terms, exprs, strict=True)]
            coverage = sum(w for w, h in zip(idf, held, strict=True) if h) / total if total else 1
            weights[i] = min(1.0, coverage) ** PARTIAL_MATCH_POWER
    return weights


def informative_terms(
    index: VectorIndex,
    conn: sqlite3.Connection,
    tables: Sequence[Table],
    terms: Sequence[str],
    expressions: Sequence[str | None],
) -> list[str]:
    """The terms the BM25 side of a hybrid search needs: those in fewer than half the rows of
    some corpus searched (and those no FTS5 expression answers). A term in half the rows or
    more adds nothing to a BM25 score (FTS5 floors its IDF), and a hit that holds only such
    terms gets no vote (`bm25_weights`), but an OR query on them scores most of the index: at
    10,000 notes that was most of a natural-language question's cost. All the terms when none
    is informative."""
    if len(terms) < 2 or len(expressions) != len(terms):
        return list(terms)
    keep = [expression is None for expression in expressions]
    for table in tables:
        rows, counts = index.document_frequencies(conn, table, expressions)
        for i, count in enumerate(counts):
            keep[i] = keep[i] or (count is not None and _idf(rows, count) > 0)
    informative = [term for term, kept in zip(terms, keep, strict=True) if kept]
    return informative or list(terms)


def note_date(path: str) -> date | None:
    """The day of a daily note (memory/YYYY-MM-DD.md); None for MEMORY.md and other files."""
    found = _DAILY_NOTE.search(path)
    if found is None:
        return None
    try:
        return date(int(found[1]), int(found[2]), int(found[3]))
    except ValueError:
        return None


def _timestamp(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def decay_factors(
    conn: sqlite3.Connection,
    keys: Sequence[tuple[Table, int]],
    half_life_days: float,
    now: datetime | None = None,
) -> list[float]:
    """0.5 ** (age in days / `half_life_days`) per row, 1.0 where the age is unknown.

    A note chunk's age comes from its daily note's file name (counted in whole days from the
    local date, so today's note is age 0); MEMORY.md and undated files never decay. An archived
    message's age comes from its `created_at` (naive times are UTC); a range archived whole has
    none. Rows from the future count as age 0."""
    if not half_life_days > 0:
        raise ValueError(f"half_life_days must be positive, not {half_life_days!r}")
    moment = now if now is not None else datetime.now(UTC).astimezone()
    ages: dict[tuple[Table, int], float] = {}
    for table in ("notes", "transcripts"):
        ids = [rowid for name, rowid in keys if name == table]
        if not ids:
            continue
        marks = ",".join("?" * len(ids))
        if table == "notes":
            today = moment.date()
            for rowid, path in conn.execute(
                f"SELECT id, path FROM chunks WHERE id IN ({marks})", ids
            ):
                day = note_date(str(path))
                if day is not None:
                    ages[(table, int(rowid))] = float((today - day).days)
        else:
            for rowid, created in conn.execute(
                f"SELECT id, created_at FROM transcripts WHERE id IN ({marks})", ids
            ):
                stamp = _timestamp(created)
                if stamp is not None:
                    ages[(table, int(rowid))] = (moment - stamp).total_seconds() / 86_400
    return [0.5 ** (max(0.0, ages[key]) / half_life_days) if key in ages else 1.0 for key in keys]


def decayed(score: float, factor: float) -> float:
    """`score` after decay: scaled toward 0 when positive, away from it when negative (a
    negative cosine), so an older row always ranks lower."""
    return score * factor if score >= 0 else score / max(factor, 1e-300)


def mmr(
    order: Sequence[int],
    relevance: Sequence[float],
    vectors: Sequence[Vectors | None],
    limit: int,
    lam: float = MMR_LAMBDA,
    pinned: int = 0,
) -> list[int]:
    """Maximal marginal relevance over candidates given best first: indices of the pick.

    Relevance is scaled to the best candidate's; the penalty is the cosine to the nearest pick
    above `NEAR_DUPLICATE` (0 for a candidate with no vector). The first `pinned` candidates
    are kept in place.
    """
    if not order:
        return []
    width = next((v.shape[0] for v in vectors if v is not None), 1)
    matrix = np.zeros((len(order), width), dtype=np.float32)
    for row, index in enumerate(order):
        vector = vectors[index]
        if vector is not None:
            matrix[row] = vector
    similarity = np.clip((matrix @ matrix.T - NEAR_DUPLICATE) / (1.0 - NEAR_DUPLICATE), 0.0, 1.0)
    top = max(relevance[index] for index in order) or 1.0
    value = lam * np.asarray([relevance[index] for index in order], dtype=np.float64) / top
    nearest = np.zeros(len(order), dtype=np.float64)
    available = np.ones(len(order), dtype=bool)
    picked: list[int] = []
    while len(picked) < min(limit, len(order)):
        if len(picked) < pinned:
            row = len(picked)
        else:
            score = np.where(available, value - (1.0 - lam) * nearest, -np.inf)
            row = int(np.argmax(score))
        picked.append(row)
        available[row] = False
        np.maximum(nearest, similarity[row], out=nearest)
    return [order[row] for row in picked]


@dataclass(frozen=True, slots=True)
class Fused:
    """One pick of a vector or hybrid search, with why it ranks there."""

    table: Table
    rowid: int
    tier: int  # 0: in the BM25 list with every term, else 1
    score: float  # the fused score (hybrid) or the cosine (vector)
    bm25_rank: int | None
    vector_score: float | None
    fused_score: float | None


def identifier_keys(
    conn: sqlite3.Connection, bm25: Sequence[tuple[Table, int, int]], terms: Sequence[str]
) -> list[tuple[Table, int]]:
    """BM25 hits holding an identifier-like query term verbatim, in BM25 order."""
    wanted = identifier_terms(terms)
    if not wanted or not bm25:
        return []
    bodies: dict[tuple[Table, int], str] = {}
    for table in ("notes", "transcripts"):
        ids = [rowid for name, rowid, _ in bm25 if name == table]
        if ids:
            marks = ",".join("?" * len(ids))
            for rowid, body in conn.execute(
                f"SELECT id, body FROM {SOURCE_TABLE[table]} WHERE id IN ({marks})", ids
            ):
                bodies[(table, int(rowid))] = str(body)
    return [
        (table, rowid)
        for table, rowid, _ in bm25
        if any(term in bodies.get((table, rowid), "") for term in wanted)
    ]


def fuse(
    index: VectorIndex,
    conn: sqlite3.Connection,
    bm25: Sequence[tuple[Table, int, int]],
    tables: Sequence[Table],
    query: Vectors,
    terms: Sequence[str],
    limit: int,
    pool: int,
    hybrid: bool,
    scope: SearchScope,
    mmr_lambda: float | None,
    *,
    expressions: Sequence[str | None] = (),
    decay: Callable[[Sequence[tuple[Table, int]]], list[float]] | None = None,
) -> list[Fused]:
    """Rank by meaning: the `pool` nearest rows per search (vector), or the weighted reciprocal
    rank fusion of them with the BM25 list (table, rowid, tier) given best first (hybrid; each
    BM25 hit votes with `bm25_weights`, from the terms' FTS5 `expressions`), exact identifier
    hits first in BM25 order; `decay` (factors per key) multiplies the scores (and orders the
    identifier hits by them); then MMR unless `mmr_lambda` is None.
    The caller runs it inside `one_blas_thread()`."""
    near: list[tuple[Table, int, float]] = []
    for table in tables:
        near.extend(
            (table, rowid, cosine)
            for rowid, cosine in index.top_k(conn, table, query, pool, scope)
        )
    near.sort(key=lambda item: -item[2])
    near = near[:pool]
    rank = {(table, rowid): n for n, (table, rowid, _) in enumerate(bm25, 1)}
    tier = {(table, rowid): t for table, rowid, t in bm25}
    if hybrid:
        votes = bm25_weights(index, conn, bm25, terms, expressions)
        fused = rrf([list(rank), [(table, rowid) for table, rowid, _ in near]], weights=[votes])
        pinned = identifier_keys(conn, bm25, terms)
    else:
        fused = {(table, rowid): cosine for table, rowid, cosine in near}
        pinned = []
    if decay is not None and fused:
        every = list(fused)
        for key, factor in zip(every, decay(every), strict=True):
            fused[key] = decayed(fused[key], factor)
        pinned.sort(key=lambda key: -fused[key])  # the newer of two holding the identifier
    rest = sorted(
        (key for key in fused if key not in pinned),
        key=lambda key: (-fused[key], rank.get(key, pool + 1)),
    )
    keys = [*pinned, *rest]
    found = index.vectors_of(conn, keys)
    order = list(range(len(keys)))
    if mmr_lambda is not None:
        relevance = [fused[key] for key in keys]
        order = mmr(order, relevance, found, limit, mmr_lambda, min(len(pinned), limit))
    out: list[Fused] = []
    for i in order[:limit]:
        key, vector = keys[i], found[i]
        out.append(
            Fused(
                key[0],
                key[1],
                tier.get(key, 1),
                fused[key],
                rank.get(key),
                None if vector is None else float(vector @ query),
                fused[key] if hybrid else None,
            )
        )
    return out
