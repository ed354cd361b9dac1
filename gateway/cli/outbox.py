"""`gatehouse outbox`: replies stored but not yet delivered to their platform."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gateway.cli.common import (
    JsonFlag,
    console,
    execute,
    load,
    on_store,
    plural,
    refuse,
    show,
    sub_app,
)

app = sub_app("Replies stored but not yet delivered to their platform.")

NOT_IN_OUTBOX = "some ids are not in the outbox (see `gatehouse outbox list`)"


@app.command("list")
def outbox_list(as_json: JsonFlag = False) -> None:
    """Replies waiting to be sent (or given up after `[gateway] delivery_attempts` tries)."""
    from gateway.turn.outbox import logged_sent

    config = load()
    rows = execute(on_store(lambda store: store.outbox()), config=config)
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
    show(data, as_json, _print_outbox, lambda data: data)


def _print_outbox(data: list[dict[str, Any]]) -> None:
    if not data:
        console.print("the outbox is empty: every stored reply reached its platform")
        return
    table = Table("id", "state", "tries", "session", "last error", "reply")
    for d in data:
        table.add_row(str(d["id"]), d["state"], str(d["attempts"]), escape(d["session"]),
                      escape(d["last_error"] or "-"), escape(d["text"][:60]))
    console.print(table)


@app.command("retry")
def outbox_retry(
    ids: Annotated[list[int] | None, typer.Argument(help="Outbox ids (see `outbox list`)")] = None,
    every: Annotated[bool, typer.Option("--all", help="Every given-up reply")] = False,
) -> None:
    """Give replies their tries back: a running gateway sends them within its sweep
    ([gateway] pending_sweep_seconds), a stopped one when it next starts."""
    if bool(ids) == every:
        refuse("name outbox ids or --all (not both)", 2)
    config = load()
    changed = execute(
        on_store(lambda store: store.retry_outbox(None if every else ids)), config=config
    )
    console.print(
        f"{changed} {plural(changed)} will be sent again: by a running gateway "
        f"within {config.gateway.pending_sweep_seconds:g} s, else when it next starts"
    )
    if not every and ids is not None and changed < len(ids):
        refuse(NOT_IN_OUTBOX)


@app.command("drop")
def outbox_drop(
    ids: Annotated[list[int], typer.Argument(help="Outbox ids (see `outbox list`)")],
) -> None:
    """Stop trying to send these replies; they stay in their conversation."""
    dropped = execute(on_store(lambda store: store.forget_outbox(ids)))
    console.print(f"dropped {dropped} {plural(dropped)}")
    if dropped < len(ids):
        refuse(NOT_IN_OUTBOX)
