"""`gatehouse memory`: the workspace's memory files and their search index."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.markup import escape
from rich.table import Table

from gateway.cli.common import (
    JsonFlag,
    console,
    err_console,
    fail,
    load,
    print_json,
    progress,
    sub_app,
)

if TYPE_CHECKING:  # the index (numpy) and the model: imported by the commands that open them
    from gateway.config import Config
    from gateway.operations.memory import MemoryStats, Reembedding
    from memory.embeddings import Encoder
    from memory.index import Corpus, Hit, MemoryIndex, SearchMode

app = sub_app("Inspect the workspace memory (memory/ notes, MEMORY.md).")


def _index_path(config: Config) -> Path:
    return config.data_dir / "memory-index.db"


def _open_index(config: Config, encoder: Encoder | None = None) -> MemoryIndex:
    from gateway.store.faults import storage_faults
    from memory.index import MemoryIndex
    from memory.workspace import ensure_workspace

    ensure_workspace(config.workspace)
    config.data_dir.mkdir(parents=True, exist_ok=True)
    with storage_faults(_index_path(config)):
        return MemoryIndex(
            _index_path(config), config.workspace,
            search_transcripts=config.memory.archive_transcripts, encoder=encoder,
        )


def _encoder_for(config: Config, mode: SearchMode) -> Encoder | None:
    """The embedding model when `mode` ranks by meaning; else (or when it is off or cannot
    load, said on stderr) None, and the search is BM25."""
    if mode == "bm25":
        return None
    if not config.memory.embeddings:
        err_console.print(
            "[yellow]memory search: BM25 only: [memory] embeddings = false[/yellow]",
            highlight=False,
        )
        return None
    from memory.embeddings import shared_encoder

    with err_console.status("loading the embedding model…"):
        encoder, reason = shared_encoder()
    if encoder is None:
        err_console.print(f"[yellow]{escape(reason)}[/yellow]", highlight=False)
    return encoder


def _hit_json(hit: Hit) -> dict[str, Any]:
    return {**asdict(hit), "location": hit.location}


def _number(value: float | int | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


@app.command("ls")
def memory_ls(as_json: JsonFlag = False) -> None:
    """List the workspace's memory files."""
    from memory.workspace import ensure_workspace, list_workspace_files

    config = load()
    ensure_workspace(config.workspace)
    files = list_workspace_files(config.workspace)
    if as_json:
        print_json([asdict(f) for f in files], default=str)
        return
    table = Table("file", "lines", "bytes", "modified", title=str(config.workspace))
    for f in files:
        table.add_row(
            escape(f.path), str(f.lines), f"{f.size:,}", f"{f.modified:%Y-%m-%d %H:%M} UTC"
        )
    console.print(table)


@app.command("show")
def memory_show(
    file: Annotated[str, typer.Argument(help="Workspace-relative path, e.g. memory/2026-12-02.md")],
    start: Annotated[int, typer.Option(help="First line (1-based)")] = 1,
    count: Annotated[int | None, typer.Option(help="How many lines")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Show a workspace file (confined to the workspace, like the agent's tools)."""
    from memory.notes import read_lines
    from memory.workspace import WorkspacePathError

    config = load()
    try:
        result = read_lines(config.workspace, file, start, count)
    except (WorkspacePathError, ValueError, OSError) as exc:
        fail("error", str(exc), 1, soft_wrap=False)
    if as_json:
        print_json(asdict(result))
        return
    console.print(escape(result.render()), highlight=False)


@app.command("search")
def memory_search(
    query: Annotated[str, typer.Argument(help="Words, identifiers, Chinese or Japanese text")],
    limit: Annotated[int, typer.Option(help="Most hits to show")] = 10,
    corpus: Annotated[str, typer.Option(help="notes, transcripts or all")] = "notes",
    mode: Annotated[
        str | None,
        typer.Option(help="bm25, vector or hybrid (default: [memory] search_mode)"),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Search the memory files by words (FTS5, BM25, trigram), meaning (embeddings) or both,
    showing why each hit ranks where it does."""
    from gateway.store.faults import storage_faults

    config = load()
    chosen = mode or config.memory.search_mode
    if chosen not in ("bm25", "vector", "hybrid"):
        fail("bad option", f"--mode must be bm25, vector or hybrid, not {chosen!r}")
    search_mode = cast("SearchMode", chosen)
    index = _open_index(config, _encoder_for(config, search_mode))
    try:
        with storage_faults(_index_path(config)):
            index.refresh()  # with an encoder, also embeds what lacks a vector
            # The index checks the name (a wrong one is its ValueError).
            hits = index.search(query, limit=limit, corpus=cast("Corpus", corpus), mode=search_mode)
    finally:
        index.close()
    if as_json:
        print_json([_hit_json(h) for h in hits])
        return
    if not hits:
        console.print("no matches")
        return
    used = hits[0].mode_used
    title = f"memory search ({used}" + (f", asked {search_mode}" if used != search_mode else "")
    table = Table(
        "where", "score", "bm25 rank", "vector", "fused", "mode", "snippet",
        title=f"{title}): {escape(query)}",
    )
    for h in hits:
        table.add_row(
            escape(h.location), f"{h.score:.2f}", _number(h.bm25_rank, "d"),
            _number(h.vector_score, ".3f"), _number(h.fused_score, ".4f"), h.mode_used,
            escape(h.snippet),
        )
    console.print(table)


@app.command("reindex")
def memory_reindex(as_json: JsonFlag = False) -> None:
    """Rebuild the memory search index from the files."""
    from gateway.store.faults import storage_faults

    config = load()
    index = _open_index(config)
    try:
        with progress() as bar, storage_faults(_index_path(config)):
            task = bar.add_task("reindexing memory", total=None)
            stats = index.reindex(lambda done, total: bar.update(task, completed=done, total=total))
    finally:
        index.close()
    if as_json:
        print_json(asdict(stats))
        return
    console.print(
        f"reindexed {stats.files_scanned} files ({stats.chunks_written} chunks) "
        f"in {stats.seconds:.2f} s"
    )


def _render_stats(stats: MemoryStats) -> None:
    table = Table(title=f"memory: {escape(str(stats.workspace))}", show_header=False)
    table.add_column("what", no_wrap=True)
    table.add_column("value", overflow="fold")
    notes = stats.notes
    last = (
        "" if notes.last_path is None or notes.last_written is None
        else f"; last written {escape(notes.last_path)} at {notes.last_written:%Y-%m-%d %H:%M} UTC"
    )
    table.add_row(
        "notes", f"{notes.files:,} files, {notes.chunks:,} chunks, {notes.bytes:,} bytes{last}"
    )
    history = stats.history
    table.add_row(
        "archived history",
        f"{history.rows:,} rows from {history.sessions:,} sessions"
        + ("" if history.searchable else " (history_search only: archive_transcripts = false)"),
    )
    fresh = stats.freshness
    if fresh.up_to_date:
        table.add_row("index", "up to date with the files")
    else:
        table.add_row(
            "index",
            f"[yellow]behind the files[/yellow]: {len(fresh.new)} new, {len(fresh.changed)} "
            f"changed, {len(fresh.deleted)} deleted (the next search or refresh takes them in)",
        )
    table.add_row(
        "index written",
        "never (no index yet)" if fresh.index_written is None
        else f"{fresh.index_written:%Y-%m-%d %H:%M:%S} UTC",
    )
    model = stats.model
    if model.state == "on":
        table.add_row("embedding model", f"{escape(model.name or '')} ({model.dimensions} dims)")
    else:
        table.add_row("embedding model", f"[yellow]off[/yellow]: {escape(model.reason or '')}")
    for c in stats.vectors:
        if c.embedded is None:
            text = f"{c.stored:,}/{c.rows:,} rows have a stored vector"
        else:
            text = (
                f"{c.embedded:,}/{c.rows:,} embedded, {c.stale or 0:,} stale (another model), "
                f"{c.missing or 0:,} to embed"
            )
        table.add_row(f"vectors: {c.corpus}", text)
    mode = stats.search_mode
    table.add_row(
        "search mode",
        mode if stats.search_mode_used == mode else f"{mode} (bm25 while the model is off)",
    )
    console.print(table, highlight=False)


@app.command("stats")
def memory_stats_command(as_json: JsonFlag = False) -> None:
    """What the memory index holds, how fresh it is, and which embedding model covers it.

    Read-only: no refresh, and the index is read through a read-only connection. The model
    is constructed (import and checksums, about 0.2 s) but its weights are not loaded."""
    from gateway.operations.memory import memory_stats

    config = load()
    stats = memory_stats(config)
    if as_json:
        print_json(stats.to_json())
        return
    _render_stats(stats)


@app.command("reembed")
def memory_reembed(
    everything: Annotated[
        bool, typer.Option("--all", help="Embed every row again, not only missing or stale ones")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Embed the rows that lack a vector from the configured model (new, edited, or from
    another model), after refreshing the index from the files."""
    from gateway.operations.memory import EmbeddingsUnavailable, embedding_model, reembed
    from gateway.store.faults import StorageError

    config = load()
    try:
        with err_console.status("loading the embedding model…"):
            encoder = embedding_model(config)
    except EmbeddingsUnavailable as exc:
        fail("memory reembed", str(exc), 1)
    try:
        if as_json or not err_console.is_terminal:
            result = reembed(config, encoder, _progress_lines(), everything=everything)
        else:
            with progress() as bar:
                task = bar.add_task("embedding", total=None)
                result = reembed(
                    config, encoder,
                    lambda done, total: bar.update(task, completed=done, total=total),
                    everything=everything,
                )
    except (StorageError, OSError):
        raise  # the command group says a storage fault in one line (exit 2)
    except Exception as exc:  # the model failed on some text: one line, not a traceback
        fail("memory reembed", f"embedding failed ({type(exc).__name__}: {exc})", 1)
    if as_json:
        print_json(result.to_json())
        return
    _render_reembedding(result)


def _progress_lines() -> Callable[[int, int], None]:
    """Plain progress on stderr, one line a batch (no terminal, or --json)."""

    def report(done: int, total: int) -> None:
        err_console.print(f"embedding: {done:,}/{total:,} rows",
                          highlight=False, soft_wrap=True)

    return report


def _render_reembedding(result: Reembedding) -> None:
    covered = ", ".join(
        f"{corpus} {done:,}/{rows:,}" for corpus, (done, rows) in result.coverage.items()
    )
    what = "every row again" if result.everything else "what lacked a current vector"
    if result.embedded == 0 and not result.everything:
        line = f"nothing to embed: every row has a vector from {escape(result.model)}"
    else:
        line = (
            f"embedded {result.embedded:,} rows ({what}) with {escape(result.model)} "
            f"in {result.seconds:.2f} s"
        )
    console.print(f"{line}; rows with vectors: {covered}", highlight=False)
