"""The `gatehouse` command line (typer + rich)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
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
from gateway.config import DEFAULT_CONFIG_NAME, Config, ConfigError, load_config
from gateway.llm import NOT_CONFIGURED
from gateway.logging_setup import setup_logging
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
        return load_config(state.config_path)
    except ConfigError as exc:
        err_console.print(f"[red]config error:[/red] {escape(str(exc))}", highlight=False)
        raise typer.Exit(2) from None


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
    await gateway.start()
    if not gateway.llm.configured:
        err_console.print(f"[yellow]{escape(NOT_CONFIGURED)}[/yellow]", highlight=False)
    if config.web.enabled:
        server = WebServer(build_app(gateway, webchat), config.web.host, config.web.port)
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


async def _show_session(config: Config, key: str) -> dict[str, object] | None:
    from gateway.store import Store

    store = Store(config.database_url)
    await store.init()
    try:
        row = await store.get_session(key)
        if row is None or row.id is None:
            return None
        messages = await store.history(row.id)
        return {
            "key": row.key,
            "platform": row.platform,
            "chat_type": row.chat_type,
            "turns": row.turns,
            "messages": [{"seq": m.seq, **m.to_openai(), "status": m.meta.get("status")} for m in messages],
        }
    finally:
        await store.close()


@sessions_app.command("show")
def sessions_show(
    key: Annotated[str, typer.Argument(help="Session key, e.g. agent:main:webchat:direct:alice")],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
) -> None:
    """Show a session's transcript."""
    data = asyncio.run(_show_session(_config(), key))
    if data is None:
        err_console.print(f"no session {key!r} (see `gatehouse sessions list`)", highlight=False)
        raise typer.Exit(1)
    if as_json:
        print(json.dumps(data, indent=2, ensure_ascii=False))
        return
    console.print(f"[bold]{data['key']}[/bold] ({data['platform']}, {data['chat_type']})")
    table = Table("seq", "role", "content", show_lines=False)
    for m in data["messages"]:  # type: ignore[attr-defined]
        content = m["content"] if isinstance(m["content"], str) else json.dumps(m["content"])
        if m.get("tool_calls"):
            content = (content or "") + " " + json.dumps(m["tool_calls"])
        table.add_row(str(m["seq"]), m["role"], escape(content or ""))
    console.print(table)


@context_app.command("explain")
def context_explain(
    key: Annotated[str, typer.Argument(help="Session key (see `gatehouse sessions list`)")],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False,
    offline: Annotated[
        bool, typer.Option("--offline", help="Don't ask the LLM server for model metadata")
    ] = False,
) -> None:
    """Explain every limit applied to a session, and where each one comes from."""
    from gateway.context_setup import explain_session

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
    for note in f["notes"]:
        console.print(f"- {escape(note)}")


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
