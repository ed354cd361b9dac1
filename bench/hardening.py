"""Hardening: every attack in `tests/security/attacks.py` against a real gateway web server.

Starts what `gatehouse run` serves over HTTP -- webchat page and API, the admin UI (anonymous
access and a token), Slack in HTTP mode, the Telegram webhook, `/metrics`, `/healthz` -- on
127.0.0.1 at a free port, against fake LLM, Slack and Telegram servers, and sends the attack list
once (a fixed, bounded number of requests, one at a time): malformed and deep JSON, wrong content
types, oversized bodies, forged origins, foreign Host headers (DNS rebinding), unsigned
webhooks, a login brute force. Per endpoint it counts the 4xx answers, the 5xx answers (goal 0),
answers that were no refusal at all (goal 0), tracebacks in the log (goal 0) and refusals that did
not leave exactly one log line (goal 0). Then two users post at the same moment with the same
``message_id``, PAIRS times, and each must get the reply to their own message: replies delivered
to the other user's session are counted (goal 0).

Then the trust boundaries (`tests/security/trust.py`): the people who share one agent trying to
read, search or steer what belongs to another through every memory, file and scheduling tool
and argument, from another conversation and from a group, a stranger's flood, pairing
exhaustion, and the Slack token's destinations; per kind: refused, leaked (one of the victim's
secrets in the answer, goal 0), lost (the attacker's own note not written, goal 0). And the
oversized download: a 300 MB Telegram file whose size is given as 100 bytes, through the real
SDK against the fake Bot API; the process's resident memory over it (goal: the cap plus a few
MB). Exit code 1 when a goal is missed.

    .venv/bin/python bench/hardening.py [--quick] [--pairs N] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.security.attacks import (
    Outcome,
    attack_list,
    capture_logs,
    run_attacks,
    serve_target,
    wrong_session_replies,
)
from tests.security.trust import TrustOutcome, run_trust

SAME_ID_ROW = "POST /api/messages, 2 users, same message_id at once"


def endpoint_rows(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for o in outcomes:
        row = rows.setdefault(o.attack.endpoint, {
            "endpoint": o.attack.endpoint, "tried": 0, "4xx": 0, "5xx": 0, "other": 0,
            "tracebacks": 0, "log_lines_off": 0, "wrong_session": None, "failures": [],
        })
        row["tried"] += 1
        row["tracebacks"] += o.tracebacks
        if o.refused:
            row["4xx"] += 1
            if len(o.lines) != 1:
                row["log_lines_off"] += 1
                row["failures"].append(f"{o.attack.name}: {len(o.lines)} log lines")
        elif o.server_error:
            row["5xx"] += 1
            row["failures"].append(f"{o.attack.name}: {o.status}")
        else:
            row["other"] += 1
            row["failures"].append(f"{o.attack.name}: {o.status or o.error}")
        if o.tracebacks:
            row["failures"].append(f"{o.attack.name}: traceback in the log")
    return list(rows.values())


async def measure(pairs: int) -> dict[str, Any]:
    attacks = attack_list()
    with tempfile.TemporaryDirectory(prefix="gatehouse-hardening-") as data:
        async with serve_target(Path(data), reply_timeout=10.0) as target:
            with capture_logs() as logs:
                began = time.perf_counter()
                outcomes = await run_attacks(target.url, attacks, logs)
                attack_seconds = time.perf_counter() - began
                before = len(logs.records)
                same_id = await wrong_session_replies(target.url, pairs)
                probe_records = logs.records[before:]
            stored = await target.gateway.store.message_count()
    rows = endpoint_rows(outcomes)
    statuses = same_id.statuses
    rows.append({
        "endpoint": SAME_ID_ROW,
        "tried": 2 * pairs,
        "4xx": sum(n for s, n in statuses.items() if 400 <= s < 500),
        "5xx": sum(n for s, n in statuses.items() if s >= 500),
        "other": 0,
        "tracebacks": sum(r.exc_info is not None for r in probe_records),
        "log_lines_off": 0,
        "wrong_session": same_id.wrong,
        "answered": same_id.answered,
        "unanswered": same_id.unanswered,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "failures": [],
    })
    with tempfile.TemporaryDirectory(prefix="gatehouse-trust-") as data:
        began = time.perf_counter()
        trust = await run_trust(Path(data))
        trust_seconds = time.perf_counter() - began
    with tempfile.TemporaryDirectory(prefix="gatehouse-download-") as data:
        download = await oversized_download(Path(data))
    return {
        "attacks": len(attacks),
        "attack_seconds": round(attack_seconds, 2),
        "pairs": pairs,
        "messages_stored": stored,
        "rows": rows,
        "trust": trust_rows(trust),
        "trust_seconds": round(trust_seconds, 2),
        "download": download,
    }


def trust_rows(outcomes: list[TrustOutcome]) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for o in outcomes:
        row = rows.setdefault(o.attack.kind, {
            "kind": o.attack.kind, "tried": 0, "refused": 0, "leaked": 0, "lost": 0,
            "through": 0, "failures": [],
        })
        row["tried"] += 1
        row["refused"] += o.refused
        row["leaked"] += bool(o.leaked)
        row["lost"] += o.lost
        if not o.ok:
            row["through"] += not (o.leaked or o.lost)
            row["failures"].append(f"{o.attack.name}: {o.answer[:120]}")
    return list(rows.values())


async def oversized_download(data: Path) -> dict[str, Any]:
    """A 300 MB Telegram document given as 100 bytes, cap 4 MiB: refused, memory bounded."""
    from channels.telegram import TelegramChannel
    from gateway.app import Gateway
    from gateway.config import parse_config
    from tests.fakes import FakeOpenAI
    from tests.fakes.file_bodies import BigBody
    from tests.fakes.telegram_server import FakeTelegram
    from tests.helpers.memory import MiB, PeakRss

    cap, huge, user = 4 * MiB, 300 * MiB, 7
    async with FakeOpenAI() as fake, FakeTelegram() as tg:
        config = parse_config({
            "gateway": {"data_dir": str(data)}, "web": {"port": 0},
            "llm": {"base_url": fake.base_url, "api_key": "x", "model": "fake-model"},
            "memory": {"embeddings": False}, "attachments": {"max_bytes": cap},
            "channels": {"telegram": {"enabled": True, "token": tg.token,
                                      "base_url": tg.base_url, "dm_policy": "open"}},
        }, "bench")
        gateway = Gateway(config)
        gateway.add_channel(TelegramChannel(config.channels.telegram))
        await gateway.start()
        try:
            body = BigBody(huge)
            doc = tg.add_file(suffix=".bin", reported_size=100, served=body)
            with PeakRss() as rss:
                tg.private_message(user, None, document={**doc, "file_name": "dump.bin"})
                [answer] = await tg.wait_for_call("sendMessage")
        finally:
            await gateway.stop()
    return {
        "declared_bytes": 100, "body_bytes": huge, "cap_bytes": cap,
        "rss_growth_mib": round(rss.growth / MiB, 1), "read_mib": round(body.written / MiB, 1),
        "refused": "larger than" in answer["text"], "answer": answer["text"],
    }


def goals_missed(result: dict[str, Any]) -> list[str]:
    missed: list[str] = []
    for row in result.get("trust", []):
        for key in ("leaked", "lost", "through"):
            if row[key]:
                missed.append(f"trust {row['kind']}: {key} = {row[key]}")
    download = result.get("download")
    if download is not None and (
        not download["refused"] or download["rss_growth_mib"] > download["cap_bytes"] / 2**20 + 16
    ):
        missed.append(f"oversized download: {download['rss_growth_mib']} MiB, {download['answer']}")
    for row in result["rows"]:
        for key in ("5xx", "other", "tracebacks", "log_lines_off"):
            if row[key]:
                missed.append(f"{row['endpoint']}: {key} = {row[key]}")
        if row["wrong_session"]:
            missed.append(f"{row['endpoint']}: {row['wrong_session']} replies to the wrong session")
        if row.get("unanswered"):
            missed.append(f"{row['endpoint']}: {row['unanswered']} requests without their reply")
    return missed


def print_table(result: dict[str, Any]) -> None:
    table = Table(title=(
        f"hardening: {result['attacks']} attacks against every endpoint "
        f"({result['attack_seconds']} s), then {result['pairs']} pairs with the same message_id"
    ))
    for col in ("endpoint", "attacks tried", "4xx answers", "5xx answers (goal 0)",
                "not refused (goal 0)", "tracebacks in the log (goal 0)",
                "log lines ≠ 1 (goal 0)", "replies to the wrong session (goal 0)"):
        table.add_column(col, justify="left" if col == "endpoint" else "right")
    for row in result["rows"]:
        wrong = row["wrong_session"]
        table.add_row(
            row["endpoint"], str(row["tried"]), str(row["4xx"]), str(row["5xx"]),
            str(row["other"]), str(row["tracebacks"]), str(row["log_lines_off"]),
            "—" if wrong is None else str(wrong),
        )
    console = Console()
    console.print(table)
    same = result["rows"][-1]
    console.print(
        f"same message_id: {same['answered']} of {same['tried']} requests got their own reply, "
        f"{same['wrong_session']} got the other user's, {same['unanswered']} none "
        f"(statuses {same['statuses']}); messages stored by the attacks and the probe: "
        f"{result['messages_stored']}"
    )
    for row in result["rows"]:
        for failure in row["failures"]:
            console.print(f"[red]{row['endpoint']}: {failure}[/red]")
    trust = Table(title=(
        f"trust boundaries: {sum(r['tried'] for r in result['trust'])} attempts by one person "
        f"on what is another's ({result['trust_seconds']} s)"
    ))
    for col in ("kind", "tried", "refused", "leaked (goal 0)", "lost (goal 0)",
                "got through (goal 0)"):
        trust.add_column(col, justify="left" if col == "kind" else "right")
    for row in result["trust"]:
        trust.add_row(row["kind"], str(row["tried"]), str(row["refused"]), str(row["leaked"]),
                      str(row["lost"]), str(row["through"]))
    console.print(trust)
    for row in result["trust"]:
        for failure in row["failures"]:
            console.print(f"[red]trust {row['kind']}: {failure}[/red]")
    d = result["download"]
    console.print(
        f"oversized download: a {d['body_bytes'] / 2**20:.0f} MB Telegram file given as "
        f"{d['declared_bytes']} bytes, cap {d['cap_bytes'] / 2**20:.0f} MiB: "
        f"{'refused' if d['refused'] else 'NOT refused'}, {d['read_mib']} MiB read, resident "
        f"memory +{d['rss_growth_mib']} MiB (goal: the cap + 16 MiB)"
    )


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pairs", type=int, default=20,
                        help="pairs of users posting with the same message_id at once")
    parser.add_argument("--quick", action="store_true", help="5 pairs (the attacks are the same)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.quick:
        args.pairs = 5
    result = await measure(args.pairs)
    result["goals_missed"] = goals_missed(result)
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 1 if result["goals_missed"] else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
