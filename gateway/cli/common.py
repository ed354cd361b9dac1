"""The scaffold every `gatehouse` command stands on: the consoles, the global options, loading
the config, running one async operation on it, printing a result as a table or as JSON, and
turning what went wrong into one line on stderr and an exit code (never a traceback).

Exit codes: 0 done, 1 the thing asked for is not there or did not work, 2 bad input (a config
error, a bad transcript, wrong arguments, a storage fault).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

if TYPE_CHECKING:
    from rich.progress import Progress

    from gateway.config import Config
    from gateway.store import Store

T = TypeVar("T")
# No emoji codes: a session key's ":thread:" would print as 🧵.
console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False)

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output")]
"""The `--json` option of every command that prints a result."""

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config", "-c",
        help="Config file (else $GATEHOUSE_CONFIG, ./gatehouse.toml); before or after the "
        "command, after wins",
    ),
]
LogLevelOption = Annotated[
    str | None,
    typer.Option(
        "--log-level", metavar="LEVEL",
        help="DEBUG, INFO (default), WARNING or ERROR; before or after the command, after wins",
    ),
]
"""The global options: the root command declares them, and `Commands` gives every command and
group a copy, so `gatehouse run --config x.toml` works as `gatehouse --config x.toml run` does."""

Refusal = tuple[type[Exception], str, int]
"""An error an operation may raise on bad input: its type, the label it is printed under, and
the exit code."""


class State:
    """The global options (`--config`, `--log-level`), for the command that runs."""

    config_path: Path | None = None
    log_level: str = "INFO"


state = State()
_GLOBALS = {"config": "config_path", "log_level": "log_level"}
"""Each global option's parameter name, and the `State` field it sets."""


def log_level_value(value: str | None) -> str | None:
    """A --log-level value, upper-cased; a bad one is a usage error (exit 2)."""
    if value is None:
        return None
    if value.upper() not in LOG_LEVELS:
        raise typer.BadParameter(
            f"{value!r} is not one of {', '.join(LOG_LEVELS)}", param_hint="'--log-level'"
        )
    return value.upper()


def _set_global(_ctx: Any, param: Any, value: Any) -> Any:
    """A global option given after a command: it wins over the same option given before it
    (the parser meets it later: the root's callback has run by then)."""
    if param.name == "log_level":
        value = log_level_value(value)
    if value is not None:
        setattr(state, _GLOBALS[param.name], value)
    return value


def fail(label: str, message: str, code: int = 2, *, soft_wrap: bool = True) -> NoReturn:
    """Say what is wrong on stderr under a red label and exit; soft-wrapped, one line stays one
    line (for a message a script may grep)."""
    err_console.print(f"[red]{label}:[/red] {escape(message)}", highlight=False, soft_wrap=soft_wrap)
    raise typer.Exit(code)


def refuse(message: str, code: int = 1) -> NoReturn:
    """Print `message` (rich markup) on stderr and exit."""
    err_console.print(message, highlight=False)
    raise typer.Exit(code)


def no_session(key: str) -> NoReturn:
    refuse(f"no session {key!r} (see `gatehouse sessions list`)")


def found(value: T | None, key: str) -> T:
    """`value`, or the "no session" line and exit 1 when the operation found no session."""
    if value is None:
        no_session(key)
    return value


class Commands(TyperGroup):
    """The root command. Every command, whatever it opens (the database, the job store, the
    memory index, the workspace): a storage fault is one line naming the file and what to do,
    and exit code 2 (gateway/store/faults.py), never a traceback. Every command and group below
    it accepts the global options too (`gatehouse sessions list --config x.toml`)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        globals_ = [p for p in self.params if p.name in _GLOBALS]
        pending = list(self.commands.values())
        while pending:
            command = pending.pop()
            pending.extend(getattr(command, "commands", {}).values())
            if command.help and not command.short_help:
                # A group lists each command with its whole first paragraph, wrapped, as
                # written (the plain formatter would cut it at the terminal's width).
                command.short_help = " ".join(inspect.cleandoc(command.help).split("\n\n")[0].split())
            taken = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
            for param in globals_:
                if taken.intersection(param.opts):
                    continue  # a command's own option of that name wins
                clone = copy.copy(param)
                clone.expose_value = False
                clone.callback = _set_global
                command.params.append(clone)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise  # --help, a usage error, an exit code: what click and typer say themselves
        except Exception as exc:
            # Imported here: `gatehouse --help` never loads the database layer.
            from gateway.store.faults import StorageError, storage_error

            fault = storage_error(exc) if isinstance(exc, StorageError | OSError) else None
            if fault is None:
                raise
            fail("storage error", str(fault))


def sub_app(help_text: str) -> typer.Typer:
    """A command group (`gatehouse sessions ...`): bare, it prints its help. Help texts are
    plain text (`rich_markup_mode=None`, as the root's): "[gateway] timezone" shows as written,
    and a flag shows as `--all`, not `--all <bool>`."""
    return typer.Typer(help=help_text, no_args_is_help=True, rich_markup_mode=None)


def quiet_logging(level: str) -> None:
    """Log at `level` unless --log-level asked for another: a command's output is its result,
    not the INFO lines a running gateway writes."""
    from gateway.logging_setup import setup_logging

    setup_logging(level if state.log_level == "INFO" else state.log_level)


def load() -> Config:
    """The config of --config (else $GATEHOUSE_CONFIG, ./gatehouse.toml); a bad one exits 2.
    A feature turned off for an unset variable is one warning in the log (`Config.notices`)."""
    from gateway.config import ConfigError, load_config
    from gateway.logging_setup import SECRETS, config_secrets

    try:
        config = load_config(state.config_path)
    except ConfigError as exc:
        fail("config error", str(exc))
    SECRETS.protect(config_secrets(config))  # never in a log line, whatever logs it
    for notice in config.notices:  # an optional feature whose ${VAR} is unset: off, said once
        logging.getLogger("gatehouse.config").warning(notice)
    from gateway.model.local_model import bundled_model_path, use_local_model

    if bundled_model_path(config) is not None:
        # Every command sees the model `gatehouse run` answers with (its window, its token
        # limits); the commands that call the model start it (`with_bundled_model`).
        use_local_model(config)
    return config


async def with_bundled_model(config: Config, main: Callable[[Config], Awaitable[T]]) -> T:
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


def execute(
    op: Callable[[Config], Coroutine[Any, Any, T]],
    *,
    quiet: str | None = None,
    config: Config | None = None,
    bundled_model: bool = False,
    session: str | None = None,
    refusals: Iterable[Refusal] = (),
) -> T:
    """Run one operation the way every command does: logging at `quiet` (when given), the
    config loaded (unless given), `op` on it in an event loop (with the bundled model for a
    command that calls the model). A KeyError for `session` is the "no session" line and exit
    1; an error among `refusals` is its labelled line and exit code."""
    if quiet is not None:
        quiet_logging(quiet)
    if config is None:
        config = load()
    refusals = tuple(refusals)
    try:
        if bundled_model:
            return asyncio.run(with_bundled_model(config, op))
        return asyncio.run(op(config))
    except KeyError:
        if session is None:
            raise
        no_session(session)
    except Exception as exc:
        for kind, label, code in refusals:
            if isinstance(exc, kind):
                fail(label, str(exc), code, soft_wrap=False)
        raise


def on_store(
    use: Callable[[Store], Awaitable[T]],
) -> Callable[[Config], Coroutine[Any, Any, T]]:
    """An operation on the database alone (no gateway): open the store, `use` it, close it."""

    async def op(config: Config) -> T:
        from gateway.store import Store

        store = Store(config.database_url)
        try:
            await store.init()
            return await use(store)
        finally:
            await store.close()

    return op


def print_json(data: Any, default: Callable[[Any], Any] | None = None) -> None:
    """`data` as indented JSON on stdout, non-ASCII text as itself."""
    print(json.dumps(data, indent=2, ensure_ascii=False, default=default))


def show(result: T, as_json: bool, render: Callable[[T], None],
         to_json: Callable[[T], Any]) -> None:
    """Print a result: its JSON form with --json, else `render` it for a person."""
    if as_json:
        print_json(to_json(result))
    else:
        render(result)


def progress() -> Progress:
    """A progress bar on stderr (stdout stays clean for --json), gone when done."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err_console, transient=True,
    )


def plural(count: int) -> str:
    """"reply" or "replies"."""
    return f"repl{'y' if count == 1 else 'ies'}"
