"""`gatehouse memory`: the workspace's memory files and their search index."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, cast

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
from gateway.config import Config
from gateway.store.faults import storage_faults
from memory.embeddings import Encoder
from memory.index import Corpus, Hit, MemoryIndex, SearchMode
from memory.workspace import ensure_workspace

app = sub_app("Inspect the workspace memory (memory/ notes, MEMORY.md).")


def _index_path(config: Config) -> Path:
    return config.data_dir / "memory-index.db"


def _open_index(config: Config, encoder: Encoder | None = None) -> MemoryIndex:
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
    from memory.workspace import list_workspace_files

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
    config = load()
    chosen = mode or config.memory.search_mode
    if chosen not in ("bm25", "vector", "hybrid"):
        fail("bad option", f"--mode must be bm25, vector or hybrid, not {chosen!r}")
    search_mode = cast(SearchMode, chosen)
    index = _open_index(config, _encoder_for(config, search_mode))
    try:
        with storage_faults(_index_path(config)):
            index.refresh()  # with an encoder, also embeds what lacks a vector
            # The index checks the name (a wrong one is its ValueError).
            hits = index.search(query, limit=limit, corpus=cast(Corpus, corpus), mode=search_mode)
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
