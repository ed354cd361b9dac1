"""Embedding vectors beside the FTS index (issue 22); how search ranks with them is `memory.fusion`.

Each note chunk and archived transcript row may have one float32 vector, stored in the index's
own SQLite file (`chunk_vectors`, `transcript_vectors`: keyed by the row's id, with the encoder
name, its dimensions and a hash of the text embedded). Search needs every vector of a corpus at
once, so each corpus is loaded lazily into one flat matrix kept in memory and patched as rows
are embedded or removed; a commit by another connection (the CLI reindexing while the gateway
runs) is noticed through `PRAGMA data_version` and the matrix is loaded again.

Row ids of SQLite tables can be reused after a delete, and an older gatehouse that knows
nothing of vectors may delete and insert rows in this file. So a vector counts only while the
hash of its row's current text equals the hash stored with it; the load drops any other.

What is embedded is the row's text without the lines a daily note puts around every entry
(`embedding_text`): the `# YYYY-MM-DD` heading and the `## HH:MM:SS · <session key>`
attribution. They carry no meaning, make every chunk of a session alike, and in a one-line
entry outweigh the entry itself; BM25 still indexes them. (Vectors stored before this were
embedded with them; they stay valid until their row changes or a `reembed(everything=True)`.)
"""

from __future__ import annotations

import hashlib
import logging
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from memory.embeddings import Encoder, Vectors, cosine_top_k
from memory.visibility import SearchScope

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

EMBED_BATCH = 256
DF_CACHE_SIZE = 4_096
_NOTE_FRAME = re.compile(r"^\s{0,3}(?:#\s+\d{4}-\d{2}-\d{2}|##\s+\d{2}:\d{2}:\d{2}\s+·.*)\s*$")
"""A daily note's date heading or an entry's attribution line (see `memory.notes`)."""


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
        scope: SearchScope | None = None,
    ) -> list[tuple[int, float]]:
        """(row id, cosine) of the k nearest rows, best first, among those `scope` allows
        (a session's archived messages, the notes a caller may see)."""
        loaded = self.matrix(conn, table)
        ids, vectors = loaded.ids, loaded.vectors
        source = SOURCE_TABLE[table]
        where = scope.where(source) if scope is not None else None
        if where is not None:
            only = [
                row[0]
                for row in conn.execute(f"SELECT id FROM {source} WHERE {where[0]}", where[1])
            ]
            mask = np.isin(ids, np.asarray(only, dtype=np.int64))
            ids, vectors = ids[mask], vectors[mask]
        order, scores = cosine_top_k(query, vectors, k)
        return [(int(ids[i]), float(s)) for i, s in zip(order, scores, strict=True)]

    def document_frequencies(
        self, conn: sqlite3.Connection, table: Table, expressions: Sequence[str | None]
    ) -> tuple[int, list[int | None]]:
        """(rows, rows matching each FTS5 expression) of a corpus, counted up to half the rows
        and one (all that `memory.fusion._idf` needs); None for a term no expression can answer.

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
