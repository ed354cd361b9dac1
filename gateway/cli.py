"""The `gatehouse` command line (typer + rich)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from channels.console import ConsoleChannel
from channels.webchat import WebchatChannel
from gateway.app import Gateway
from gateway.channels_setup import add_channel_routes, platform_channels
from gateway.config import DEFAULT_CONFIG_NAME, Config, ConfigError, load_config
from gateway.llm import NOT_CONFIGURED
from gateway.logging_setup import SECRETS, config_secrets, setup_logging
from gateway.web import WebServer, build_app
from memory.workspace import ensure_workspace

log = logging.getLogger("gatehouse")
console = Console()
err_console = Console(stderr=True)

app = typer.Typer(
    help="Gatehouse: a self-hosted chat-bot gateway for one LLM agent.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
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
        err_console.print(f"[red]config error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
    SECRETS.protect(config_secrets(config))  # never in a log line, whatever logs it
    return config


@app.command()
def init(
    directory: Annotated[Path, typer.Option("--dir", help="Where to write gatehouse.toml")] = Path(),
    force: Annotated[bool, typer.Option(help="Overwrite an existing gatehouse.toml")] = False,
) -> None:
    """Write a commented gatehouse.toml and create the workspace (AGENTS.md, memory/)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / DEFAULT_CONFIG_NAME
    if target.exists() and not force:
        console.print(f"{target} already exists; keeping it (use --force to overwrite).")
    else:
        template = resources.files("gateway") / "templates" / "gatehouse.toml"
        target.write_text(template.read_text(encoding="utf-8"), encoding="utf-8")
        console.print(f"wrote {target}")
    try:
        config = load_config(target)
    except ConfigError as exc:
        err_console.print(f"[red]config error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None
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
    url = config.database_url
    if "@" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


@app.command()
def run() -> None:
    """Start the gateway: every enabled channel and the web server."""
    setup_logging(state.log_level)
    config = _config()
    try:
        asyncio.run(_serve(config))
    except OSError as exc:
        err_console.print(f"[red]cannot start:[/red] {exc}", highlight=False)
        raise typer.Exit(1) from None


async def _chat(config: Config, user: str | None, message: str | None) -> int:
    config.web.enabled = False
    gateway = Gateway(config)
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
    code = asyncio.run(_chat(config, user, message))
    raise typer.Exit(code)


async def _list_sessions(config: Config) -> list[dict[str, object]]:
    from gateway.store import Store

    store = Store(config.database_url)
    await store.init()
    try:
        rows = await store.list_sessions()
        out = []
        for row in rows:
            assert row.id is not None
            out.append(
                {
                    "key": row.key,
                    "platform": row.platform,
                    "chat_type": row.chat_type,
                    "turns": row.turns,
                    "messages": await store.message_count(row.id),
                    "last_prompt_tokens": row.last_prompt_tokens,
                    "updated_at": row.updated_at.isoformat(timespec="seconds"),
                }
            )
        return out
    finally:
        await store.close()


@sessions_app.command("list")
def sessions_list(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
) -> None:
    """List sessions, most recent first."""
    rows = asyncio.run(_list_sessions(_config()))
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("session", "platform", "type", "turns", "messages", "prompt tokens", "updated")
    for r in rows:
        table.add_row(
            str(r["key"]), str(r["platform"]), str(r["chat_type"]), str(r["turns"]),
            str(r["messages"]), str(r["last_prompt_tokens"] or "-"), str(r["updated_at"]),
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
    key: Annotated[str, typer.Argument(help="Session key")],
    instructions: Annotated[
        str, typer.Option("--instructions", "-i", help="What the summary should focus on")
    ] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
) -> None:
    """Compact a session now (the same pipeline as automatic compaction)."""
    from gateway.operations import compact_session

    setup_logging("WARNING" if state.log_level == "INFO" else state.log_level)
    try:
        with console.status("compacting…"):
            data = asyncio.run(compact_session(_config(), key, instructions))
    except KeyError:
        err_console.print(f"no session {key!r} (see `gatehouse sessions list`)", highlight=False)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        console.print(escape(data["message"]))
    raise typer.Exit(0 if data["committed"] else 1)


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
        data = asyncio.run(compact_transcript(config, transcript, window))
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
    console.print(
        f"tokens {data['tokens_before']:,} → {data['tokens_after']:,}; "
        f"identifiers {len(data['identifiers'])}; "
        f"quality: {'passed' if q.get('passed') else 'see --json'}"
        + (f"; fallback {q['fallback']}" if q.get("fallback") else "")
    )


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


def _memory_index(config: Config) -> Any:
    from memory.index import MemoryIndex

    ensure_workspace(config.workspace)
    config.data_dir.mkdir(parents=True, exist_ok=True)
    return MemoryIndex(config.data_dir / "memory-index.db", config.workspace)


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
    from rich.progress import Progress

    config = _config()
    index = _memory_index(config)
    try:
        with Progress(console=err_console, transient=True) as progress:
            progress.add_task("reindexing memory…", total=None)
            stats = index.reindex()
    finally:
        index.close()
    if as_json:
        print(json.dumps(asdict(stats), indent=2))
        return
    console.print(
        f"reindexed {stats.files_scanned} files ({stats.chunks_written} chunks) "
        f"in {stats.seconds:.2f} s"
    )


async def _pairing(config: Config, action: str, code: str | None) -> Any:
    from gateway.store import Store

    store = Store(config.database_url)
    await store.init()
    try:
        if action == "list":
            return await store.list_pairings()
        assert code is not None
        return await store.decide_pairing(code, action)
    finally:
        await store.close()


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


@app.command("config-check")
def config_check() -> None:
    """Validate the configuration and print the resolved values."""
    config = _config()
    console.print(f"[green]ok[/green] {config.source or '(defaults: no config file found)'}")
    console.print(f"database:  {_safe_url(config)}")
    console.print(f"workspace: {config.workspace}")
    console.print(f"llm:       {config.llm.base_url or '(not configured)'} model={config.llm.model}")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
