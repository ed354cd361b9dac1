"""The `gatehouse` command line (typer + rich)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table
from typer.core import TyperGroup

from channels.console import ConsoleChannel
from channels.webchat import WebchatChannel
from gateway.adapters import add_channel_routes, platform_channels
from gateway.app import Gateway
from gateway.config import DEFAULT_CONFIG_NAME, Config, ConfigError, load_config, redacted_url
from gateway.logging_setup import SECRETS, config_secrets, setup_logging
from gateway.model.llm import NOT_CONFIGURED
from gateway.store.faults import StorageError, database_where, storage_error, storage_faults
from gateway.web.server import WebServer, build_app
from memory.workspace import ensure_workspace

log = logging.getLogger("gatehouse")
T = TypeVar("T")
console = Console()
err_console = Console(stderr=True)


def _fail(label: str, message: str, code: int = 2) -> NoReturn:
    """Say what is wrong on stderr, unwrapped (one line stays one line), and exit."""
    err_console.print(f"[red]{label}:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


class _Commands(TyperGroup):
    """Every command, whatever it opens (the database, the job store, the memory index, the
    workspace): a storage fault is one line naming the file and what to do, and exit code 2
    (gateway/store/faults.py), never a traceback."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (StorageError, OSError) as exc:
            fault = storage_error(exc)
            if fault is None:
                raise
            _fail("storage error", str(fault))


app = typer.Typer(
    help="Gatehouse: a self-hosted chat-bot gateway for one LLM agent.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=_Commands,
)
sessions_app = typer.Typer(help="Inspect sessions.", no_args_is_help=True)
app.add_typer(sessions_app, name="sessions")
context_app = typer.Typer(help="Inspect and manage the context engine.", no_args_is_help=True)
app.add_typer(context_app, name="context")
pairing_app = typer.Typer(help="Approve or deny people who DM the bot (dm_policy = pairing).",
                          no_args_is_help=True)
app.add_typer(pairing_app, name="pairing")
memory_app = typer.Typer(help="Inspect the workspace memory (memory/ notes, MEMORY.md).",
                         no_args_is_help=True)
app.add_typer(memory_app, name="memory")
db_app = typer.Typer(help="The database schema (Alembic migrations).", no_args_is_help=True)
app.add_typer(db_app, name="db")
jobs_app = typer.Typer(help="Scheduled jobs: reminders, cron tasks and maintenance.",
                       no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")
outbox_app = typer.Typer(help="Replies stored but not yet delivered to their platform.",
                         no_args_is_help=True)
app.add_typer(outbox_app, name="outbox")


class State:
    config_path: Path | None = None
    log_level: str = "INFO"


state = State()


@app.callback()
def _main(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Config file (else $GATEHOUSE_CONFIG, ./gatehouse.toml)"),
    ] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR")] = "INFO",
) -> None:
    state.config_path = config
    state.log_level = log_level


def _config() -> Config:
    try:
        config = load_config(state.config_path)
    except ConfigError as exc:
        _fail("config error", str(exc))
    SECRETS.protect(config_secrets(config))  # never in a log line, whatever logs it
    from gateway.model.local_model import bundled_model_path, use_local_model

    if bundled_model_path(config) is not None:
        # Every command sees the model `gatehouse run` answers with (its window, its token
        # limits); the commands that call the model start it (`_with_bundled_model`).
        use_local_model(config)
    return config


@app.command()
def init(
    directory: Annotated[Path, typer.Option("--dir", help="Where to write gatehouse.toml")] = Path(),
    force: Annotated[bool, typer.Option(help="Overwrite an existing gatehouse.toml")] = False,
) -> None:
    """Write a commented gatehouse.toml and create the workspace (AGENTS.md, memory/)."""
    target = directory / DEFAULT_CONFIG_NAME
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if target.exists() and not force:
            console.print(f"{target} already exists; keeping it (use --force to overwrite).")
        else:
            template = resources.files("gateway") / "templates" / "gatehouse.toml"
            target.write_text(template.read_text(encoding="utf-8"), encoding="utf-8")
            console.print(f"wrote {target}")
    except OSError as exc:
        _fail("cannot write", f"{exc.filename or target}: {exc.strerror or exc}; choose another --dir")
    try:
        config = load_config(target)
    except ConfigError as exc:
        _fail("config error", str(exc))
    for path in ensure_workspace(config.workspace):
        console.print(f"created {path}")
    console.print(f"workspace: {config.workspace}")


async def _serve(config: Config) -> None:
    gateway = Gateway(config)
    webchat = WebchatChannel()
    server: WebServer | None = None
    if config.channels.webchat.enabled and config.web.enabled:
        gateway.add_channel(webchat)
    try:
        platforms = platform_channels(config)
    except ValueError as exc:
        err_console.print(f"[red]channel error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    for channel in platforms:
        gateway.add_channel(channel)
        log.info("channel %s enabled", channel.name)
    await gateway.store.verify()  # a damaged SQLite file is refused now, not by each message
    await gateway.start()
    if not gateway.llm.configured:
        err_console.print(f"[yellow]{escape(NOT_CONFIGURED)}[/yellow]", highlight=False)
    if config.web.enabled:
        web_app = build_app(gateway, webchat)
        add_channel_routes(web_app, platforms)
        server = WebServer(web_app, config.web.host, config.web.port)
        url = await server.start()
        log.info("web chat on %s/ (POST %s/api/messages)", url, url)
        print(f"gatehouse listening on {url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("gateway running (database %s, workspace %s)", _safe_url(config), config.workspace)
    await stop.wait()
    log.info("shutting down: finishing in-flight turns")
    if server is not None:
        await server.stop()
    await gateway.stop()
    log.info("stopped")


def _safe_url(config: Config) -> str:
    return redacted_url(config.database_url)


@app.command()
def run() -> None:
    """Start the gateway: every enabled channel and the web server."""
    setup_logging(state.log_level)
    config = _config()
    try:
        asyncio.run(_with_bundled_model(config, _serve))
    except OSError as exc:
        if storage_error(exc) is not None:
            raise  # a data file: the storage line (`_Commands`)
        _fail("cannot start", str(exc), 1)


async def _chat(config: Config, user: str | None, message: str | None) -> int:
    config.web.enabled = False
    gateway = Gateway(config)
    gateway.scheduler.fires_jobs = False  # jobs are stored here and fire in `gatehouse run`
    channel = ConsoleChannel(user_id=user)
    gateway.add_channel(channel)
    await gateway.start()
    try:
        if message is not None:
            _key, replies = await channel.ask(message)
            for reply in replies:
                print(reply, flush=True)
            return 0
        if not gateway.llm.configured:
            err_console.print(f"[yellow]{escape(NOT_CONFIGURED)}[/yellow]", highlight=False)
        console.print(f"Chatting as [bold]{channel.user_id}[/bold]. Ctrl-D or /quit to leave.")
        while True:
            try:
                line = await asyncio.to_thread(console.input, "[bold blue]you>[/bold blue] ")
            except (EOFError, KeyboardInterrupt):
                console.print()
                return 0
            if line.strip() in ("/quit", "/exit"):
                return 0
            if not line.strip():
                continue
            with console.status("thinking…"):
                _key, replies = await channel.ask(line)
            for reply in replies:
                console.print(f"[bold green]agent>[/bold green] {escape(reply)}", highlight=False)
    finally:
        await gateway.stop()


@app.command()
def chat(
    message: Annotated[
        str | None, typer.Option("--message", "-m", help="Send one message, print the reply, exit")
    ] = None,
    user: Annotated[str | None, typer.Option(help="Your user id (default: OS user)")] = None,
) -> None:
    """Chat with the agent in the terminal."""
    setup_logging("WARNING" if state.log_level == "INFO" else state.log_level)
    config = _config()
    code = asyncio.run(_with_bundled_model(config, lambda c: _chat(c, user, message)))
    raise typer.Exit(code)


async def _with_bundled_model(config: Config, main: Callable[[Config], Awaitable[T]]) -> T:
    """Run `main` with the bundled offline model when no [llm] endpoint is configured (and the
    `local` extra is installed); if it cannot start, say why and run without it."""
    from gateway.model.local_model import LocalModelError, bundled_model

    def notify(text: str) -> None:
        err_console.print(f"[yellow]{escape(text)}[/yellow]", highlight=False)

    async with contextlib.AsyncExitStack() as stack:
        try:
            with err_console.status("starting the bundled offline model…"):
                await stack.enter_async_context(bundled_model(config, notify))
        except LocalModelError as exc:
            notify(f"The bundled offline model did not start: {exc}")
        return await main(config)


@sessions_app.command("list")
def sessions_list(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
) -> None:
    """List sessions, most recent first, with their token pressure and next trigger."""
    from gateway.operations import list_sessions

    setup_logging("ERROR" if state.log_level == "INFO" else state.log_level)
    rows = asyncio.run(list_sessions(_config()))
    if as_json:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    if not rows:
        console.print("no sessions yet")
        return
    table = Table(
        Column("session", overflow="fold"), "chat", "turns / msgs",
        "prompt tokens", "next trigger", Column("history limit", overflow="fold"),
        title=f"window {rows[0]['window']:,} tokens ({escape(rows[0]['window_source'])})",
    )
    for r in rows:
        tokens = r["prompt_tokens"]
        pressure = "-" if tokens is None else f"{tokens:,} ({tokens / r['window']:.0%})"
        trigger = r["next_trigger"]
        to_go = "" if trigger["to_go"] is None else f" ({trigger['to_go']:,} to go)"
        limit = "unlimited" if r["history_limit"] == 0 else f"{r['history_limit']:,} turns"
        table.add_row(
            escape(r["key"]), f"{r['platform']} {r['chat_type']}",
            f"{r['turns']:,} / {r['messages']:,}", pressure, f"{trigger['name']} at {trigger['at']:,}{to_go}",
            escape(f"{limit} ({r['history_limit_source']})"),
        )
    console.print(table)


@sessions_app.command("show")
def sessions_show(
    key: Annotated[str, typer.Argument(help="Session key, e.g. agent:main:webchat:direct:alice")],
    show_all: Annotated[
        bool, typer.Option("--all", help="Every stored message, compacted ones included")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
) -> None:
    """Show a session: its latest summary and the messages after it (or everything, --all)."""
    from gateway.operations import show_session

    setup_logging("ERROR" if state.log_level == "INFO" else state.log_level)
    data = asyncio.run(show_session(_config(), key, show_all))
    if data is None:
        err_console.print(f"no session {key!r} (see `gatehouse sessions list`)", highlight=False)
        raise typer.Exit(1)
    if as_json:
        print(json.dumps(data, indent=2, ensure_ascii=False))
        return
    console.print(
        f"[bold]{escape(data['key'])}[/bold] ({data['platform']}, {data['chat_type']}); "
        f"automatic compaction: {escape(data['automatic_compaction'])}"
    )
    if data["compactions"]:
        history = Table("id", "covers seq", "tokens before → after", "quality", "when", "state",
                        title="Compactions")
        for c in data["compactions"]:
            q = c.get("quality") or {}
            quality = (
                f"sections {len(q.get('sections_present', []))}/5, ids "
                f"{q.get('identifier_retention', 0):.0%}, ratio {q.get('compression_ratio', 0):.2f}"
                + (f", fallback {q['fallback']}" if q.get("fallback") else "")
            )
            if q.get("reason") == "reset":
                quality = f"reset ({q.get('why', '')}): a fresh context, nothing deleted"
            history.add_row(
                str(c["id"]), f"{c['first_seq']}-{c['last_seq']}",
                f"{c['tokens_before']:,} → {c['tokens_after']:,}", quality, c["created_at"],
                "undone" if c["undone"] else "active",
            )
        console.print(history)
    if data["summary"]:
        console.print("[bold]Latest summary[/bold] (sent instead of the messages it covers):")
        console.print(escape(data["summary"]))
    table = Table("seq", "role", "content", "tokens", show_lines=False)
    for m in data["messages"]:
        content = m["content"] if isinstance(m["content"], str) else json.dumps(m["content"])
        if m.get("tool_calls"):
            content = (content or "") + " " + json.dumps(m["tool_calls"])
        role = m["role"] + (" (compacted)" if m["compacted"] else "")
        if m.get("status"):
            role += f" [{m['status']}]"
        table.add_row(str(m["seq"]), escape(role), escape(content or ""), str(m["tokens"] or ""))
    console.print(table)


@sessions_app.command("compact")
def sessions_compact(
    key: Annotated[str | None, typer.Argument(help="Session key (or --all)")] = None,
    every: Annotated[bool, typer.Option("--all", help="Compact every session")] = False,
    instructions: Annotated[
        str, typer.Option("--instructions", "-i", help="What the summary should focus on")
    ] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
) -> None:
    """Compact a session now (the same pipeline as automatic compaction), or every one (--all)."""
    from gateway.operations import compact_all, compact_session

    setup_logging("WARNING" if state.log_level == "INFO" else state.log_level)
    if every == (key is not None):
        err_console.print("give one session KEY or --all", highlight=False)
        raise typer.Exit(2)
    if every:

        async def compact_every(config: Config) -> list[dict[str, Any]]:
            with _progress() as progress:
                task = progress.add_task("compacting sessions", total=None)

                def advance(done: int, total: int, outcome: dict[str, Any]) -> None:
                    progress.update(task, completed=done, total=total,
                                    description=f"compacted {escape(outcome['session'])}")

                return await compact_all(config, instructions, advance)

        results = asyncio.run(_with_bundled_model(_config(), compact_every))
        failed = [r for r in results if not r["committed"] and not r["nothing_to_compact"]]
        if as_json:
            print(json.dumps(results, indent=2, ensure_ascii=False))
        else:
            table = Table("session", "result", title=f"compacted {len(results)} sessions")
            for r in results:
                table.add_row(escape(r["session"]), escape(r["message"]))
            console.print(table)
        raise typer.Exit(1 if failed else 0)
    assert key is not None

    async def compact_one(config: Config) -> dict[str, Any]:
        with console.status("compacting…"):
            return await compact_session(config, key, instructions)

    try:
        data = asyncio.run(_with_bundled_model(_config(), compact_one))
    except KeyError:
        err_console.print(f"no session {key!r} (see `gatehouse sessions list`)", highlight=False)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        console.print(escape(data["message"]))
    raise typer.Exit(0 if data["committed"] else 1)


@sessions_app.command("export")
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

    setup_logging("ERROR" if state.log_level == "INFO" else state.log_level)
    try:
        messages = asyncio.run(export_session(_config(), key))
    except KeyError:
        err_console.print(f"no session {key!r} (see `gatehouse sessions list`)", highlight=False)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(messages, indent=2, ensure_ascii=False))
        return
    lines = "".join(json.dumps(m, ensure_ascii=False) + "\n" for m in messages)
    if output is None:
        sys.stdout.write(lines)
        return
    try:
        output.write_text(lines, encoding="utf-8")
    except OSError as exc:  # the user's path, not a data file: no storage advice
        _fail("cannot write", f"{output}: {exc.strerror or exc}", 1)
    roles: dict[str, int] = {}
    for m in messages:
        roles[m["role"]] = roles.get(m["role"], 0) + 1
    table = Table("role", "messages", title=f"wrote {escape(str(output))}")
    for role, count in roles.items():
        table.add_row(role, f"{count:,}")
    console.print(table)


@sessions_app.command("import")
def sessions_import(
    transcript: Annotated[Path, typer.Argument(help="OpenAI-format JSONL, one message a line")],
    key: Annotated[
        str | None, typer.Option("--key", help="Session key (default: agent:<agent>:import:direct:<file name>)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
) -> None:
    """Import a transcript as a new session (the whole file is checked before anything is stored)."""
    from gateway.operations import TranscriptError, import_session

    setup_logging("ERROR" if state.log_level == "INFO" else state.log_level)
    config = _config()
    try:
        with _progress() as progress:
            task = progress.add_task(f"importing {escape(transcript.name)}", total=None)
            data = asyncio.run(import_session(
                config, transcript, key,
                lambda done, total: progress.update(task, completed=done, total=total),
            ))
    except TranscriptError as exc:
        err_console.print(f"[red]transcript error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    except ValueError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(data, indent=2, ensure_ascii=False))
        return
    skipped = data["skipped_system_messages"]
    console.print(
        f"imported {data['imported']:,} messages ({data['tokens']:,} tokens) into "
        f"{escape(data['session'])}"
        + (f"; skipped {skipped} system message(s): the gateway's own prompt is used" if skipped else "")
    )


def _progress() -> Any:
    """A progress bar on stderr (stdout stays clean for --json), gone when done."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err_console, transient=True,
    )


@sessions_app.command("uncompact")
def sessions_uncompact(key: Annotated[str, typer.Argument(help="Session key")]) -> None:
    """Restore the state before the last compaction (the summary is kept, marked undone)."""
    from gateway.operations import uncompact_session

    setup_logging("WARNING" if state.log_level == "INFO" else state.log_level)
    try:
        data = asyncio.run(uncompact_session(_config(), key))
    except KeyError:
        err_console.print(f"no session {key!r} (see `gatehouse sessions list`)", highlight=False)
        raise typer.Exit(1) from None
    console.print(escape(data["message"]))


@sessions_app.command("search")
def sessions_search(
    key: Annotated[str, typer.Argument(help="Session key")],
    query: Annotated[str, typer.Argument(help="An exact identifier, or words")],
    limit: Annotated[int, typer.Option(min=1, max=20, help="Most hits to show")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
) -> None:
    """Search a session's compacted messages as its agent's history_search does."""
    from gateway.operations import search_session_history
    from gateway.tools.history import when

    setup_logging("ERROR" if state.log_level == "INFO" else state.log_level)
    config = _config()
    hits = asyncio.run(search_session_history(config, key, query, limit))
    if hits is None:
        err_console.print(f"no session {key!r} (see `gatehouse sessions list`)", highlight=False)
        raise typer.Exit(1)
    if as_json:
        print(json.dumps(hits, indent=2, ensure_ascii=False))
        return
    if not hits:
        console.print("no matches in this session's archived messages")
        return
    table = Table(
        "seq", "time", "role", "via", Column("excerpt", overflow="fold"),
        title=f"{escape(key)}: {escape(query)}",
    )
    for h in hits:
        seq = str(h["seq"]) if h["last_seq"] is None else f"{h['seq']}-{h['last_seq']}"
        role = f"{h['role']} {h['name']}" if h["role"] == "tool" and h["name"] else h["role"]
        table.add_row(
            seq, when(h["created_at"], config.gateway.timezone), escape(role), h["via"],
            escape(h["excerpt"]),
        )
    console.print(table)


@context_app.command("compact")
def context_compact(
    transcript: Annotated[Path, typer.Argument(help="OpenAI-format JSONL, one message a line")],
    window: Annotated[
        int | None, typer.Option("--window", help="Context window in tokens (default: resolved)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
) -> None:
    """Compact a transcript with the configured LLM and print the resulting prompt."""
    from gateway.operations import TranscriptError, compact_transcript

    setup_logging("WARNING" if state.log_level == "INFO" else state.log_level)
    config = _config()
    try:
        data = asyncio.run(_with_bundled_model(
            config, lambda c: compact_transcript(c, transcript, window)
        ))
    except TranscriptError as exc:
        err_console.print(f"[red]transcript error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(data, indent=2, ensure_ascii=False))
        return
    for m in data["messages"]:
        console.rule(f"[bold]{m['role']}[/bold]")
        text = m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
        if m.get("tool_calls"):
            text = (text or "") + "\n" + json.dumps(m["tool_calls"])
        console.print(escape(text or ""), highlight=False)
    q = data.get("quality") or {}
    console.rule()
    archived = data.get("identifiers_archived", 0)
    console.print(
        f"tokens {data['tokens_before']:,} → {data['tokens_after']:,} (the prompt above); "
        f"identifiers {len(data['identifiers'])}"
        + (f" ({archived:,} archived for history_search)" if archived else "")
        + f"; quality: {'passed' if q.get('passed') else 'see --json'}"
        + (f"; fallback {q['fallback']}" if q.get("fallback") else "")
    )
    for note in q.get("notes") or ([data["note"]] if data.get("note") else []):
        console.print(f"- {escape(note)}", highlight=False)


@context_app.command("explain")
def context_explain(
    key: Annotated[str, typer.Argument(help="Session key (see `gatehouse sessions list`)")],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
    offline: Annotated[
        bool, typer.Option("--offline", help="Don't ask the LLM server for model metadata")
    ] = False,
) -> None:
    """Explain every limit applied to a session, and where each one comes from."""
    from gateway.operations import explain_session

    setup_logging("ERROR" if state.log_level == "INFO" else state.log_level)
    facts = asyncio.run(explain_session(_config(), key, fetch_metadata=not offline))
    if facts is None:
        err_console.print(f"no session {key!r} (see `gatehouse sessions list`)", highlight=False)
        raise typer.Exit(1)
    if as_json:
        print(json.dumps(facts, indent=2, ensure_ascii=False))
        return
    _print_explain(facts)


def _print_explain(f: dict[str, Any]) -> None:
    console.print(f"[bold]{escape(f['session'])}[/bold] ({f['platform']}, {f['chat_type']})")
    rows = [
        ("engine", f["engine"], ""),
        ("model", f["model"], ""),
        ("context window", f"{f['window']:,} tokens", f["window_source"]),
        ("token counter", f["counter"], "exact" if f["counter_exact"] else "estimate ×1.2"),
        ("usage calibration", f["calibration"], "provider usage.prompt_tokens"),
        ("history limit", f["history_limit_text"], f["history_limit_source"]),
        ("", f.get("history_limit_order", ""), ""),
    ]
    facts = Table("setting", "value", "source", title="Resolved limits")
    for name, value, source in rows:
        facts.add_row(name, escape(str(value)), escape(str(source)))
    console.print(facts)
    if f.get("window_warning"):
        console.print(f"[yellow]warning:[/yellow] {escape(f['window_warning'])}")
    if f.get("window_too_small"):
        console.print("[red]turns are refused: the window is below 16,000 tokens[/red]")
    budget = Table("budget", "tokens", "why", title="Budget")
    for row in f["budget"]:
        budget.add_row(row["name"], f"{row['tokens']:,}", escape(row["why"]))
    console.print(budget)
    tokens = f["tokens"]
    now = Table("part", "tokens", title="Current prompt (next turn, before the new message)")
    for part in ("system", "tools", "summary", "history", "prompt"):
        now.add_row(part, f"{tokens.get(part, 0):,}")
    now.add_row("whole stored history (local count)", f"{tokens['local_total']:,}")
    console.print(now)
    console.print(
        f"stored messages: {f['stored_messages']:,}, in prompt: {f['messages_in_prompt']:,}; "
        f"last provider-reported prompt tokens: {f['last_reported_prompt_tokens'] or '-'}"
    )
    console.print(
        f"memory flush at {f['flush_threshold']:,} tokens ({f['to_flush']:,} to go); "
        f"compaction at {f['compaction_threshold']:,} tokens ({f['to_compaction']:,} to go); "
        f"overflow tier now: [bold]{f['tier']}[/bold]"
    )
    console.print(f"automatic compaction: {escape(f['automatic_compaction'])}")
    last = f.get("last_compaction")
    if last:
        q = last.get("quality") or {}
        console.print(
            f"last compaction #{last['id']}: seq {last['covers'][0]}-{last['covers'][1]}, "
            f"{last['tokens_before']:,} → {last['tokens_after']:,} tokens; compression "
            f"{q.get('compression_ratio', 0):.2f}, identifier retention "
            f"{q.get('identifier_retention', 0):.0%}, sections {len(q.get('sections_present', []))}/5"
            + (f", fallback {q['fallback']}" if q.get("fallback") else "")
        )
    for note in f["notes"]:
        console.print(f"- {escape(note)}")


def _memory_index_path(config: Config) -> Path:
    return config.data_dir / "memory-index.db"


def _memory_index(config: Config) -> Any:
    from memory.index import MemoryIndex

    ensure_workspace(config.workspace)
    config.data_dir.mkdir(parents=True, exist_ok=True)
    with storage_faults(_memory_index_path(config)):
        return MemoryIndex(
            _memory_index_path(config),
            config.workspace,
            search_transcripts=config.memory.archive_transcripts,
        )


@memory_app.command("ls")
def memory_ls(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
) -> None:
    """List the workspace's memory files."""
    from memory.workspace import list_workspace_files

    config = _config()
    ensure_workspace(config.workspace)
    files = list_workspace_files(config.workspace)
    if as_json:
        print(json.dumps([asdict(f) for f in files], indent=2, ensure_ascii=False, default=str))
        return
    table = Table("file", "lines", "bytes", "modified", title=str(config.workspace))
    for f in files:
        table.add_row(
            escape(f.path), str(f.lines), f"{f.size:,}", f"{f.modified:%Y-%m-%d %H:%M} UTC"
        )
    console.print(table)


@memory_app.command("show")
def memory_show(
    file: Annotated[str, typer.Argument(help="Workspace-relative path, e.g. memory/2026-12-02.md")],
    start: Annotated[int, typer.Option(help="First line (1-based)")] = 1,
    count: Annotated[int | None, typer.Option(help="How many lines")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
) -> None:
    """Show a workspace file (confined to the workspace, like the agent's tools)."""
    from memory.notes import read_lines
    from memory.workspace import WorkspacePathError

    config = _config()
    try:
        result = read_lines(config.workspace, file, start, count)
    except (WorkspacePathError, ValueError, OSError) as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(asdict(result), indent=2, ensure_ascii=False))
        return
    console.print(escape(result.render()), highlight=False)


@memory_app.command("search")
def memory_search(
    query: Annotated[str, typer.Argument(help="Words, identifiers, Chinese or Japanese text")],
    limit: Annotated[int, typer.Option(help="Most hits to show")] = 10,
    corpus: Annotated[str, typer.Option(help="notes, transcripts or all")] = "notes",
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
) -> None:
    """Full-text search (FTS5, BM25, trigram) over the memory files."""
    config = _config()
    index = _memory_index(config)
    try:
        with storage_faults(_memory_index_path(config)):
            index.refresh()
            hits = index.search(query, limit=limit, corpus=corpus)
    finally:
        index.close()
    if as_json:
        print(json.dumps([asdict(h) for h in hits], indent=2, ensure_ascii=False))
        return
    if not hits:
        console.print("no matches")
        return
    table = Table("where", "score", "snippet", title=f"memory search: {escape(query)}")
    for h in hits:
        table.add_row(escape(h.location), f"{h.score:.2f}", escape(h.snippet))
    console.print(table)


@memory_app.command("reindex")
def memory_reindex(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
) -> None:
    """Rebuild the memory search index from the files."""
    config = _config()
    index = _memory_index(config)
    try:
        with _progress() as progress, storage_faults(_memory_index_path(config)):
            task = progress.add_task("reindexing memory", total=None)
            stats = index.reindex(
                lambda done, total: progress.update(task, completed=done, total=total)
            )
    finally:
        index.close()
    if as_json:
        print(json.dumps(asdict(stats), indent=2))
        return
    console.print(
        f"reindexed {stats.files_scanned} files ({stats.chunks_written} chunks) "
        f"in {stats.seconds:.2f} s"
    )


async def _with_store(config: Config, use: Callable[[Any], Awaitable[T]]) -> T:
    from gateway.store import Store

    store = Store(config.database_url)
    await store.init()
    try:
        return await use(store)
    finally:
        await store.close()


async def _pairing(config: Config, action: str, code: str | None) -> Any:
    async def use(store: Any) -> Any:
        if action == "list":
            return await store.list_pairings()
        assert code is not None
        return await store.decide_pairing(code, action)

    return await _with_store(config, use)


@pairing_app.command("list")
def pairing_list(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
) -> None:
    """Pairing requests: pending (with their codes), approved and denied."""
    rows = asyncio.run(_pairing(_config(), "list", None))
    data = [
        {
            "code": r.code, "platform": r.platform, "sender_id": r.sender_id,
            "sender_name": r.sender_name, "status": r.status,
            "created_at": r.created_at.isoformat(timespec="seconds"),
            "expires_at": r.expires_at.isoformat(timespec="seconds"),
        }
        for r in rows
    ]
    if as_json:
        print(json.dumps(data, indent=2, ensure_ascii=False))
        return
    table = Table("code", "platform", "sender", "status", "requested", "expires")
    for d in data:
        table.add_row(d["code"], d["platform"], escape(f"{d['sender_name'] or ''} ({d['sender_id']})"),
                      d["status"], d["created_at"], d["expires_at"])
    console.print(table)


def _decide_pairing(code: str, status: str) -> None:
    row = asyncio.run(_pairing(_config(), status, code))
    if row is None:
        err_console.print(f"no pending, unexpired pairing code {code!r}", highlight=False)
        raise typer.Exit(1)
    console.print(f"{status} {row.platform} user {escape(row.sender_name or row.sender_id)}")


@pairing_app.command("approve")
def pairing_approve(code: Annotated[str, typer.Argument(help="The 8-character code")]) -> None:
    """Let the sender with this code talk to the agent."""
    _decide_pairing(code, "approved")


@pairing_app.command("deny")
def pairing_deny(code: Annotated[str, typer.Argument(help="The 8-character code")]) -> None:
    """Refuse the sender with this code."""
    _decide_pairing(code, "denied")


async def _jobs(config: Config, cancel: str | None = None) -> Any:
    from gateway.jobs.maintenance import maintenance_schedule
    from gateway.jobs.scheduler import JobInfo, open_job_store

    # APScheduler's job store: its own engine on the database, so its faults are named here.
    with storage_faults(database_where(config.database_url)):
        async with open_job_store(config) as scheduler:
            if cancel is not None:
                return await scheduler.cancel(cancel)
            jobs = await scheduler.jobs()
    now = datetime.now(UTC)
    maintenance = [
        JobInfo(j.id, "maintenance", j.description, str(j.trigger),
                j.trigger.get_next_fire_time(None, now))
        for j in maintenance_schedule(config)
    ] if config.scheduler.enabled else []
    return sorted(jobs, key=lambda j: j.next_run or now) + maintenance


@jobs_app.command("list")
def jobs_list(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
) -> None:
    """Reminders and cron tasks stored in the database, then the maintenance jobs."""
    config = _config()
    jobs = asyncio.run(_jobs(config))
    if as_json:
        print(json.dumps([j.to_json() for j in jobs], indent=2, ensure_ascii=False))
        return
    table = Table("kind", "schedule", "next run", "session / target", "what")
    table.add_column("id", no_wrap=True)
    for j in jobs:
        where = j.session_key or ""
        if j.target is not None and j.kind == "cron":
            where += f" → {j.target.describe()}"
        table.add_row(
            j.kind, escape(j.schedule),
            j.next_run.isoformat(timespec="minutes") if j.next_run else "-",
            escape(where), escape((j.text or j.name)[:80]), j.id,
        )
    console.print(table)


@jobs_app.command("cancel")
def jobs_cancel(job_id: Annotated[str, typer.Argument(help="The job id (see `jobs list`)")]) -> None:
    """Cancel a reminder or cron task (works whether or not the gateway runs)."""
    from gateway.jobs.maintenance import maintenance_schedule

    config = _config()
    if job_id in {j.id for j in maintenance_schedule(config)}:
        err_console.print(
            escape(f"{job_id} is a maintenance job: turn it off in [scheduler] of the config"),
            highlight=False,
        )
        raise typer.Exit(1)
    info = asyncio.run(_jobs(config, cancel=job_id))
    if info is None:
        err_console.print(escape(f"no job {job_id!r} (see `gatehouse jobs list`)"),
                          highlight=False)
        raise typer.Exit(1)
    console.print(f"cancelled {info.kind} {info.id} of {escape(info.session_key or '-')}")


@outbox_app.command("list")
def outbox_list(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
) -> None:
    """Replies waiting to be sent (or given up after `[gateway] delivery_attempts` tries)."""
    from gateway.turn.outbox import logged_sent

    config = _config()
    rows = asyncio.run(_with_store(config, lambda store: store.outbox()))
    # A running gateway on SQLite logs sent replies first and deletes their rows in batches.
    sent = set(logged_sent(config.data_dir))
    data = [
        {
            "id": r.id, "session": r.session_key, "platform": r.platform, "chat_id": r.chat_id,
            "state": "given up" if r.given_up_at is not None else "waiting",
            "attempts": r.attempts, "sent_parts": r.sent_parts, "last_error": r.last_error,
            "since": r.created_at.isoformat(timespec="seconds"), "text": r.text,
        }
        for r in rows
        if r.id not in sent
    ]
    if as_json:
        print(json.dumps(data, indent=2, ensure_ascii=False))
        return
    if not data:
        console.print("the outbox is empty: every stored reply reached its platform")
        return
    table = Table("id", "state", "tries", "session", "last error", "reply")
    for d in data:
        table.add_row(str(d["id"]), d["state"], str(d["attempts"]), escape(d["session"]),
                      escape(d["last_error"] or "-"), escape(d["text"][:60]))
    console.print(table)


@outbox_app.command("retry")
def outbox_retry(
    ids: Annotated[list[int] | None, typer.Argument(help="Outbox ids (see `outbox list`)")] = None,
    every: Annotated[bool, typer.Option("--all", help="Every given-up reply")] = False,
) -> None:
    """Give replies their tries back: a running gateway sends them within its sweep
    ([gateway] pending_sweep_seconds), a stopped one when it next starts."""
    if bool(ids) == every:
        err_console.print("name outbox ids or --all (not both)", highlight=False)
        raise typer.Exit(2)
    config = _config()
    changed = asyncio.run(
        _with_store(config, lambda store: store.retry_outbox(None if every else ids))
    )
    console.print(
        f"{changed} repl{'y' if changed == 1 else 'ies'} will be sent again: by a running gateway "
        f"within {config.gateway.pending_sweep_seconds:g} s, else when it next starts"
    )
    if not every and ids is not None and changed < len(ids):
        err_console.print("some ids are not in the outbox (see `gatehouse outbox list`)",
                          highlight=False)
        raise typer.Exit(1)


@outbox_app.command("drop")
def outbox_drop(
    ids: Annotated[list[int], typer.Argument(help="Outbox ids (see `outbox list`)")],
) -> None:
    """Stop trying to send these replies; they stay in their conversation."""
    dropped = asyncio.run(_with_store(_config(), lambda store: store.forget_outbox(ids)))
    console.print(f"dropped {dropped} repl{'y' if dropped == 1 else 'ies'}")
    if dropped < len(ids):
        err_console.print("some ids are not in the outbox (see `gatehouse outbox list`)",
                          highlight=False)
        raise typer.Exit(1)


@app.command()
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
) -> None:
    """Check that everything is ready: config, database, workspace, LLM, each enabled platform
    (one harmless call each). Exits 1 when something needs fixing."""
    from dataclasses import asdict as as_dict

    from gateway.doctor import run_doctor

    setup_logging("ERROR" if state.log_level == "INFO" else state.log_level)
    with err_console.status("checking…"):
        _config_loaded, checks = asyncio.run(run_doctor(state.config_path))
    ready = all(c.ok for c in checks)
    if as_json:
        print(json.dumps({"ready": ready, "checks": [as_dict(c) for c in checks]}, indent=2,
                         ensure_ascii=False))
    else:
        style = {"ready": "[green]ready[/green]", "warning": "[yellow]warning[/yellow]",
                 "problem": "[red]problem[/red]"}
        table = Table("check", "status", Column("detail", overflow="fold"), "how to fix",
                      title="gatehouse doctor", show_lines=True)
        for c in checks:
            table.add_row(c.name, style[c.status], escape(c.detail), escape(c.fix))
        console.print(table)
        console.print("[green]ready to run[/green]" if ready
                      else "[red]not ready:[/red] fix the problems above, then run doctor again")
    raise typer.Exit(0 if ready else 1)


@app.command("config-check")
def config_check() -> None:
    """Validate the configuration and print the resolved values."""
    config = _config()
    console.print(f"[green]ok[/green] {config.source or '(defaults: no config file found)'}")
    console.print(f"database:  {_safe_url(config)}")
    console.print(f"workspace: {config.workspace}")
    llm = redacted_url(config.llm.base_url) if config.llm.base_url else "(not configured)"
    console.print(f"llm:       {llm} model={config.llm.model}")


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Bring the database to the newest schema (every process also does this when it opens)."""
    from gateway.store import Store

    config = _config()

    async def upgrade() -> str:
        store = Store(config.database_url)
        try:
            await store.init()
            return store.schema_status
        finally:
            await store.close()

    console.print(f"{_safe_url(config)}: {asyncio.run(upgrade())}")


@db_app.command("current")
def db_current() -> None:
    """Show the database's schema revision and the newest one this release knows."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import OperationalError

    from gateway.store.db import sync_url
    from gateway.store.schema import current_revision, head_revision

    config = _config()
    url = sync_url(config.database_url)
    database = make_url(url).database
    if url.startswith("sqlite") and database and not Path(database).exists():
        console.print(f"no database yet at {database} (`gatehouse db upgrade` creates it)")
        raise typer.Exit(1)
    engine = create_engine(url)
    try:
        with storage_faults(database_where(config.database_url)), engine.connect() as conn:
            current = current_revision(conn)
    except OperationalError as exc:
        _fail(f"cannot open {_safe_url(config)}", str(exc.orig), 1)
    finally:
        engine.dispose()
    head = head_revision()
    state_text = "up to date" if current == head else "needs `gatehouse db upgrade`"
    console.print(f"database revision: {current or '(none)'}; newest: {head} ({state_text})")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
