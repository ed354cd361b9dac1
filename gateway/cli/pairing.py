"""`gatehouse pairing`: approve or deny people who DM the bot (dm_policy = pairing)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gateway.cli.common import JsonFlag, console, execute, on_store, refuse, show, sub_app

app = sub_app("Approve or deny people who DM the bot (dm_policy = pairing).")


@app.command("list")
def pairing_list(as_json: JsonFlag = False) -> None:
    """Pairing requests: pending (with their codes), approved and denied."""
    rows = execute(on_store(lambda store: store.list_pairings()))
    data = [
        {
            "code": r.code, "platform": r.platform, "sender_id": r.sender_id,
            "sender_name": r.sender_name, "status": r.status,
            "created_at": r.created_at.isoformat(timespec="seconds"),
            "expires_at": r.expires_at.isoformat(timespec="seconds"),
        }
        for r in rows
    ]
    show(data, as_json, _print_pairings, lambda data: data)


def _print_pairings(data: list[dict[str, Any]]) -> None:
    table = Table("code", "platform", "sender", "status", "requested", "expires")
    for d in data:
        table.add_row(d["code"], d["platform"], escape(f"{d['sender_name'] or ''} ({d['sender_id']})"),
                      d["status"], d["created_at"], d["expires_at"])
    console.print(table)


def _decide(code: str, status: str) -> None:
    row = execute(on_store(lambda store: store.decide_pairing(code, status)))
    if row is None:
        refuse(f"no pending, unexpired pairing code {code!r}")
    console.print(f"{status} {row.platform} user {escape(row.sender_name or row.sender_id)}")


@app.command("approve")
def pairing_approve(code: Annotated[str, typer.Argument(help="The 8-character code")]) -> None:
    """Let the sender with this code talk to the agent."""
    _decide(code, "approved")


@app.command("deny")
def pairing_deny(code: Annotated[str, typer.Argument(help="The 8-character code")]) -> None:
    """Refuse the sender with this code."""
    _decide(code, "denied")
