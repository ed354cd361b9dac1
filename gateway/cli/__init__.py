"""The `gatehouse` command line (typer + rich): the root command and its own commands in
`root`, one module per command group, and the scaffold they all stand on in `common`."""

from __future__ import annotations

import sys

from gateway.cli import context, db, jobs, memory, outbox, pairing, sessions
from gateway.cli.root import app

# The order `gatehouse --help` lists the groups in.
app.add_typer(sessions.app, name="sessions")
app.add_typer(context.app, name="context")
app.add_typer(pairing.app, name="pairing")
app.add_typer(memory.app, name="memory")
app.add_typer(db.app, name="db")
app.add_typer(jobs.app, name="jobs")
app.add_typer(outbox.app, name="outbox")


def main() -> None:
    """The console script: Ctrl-C is exit code 130, not a traceback."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


__all__ = ["app", "main"]
