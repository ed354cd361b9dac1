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

Hybrid ranking is weighted reciprocal rank fusion of the BM25 list and the vector list (ranks
need no calibration between BM25 scores and cosines), then optional MMR so that near-identical
chunks do not fill the top. A BM25 hit's vote is weighted by how much of the query it matched
(`bm25_weights`): a hit with every term votes in full; a hit that matched only some terms votes
with the share of the query's IDF (its information) it holds, cubed. A question whose words
are not in its answer ("which database did we pick for the cache?") still gets a full BM25
list, matched on "which", "did", "the"; unweighted, those hits outvote the vector side's real
answer. A keyword question with filler ("when is the pottery class in Verona?") matches
"pottery" and "Verona", most of its IDF, and keeps most of its vote.

What is embedded is the row's text without the lines a daily note puts around every entry
(`embedding_text`): the `# YYYY-MM-DD` heading and the `## HH:MM:SS · <session key>`
attribution. They carry no meaning, make every chunk of a session alike, and in a one-line
entry outweigh the entry itself; BM25 still indexes them. (Vectors stored before this were
embedded with them; they stay valid until their row changes or a `reembed(everything=True)`.)

Optional temporal decay (`decay_factors`) multiplies each score by 0.5 ** (age / half-life),
the age taken from a daily note's file name (memory/YYYY-MM-DD.md) or an archived message's
time; MEMORY.md and other undated files never decay.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
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
CREATE TABLE IF NOT EXISTS vector_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
EMBEDDED_TEXT = "2"
"""Which text of a row is embedded (`embedding_text`); vectors stored under another version
were made from other text (1: with the daily notes' date and attribution lines) and are
dropped when the index opens, so the gateway's start-up refresh embeds them again."""
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
PARTIAL_MATCH_POWER = 3.0
"""A BM25 hit missing some query terms votes with weight coverage ** this, where coverage is
the share of the query's IDF it matched (1 for a hit with every term). Cubed because with
RRF's k = 60 the top vector ranks are close (1/61 against 1/63: a gap of ~0.03 of a vote), so
a hit on a question's common words (coverage ~0.3) must vote less than that not to reorder
them (0.3 ** 3 = 0.027), while one on its rare words (coverage ~0.8) keeps half its vote."""
DF_CACHE_SIZE = 4_096
_NOTE_FRAME = re.compile(r"^\s{0,3}(?:#\s+\d{4}-\d{2}-\d{2}|##\s+\d{2}:\d{2}:\d{2}\s+·.*)\s*$")
"""A daily note's date heading or an entry's attribution line (see `memory.notes`)."""
_DAILY_NOTE = re.compile(r"(?:^|/)(\d{4})-(\d{2})-(\d{2})\.md$")

_IDENTIFIER = re.compile(r"\S*(?:\d|[A-Za-z][_/.:#@-][A-Za-z0-9]|[a-z][A-Z])\S*")
"""A query term an embedding cannot be trusted with: digits, inner `_/.:#@-`, or camelCase."""


_blas: Any = None  # threadpoolctl's controller once looked up; False without threadpoolctl


def one_blas_thread() -> AbstractContextManager[Any]:
    """Limit BLAS to one thread (process-wide, restored on exit) for a search's products.

    On a small, busy host OpenBLAS's threads contend with everything else: measured on 2 loaded
    cores, the 10,000 x 512 product of a vector search took 15 ms at p50 with two threads
    against 4 ms with one, and MMR's 32 x 32 similarity 46 ms at p99 against 8 ms. (The model's
    forward pass limits itself the same way.) Without threadpoolctl, which comes with the
    model, nothing is limited."""
    global _blas
    if _blas is None:
        try:
            from threadpoolctl import ThreadpoolController

            _blas = ThreadpoolController()
        except Exception:  # not installed, or no BLAS it knows: leave the threads alone
            _blas = False
    if _blas is False:
        return nullcontext()
    limited: AbstractContextManager[Any] = _blas.limit(limits=1, user_api="blas")
    return limited


def body_hash(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def embedding_text(text: str) -> str:
    """`text` as embedded: without daily-note date headings and entry attribution lines (all of
    it when that is all there is)."""
    if "#" not in text:
        return text
    kept = "\n".join(line for line in text.split("\n") if not _NOTE_FRAME.match(line)).strip()
    return kept or text


def drop_vectors_of_older_text(conn: sqlite3.Connection) -> bool:
    """Forget every vector embedded from another `EMBEDDED_TEXT` version; True if any were."""
    row = conn.execute("SELECT value FROM vector_meta WHERE key = 'embedded_text'").fetchone()
    if row is not None and row[0] == EMBEDDED_TEXT:
        return False
    dropped = False
    for table in VECTOR_TABLE.values():
        dropped |= conn.execute(f"DELETE FROM {table}").rowcount > 0
    conn.execute(
        "INSERT OR REPLACE INTO vector_meta(key, value) VALUES ('embedded_text', ?)",
        (EMBEDDED_TEXT,),
    )
    if dropped:
        _log.info("memory index: vectors from an older way of choosing the text are re-made")
    return dropped


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
        self._df: dict[tuple[Table, str], int] = {}
        self._df_rows: dict[Table, int] = {}
        self._df_state: tuple[int, int] | None = None

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
        encoded = self.encoder.encode([embedding_text(text) for _, text in rows])
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

    def document_frequencies(
        self, conn: sqlite3.Connection, table: Table, expressions: Sequence[str | None]
    ) -> tuple[int, list[int | None]]:
        """(rows, rows matching each FTS5 expression) of a corpus, counted up to half the rows
        and one (all that `_idf` needs); None for a term no expression can answer.

        Cached until a write: this connection's `total_changes` or another's commit (`PRAGMA
        data_version`) moves. Questions' filler words recur, and their long posting lists are
        the costly ones to count."""
        state = (conn.total_changes, int(conn.execute("PRAGMA data_version").fetchone()[0]))
        if state != self._df_state or len(self._df) > DF_CACHE_SIZE:
            self._df.clear()
            self._df_rows.clear()
            self._df_state = state
        source = SOURCE_TABLE[table]
        rows = self._df_rows.get(table)
        if rows is None:
            rows = int(conn.execute(f"SELECT count(*) FROM {source}").fetchone()[0])
            self._df_rows[table] = rows
        fts = f"{source}_fts"
        out: list[int | None] = []
        for expression in expressions:
            if expression is None:
                out.append(None)
                continue
            known = self._df.get((table, expression))
            if known is None:  # counted up to half the rows: past that the IDF is 0 anyway
                known = int(
                    conn.execute(
                        f"SELECT count(*) FROM (SELECT 1 FROM {fts} WHERE {fts} MATCH ? LIMIT ?)",
                        (expression, rows // 2 + 1),
                    ).fetchone()[0]
                )
                self._df[(table, expression)] = known
            out.append(known)
        return rows, out

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
    session_key: str | None,
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
            for rowid, cosine in index.top_k(conn, table, query, pool, session_key)
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
