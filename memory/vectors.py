"""Embedding vectors beside the FTS index, and the fusion that ranks with them (issue 22).

Each note chunk and archived transcript row may have one float32 vector, stored in the index's
own SQLite file (`chunk_vectors`, `transcript_vectors`: keyed by the row's id, with the encoder
name, its dimensions and a hash of the text embedded). Search needs every vector of a corpus at
once, so each corpus is loaded lazily into one flat matrix kept in memory and patched as rows
are embedded or removed; a commit by another connection (the CLI reindexing while the gateway
runs) is noticed through `PRAGMA data_version` and the matrix is loaded again.

Row ids of SQLite tables can be reused after a delete, and an older gatehouse that knows
nothing of vectors may delete and insert rows in this file. So a vector counts only while the
hash of its row's current text equals the hash stored with it; the load drops any other.

Hybrid ranking is reciprocal rank fusion of the BM25 list and the vector list (it needs no
calibration between BM25 scores and cosines), then optional MMR so that near-identical chunks
do not fill the top.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from memory.embeddings import Encoder, Vectors, cosine_top_k

Table = Literal["notes", "transcripts"]
_log = logging.getLogger(__name__)

VECTOR_SCHEMA = """
CREATE TABLE IF NOT EXISTS chunk_vectors(
    id INTEGER PRIMARY KEY,
    encoder TEXT NOT NULL,
    dimensions INTEGER NOT NULL,
    body_hash BLOB NOT NULL,
    vector BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS chunk_vectors_by_encoder ON chunk_vectors(encoder, dimensions);
CREATE TABLE IF NOT EXISTS transcript_vectors(
    id INTEGER PRIMARY KEY,
    encoder TEXT NOT NULL,
    dimensions INTEGER NOT NULL,
    body_hash BLOB NOT NULL,
    vector BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS transcript_vectors_by_encoder
    ON transcript_vectors(encoder, dimensions);
"""
VECTOR_TABLE: dict[Table, str] = {"notes": "chunk_vectors", "transcripts": "transcript_vectors"}
SOURCE_TABLE: dict[Table, str] = {"notes": "chunks", "transcripts": "transcripts"}

RRF_K = 60
"""The constant of reciprocal rank fusion (Cormack et al.): damps the weight of the top ranks."""
CANDIDATES_PER_RESULT = 4
"""Each list contributes `limit * 4` candidates to the fusion."""
MMR_LAMBDA = 0.7
NEAR_DUPLICATE = 0.5
"""MMR penalises only similarity above this cosine, scaled to 0..1: it is there to stop
near-identical chunks filling the top, not to push a relevant chunk out for sharing a topic
(fused scores are close together, so a full-range penalty reorders almost everything)."""
EMBED_BATCH = 256

_IDENTIFIER = re.compile(r"\S*(?:\d|[A-Za-z][_/.:#@-][A-Za-z0-9]|[a-z][A-Z])\S*")
"""A query term an embedding cannot be trusted with: digits, inner `_/.:#@-`, or camelCase."""


def body_hash(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def identifier_terms(terms: Iterable[str]) -> list[str]:
    return [term for term in terms if len(term) >= 3 and _IDENTIFIER.fullmatch(term)]


@dataclass(slots=True)
class _Matrix:
    """One corpus's vectors: row i of `vectors` belongs to the source row `ids[i]`."""

    ids: NDArray[np.int64]
    vectors: Vectors
    _position: dict[int, int] | None = field(default=None)

    def position(self) -> dict[int, int]:
        if self._position is None:
            self._position = {int(rowid): i for i, rowid in enumerate(self.ids.tolist())}
        return self._position

    def without(self, ids: Iterable[int]) -> _Matrix:
        gone = np.fromiter(ids, dtype=np.int64)
        if gone.size == 0 or self.ids.size == 0:
            return self
        keep = ~np.isin(self.ids, gone)
        return self if bool(keep.all()) else _Matrix(self.ids[keep], self.vectors[keep])

    def plus(self, ids: Sequence[int], vectors: Vectors) -> _Matrix:
        base = self.without(ids)
        return _Matrix(
            np.concatenate([base.ids, np.asarray(ids, dtype=np.int64)]),
            np.vstack([base.vectors, vectors]).astype(np.float32, copy=False),
        )


class VectorIndex:
    """Vectors of one `MemoryIndex` for one encoder: storage, in-memory matrices, top-k.

    Methods that take a connection run under the index's lock (writes inside its
    transaction); the embedding passes take the lock themselves, batch by batch.
    """

    def __init__(
        self,
        encoder: Encoder,
        conn: sqlite3.Connection,
        lock: AbstractContextManager[Any],
        transaction: Callable[[], AbstractContextManager[sqlite3.Connection]],
    ) -> None:
        self.encoder = encoder
        self.name = encoder.name
        self.dimensions = int(encoder.dimensions)
        self._conn = conn
        self._lock = lock
        self._transaction = transaction
        self._embed_lock = threading.Lock()  # one embedding pass at a time: each row once
        self._matrices: dict[Table, _Matrix] = {}
        self._data_version: int | None = None

    # ---- embedding passes (take the index lock per batch, never while holding it) ---------

    def embed_missing(
        self,
        tables: Sequence[Table],
        everything: bool = False,
        progress: Callable[[int, int], None] | None = None,
        strict: bool = False,
        only: Sequence[int] | None = None,
    ) -> int:
        """Embed rows lacking a vector from this encoder (every row with `everything`; just
        the rows `only`, if given); returns rows embedded. Unless `strict`, an encoder failure
        is logged and the rest is left for the next pass: indexing must not fail with it."""
        with self._embed_lock:
            if only is not None:
                todo = [(table, list(only)) for table in tables]
            else:
                with self._lock:
                    todo = [(t, self.missing(self._conn, t, everything)) for t in tables]
            total = sum(len(ids) for _, ids in todo)
            done = written = 0
            for table, ids in todo:
                for start in range(0, len(ids), EMBED_BATCH):
                    batch = ids[start : start + EMBED_BATCH]
                    try:
                        written += self._embed(table, batch)
                    except Exception as exc:
                        if strict:
                            raise
                        _log.warning("embedding %d %s rows failed: %s", len(batch), table, exc)
                        return written
                    done += len(batch)
                    if progress is not None:
                        progress(done, total)
            return written

    def _embed(self, table: Table, ids: Sequence[int]) -> int:
        """Encode rows outside the lock (searches go on), then store the vectors of the rows
        whose text is still what was encoded."""
        marks = ",".join("?" * len(ids))
        with self._lock:
            rows = [
                (int(rowid), str(body))
                for rowid, body in self._conn.execute(
                    f"SELECT id, body FROM {SOURCE_TABLE[table]} WHERE id IN ({marks})", ids
                )
            ]
        if not rows:
            return 0
        encoded = self.encoder.encode([text for _, text in rows])
        if encoded.shape != (len(rows), self.dimensions):
            raise ValueError(f"encoder returned shape {encoded.shape} for {len(rows)} texts")
        with self._lock, self._transaction() as conn:
            return self.store(conn, table, rows, encoded)

    def invalidate(self) -> None:
        """Forget the matrices (a rolled-back write, another connection's commit)."""
        self._matrices.clear()
        self._data_version = None

    def _check_external(self, conn: sqlite3.Connection) -> None:
        version = int(conn.execute("PRAGMA data_version").fetchone()[0])
        if version != self._data_version:
            self._matrices.clear()
            self._data_version = version

    # ---- writes (inside the caller's transaction) ----------------------------------------

    def forget(self, conn: sqlite3.Connection, table: Table, ids: Sequence[int]) -> None:
        """Drop the vectors of rows being deleted or rewritten."""
        if not ids:
            return
        conn.executemany(
            f"DELETE FROM {VECTOR_TABLE[table]} WHERE id = ?", [(int(i),) for i in ids]
        )
        if table in self._matrices:
            self._matrices[table] = self._matrices[table].without(ids)

    def store(
        self,
        conn: sqlite3.Connection,
        table: Table,
        rows: Sequence[tuple[int, str]],
        vectors: Vectors,
    ) -> int:
        """Write the vectors of (id, text) rows whose text is still what was embedded."""
        if not rows:
            return 0
        marks = ",".join("?" * len(rows))
        current = {
            int(rowid): str(body)
            for rowid, body in conn.execute(
                f"SELECT id, body FROM {SOURCE_TABLE[table]} WHERE id IN ({marks})",
                [rowid for rowid, _ in rows],
            )
        }
        keep = [i for i, (rowid, text) in enumerate(rows) if current.get(rowid) == text]
        if not keep:
            return 0
        ids = [rows[i][0] for i in keep]
        kept = np.ascontiguousarray(vectors[keep], dtype=np.float32)
        conn.executemany(
            f"INSERT OR REPLACE INTO {VECTOR_TABLE[table]}"
            "(id, encoder, dimensions, body_hash, vector) VALUES (?, ?, ?, ?, ?)",
            [
                (rowid, self.name, self.dimensions, body_hash(rows[i][1]), kept[n].tobytes())
                for n, (i, rowid) in enumerate(zip(keep, ids, strict=True))
            ],
        )
        if table in self._matrices:
            self._matrices[table] = self._matrices[table].plus(ids, kept)
        return len(ids)

    # ---- reads --------------------------------------------------------------------------

    def missing(
        self, conn: sqlite3.Connection, table: Table, everything: bool = False
    ) -> list[int]:
        """Ids of rows with no vector from this encoder (all rows with `everything`)."""
        source, vectors = SOURCE_TABLE[table], VECTOR_TABLE[table]
        if everything:
            sql, args = f"SELECT id FROM {source} ORDER BY id", ()
        else:
            sql = (
                f"SELECT id FROM {source} WHERE id NOT IN (SELECT id FROM {vectors} "
                "WHERE encoder = ? AND dimensions = ?) ORDER BY id"
            )
            args = (self.name, self.dimensions)  # type: ignore[assignment]
        return [int(row[0]) for row in conn.execute(sql, args)]

    def coverage(self, conn: sqlite3.Connection, table: Table) -> tuple[int, int]:
        """(rows with a vector from this encoder, rows)."""
        source, vectors = SOURCE_TABLE[table], VECTOR_TABLE[table]
        total = int(conn.execute(f"SELECT count(*) FROM {source}").fetchone()[0])
        have = int(
            conn.execute(
                f"SELECT count(*) FROM {vectors} WHERE encoder = ? AND dimensions = ?",
                (self.name, self.dimensions),
            ).fetchone()[0]
        )
        return min(have, total), total

    def matrix(self, conn: sqlite3.Connection, table: Table) -> _Matrix:
        """The corpus's vectors, loaded once; vectors whose row is gone or whose text changed
        behind this index's back (see the module docstring) are deleted, to be embedded again."""
        self._check_external(conn)
        cached = self._matrices.get(table)
        if cached is not None:
            return cached
        ids: list[int] = []
        rows: list[NDArray[np.float32]] = []
        stale: list[tuple[int]] = []
        width = self.dimensions * 4
        for rowid, blob, digest, body in conn.execute(
            f"SELECT v.id, v.vector, v.body_hash, s.body FROM {VECTOR_TABLE[table]} v "
            f"LEFT JOIN {SOURCE_TABLE[table]} s ON s.id = v.id "
            "WHERE v.encoder = ? AND v.dimensions = ? ORDER BY v.id",
            (self.name, self.dimensions),
        ):
            if body is None or len(blob) != width or bytes(digest) != body_hash(str(body)):
                stale.append((int(rowid),))
                continue
            ids.append(int(rowid))
            rows.append(np.frombuffer(blob, dtype=np.float32))
        if stale:
            conn.executemany(f"DELETE FROM {VECTOR_TABLE[table]} WHERE id = ?", stale)
            self._data_version = int(conn.execute("PRAGMA data_version").fetchone()[0])
        vectors = (
            np.vstack(rows).astype(np.float32, copy=False)
            if rows
            else np.empty((0, self.dimensions), dtype=np.float32)
        )
        loaded = _Matrix(np.asarray(ids, dtype=np.int64), vectors)
        self._matrices[table] = loaded
        return loaded

    def top_k(
        self,
        conn: sqlite3.Connection,
        table: Table,
        query: Vectors,
        k: int,
        session_key: str | None = None,
    ) -> list[tuple[int, float]]:
        """(row id, cosine) of the k nearest rows, best first; `session_key` (transcripts)
        confines them to that session's rows."""
        loaded = self.matrix(conn, table)
        ids, vectors = loaded.ids, loaded.vectors
        if table == "transcripts" and session_key is not None:
            only = [
                row[0]
                for row in conn.execute(
                    "SELECT id FROM transcripts WHERE session_key = ?", (session_key,)
                )
            ]
            mask = np.isin(ids, np.asarray(only, dtype=np.int64))
            ids, vectors = ids[mask], vectors[mask]
        order, scores = cosine_top_k(query, vectors, k)
        return [(int(ids[i]), float(s)) for i, s in zip(order, scores, strict=True)]

    def vectors_of(
        self, conn: sqlite3.Connection, keys: Sequence[tuple[Table, int]]
    ) -> list[Vectors | None]:
        out: list[Vectors | None] = []
        for table, rowid in keys:
            loaded = self.matrix(conn, table)
            at = loaded.position().get(rowid)
            out.append(None if at is None else loaded.vectors[at])
        return out


def forget_vectors(
    conn: sqlite3.Connection, index: VectorIndex | None, table: Table, ids: Sequence[int]
) -> None:
    """Drop the vectors of rows being deleted, with or without an encoder (an id may be
    reused, and a vector must not outlive its row)."""
    if index is not None:
        index.forget(conn, table, ids)
    elif ids:
        conn.executemany(f"DELETE FROM {VECTOR_TABLE[table]} WHERE id = ?", [(i,) for i in ids])


def rrf(
    ranked_lists: Sequence[Sequence[tuple[Table, int]]], k: int = RRF_K
) -> dict[tuple[Table, int], float]:
    """Reciprocal rank fusion: each list adds 1 / (k + rank) to the keys it holds (rank 1-based)."""
    fused: dict[tuple[Table, int], float] = {}
    for ranked in ranked_lists:
        for rank, key in enumerate(ranked, start=1):
            fused[key] = fused.get(key, 0.0) + 1.0 / (k + rank)
    return fused


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
    session_key: str | None,
    mmr_lambda: float | None,
) -> list[Fused]:
    """Rank by meaning: the `pool` nearest rows per search (vector), or their reciprocal rank
    fusion with the BM25 list (table, rowid, tier) given best first (hybrid), exact
    identifier hits first; then MMR unless `mmr_lambda` is None."""
    near: list[tuple[Table, int, float]] = []
    for table in tables:
        near.extend(
            (table, rowid, cosine)
            for rowid, cosine in index.top_k(conn, table, query, pool, session_key)
        )
    near.sort(key=lambda item: -item[2])
    near = near[:pool]
    rank = {(table, rowid): n for n, (table, rowid, _) in enumerate(bm25, 1)}
    tier = {(table, rowid): t for table, rowid, t in bm25}
    if hybrid:
        fused = rrf([list(rank), [(table, rowid) for table, rowid, _ in near]])
        pinned = identifier_keys(conn, bm25, terms)
    else:
        fused = {(table, rowid): cosine for table, rowid, cosine in near}
        pinned = []
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
