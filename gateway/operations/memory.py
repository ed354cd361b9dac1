"""The memory index seen from outside: what it holds and how fresh it is (`gatehouse memory
stats`), and embedding what lacks a vector (`gatehouse memory reembed`).

Unlike the session operations these take a config, not a gateway: they need only the
workspace and the index file, and the stats must not change the index they describe.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from gateway.config import Config
from gateway.store.faults import storage_faults
from memory import index_stats
from memory.embeddings import Encoder
from memory.index import MemoryIndex, RefreshStats
from memory.workspace import ensure_workspace

OFF_PREFIX = "Semantic memory search is off, BM25 only: "
"""How `memory.embeddings` starts the reason it gives; the rest is the reason itself."""


class EmbeddingsUnavailable(RuntimeError):
    """The embedding model cannot be used; the message is one sentence saying why."""


def index_path(config: Config) -> Path:
    return config.data_dir / "memory-index.db"


def _when(ns: int | None) -> datetime | None:
    return None if ns is None else datetime.fromtimestamp(ns / 1e9, tz=UTC)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="seconds")


@dataclass(frozen=True, slots=True)
class NotesStats:
    """The note files on disk that the index covers, and the chunks it holds for them."""

    files: int
    chunks: int
    bytes: int
    last_written: datetime | None  # the newest file's mtime
    last_path: str | None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "last_written": _iso(self.last_written)}


@dataclass(frozen=True, slots=True)
class HistoryStats:
    """The archived (compacted) messages: `history_search` always, `memory_search` only with
    [memory] archive_transcripts."""

    sessions: int
    rows: int
    searchable: bool  # by memory_search (corpus transcripts / all)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Freshness:
    """What the next refresh would do: files new on disk, edited, or deleted since the index
    last saw them; `index_written` is when the index file last changed (any write)."""

    new: tuple[str, ...]
    changed: tuple[str, ...]
    deleted: tuple[str, ...]
    index_written: datetime | None  # None: no index file yet

    @property
    def up_to_date(self) -> bool:
        return not (self.new or self.changed or self.deleted)

    def to_json(self) -> dict[str, Any]:
        return {
            "new": len(self.new),
            "changed": len(self.changed),
            "deleted": len(self.deleted),
            "up_to_date": self.up_to_date,
            "index_written": _iso(self.index_written),
            "paths": {
                "new": list(self.new), "changed": list(self.changed),
                "deleted": list(self.deleted),
            },
        }


@dataclass(frozen=True, slots=True)
class ModelState:
    """The embedding model the config asks for: its name and dimensions, or "off" and why.
    `stored` is what embedded the index, as (name, dimensions, vectors), most first."""

    state: Literal["on", "off"]
    name: str | None
    dimensions: int | None
    reason: str | None
    stored: tuple[tuple[str, int, int], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "name": self.name,
            "dimensions": self.dimensions,
            "reason": self.reason,
            "stored": [
                {"name": name, "dimensions": dims, "vectors": count}
                for name, dims, count in self.stored
            ],
        }


@dataclass(frozen=True, slots=True)
class Coverage:
    """One corpus's vectors. With the model off, `embedded` and `stale` are None (nothing to
    compare with) and `stored` says how many vectors the index holds anyway."""

    corpus: Literal["notes", "transcripts"]
    rows: int
    embedded: int | None  # rows with a vector from the configured model
    stale: int | None  # rows with a vector from another model (or other dimensions)
    stored: int  # rows with any vector

    @property
    def missing(self) -> int | None:
        return None if self.embedded is None else self.rows - self.embedded

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows, "embedded": self.embedded, "stale": self.stale,
            "missing": self.missing, "stored": self.stored,
        }


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """`gatehouse memory stats`."""

    workspace: Path
    notes: NotesStats
    history: HistoryStats
    freshness: Freshness
    model: ModelState
    vectors: tuple[Coverage, ...]  # the corpora memory_search embeds
    search_mode: str  # [memory] search_mode
    search_mode_used: str  # what it is without the model: bm25

    def to_json(self) -> dict[str, Any]:
        return {
            "workspace": str(self.workspace),
            "notes": self.notes.to_json(),
            "history": self.history.to_json(),
            "freshness": self.freshness.to_json(),
            "model": self.model.to_json(),
            "vectors": {c.corpus: c.to_json() for c in self.vectors},
            "search_mode": self.search_mode,
            "search_mode_used": self.search_mode_used,
        }


def configured_model(config: Config) -> tuple[Encoder | None, str]:
    """The embedding model the config asks for, constructed but not loaded, or None and why.

    Constructing it imports the package and checks the SHA-256 of its files (about 0.2 s for
    the 33 MB of the bundled model); its weights load only on the first `encode`, which stats
    never calls. That is cheap enough to do on every `memory stats`, and it is the only way to
    know the exact name vectors are stored under (stale vectors are those under another name)
    and to catch a damaged model file that a mere import would not."""
    if not config.memory.embeddings:
        return None, "[memory] embeddings = false"
    from memory.embeddings import load_encoder

    encoder, reason = load_encoder(warm_up=False)
    return encoder, reason.removeprefix(OFF_PREFIX).rstrip(".")


def memory_stats(config: Config) -> MemoryStats:
    """What the memory index holds and how it stands against the files, read without
    changing it: no refresh, no index file created, a read-only connection."""
    path = index_path(config)
    encoder, reason = configured_model(config)
    written = index_stats.written_ns(path)  # before opening: no connection writes it
    with storage_faults(path):
        conn = index_stats.read_only(path)
        try:
            files, changes = index_stats.pending_changes(conn, config.workspace)
            counts = index_stats.stored_counts(conn)
            stored = index_stats.stored_encoders(conn)
            key = None if encoder is None else (encoder.name, int(encoder.dimensions))
            corpora: list[Literal["notes", "transcripts"]] = ["notes"]
            if config.memory.archive_transcripts:
                corpora.append("transcripts")
            vectors = []
            for corpus in corpora:
                rows, current, other = index_stats.vector_counts(conn, corpus, key)
                vectors.append(
                    Coverage(
                        corpus, rows,
                        None if key is None else current, None if key is None else other,
                        current + other,
                    )
                )
        finally:
            if conn is not None:
                conn.close()
    newest = max(files, key=lambda f: f[2], default=None)
    model = ModelState(
        "off" if encoder is None else "on",
        None if encoder is None else encoder.name,
        None if encoder is None else int(encoder.dimensions),
        reason if encoder is None else None,
        tuple(stored),
    )
    return MemoryStats(
        workspace=config.workspace,
        notes=NotesStats(
            files=len(files),
            chunks=counts["chunks"],
            bytes=sum(size for _, size, _ in files),
            last_written=None if newest is None else _when(newest[2]),
            last_path=None if newest is None else newest[0],
        ),
        history=HistoryStats(
            counts["sessions"], counts["transcript_rows"], config.memory.archive_transcripts
        ),
        freshness=Freshness(
            tuple(changes["new"]), tuple(changes["changed"]), tuple(changes["deleted"]),
            _when(written),
        ),
        model=model,
        vectors=tuple(vectors),
        search_mode=config.memory.search_mode,
        search_mode_used="bm25" if encoder is None else config.memory.search_mode,
    )


@dataclass(frozen=True, slots=True)
class Reembedding:
    """`gatehouse memory reembed`: the refresh that ran first, the rows embedded, and each
    corpus's (rows with a vector from the model, rows) after."""

    model: str
    dimensions: int
    everything: bool
    embedded: int
    refresh: RefreshStats
    coverage: dict[str, tuple[int, int]]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "dimensions": self.dimensions,
            "everything": self.everything,
            "embedded": self.embedded,
            "refresh": asdict(self.refresh),
            "coverage": {
                corpus: {"embedded": done, "rows": rows}
                for corpus, (done, rows) in self.coverage.items()
            },
            "seconds": round(self.seconds, 3),
        }


def embedding_model(config: Config) -> Encoder:
    """The configured model, loaded and warmed up (slow the first time in a process), or
    `EmbeddingsUnavailable` saying why not."""
    if not config.memory.embeddings:
        raise EmbeddingsUnavailable(
            "[memory] embeddings = false: set it to true to rank memory by meaning"
        )
    from memory.embeddings import shared_encoder

    encoder, reason = shared_encoder()
    if encoder is None:
        raise EmbeddingsUnavailable(reason.removeprefix(OFF_PREFIX))
    return encoder


def reembed(
    config: Config,
    encoder: Encoder,
    progress: Callable[[int, int], None] | None = None,
    *,
    everything: bool = False,
) -> Reembedding:
    """Refresh the index from the files (so new notes are covered), then embed every row
    lacking a vector from `encoder` (every row with `everything`), telling `progress(done,
    total)` batch by batch. An encoder failure is raised."""
    began = time.perf_counter()
    path = index_path(config)
    ensure_workspace(config.workspace)
    config.data_dir.mkdir(parents=True, exist_ok=True)
    with storage_faults(path):
        # Opened without the encoder, so the refresh only follows the files; the embedding
        # below is the one pass, with progress.
        index = MemoryIndex(
            path, config.workspace, search_transcripts=config.memory.archive_transcripts
        )
        try:
            refreshed = index.refresh()
            index.use_encoder(encoder)
            embedded = index.reembed(progress, everything=everything)
            coverage = index.vector_coverage()
        finally:
            index.close()
    return Reembedding(
        encoder.name, int(encoder.dimensions), everything, embedded, refreshed, coverage,
        time.perf_counter() - began,
    )
