"""Full-text search over the workspace's Markdown (`memory_search`).

SQLite FTS5 with the `trigram` tokenizer: Chinese and Japanese have no spaces between words, so a
word-splitting tokenizer would index whole sentences as one token; trigrams make any substring of
three or more characters findable in any script, ranked by BM25. A trigram index cannot answer a
shorter term (two-character Chinese words such as 会议, or "go"), so each chunk also carries a
second column of short tokens: every CJK character pair and every one- or two-character word,
space-delimited. The query ` 会议 ` is three characters, so it hits that column through the same
trigram index, and one BM25 ranks both kinds of term together. Only terms neither column can
express (a single CJK character, "C#") fall back to a substring scan scored with the same formula.

The index is derived data. `refresh()` follows the files incrementally: a file is re-read only
when its size or mtime changed, re-chunked only when its SHA-256 changed, and dropped when it
disappears, so hand edits by people are picked up without a full rebuild. The optional
transcripts corpus is not derived from files (archived session transcripts are added by the
gateway), so `reindex()` leaves it alone.

The same file keeps each session's history archive: the messages a compaction (or a reset) took
out of the prompt, one row per message (`archive_messages`, secrets already redacted by the
gateway), and the identifiers found in them with the seqs they appear in
(`archive_identifiers`). `history_search` answers from that session's archive only: an exact
identifier first, then words by BM25. The message rows are also the transcripts corpus of
`search()` (which spans every session), unless the index is opened with
`search_transcripts=False`.

With an encoder (`memory.embeddings`), every chunk and archived row also gets a vector in the
same file, embedded once when written and dropped with its row (`memory.vectors`), and
`search(mode="vector" | "hybrid")` ranks by meaning too; BM25 stays the default.

Schema changes are additive (`CREATE TABLE IF NOT EXISTS`, an `ALTER TABLE ADD COLUMN` guarded
by `PRAGMA table_info`) and `user_version` stays 1: an older gatehouse treats any other version
as "rebuild" and drops every table, transcripts included, which cannot be derived again.

Synchronous on purpose: the gateway calls it through `asyncio.to_thread`; one connection guarded
by a lock serves those worker threads.
"""

from __future__ import annotations

import hashlib
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from memory.embeddings import Encoder
from memory.fusion import (
    CANDIDATES_PER_RESULT,
    MMR_LAMBDA,
    decay_factors,
    decayed,
    fuse,
    informative_terms,
)
from memory.text import (
    Chunk,
    centred_excerpt,
    chunk_markdown,
    fts_term,
    identifier_candidates,
    make_snippet,
    message_chunks,
    query_terms,
    short_tokens,
    with_outcome,
)
from memory.vectors import (
    VECTOR_SCHEMA,
    VectorIndex,
    drop_vectors_of_older_text,
    forget_vectors,
    one_blas_thread,
)
from memory.visibility import SearchScope, Visibility, entry_authors
from memory.workspace import exclusive, scan_workspace, split_lines

Corpus = Literal["notes", "transcripts", "all"]
SearchMode = Literal["bm25", "vector", "hybrid"]
_log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
MAX_LIMIT = 50
MAX_FILE_BYTES = 16 * 1024 * 1024
"""Bigger files are not notes (a pasted log, a dump); indexing them would stall a refresh."""
RACY_NS = 2_000_000_000
"""A file modified this recently may change again within the same mtime tick without changing
size; its stat is not trusted, so the next refresh re-hashes it (git's "racy clean" rule)."""

K1 = 1.2  # FTS5's bm25() defaults, so scan scores and index scores share one scale
B = 0.75

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
HISTORY_LIMIT = 20

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files(
    path TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    sha256 TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS chunks(
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL,
    start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL,
    body TEXT NOT NULL,
    short TEXT NOT NULL,
    author TEXT,
    person TEXT,
    shared INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS chunks_by_path ON chunks(path);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(
    body, short, content='chunks', content_rowid='id', tokenize='trigram'
);
CREATE TABLE IF NOT EXISTS transcripts(
    id INTEGER PRIMARY KEY,
    session_key TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    body TEXT NOT NULL,
    short TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS transcripts_by_range ON transcripts(session_key, first_seq, last_seq);
CREATE VIRTUAL TABLE IF NOT EXISTS transcripts_fts USING fts5(
    body, short, content='transcripts', content_rowid='id', tokenize='trigram'
);
CREATE TABLE IF NOT EXISTS history_identifiers(
    session_key TEXT NOT NULL,
    value TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    folded TEXT NOT NULL,
    PRIMARY KEY (session_key, value, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS history_identifiers_folded ON history_identifiers(session_key, folded);
"""
_AUTHOR_COLUMNS = (
    ("author", "TEXT"), ("person", "TEXT"), ("shared", "INTEGER NOT NULL DEFAULT 0"),
)
"""Added to `chunks`: whom the note entry a chunk belongs to is for (`memory.visibility`;
author NULL: written by hand). An index file from before them is re-chunked once."""
_MESSAGE_COLUMNS = (("role", "TEXT"), ("created_at", "TEXT"), ("name", "TEXT"))
"""Added to `transcripts` for per-message rows (first_seq = last_seq = the message's seq); a row
with role NULL is a whole range from `add_transcript` (how index files before them archived)."""
_DERIVED_TABLES = ("chunks_fts", "chunks", "files")
"""What an unknown layout may rebuild from the files. Never the transcripts or identifiers."""


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result. For transcripts, `path` is the session key and the "lines" are the
    message sequence numbers. `score` is higher-better and comparable within one search."""

    corpus: Literal["notes", "transcripts"]
    path: str
    start_line: int
    end_line: int
    snippet: str
    score: float
    all_terms: bool  # False: matched only some query terms (listed after full matches)
    role: str | None = None  # an archived message's role (None: notes, or an archived range)
    # Why it ranks here (None where the mode used has no such list):
    bm25_rank: int | None = None  # 1-based place in the BM25 list
    vector_score: float | None = None  # cosine to the query
    fused_score: float | None = None  # reciprocal rank fusion (hybrid)
    mode_used: SearchMode = "bm25"  # "bm25" when vector or hybrid had to fall back

    @property
    def location(self) -> str:
        """How the tool result cites the hit (`memory_get` takes the notes form)."""
        if self.corpus == "transcripts":
            if self.start_line == self.end_line:
                return f"transcript {self.path} #{self.start_line}" + (
                    f" ({self.role})" if self.role else ""
                )
            return f"transcript {self.path} #{self.start_line}-{self.end_line}"
        return f"{self.path}:{self.start_line}-{self.end_line}"


@dataclass(frozen=True, slots=True)
class ArchivedMessage:
    """One message a compaction or reset took out of the prompt, as `history_search` keeps it.

    `text` is what is searchable (the gateway redacts secrets before archiving); `created_at`
    is an ISO timestamp when known; `name` is a tool result's tool."""

    seq: int
    role: str
    text: str
    created_at: str | None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class HistoryHit:
    """One `history_search` result: an archived message of the searched session.

    `via` says how it was found: "identifier" (an exact identifier lookup; score 1.0, or 0.5
    for a case-insensitive match) or "words" (BM25, higher-better). Scores compare only within
    one `via`. A range archived before per-message archiving has role "transcript", `seq` its
    first seq and `last_seq` its last."""

    seq: int
    role: str
    created_at: str | None
    excerpt: str
    via: Literal["identifier", "words"]
    score: float
    name: str | None = None
    last_seq: int | None = None


@dataclass(frozen=True, slots=True)
class RefreshStats:
    """What one refresh did, so callers and the benchmark can see its incremental cost."""

    files_scanned: int
    files_hashed: int  # stat changed (or was too recent to trust): content read and hashed
    files_changed: int  # content changed: re-chunked
    files_removed: int
    chunks_written: int  # new or edited chunks put into the FTS index
    chunks_removed: int  # chunks taken out of it (edited or deleted)
    seconds: float
    vectors_written: int = 0  # rows embedded (new, edited, or missing a current vector)


@dataclass(frozen=True, slots=True)
class _Ranked:
    tier: int  # 0: every term matched, 1: some
    score: float
    rowid: int


class MemoryIndex:
    """The search index for one workspace, stored in its own SQLite file (WAL).

    Call `refresh()` before searching (cheap when little changed) so hand edits are seen.
    """

    def __init__(
        self,
        db_path: Path,
        workspace: Path,
        *,
        suffixes: Sequence[str] = (".md",),
        exclude_dirs: Sequence[str] = ("artifacts", "inbox"),  # inbox: files people sent
        search_transcripts: bool = True,
        encoder: Encoder | None = None,
    ) -> None:
        self.db_path = db_path
        self.workspace = workspace
        self.search_transcripts = search_transcripts
        """False: `search()` leaves the archived messages out (corpus "transcripts" finds
        nothing, "all" means the notes); `history_search` is not affected."""
        self.encoder = encoder
        """With an encoder every row gets a vector and `search` can rank by meaning; without,
        modes "vector" and "hybrid" fall back to BM25 (and the hits say so)."""
        self._fallback_logged = False
        self._suffixes = tuple(suffixes)
        self._exclude = tuple(exclude_dirs)
        self._lock = threading.RLock()
        self._corpus_stats: dict[str, tuple[int, float]] = {}
        db_path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(db_path), check_same_thread=False, isolation_level=None)
        self._vectors = (
            None if encoder is None
            else VectorIndex(encoder, self._conn, self._lock, self._transaction)
        )
        try:
            # Processes sharing a workspace open this file at once (two `gatehouse run`, a CLI
            # command): one at a time checks and upgrades the schema, or both add a column. A
            # lock file of its own: closing a descriptor of the database drops SQLite's locks.
            with exclusive(db_path.with_name(db_path.name + ".lock")):
                self._setup()
        except BaseException:
            self._conn.close()
            raise

    def _setup(self) -> None:
        conn = self._conn
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        try:
            conn.execute("CREATE VIRTUAL TABLE temp.probe USING fts5(x, tokenize='trigram')")
            conn.execute("DROP TABLE temp.probe")
        except sqlite3.OperationalError as exc:
            raise RuntimeError(
                f"SQLite {sqlite3.sqlite_version} lacks FTS5 with the trigram tokenizer "
                "(needs 3.34+ built with FTS5); memory_search cannot work"
            ) from exc
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version not in (0, SCHEMA_VERSION):
            for table in _DERIVED_TABLES:  # derived data from another layout: rebuild
                conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.executescript(_SCHEMA)
        conn.executescript(VECTOR_SCHEMA)
        drop_vectors_of_older_text(conn)
        have = {str(row[1]) for row in conn.execute("PRAGMA table_info(transcripts)")}
        for column, kind in _MESSAGE_COLUMNS:
            if column not in have:  # an index file from before per-message archiving
                conn.execute(f"ALTER TABLE transcripts ADD COLUMN {column} {kind}")
        have = {str(row[1]) for row in conn.execute("PRAGMA table_info(chunks)")}
        missing = [(c, k) for c, k in _AUTHOR_COLUMNS if c not in have]
        for column, kind in missing:  # an index file from before note visibility
            conn.execute(f"ALTER TABLE chunks ADD COLUMN {column} {kind}")
        if missing:
            conn.execute("DELETE FROM files")  # every file re-chunked: its chunks' authors
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def use_encoder(self, encoder: Encoder) -> None:
        """Search by meaning from now on with `encoder`, loaded after the index opened (the
        gateway warms the model up off the request path); the next refresh embeds the rows."""
        with self._lock:
            self.encoder = encoder
            self._vectors = VectorIndex(encoder, self._conn, self._lock, self._transaction)
            self._fallback_logged = False

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> MemoryIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            if self._vectors is not None:
                self._vectors.invalidate()  # its matrices may hold the rolled-back changes
            raise
        self._conn.execute("COMMIT")
        self._corpus_stats.clear()

    # ---- notes corpus -------------------------------------------------------------------

    def refresh(self, progress: Callable[[int, int], None] | None = None) -> RefreshStats:
        """Bring the index in line with the files: changed files re-chunked, deleted ones gone.

        `progress(done, total)` hears of each file scanned (the CLI's progress bar). With an
        encoder, every row then lacking a current vector (new, edited, or from another
        encoder) is embedded, outside the lock that searches wait on."""
        began = time.perf_counter()
        stats = self._refresh_files(progress)
        if self._vectors is None:
            return stats
        embedded = self._vectors.embed_missing(self._vector_tables())
        return replace(stats, vectors_written=embedded, seconds=time.perf_counter() - began)

    def _refresh_files(self, progress: Callable[[int, int], None] | None) -> RefreshStats:
        began = time.perf_counter()
        scanned = hashed = changed = removed = written = dropped = 0
        with self._lock, self._transaction() as conn:
            known = {
                row[0]: (int(row[1]), int(row[2]), str(row[3]))
                for row in conn.execute("SELECT path, size, mtime_ns, sha256 FROM files")
            }
            seen: set[str] = set()
            now_ns = time.time_ns()
            files = list(scan_workspace(self.workspace, self._suffixes, self._exclude))
            for found in files:
                rel = found.rel
                scanned += 1
                if progress is not None:
                    progress(scanned, len(files))
                if found.size > MAX_FILE_BYTES:
                    continue  # not notes; dropped from the index below if it was there
                old = known.get(rel)
                if old is not None and old[0] == found.size and old[1] == found.mtime_ns:
                    seen.add(rel)
                    continue
                try:
                    with open(found.path, "rb") as handle:
                        data = handle.read()
                except OSError:
                    continue  # vanished since the scan: removed below
                seen.add(rel)
                hashed += 1
                digest = hashlib.sha256(data).hexdigest()
                size = -1 if now_ns - found.mtime_ns < RACY_NS else found.size
                conn.execute(
                    "INSERT INTO files(path, size, mtime_ns, sha256) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(path) DO UPDATE SET size=excluded.size, "
                    "mtime_ns=excluded.mtime_ns, sha256=excluded.sha256",
                    (rel, size, found.mtime_ns, digest),
                )
                if old is not None and old[2] == digest:
                    continue  # touched, not changed
                changed += 1
                text = data.decode("utf-8", errors="replace")
                added, gone = self._sync_chunks(conn, rel, chunk_markdown(text), text)
                written += added
                dropped += gone
            for rel in known.keys() - seen:
                dropped += self._sync_chunks(conn, rel, [], "")[1]
                conn.execute("DELETE FROM files WHERE path = ?", (rel,))
                removed += 1
        return RefreshStats(
            scanned, hashed, changed, removed, written, dropped, time.perf_counter() - began
        )

    def _sync_chunks(
        self, conn: sqlite3.Connection, rel: str, chunks: list[Chunk], text: str
    ) -> tuple[int, int]:
        """Make the file's chunks equal `chunks` (of the file's `text`), touching the FTS index
        only where text changed; each chunk carries the author of the note entry it is part
        of (a hand edit of a heading changes who may see every chunk of that entry).

        An appended entry adds one chunk; a hand edit replaces the edited chunk and merely
        renumbers the lines of the chunks after it. Returns (chunks added, chunks removed).
        """
        authors = entry_authors(split_lines(text))

        def author_of(chunk: Chunk) -> tuple[str | None, str | None, int]:
            found = [a for a in authors[chunk.start_line - 1 : chunk.end_line] if a is not None]
            if not found:
                return None, None, 0
            a = found[-1]
            return a.session_key, a.person, int(a.shared)

        reusable: dict[str, list[tuple[int, int, int]]] = {}
        for rowid, start, end, body in conn.execute(
            "SELECT id, start_line, end_line, body FROM chunks WHERE path = ? ORDER BY id", (rel,)
        ):
            reusable.setdefault(str(body), []).append((int(rowid), int(start), int(end)))
        fresh: list[Chunk] = []
        moved: list[tuple[int, int, str | None, str | None, int, int]] = []
        for chunk in chunks:
            bucket = reusable.get(chunk.text)
            if not bucket:
                fresh.append(chunk)
                continue
            rowid, start, end = bucket.pop(0)
            # Lines and author rewritten whether or not they moved: cheap, and always right.
            moved.append((chunk.start_line, chunk.end_line, *author_of(chunk), rowid))
        stale = [(rowid,) for bucket in reusable.values() for rowid, _, _ in bucket]
        conn.executemany(
            "INSERT INTO chunks_fts(chunks_fts, rowid, body, short) "
            "SELECT 'delete', id, body, short FROM chunks WHERE id = ?",
            stale,
        )
        conn.executemany("DELETE FROM chunks WHERE id = ?", stale)
        forget_vectors(conn, self._vectors, "notes", [rowid for rowid, in stale])
        conn.executemany(
            "UPDATE chunks SET start_line = ?, end_line = ?, author = ?, person = ?, shared = ? "
            "WHERE id = ?",
            moved,
        )
        rows: list[tuple[int, str, str]] = []
        for chunk in fresh:
            short = short_tokens(chunk.text)
            cursor = conn.execute(
                "INSERT INTO chunks(path, start_line, end_line, body, short, author, person, "
                "shared) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (rel, chunk.start_line, chunk.end_line, chunk.text, short, *author_of(chunk)),
            )
            rows.append((int(cursor.lastrowid or 0), chunk.text, short))
        conn.executemany("INSERT INTO chunks_fts(rowid, body, short) VALUES (?, ?, ?)", rows)
        return len(fresh), len(stale)

    def reindex(self, progress: Callable[[int, int], None] | None = None) -> RefreshStats:
        """Forget the notes index and build it again from the files (transcripts are kept)."""
        with self._lock:
            with self._transaction() as conn:
                conn.execute("INSERT INTO chunks_fts(chunks_fts) VALUES ('delete-all')")
                conn.execute("DELETE FROM chunks")
                conn.execute("DELETE FROM chunk_vectors")
                if self._vectors is not None:
                    self._vectors.invalidate()
                conn.execute("DELETE FROM files")
            stats = self._refresh_files(progress)
        if self._vectors is None:
            return stats
        return replace(stats, vectors_written=self._vectors.embed_missing(self._vector_tables()))

    # ---- vectors ------------------------------------------------------------------------

    def _vector_tables(self) -> list[Literal["notes", "transcripts"]]:
        return ["notes", "transcripts"] if self.search_transcripts else ["notes"]

    def _forget_transcripts(
        self, conn: sqlite3.Connection, where: str, params: Sequence[tuple[object, ...]]
    ) -> None:
        """Drop the vectors of the transcript rows `where` is about to delete."""
        ids = [
            int(row[0])
            for args in params
            for row in conn.execute(f"SELECT id FROM transcripts WHERE {where}", args)
        ]
        forget_vectors(conn, self._vectors, "transcripts", ids)

    def _embed_written(self, ids: list[int]) -> None:
        if self._vectors is not None and self.search_transcripts:
            self._vectors.embed_missing(["transcripts"], only=ids)

    def reembed(
        self, progress: Callable[[int, int], None] | None = None, *, everything: bool = False
    ) -> int:
        """Embed every row lacking a vector from the current encoder (all rows with
        `everything`); returns rows embedded. Unlike refresh, an encoder failure is raised."""
        if self._vectors is None:
            raise RuntimeError("this index has no encoder")
        return self._vectors.embed_missing(self._vector_tables(), everything, progress, True)

    def vector_coverage(self) -> dict[str, tuple[int, int]]:
        """Per corpus: (rows with a vector from the current encoder, rows); {} without one."""
        if self._vectors is None:
            return {}
        with self._lock:
            return {t: self._vectors.coverage(self._conn, t) for t in self._vector_tables()}

    # ---- transcripts corpus -------------------------------------------------------------

    def add_transcript(self, session_key: str, first_seq: int, last_seq: int, text: str) -> int:
        """Index archived messages `first_seq`..`last_seq` of a session as one rendered range;
        return chunks written. (The gateway now archives per message: `archive_messages`.)

        Adding the same range again replaces it, so re-archiving is harmless.
        """
        if first_seq > last_seq:
            raise ValueError(f"first_seq {first_seq} is after last_seq {last_seq}")
        chunks = chunk_markdown(text)
        key = (session_key, first_seq, last_seq)
        with self._lock, self._transaction() as conn:
            where = "session_key = ? AND first_seq = ? AND last_seq = ? AND role IS NULL"
            conn.execute(
                "INSERT INTO transcripts_fts(transcripts_fts, rowid, body, short) "
                f"SELECT 'delete', id, body, short FROM transcripts WHERE {where}",
                key,
            )
            self._forget_transcripts(conn, where, [key])
            conn.execute(f"DELETE FROM transcripts WHERE {where}", key)
            conn.executemany(
                "INSERT INTO transcripts(session_key, first_seq, last_seq, body, short) "
                "VALUES (?, ?, ?, ?, ?)",
                [(*key, c.text, short_tokens(c.text)) for c in chunks],
            )
            conn.execute(
                "INSERT INTO transcripts_fts(rowid, body, short) "
                f"SELECT id, body, short FROM transcripts WHERE {where}",
                key,
            )
            new = [int(r[0]) for r in conn.execute(f"SELECT id FROM transcripts WHERE {where}", key)]
        self._embed_written(new)
        return len(chunks)

    # ---- history archive ----------------------------------------------------------------

    def archive_messages(self, session_key: str, messages: Sequence[ArchivedMessage]) -> int:
        """Archive messages of a session, one searchable row per message (a long one in chunks
        that share its seq); return the rows written.

        A message archived again replaces its rows, so re-archiving is idempotent. A range
        archived whole by `add_transcript` that lies inside the seqs archived here is dropped:
        these rows supersede it.
        """
        if not messages:
            return 0
        latest: dict[int, ArchivedMessage] = {m.seq: m for m in messages}
        rows = [
            (session_key, m.seq, m.seq, chunk, short_tokens(chunk), m.role, m.created_at, m.name)
            for m in latest.values()
            for chunk in message_chunks(m.text)
        ]
        seqs = [(session_key, seq, seq) for seq in latest]
        low, high = min(latest), max(latest)
        with self._lock, self._transaction() as conn:
            one = "session_key = ? AND first_seq = ? AND last_seq = ? AND role IS NOT NULL"
            conn.executemany(
                "INSERT INTO transcripts_fts(transcripts_fts, rowid, body, short) "
                f"SELECT 'delete', id, body, short FROM transcripts WHERE {one}",
                seqs,
            )
            self._forget_transcripts(conn, one, seqs)
            conn.executemany(f"DELETE FROM transcripts WHERE {one}", seqs)
            inside = "session_key = ? AND role IS NULL AND first_seq >= ? AND last_seq <= ?"
            conn.execute(
                "INSERT INTO transcripts_fts(transcripts_fts, rowid, body, short) "
                f"SELECT 'delete', id, body, short FROM transcripts WHERE {inside}",
                (session_key, low, high),
            )
            self._forget_transcripts(conn, inside, [(session_key, low, high)])
            conn.execute(f"DELETE FROM transcripts WHERE {inside}", (session_key, low, high))
            written: list[tuple[int, str, str]] = []
            for row in rows:
                cursor = conn.execute(
                    "INSERT INTO transcripts(session_key, first_seq, last_seq, body, short, role, "
                    "created_at, name) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    row,
                )
                written.append((int(cursor.lastrowid or 0), row[3], row[4]))
            conn.executemany(
                "INSERT INTO transcripts_fts(rowid, body, short) VALUES (?, ?, ?)", written
            )
        self._embed_written([rowid for rowid, _, _ in written])
        return len(rows)

    def archive_identifiers(
        self, session_key: str, items: Sequence[tuple[str, str, Sequence[int]]]
    ) -> int:
        """Record (value, kind, seqs): the identifier `value` appears in those messages of the
        session. Unique per (session, value, seq), so recording again is harmless (the latest
        kind wins). Returns the (value, seq) pairs given."""
        rows = [
            (session_key, value, int(seq), kind, value.lower())
            for value, kind, seqs in items
            if value
            for seq in seqs
        ]
        if not rows:
            return 0
        with self._lock, self._transaction() as conn:
            conn.executemany(
                "INSERT INTO history_identifiers(session_key, value, seq, kind, folded) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT(session_key, value, seq) "
                "DO UPDATE SET kind = excluded.kind",
                rows,
            )
        return len(rows)

    def history_search(self, session_key: str, query: str, limit: int = 5) -> list[HistoryHit]:
        """The archived messages of `session_key` (and no other session) that answer `query`.

        First exact identifiers: the whole query (without surrounding quotes or backticks), or
        else the pieces of it, that equal an identifier archived for the session, in exact case
        or, failing that, any case: the messages it appears in, newest first, with an excerpt
        centred on it. Then words: BM25 over the session's archived messages (every term
        first, then some), with an excerpt around the longest term found. One hit per seq, at
        most `limit` (capped at 20); a range archived whole counts as all its seqs.
        """
        limit = max(1, min(int(limit), HISTORY_LIMIT))
        hits: list[HistoryHit] = []
        seen: set[int] = set()

        def take(hit: HistoryHit | None) -> None:
            if hit is None or len(hits) >= limit:
                return
            span = range(hit.seq, (hit.last_seq or hit.seq) + 1)
            if not seen.intersection(span):
                seen.update(span)
                hits.append(hit)

        with self._lock:
            for value, seq, score in self._identifier_matches(session_key, query):
                if len(hits) >= limit:
                    break
                if seq not in seen:
                    take(self._identifier_hit(session_key, value, seq, score))
            terms = query_terms(query)
            if len(hits) < limit and terms:
                for hit in self._word_hits(session_key, terms, min(limit * 4, 100)):
                    take(hit)
        return hits

    def _identifier_matches(self, session_key: str, query: str) -> list[tuple[str, int, float]]:
        """(value, seq, score) of the identifiers in `query`, newest seq first per identifier.

        The whole query is tried first; only when it is no identifier are its pieces tried."""
        candidates = identifier_candidates(query)
        out: list[tuple[str, int, float]] = []
        for index, candidate in enumerate(candidates):
            rows = self._conn.execute(
                "SELECT value, seq FROM history_identifiers WHERE session_key = ? AND value = ? "
                "ORDER BY seq DESC",
                (session_key, candidate),
            ).fetchall()
            score = 1.0
            if not rows:
                rows = self._conn.execute(
                    "SELECT value, seq FROM history_identifiers WHERE session_key = ? "
                    "AND folded = ? ORDER BY seq DESC, value",
                    (session_key, candidate.lower()),
                ).fetchall()
                score = 0.5
            out.extend((str(value), int(seq), score) for value, seq in rows)
            if index == 0 and rows:
                break
        return out

    def _identifier_hit(
        self, session_key: str, value: str, seq: int, score: float
    ) -> HistoryHit | None:
        """The archived message `seq` (or the range archived whole that holds it), centred on
        `value`."""
        rows = self._conn.execute(
            "SELECT body, role, created_at, name FROM transcripts WHERE session_key = ? "
            "AND first_seq = ? AND last_seq = ? AND role IS NOT NULL ORDER BY id",
            (session_key, seq, seq),
        ).fetchall()
        if rows:
            body = next((str(r[0]) for r in rows if value.lower() in str(r[0]).lower()), rows[0][0])
            role, created_at, name = rows[0][1], rows[0][2], rows[0][3]
            excerpt = with_outcome(centred_excerpt(str(body), [value]), str(rows[0][0]))
            return HistoryHit(seq, str(role), created_at, excerpt, "identifier", score, name)
        legacy = self._conn.execute(
            "SELECT body, first_seq, last_seq FROM transcripts WHERE session_key = ? "
            "AND role IS NULL AND first_seq <= ? AND last_seq >= ? ORDER BY id",
            (session_key, seq, seq),
        ).fetchall()
        if not legacy:
            return None  # the message was never archived: nothing to show
        row = next((r for r in legacy if value.lower() in str(r[0]).lower()), legacy[0])
        first, last = int(row[1]), int(row[2])
        return HistoryHit(
            first, "transcript", None, centred_excerpt(str(row[0]), [value]), "identifier",
            score, None, None if first == last else last,
        )

    def _word_hits(self, session_key: str, terms: list[str], limit: int) -> list[HistoryHit]:
        ranked = self._rank("transcripts", terms, limit, scope=SearchScope(session_key))
        if not ranked:
            return []
        ids = [item.rowid for item in ranked]
        marks = ",".join("?" * len(ids))
        rows = {
            int(row[0]): row
            for row in self._conn.execute(
                "SELECT id, first_seq, last_seq, body, role, created_at, name FROM transcripts "
                f"WHERE id IN ({marks}) AND session_key = ?",
                (*ids, session_key),
            )
        }
        needles = sorted(terms, key=len, reverse=True)
        hits: list[HistoryHit] = []
        for item in sorted(ranked, key=lambda r: (r.tier, -r.score)):
            row = rows.get(item.rowid)
            if row is None:
                continue
            _, first, last, body, role, created_at, name = row
            hits.append(
                HistoryHit(
                    int(first),
                    "transcript" if role is None else str(role),
                    created_at,
                    centred_excerpt(str(body), needles),
                    "words",
                    item.score,
                    name,
                    None if role is not None or first == last else int(last),
                )
            )
        return hits

    # ---- search -------------------------------------------------------------------------

    def search(
        self,
        query: str,
        limit: int = 8,
        corpus: Corpus = "notes",
        mode: SearchMode = "bm25",
        *,
        session_key: str | None = None,
        mmr_lambda: float | None = MMR_LAMBDA,
        half_life_days: float | None = None,
        notes: Visibility | None = None,
    ) -> list[Hit]:
        """The best chunks for `query`.

        "bm25": chunks with every term first, then with some, by BM25. "vector": by cosine to
        the query's embedding. "hybrid": reciprocal rank fusion of both lists, each BM25 hit's
        vote weighted by the share of the query's IDF it matched (`memory.fusion`), except
        that BM25 hits holding an identifier of the query verbatim come first (an embedding
        blurs ORD-88123 into ORD-88124). Vector and hybrid pick with MMR (`mmr_lambda`, None:
        off) so near-identical chunks do not fill the top. Without an encoder, or if it fails,
        they fall back to BM25 and each hit's `mode_used` says so. `session_key` confines the
        transcripts searched to that session's; `notes` confines the notes to what a caller may
        see (`memory.visibility`; None: every note).

        `half_life_days` (None: off) multiplies each score by 0.5 ** (age / half-life), the age
        from a daily note's name (memory/YYYY-MM-DD.md) or an archived message's time;
        MEMORY.md and undated files never decay. In BM25 mode it reorders within each tier.
        """
        if corpus not in ("notes", "transcripts", "all"):
            raise ValueError(f"corpus must be 'notes', 'transcripts' or 'all', not {corpus!r}")
        if mode not in ("bm25", "vector", "hybrid"):
            raise ValueError(f"mode must be 'bm25', 'vector' or 'hybrid', not {mode!r}")
        terms = query_terms(query)
        limit = max(1, min(int(limit), MAX_LIMIT))
        if half_life_days is not None and not half_life_days > 0:
            raise ValueError(f"half_life_days must be positive, not {half_life_days!r}")
        if not terms:
            return []
        tables: list[Literal["notes", "transcripts"]] = (
            ["notes", "transcripts"] if corpus == "all" else [corpus]
        )
        if not self.search_transcripts:
            tables = [table for table in tables if table != "transcripts"]
        query_vector = None if mode == "bm25" else self._query_vector(query)
        scope = SearchScope(session_key, notes)
        with self._lock:
            if query_vector is not None:
                return self._search_by_meaning(
                    tables, terms, query_vector, limit, mode, scope, mmr_lambda,
                    half_life_days,
                )
            if half_life_days is None:
                ranked = self._bm25(tables, terms, limit, scope)
                return self._hits(
                    ranked[:limit], terms, [(i + 1, None, None) for i in range(limit)]
                )
            ranked = self._bm25(tables, terms, limit * CANDIDATES_PER_RESULT, scope)
            factors = decay_factors(
                self._conn, [(table, item.rowid) for table, item in ranked], half_life_days
            )
            aged = [
                (table, replace(item, score=decayed(item.score, factor)))
                for (table, item), factor in zip(ranked, factors, strict=True)
            ]
            order = sorted(range(len(aged)), key=lambda i: (aged[i][1].tier, -aged[i][1].score))
            return self._hits(
                [aged[i] for i in order[:limit]], terms, [(i + 1, None, None) for i in order]
            )

    def _bm25(
        self,
        tables: Sequence[Literal["notes", "transcripts"]],
        terms: list[str],
        limit: int,
        scope: SearchScope,
    ) -> list[tuple[Literal["notes", "transcripts"], _Ranked]]:
        ranked = [
            (table, item)
            for table in tables
            for item in self._rank(table, terms, limit, scope=scope)
        ]
        ranked.sort(key=lambda pair: (pair[1].tier, -pair[1].score))
        return ranked

    def _query_vector(self, query: str) -> NDArray[np.float32] | None:
        """The query's embedding, or None (logged once) when search must fall back to BM25."""
        reason = "no embedding model is configured"
        if self._vectors is not None:
            try:
                vector = self._vectors.encoder.encode([query])
                if vector.shape == (1, self._vectors.dimensions):
                    row: NDArray[np.float32] = vector[0]
                    return row
                reason = f"the encoder returned shape {vector.shape}"
            except Exception as exc:
                reason = f"the encoder failed ({type(exc).__name__}: {exc})"
        if not self._fallback_logged:
            self._fallback_logged = True
            _log.warning("memory search by meaning falls back to BM25: %s", reason)
        return None

    def _search_by_meaning(
        self,
        tables: Sequence[Literal["notes", "transcripts"]],
        terms: list[str],
        query_vector: NDArray[np.float32],
        limit: int,
        mode: SearchMode,
        scope: SearchScope,
        mmr_lambda: float | None,
        half_life_days: float | None = None,
    ) -> list[Hit]:
        assert self._vectors is not None
        pool = limit * CANDIDATES_PER_RESULT
        conn = self._conn
        expressions = [fts_term(term) for term in terms]
        bm25 = []
        if mode == "hybrid":  # on the terms that carry information (see informative_terms)
            searched = informative_terms(self._vectors, conn, tables, terms, expressions)
            bm25 = self._bm25(tables, searched, pool, scope)[:pool]
        with one_blas_thread():
            picked = fuse(
                self._vectors, conn, [(t, item.rowid, item.tier) for t, item in bm25],
                tables, query_vector, terms, limit, pool, mode == "hybrid", scope,
                mmr_lambda, expressions=expressions,
                decay=None if half_life_days is None
                else lambda keys: decay_factors(conn, keys, half_life_days),
            )
        return self._hits(
            [(p.table, _Ranked(p.tier, p.score, p.rowid)) for p in picked],
            terms,
            [(p.bm25_rank, p.vector_score, p.fused_score) for p in picked],
            mode,
        )

    def _rank(
        self, table: str, terms: list[str], limit: int, *, scope: SearchScope = SearchScope()
    ) -> list[_Ranked]:
        """All-term matches by BM25, then (if too few) any-term matches by BM25, among the
        rows `scope` allows."""
        parts = [fts_term(term) for term in terms]
        if None in parts:
            return self._rank_scan(table, terms, limit, scope=scope)
        fts = "chunks_fts" if table == "notes" else "transcripts_fts"
        source = "chunks" if table == "notes" else "transcripts"
        where = scope.where(source)
        # bm25() in ORDER BY is markedly faster than FTS5's `rank` column here.
        if where is None:
            sql = (
                f"SELECT rowid, bm25({fts}) AS score FROM {fts} WHERE {fts} MATCH ? "
                "ORDER BY score LIMIT ?"
            )
            confined: tuple[str, ...] = ()
        else:
            sql = (
                f"SELECT {fts}.rowid, bm25({fts}) AS score FROM {fts} "
                f"JOIN {source} ON {source}.id = {fts}.rowid "
                f"WHERE {fts} MATCH ? AND {where[0]} ORDER BY score LIMIT ?"
            )
            confined = tuple(where[1])
        exprs = [part for part in parts if part is not None]
        out = [
            _Ranked(0, -float(score), int(rowid))
            for rowid, score in self._conn.execute(sql, (" AND ".join(exprs), *confined, limit))
        ]
        if len(out) < limit and len(exprs) > 1:
            have = {item.rowid for item in out}
            for rowid, score in self._conn.execute(
                sql, (" OR ".join(exprs), *confined, limit + len(out))
            ):
                if int(rowid) not in have and len(out) < limit:
                    out.append(_Ranked(1, -float(score), int(rowid)))
        return out

    def _stats(self, table: str) -> tuple[int, float]:
        """(rows, average length) for BM25 in the scan path; cached until the next write."""
        if table not in self._corpus_stats:
            name = "chunks" if table == "notes" else "transcripts"
            count, avg = self._conn.execute(
                f"SELECT count(*), avg(length(body)) FROM {name}"
            ).fetchone()
            self._corpus_stats[table] = (int(count), float(avg or 1.0))
        return self._corpus_stats[table]

    def _rank_scan(
        self, table: str, terms: list[str], limit: int, *, scope: SearchScope = SearchScope()
    ) -> list[_Ranked]:
        """FTS5's BM25 formula by hand over a substring scan, for terms no index can answer.

        Case-insensitive for ASCII only, like SQLite's lower(); rare enough not to matter.
        """
        name = "chunks" if table == "notes" else "transcripts"
        folded = [term.translate(_ASCII_LOWER) for term in terms]
        counts = ", ".join(
            f"(length(low) - length(replace(low, ?, ''))) / {len(term)}" for term in folded
        )
        where = " OR ".join("instr(low, ?) > 0" for _ in folded)
        confined = scope.where(name)
        inner = "" if confined is None else f" WHERE {confined[0]}"
        rows = self._conn.execute(
            f"SELECT id, length(low), {counts} FROM "
            f"(SELECT id, lower(body) AS low FROM {name}{inner}) WHERE {where}",
            (*folded, *(() if confined is None else confined[1]), *folded),
        ).fetchall()
        if not rows:
            return []
        total, avg_len = self._stats(table)
        weights: list[float] = []
        for column in range(len(folded)):
            hits = sum(1 for row in rows if row[2 + column] > 0)
            idf = math.log((total - hits + 0.5) / (hits + 0.5))
            weights.append(idf if idf > 0 else 1e-6)
        out: list[_Ranked] = []
        for row in rows:
            norm = K1 * (1 - B + B * row[1] / avg_len)
            score = 0.0
            matched = 0
            for column, idf in enumerate(weights):
                tf = row[2 + column]
                if tf > 0:
                    matched += 1
                    score += idf * tf * (K1 + 1) / (tf + norm)
            out.append(_Ranked(0 if matched == len(folded) else 1, score, int(row[0])))
        out.sort(key=lambda item: (item.tier, -item.score))
        return out[:limit]

    def _hits(
        self,
        ranked: list[tuple[Literal["notes", "transcripts"], _Ranked]],
        terms: list[str],
        details: Sequence[tuple[int | None, float | None, float | None]],
        mode: SearchMode = "bm25",
    ) -> list[Hit]:
        """Hits for `ranked`, each with its (bm25_rank, vector_score, fused_score)."""
        rows: dict[tuple[str, int], tuple[str, int, int, str, str | None]] = {}
        for table in ("notes", "transcripts"):
            ids = [item.rowid for name, item in ranked if name == table]
            if not ids:
                continue
            marks = ",".join("?" * len(ids))
            sql = (
                "SELECT id, path, start_line, end_line, body, NULL FROM chunks "
                f"WHERE id IN ({marks})"
                if table == "notes"
                else "SELECT id, session_key, first_seq, last_seq, body, role FROM transcripts "
                f"WHERE id IN ({marks})"
            )
            for row in self._conn.execute(sql, ids):
                rows[(table, int(row[0]))] = (
                    str(row[1]), int(row[2]), int(row[3]), str(row[4]),
                    None if row[5] is None else str(row[5]),
                )
        hits: list[Hit] = []
        for (table, item), (rank, cosine, fused) in zip(ranked, details, strict=False):
            found = rows.get((table, item.rowid))
            if found is None:
                continue
            path, start, end, text, role = found
            snippet = make_snippet(text, terms)
            hits.append(
                Hit(
                    table, path, start, end, snippet, item.score, item.tier == 0, role,
                    rank, cosine, fused, mode,
                )
            )
        return hits
