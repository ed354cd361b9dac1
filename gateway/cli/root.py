"""The root `gatehouse` command and its own commands: init, run, chat, doctor, config-check."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Column, Table

from channels.console import ConsoleChannel
from channels.webchat import WebchatChannel
from gateway.adapters import add_channel_routes, platform_channels
from gateway.app import Gateway
from gateway.cli.common import (
    Commands,
    JsonFlag,
    console,
    err_console,
    fail,
    load,
    print_json,
    quiet_logging,
    state,
    with_bundled_model,
)
from gateway.config import DEFAULT_CONFIG_NAME, Config, ConfigError, load_config, redacted_url
from gateway.logging_setup import setup_logging
from gateway.model.llm import NOT_CONFIGURED
from gateway.store.faults import storage_error
from gateway.web.server import WebServer, build_app
from memory.workspace import ensure_workspace

log = logging.getLogger("gatehouse")

app = typer.Typer(
    help="Gatehouse: a self-hosted chat-bot gateway for one LLM agent.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Commands,
)


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
        fail("cannot write", f"{exc.filename or target}: {exc.strerror or exc}; choose another --dir")
    try:
        config = load_config(target)
    except ConfigError as exc:
        fail("config error", str(exc))
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
    log.info("gateway running (database %s, workspace %s)", redacted_url(config.database_url),
             config.workspace)
    await stop.wait()
    log.info("shutting down: finishing in-flight turns")
    if server is not None:
        await server.stop()
    await gateway.stop()
    log.info("stopped")


@app.command()
def run() -> None:
    """Start the gateway: every enabled channel and the web server."""
    setup_logging(state.log_level)
    config = load()
    try:
        asyncio.run(with_bundled_model(config, _serve))
    except OSError as exc:
        if storage_error(exc) is not None:
            raise  # a data file: the storage line (`Commands`)
        fail("cannot start", str(exc), 1)


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
    quiet_logging("WARNING")
    config = load()
    code = asyncio.run(with_bundled_model(config, lambda c: _chat(c, user, message)))
    raise typer.Exit(code)


@app.command()
def doctor(as_json: JsonFlag = False) -> None:
    """Check that everything is ready: config, database, workspace, LLM, each enabled platform
    (one harmless call each). Exits 1 when something needs fixing."""
    from gateway.doctor import run_doctor

    quiet_logging("ERROR")
    with err_console.status("checking…"):
        _config_loaded, checks = asyncio.run(run_doctor(state.config_path))
    ready = all(c.ok for c in checks)
    if as_json:
        print_json({"ready": ready, "checks": [asdict(c) for c in checks]})
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
    config = load()
    console.print(f"[green]ok[/green] {config.source or '(defaults: no config file found)'}")
    console.print(f"database:  {redacted_url(config.database_url)}")
    console.print(f"workspace: {config.workspace}")
    llm = redacted_url(config.llm.base_url) if config.llm.base_url else "(not configured)"
    console.print(f"llm:       {llm} model={config.llm.model}")
