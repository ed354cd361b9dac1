"""What `gatehouse memory stats` reports about the memory index, read without changing it.

Opening a `MemoryIndex` writes (the schema, its version), so these functions read through a
read-only connection of their own (`read_only`) and never create the file; a table an index
from an older gatehouse lacks counts as empty."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from memory.index import MAX_FILE_BYTES
from memory.workspace import scan_workspace


def read_only(db_path: Path) -> sqlite3.Connection | None:
    """A read-only connection to the index file, or None when there is no file yet."""
    if not db_path.is_file():
        return None
    return sqlite3.connect(
        f"{db_path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None
    )


def written_ns(db_path: Path) -> int | None:
    """When the index file last changed (ns since the epoch; its WAL counts while it holds
    commits), None without a file. The index keeps no refresh timestamp: this is the last
    write of any kind (a refresh that changed something, archiving, embedding, a process
    opening it read-write); a refresh that found nothing to do writes nothing."""
    try:
        latest = db_path.stat().st_mtime_ns
    except OSError:
        return None
    try:
        wal = Path(f"{db_path}-wal").stat()
    except OSError:
        return latest
    return max(latest, wal.st_mtime_ns) if wal.st_size > 0 else latest


def pending_changes(
    conn: sqlite3.Connection | None,
    workspace: Path,
    *,
    suffixes: Sequence[str] = (".md",),
    exclude_dirs: Sequence[str] = ("artifacts", "inbox"),  # inbox: files people sent
) -> tuple[list[tuple[str, int, int]], dict[str, list[str]]]:
    """The note files `refresh` would index, as (path, bytes, mtime_ns), and what it would
    do to the index (`conn`; None: no index yet): paths "new", "changed" (content differs
    from what was indexed; a file touched but not edited is not changed) and "deleted"
    (indexed, now gone or too big). Hashes the files whose size or mtime differ, as
    refresh does, and writes nothing."""
    known: dict[str, tuple[int, int, str]] = {}
    if conn is not None:
        try:
            known = {
                str(row[0]): (int(row[1]), int(row[2]), str(row[3]))
                for row in conn.execute("SELECT path, size, mtime_ns, sha256 FROM files")
            }
        except sqlite3.OperationalError:
            known = {}  # an empty or foreign file: everything is new
    files: list[tuple[str, int, int]] = []
    changes: dict[str, list[str]] = {"new": [], "changed": [], "deleted": []}
    present: set[str] = set()
    for found in scan_workspace(workspace, suffixes, exclude_dirs):
        if found.size > MAX_FILE_BYTES:
            continue
        old = known.get(found.rel)
        if old is not None and (old[0], old[1]) != (found.size, found.mtime_ns):
            try:
                with open(found.path, "rb") as handle:
                    digest = hashlib.file_digest(handle, "sha256").hexdigest()
            except OSError:
                continue  # vanished or unreadable: refresh drops it too
            if digest != old[2]:
                changes["changed"].append(found.rel)
        elif old is None:
            changes["new"].append(found.rel)
        present.add(found.rel)
        files.append((found.rel, found.size, found.mtime_ns))
    changes["deleted"] = sorted(known.keys() - present)
    return files, changes


def _stat_count(conn: sqlite3.Connection | None, sql: str, args: Sequence[object] = ()) -> int:
    if conn is None:
        return 0
    try:
        return int(conn.execute(sql, tuple(args)).fetchone()[0])
    except sqlite3.OperationalError:  # no such table: an index from an older gatehouse
        return 0


def stored_counts(conn: sqlite3.Connection | None) -> dict[str, int]:
    """What the index holds: "files" and "chunks" of notes, archived "transcript_rows" and
    the "sessions" they come from."""
    count = _stat_count
    return {
        "files": count(conn, "SELECT count(*) FROM files"),
        "chunks": count(conn, "SELECT count(*) FROM chunks"),
        "transcript_rows": count(conn, "SELECT count(*) FROM transcripts"),
        "sessions": count(conn, "SELECT count(DISTINCT session_key) FROM transcripts"),
    }


def vector_counts(
    conn: sqlite3.Connection | None,
    corpus: Literal["notes", "transcripts"],
    encoder: tuple[str, int] | None,
) -> tuple[int, int, int]:
    """(rows, rows with a vector from `encoder` (name, dimensions), rows with a vector from
    another encoder: stale, embedded again by the next refresh or reembed with `encoder`).
    Without `encoder` every stored vector counts as another's."""
    source, vectors = {
        "notes": ("chunks", "chunk_vectors"),
        "transcripts": ("transcripts", "transcript_vectors"),
    }[corpus]
    count = _stat_count
    rows = count(conn, f"SELECT count(*) FROM {source}")
    joined = f"SELECT count(*) FROM {vectors} v JOIN {source} s ON s.id = v.id"
    if encoder is None:
        return rows, 0, count(conn, joined)
    name, dimensions = encoder
    mine = "v.encoder = ? AND v.dimensions = ?"
    current = count(conn, f"{joined} WHERE {mine}", (name, dimensions))
    other = count(conn, f"{joined} WHERE NOT ({mine})", (name, dimensions))
    return rows, current, other


def stored_encoders(conn: sqlite3.Connection | None) -> list[tuple[str, int, int]]:
    """(encoder name, dimensions, vectors) of every encoder with vectors stored, most
    first: which model embedded the index, read without loading any."""
    if conn is None:
        return []
    try:
        rows = conn.execute(
            "SELECT encoder, dimensions, count(*) AS n FROM (SELECT encoder, dimensions "
            "FROM chunk_vectors UNION ALL SELECT encoder, dimensions FROM "
            "transcript_vectors) GROUP BY encoder, dimensions ORDER BY n DESC, encoder"
        ).fetchall()
    except sqlite3.OperationalError:
        return []
    return [(str(name), int(dims), int(n)) for name, dims, n in rows]
