"""The root `gatehouse` command and its own commands: init, run, reload, chat, doctor,
config-check."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Iterator
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Column, Table

from gateway.cli.common import (
    Commands,
    ConfigOption,
    JsonFlag,
    LogLevelOption,
    console,
    err_console,
    fail,
    load,
    log_level_value,
    print_json,
    quiet_logging,
    state,
    with_bundled_model,
)

if TYPE_CHECKING:
    from gateway.app import Gateway
    from gateway.config import Config

# The gateway, its channels and its web server are imported by the commands that start them
# (`run`, `chat`): `gatehouse --help` and the store-only commands never load the SDKs.

log = logging.getLogger("gatehouse")

app = typer.Typer(
    help="Gatehouse: a self-hosted chat-bot gateway for one LLM agent.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Commands,
    rich_markup_mode=None,  # help texts as written: "[gateway]" stays, flags show no <bool>
)


@app.callback()
def _main(config: ConfigOption = None, log_level: LogLevelOption = None) -> None:
    # Given again after the command, an option is set again then (`Commands`): after wins.
    state.config_path = config
    state.log_level = log_level_value(log_level) or "INFO"


@app.command()
def init(
    directory: Annotated[Path, typer.Option("--dir", help="Where to write gatehouse.toml")] = Path(),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing gatehouse.toml")] = False,
) -> None:
    """Write a commented gatehouse.toml and create the workspace (AGENTS.md, memory/)."""
    from gateway.config import DEFAULT_CONFIG_NAME, ConfigError, load_config
    from memory.workspace import ensure_workspace

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
    from channels.webchat import WebchatChannel
    from gateway.adapters import add_channel_routes, platform_channels
    from gateway.app import Gateway
    from gateway.cli.pidfiles import pid_file
    from gateway.config import redacted_url
    from gateway.model.llm import NOT_CONFIGURED
    from gateway.web.server import WebServer, build_app

    started_from = await _as_read(config)
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
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, _Reloads(gateway, started_from).request)
    # From here on, `gatehouse reload` finds this process, and `gatehouse doctor` what it saw
    # of its database.
    with pid_file(config.data_dir) as record:
        record.update(storage=gateway.store.health.as_dict())
        gateway.store.watch(lambda health: record.update(storage=health.as_dict()))
        if config.web.enabled:
            web_app = build_app(gateway, webchat)
            add_channel_routes(web_app, platforms)
            server = WebServer(web_app, config.web.host, config.web.port)
            url = await server.start()
            record.update(url=url)
            log.info("web chat on %s/ (POST %s/api/messages)", url, url)
            print(f"gatehouse listening on {url}", flush=True)
        log.info("gateway running (database %s, workspace %s)",
                 redacted_url(config.database_url), config.workspace)
        await stop.wait()
        log.info("shutting down: finishing in-flight turns")
        if server is not None:
            await server.stop()
        await gateway.stop()
    log.info("stopped")


async def _as_read(config: Config) -> Config:
    """The config file as read, before the gateway adjusted anything in it (the bundled
    model's settings): what a reload compares the file with to name keys that need a restart."""
    from gateway.config import ConfigError, load_config

    if config.source is None:
        return config
    try:
        return await asyncio.to_thread(load_config, config.source)
    except ConfigError:
        return config  # changed since the start: the next reload says what


class _Reloads:
    """SIGHUP (or `gatehouse reload`): read the config file again and apply what may change
    while running (history limits, access lists); an invalid file changes nothing and is one
    error line. Reloads run one at a time."""

    def __init__(self, gateway: Gateway, started_from: Config) -> None:
        self.gateway = gateway
        self.started_from = started_from
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    def request(self) -> None:
        task = asyncio.get_running_loop().create_task(self.reload())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def reload(self) -> None:
        from gateway.config import ConfigError, load_config
        from gateway.logging_setup import SECRETS, config_secrets

        path = self.gateway.config.source
        async with self._lock:
            if path is None:
                log.warning("reload: no config file (running on the defaults): nothing to reload")
                return
            try:
                new = await asyncio.to_thread(load_config, path)
            except ConfigError as exc:
                reason = "; ".join(line.strip() for line in str(exc).splitlines())
                log.error("reload refused, the running config is kept: %s", reason)
                return
            SECRETS.protect(config_secrets(new))
            for notice in new.notices:
                if notice not in self.started_from.notices:
                    log.warning(notice)
            plan = self.gateway.reload_config(new, self.started_from)
        for line in plan.changes or ["no change to history limits or access lists"]:
            log.info("reload: %s", line)
        if plan.restart:
            log.warning("reload: changed, needs a restart (the running values are kept): %s",
                        ", ".join(plan.restart))


@app.command()
def run() -> None:
    """Start the gateway: every enabled channel and the web server.

    SIGINT/SIGTERM stop it cleanly (turns in flight finish); SIGHUP (`gatehouse reload`)
    reloads history limits and access lists."""
    from gateway.logging_setup import setup_logging
    from gateway.store.faults import storage_error

    setup_logging(state.log_level)
    config = load()
    try:
        with _alone(config, "run"):
            asyncio.run(with_bundled_model(config, _serve))
    except OSError as exc:
        if storage_error(exc) is not None:
            raise  # a data file: the storage line (`Commands`)
        fail("cannot start", str(exc), 1)


@contextlib.contextmanager
def _alone(config: Config, command: str) -> Iterator[None]:
    """The SQLite run lock for a command that answers messages (`run`, `chat`): a second one
    on the same data directory is refused with one line naming the first's pid."""
    from gateway.cli.pidfiles import AlreadyRunning, run_lock

    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(run_lock(config, command))
        except AlreadyRunning as exc:
            fail("cannot start", str(exc), 1)
        yield


@app.command()
def reload() -> None:
    """Reload history limits and access lists in the running gateway, without a restart.

    Signals (SIGHUP) every `gatehouse run` on this config's data directory (found by its pid
    file in <data_dir>/pids/); each reads its config file again, applies history limits and
    access lists (dm_policy, allow_from, group_allowlist, require_mention), and logs what
    changed and which other changes need a restart. An invalid config is refused here, and
    nothing is signalled; a gateway that reads an invalid one keeps its config."""
    from gateway.cli.pidfiles import pids_dir, running_gateways

    config = load()
    pids = running_gateways(config.data_dir)
    if not pids:
        fail("no running gateway",
             f"no `gatehouse run` on {config.data_dir} (pid files in {pids_dir(config.data_dir)})",
             1)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGHUP)
        except OSError as exc:
            fail("cannot signal", f"pid {pid}: {exc.strerror or exc}", 1)
        console.print(f"reloading gatehouse run (pid {pid}): its log says what changed")


async def _chat(config: Config, user: str | None, message: str | None) -> int:
    from channels.console import ConsoleChannel
    from gateway.app import Gateway
    from gateway.cli.chat_prompt import ChatPrompt
    from gateway.model.llm import NOT_CONFIGURED

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
        prompt = ChatPrompt(console)  # a log line while it waits goes above it (chat_prompt.py)
        while True:
            try:
                line = await prompt.read()
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
    with _alone(config, "chat"):  # it answers what waits in the store too
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
    from gateway.config import redacted_url

    quiet_logging("WARNING")  # a feature turned off for an unset ${VAR} is a warning line
    config = load()
    console.print(f"[green]ok[/green] {config.source or '(defaults: no config file found)'}")
    console.print(f"database:  {redacted_url(config.database_url)}")
    console.print(f"workspace: {config.workspace}")
    llm = redacted_url(config.llm.base_url) if config.llm.base_url else "(not configured)"
    console.print(f"llm:       {llm} model={config.llm.model}")
