"""`gatehouse sessions`: list, show, compact, export, import, uncompact and search sessions."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Column, Table

from gateway.cli.common import (
    JsonFlag,
    console,
    execute,
    fail,
    found,
    load,
    print_json,
    progress,
    quiet_logging,
    refuse,
    show,
    sub_app,
)

if TYPE_CHECKING:  # each command imports the operations it runs: `--help` loads none of them
    from gateway.config import Config
    from gateway.operations import ImportReport, SessionCompaction, SessionDetail, SessionOverview
    from memory.index import HistoryHit

app = sub_app("Inspect sessions.")


@app.command("list")
def sessions_list(as_json: JsonFlag = False) -> None:
    """List sessions, most recent first, with their token pressure and next trigger."""
    from gateway.operations import list_sessions

    rows = execute(list_sessions, quiet="ERROR")
    show(rows, as_json, _print_list, lambda rows: [r.to_json() for r in rows])


def _print_list(rows: list[SessionOverview]) -> None:
    if not rows:
        console.print("no sessions yet")
        return
    table = Table(
        Column("session", overflow="fold"), "chat", "turns / msgs",
        "prompt tokens", "next trigger", Column("history limit", overflow="fold"),
        title=f"window {rows[0].window:,} tokens ({escape(rows[0].window_source)})",
    )
    for r in rows:
        tokens = r.prompt_tokens
        pressure = "-" if tokens is None else f"{tokens:,} ({tokens / r.window:.0%})"
        trigger = r.next_trigger
        to_go = "" if trigger.to_go is None else f" ({trigger.to_go:,} to go)"
        limit = "unlimited" if r.history_limit == 0 else f"{r.history_limit:,} turns"
        table.add_row(
            escape(r.key), f"{r.platform} {r.chat_type}", f"{r.turns:,} / {r.messages:,}",
            pressure, f"{trigger.name} at {trigger.at:,}{to_go}",
            escape(f"{limit} ({r.history_limit_source})"),
        )
    console.print(table)


@app.command("show")
def sessions_show(
    key: Annotated[str, typer.Argument(help="Session key, e.g. agent:main:webchat:direct:alice")],
    show_all: Annotated[
        bool, typer.Option("--all", help="Every stored message, compacted ones included")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Show a session: its latest summary and the messages after it (or everything, --all)."""
    from gateway.operations import SessionDetail, show_session

    data = found(execute(lambda c: show_session(c, key, show_all), quiet="ERROR"), key)
    show(data, as_json, _print_session, SessionDetail.to_json)


def _print_session(data: SessionDetail) -> None:
    console.print(
        f"[bold]{escape(data.key)}[/bold] ({data.platform}, {data.chat_type}); "
        f"automatic compaction: {escape(data.automatic_compaction)}"
    )
    if data.prompt_cache is not None:
        console.print(f"read from the provider's prompt cache: {data.prompt_cache.describe()}")
    if data.compactions:
        history = Table("id", "covers seq", "tokens before → after", "quality", "when", "state",
                        title="Compactions")
        for c in data.compactions:
            q = c.quality or {}
            quality = (
                f"sections {len(q.get('sections_present', []))}/5, ids "
                f"{q.get('identifier_retention', 0):.0%}, ratio {q.get('compression_ratio', 0):.2f}"
                + (f", fallback {q['fallback']}" if q.get("fallback") else "")
            )
            if q.get("reason") == "reset":
                quality = f"reset ({q.get('why', '')}): a fresh context, nothing deleted"
            history.add_row(
                str(c.id), f"{c.first_seq}-{c.last_seq}",
                f"{c.tokens_before:,} → {c.tokens_after:,}", quality, c.created_at,
                "undone" if c.undone else "active",
            )
        console.print(history)
    if data.summary:
        console.print("[bold]Latest summary[/bold] (sent instead of the messages it covers):")
        console.print(escape(data.summary))
    table = Table("seq", "role", "content", "tokens", show_lines=False)
    for shown in data.messages:
        m = shown.message
        content = m.content if isinstance(m.content, str) else json.dumps(m.content)
        if m.tool_calls:
            content = (content or "") + " " + json.dumps([tc.to_openai() for tc in m.tool_calls])
        role = m.role + (" (compacted)" if shown.compacted else "")
        if shown.status:
            role += f" [{shown.status}]"
        table.add_row(str(m.seq), escape(role), escape(content or ""), str(m.tokens or ""))
    console.print(table)


@app.command("compact")
def sessions_compact(
    key: Annotated[str | None, typer.Argument(help="Session key (or --all)")] = None,
    every: Annotated[bool, typer.Option("--all", help="Compact every session")] = False,
    instructions: Annotated[
        str, typer.Option("--instructions", "-i", help="What the summary should focus on")
    ] = "",
    as_json: JsonFlag = False,
) -> None:
    """Compact a session now (the same pipeline as automatic compaction), or every one (--all)."""
    from gateway.operations import SessionCompaction, compact_all, compact_session

    quiet_logging("WARNING")
    if every == (key is not None):
        refuse("give one session KEY or --all", 2)
    if key is None:

        async def compact_every(config: Config) -> list[SessionCompaction]:
            with progress() as bar:
                task = bar.add_task("compacting sessions", total=None)

                def advance(done: int, total: int, outcome: SessionCompaction) -> None:
                    bar.update(task, completed=done, total=total,
                               description=f"compacted {escape(outcome.session)}")

                return await compact_all(config, instructions, advance)

        results = execute(compact_every, bundled_model=True)
        show(results, as_json, _print_compacted, lambda rs: [r.to_json() for r in rs])
        failed = [r for r in results if not r.committed and not r.nothing_to_compact]
        raise typer.Exit(1 if failed else 0)

    async def compact_one(config: Config) -> SessionCompaction:
        with console.status("compacting…"):
            return await compact_session(config, key, instructions)

    outcome = execute(compact_one, bundled_model=True, session=key)
    show(outcome, as_json, lambda o: console.print(escape(o.message)), SessionCompaction.to_json)
    raise typer.Exit(0 if outcome.committed else 1)


def _print_compacted(results: list[SessionCompaction]) -> None:
    table = Table("session", "result", title=f"compacted {len(results)} sessions")
    for r in results:
        table.add_row(escape(r.session), escape(r.message))
    console.print(table)


@app.command("export")
def sessions_export(
    key: Annotated[str, typer.Argument(help="Session key")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write JSONL here (default: stdout)")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON array on stdout instead of JSONL")
    ] = False,
) -> None:
    """Export a session as OpenAI-format JSONL, one message a line (compacted ones included);
    `sessions import` and `context compact` read it back."""
    from gateway.operations import export_session

    stored = execute(lambda c: export_session(c, key), quiet="ERROR", session=key)
    messages = [m.to_openai() for m in stored]
    if as_json:
        print_json(messages)
        return
    lines = "".join(json.dumps(m, ensure_ascii=False) + "\n" for m in messages)
    if output is None:
        sys.stdout.write(lines)
        return
    try:
        output.write_text(lines, encoding="utf-8")
    except OSError as exc:  # the user's path, not a data file: no storage advice
        fail("cannot write", f"{output}: {exc.strerror or exc}", 1)
    roles: dict[str, int] = {}
    for m in stored:
        roles[m.role] = roles.get(m.role, 0) + 1
    table = Table("role", "messages", title=f"wrote {escape(str(output))}")
    for role, count in roles.items():
        table.add_row(role, f"{count:,}")
    console.print(table)


@app.command("import")
def sessions_import(
    transcript: Annotated[Path, typer.Argument(help="OpenAI-format JSONL, one message a line")],
    key: Annotated[
        str | None, typer.Option("--key", help="Session key (default: agent:<agent>:import:direct:<file name>)")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Import a transcript as a new session (the whole file is checked before anything is stored)."""
    from gateway.operations import ImportReport, TranscriptError, import_session

    async def store_it(config: Config) -> ImportReport:
        with progress() as bar:
            task = bar.add_task(f"importing {escape(transcript.name)}", total=None)
            return await import_session(
                config, transcript, key,
                lambda done, total: bar.update(task, completed=done, total=total),
            )

    report = execute(
        store_it, quiet="ERROR",
        refusals=[(TranscriptError, "transcript error", 2), (ValueError, "error", 1)],
    )
    show(report, as_json, _print_import, ImportReport.to_json)


def _print_import(report: ImportReport) -> None:
    skipped = report.skipped_system_messages
    console.print(
        f"imported {report.imported:,} messages ({report.tokens:,} tokens) into "
        f"{escape(report.session)}"
        + (f"; skipped {skipped} system message(s): the gateway's own prompt is used" if skipped else "")
    )


@app.command("uncompact")
def sessions_uncompact(key: Annotated[str, typer.Argument(help="Session key")]) -> None:
    """Restore the state before the last compaction (the summary is kept, marked undone)."""
    from gateway.operations import uncompact_session

    outcome = execute(lambda c: uncompact_session(c, key), quiet="WARNING", session=key)
    console.print(escape(outcome.message))


@app.command("search")
def sessions_search(
    key: Annotated[str, typer.Argument(help="Session key")],
    query: Annotated[str, typer.Argument(help="An exact identifier, or words")],
    limit: Annotated[int, typer.Option(min=1, max=20, help="Most hits to show")] = 5,
    as_json: JsonFlag = False,
) -> None:
    """Search a session's compacted messages as its agent's history_search does."""
    from gateway.operations import search_session_history
    from gateway.tools.history import when

    quiet_logging("ERROR")
    config = load()
    hits = found(
        execute(lambda c: search_session_history(c, key, query, limit), config=config), key
    )

    def render(hits: list[HistoryHit]) -> None:
        if not hits:
            console.print("no matches in this session's archived messages")
            return
        table = Table(
            "seq", "time", "role", "via", Column("excerpt", overflow="fold"),
            title=f"{escape(key)}: {escape(query)}",
        )
        for h in hits:
            seq = str(h.seq) if h.last_seq is None else f"{h.seq}-{h.last_seq}"
            role = f"{h.role} {h.name}" if h.role == "tool" and h.name else h.role
            table.add_row(
                seq, when(h.created_at, config.gateway.timezone), escape(role), h.via,
                escape(h.excerpt),
            )
        console.print(table)

    show(hits, as_json, render, lambda hits: [asdict(h) for h in hits])
