"""Run every benchmark under bench/ and write one report: bench/REPORT.md (one Markdown table,
charts beside it), bench/report.json (every script's own JSON) and bench/charts/*.png.

Side by side with the peers and floors people would otherwise use: context assembly against
langchain_core's ``trim_messages``, compaction against langchain's ``SummarizationMiddleware``
(same transcript, same fake model), compaction wall time against the summarizer latency L, the
gateway against the bare SDKs (openai, python-telegram-bot, slack-bolt, discord.py); plus
memory search, kill -9 crash safety and load. Each script runs as a subprocess with
``--json``, so nothing is scraped from printed tables.

    .venv/bin/python bench/report.py            # every script in its quick size (a few minutes)
    .venv/bin/python bench/report.py --full     # the sizes the README quotes (much longer)
    .venv/bin/python bench/report.py --only load --full   # rerun one, keep the others' results

The peers come with the ``bench`` extra: ``.venv/bin/pip install -e '.[bench]'``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import paired_ratio

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
REPORT_MD = BENCH / "REPORT.md"
REPORT_JSON = BENCH / "report.json"
CHARTS = BENCH / "charts"


@dataclass(frozen=True)
class Script:
    name: str
    quick: tuple[str, ...] = ("--quick",)
    full: tuple[str, ...] = ()
    timeout: float = 3_600.0

    @property
    def path(self) -> Path:
        return BENCH / f"{self.name}.py"


SCRIPTS = (
    Script("context_assembly"),
    Script("compaction"),
    Script("tool_loop"),
    Script("prompt_cache"),
    Script("pipeline"),
    Script("channels"),
    # Under valgrind (~20x slower): even the quick sizes take a few minutes.
    Script("instructions", full=("--cache",)),
    Script("memory_search"),
    Script("crash"),
    Script("load", timeout=7_200.0),
    Script("scale"),
    Script("hardening", timeout=600.0),
)
NOT_RUN_DIRECTLY = {
    "__init__.py": "the package marker",
    "common.py": "helpers shared by the scripts",
    "report.py": "this script",
    "channel_telegram.py": "run by channels.py",
    "channel_slack.py": "run by channels.py",
    "channel_discord.py": "run by channels.py",
}


def unlisted_scripts() -> list[str]:
    """bench/*.py that neither run here nor are known helpers: a new script must be added."""
    known = {s.path.name for s in SCRIPTS} | set(NOT_RUN_DIRECTLY)
    return sorted(p.name for p in BENCH.glob("*.py") if p.name not in known)


def run_script(script: Script, full: bool) -> dict[str, Any]:
    args = list(script.full if full else script.quick)
    with tempfile.TemporaryDirectory(prefix="gatehouse-report-") as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, str(script.path), *args, "--json", str(out)]
        print(f"→ {script.name}: {' '.join(command[1:])}", flush=True)
        began = time.perf_counter()
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=script.timeout,
            env={**os.environ, "COLUMNS": "120"},
        )
        seconds = time.perf_counter() - began
        result = json.loads(out.read_text()) if out.exists() else None
    print(done.stdout[-4_000:], flush=True)
    if done.returncode != 0:
        print(done.stderr[-4_000:], file=sys.stderr, flush=True)
    return {
        "mode": "full" if full else "quick",
        "args": args,
        "exit_code": done.returncode,
        "seconds": round(seconds, 1),
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "result": result,
    }


# -- the table ----------------------------------------------------------------------------------

Row = tuple[str, str, str, str, str, str]
"""benchmark, measure, gatehouse, peer or floor, which peer, gatehouse vs peer."""


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.2f} ms" if value < 100 else f"{value:,.0f} ms"


def _times(gatehouse: float | None, peer: float | None, lower_is_better: bool = True) -> str:
    if not gatehouse or not peer:
        return ""
    ratio = peer / gatehouse if lower_is_better else gatehouse / peer
    return f"{ratio:,.1f}× faster" if ratio >= 1 else f"{1 / ratio:,.1f}× slower"


def rows_context_assembly(r: dict[str, Any]) -> list[Row]:
    gh, lc = r["gatehouse"], r.get("langchain")
    name = f"Context assembly, {r['config']['messages']:,}-message session"
    peer = "langchain_core `trim_messages`" if lc else "langchain-core not installed"
    return [
        (name, f"per-turn {q}", _ms(gh[f"{q}_ms"]), _ms(lc[f"{q}_ms"]) if lc else "—", peer,
         _times(gh[f"{q}_ms"], lc[f"{q}_ms"]) if lc else "")
        for q in ("p50", "p99")
    ]


def rows_compaction(r: dict[str, Any]) -> list[Row]:
    rows = rows_compaction_timing(r) if "engines" in r else []
    if r.get("promise"):
        rows += rows_compaction_promise(r["promise"])
    return rows


def rows_compaction_promise(p: dict[str, Any]) -> list[Row]:
    """Per window: fits and recall of gatehouse (through the gateway, five summarizers) against
    SummarizationMiddleware and the "drop old tool output" baseline on the same transcript."""
    tr = p["transcript"]
    rows: list[Row] = []
    lc_name = "langchain `SummarizationMiddleware` (defaults), no lookup tool"
    base_name = "baseline: drop tool results but the last 3, keep all text"
    for window in dict.fromkeys(c["window"] for c in p["cases"]):
        name = (
            f"Compaction promise, {tr['tokens']:,}-token ops transcript, "
            f"{window // 1000}k window"
        )
        gh = {c["kind"]: c for c in p["cases"] if c["window"] == window}
        lc = {x["kind"]: x for x in p["peers"] if x["window"] == window and x["engine"].startswith("langchain")}
        base = next(
            (x for x in p["peers"] if x["window"] == window and not x["engine"].startswith("langchain")), None
        )

        def fits(group: dict[str, dict[str, Any]]) -> str:
            if not group:
                return "—"
            bad = [
                k + (" (turn fails)" if x.get("tokens_after") is None else "")
                for k, x in group.items() if not x["fits"]
            ]
            return f"{len(group) - len(bad)}/{len(group)}" + (
                f"; not: {', '.join(bad)}" if bad else ""
            )

        rows.append((
            name, f"next prompt fits, per summarizer ({'/'.join(gh)}); goal all",
            fits(gh), fits(lc), lc_name, "",
        ))
        worst = max(gh.values(), key=lambda x: len(x["ids_lost"]))
        worst_lc = max(lc.values(), key=lambda x: len(x["ids_lost"])) if lc else None
        lookup = max(x["ids_by_lookup"] for x in gh.values())
        rows.append((
            name, "planted identifiers lost, worst summarizer; goal 0",
            f"{len(worst['ids_lost'])} of {worst['ids_total']} "
            f"({worst['kind'] if worst['ids_lost'] else 'any summarizer'}; up to {lookup} found "
            "only by history_search)",
            "—" if worst_lc is None
            else f"{len(worst_lc['ids_lost'])} of {worst_lc['ids_total']} ({worst_lc['kind']})",
            lc_name, "",
        ))
        for kind in ("good", "lossy"):
            if kind not in gh:
                continue
            g, other = gh[kind], lc.get(kind)
            rows.append((
                name, f"recall exam ({tr['exam']} questions), {kind} summarizer"
                + ("; goal ≥ 95 %" if window == 32_000 else ""),
                f"{g['recall']:.0%} ({g['recall_in_prompt']:.0%} in prompt + "
                f"{g['recall_by_lookup']:.0%} by lookup)",
                "—" if other is None else f"{other['recall']:.0%}",
                lc_name,
                "" if other is None else f"{(g['recall'] - other['recall']) * 100:+.0f} points",
            ))
        failed = [k for k in ("empty", "failing", "hanging") if k in gh]
        if failed:
            rows.append((
                name, f"recall exam, {'/'.join(failed)} summarizer",
                " / ".join(f"{gh[k]['recall']:.0%}" for k in failed),
                " / ".join(
                    (f"{lc[k]['recall']:.0%}" if lc[k]["tokens_after"] is not None else "turn fails")
                    if k in lc else "—"
                    for k in failed
                ),
                lc_name, "",
            ))
        if base is not None:
            g = gh.get("good") or next(iter(gh.values()))
            rows.append((
                name, "tokens in the next prompt ÷ usable, recall (good summarizer)",
                f"{g['tokens_after'] / g['usable']:.2f}, {g['recall']:.0%}",
                f"{base['tokens_after'] / base['usable']:.2f}, {base['recall']:.0%}"
                + ("" if base["fits"] else " (does not fit)"),
                base_name,
                f"{(g['recall'] - base['recall']) * 100:+.0f} points",
            ))
    return rows


def rows_tool_loop(r: dict[str, Any]) -> list[Row]:
    """One ask then 50-500 tool rounds: what is lost per engine over every case (import +
    compact), and the live 300-round turn."""
    cases = r["cases"]
    name = "Tool loop: one ask, 50-500 rounds, 16k-128k"
    rows: list[Row] = []

    def totals(engine: str) -> dict[str, Any] | None:
        group = [c for c in cases if c["engine"] == engine and c["path"] == "import + compact"]
        if not group:
            return None
        return {
            "n": len(group),
            "fits": sum(c["fits"] for c in group),
            "ask": sum(c["ask"] for c in group),
            "ids": sum(c["identifiers"]["lost"] for c in group),
            "ids_total": sum(c["identifiers_total"] for c in group),
            "fails": sum(c["failures"]["lost"] for c in group),
            "fails_total": sum(c["failures_total"] for c in group),
        }

    ours = totals("gatehouse")
    if ours is None:
        return rows
    for engine, label in (
        ("langchain SummarizationMiddleware", "langchain `SummarizationMiddleware` (defaults)"),
        ("drop the oldest rounds", "drop the oldest rounds (ask kept)"),
    ):
        peer = totals(engine)
        if peer is None:
            continue
        rows += [
            (name, "identifiers lost (prompt or one lookup); goal 0",
             f"{ours['ids']} of {ours['ids_total']:,}",
             f"{peer['ids']:,} of {peer['ids_total']:,}", label, ""),
            (name, "tool failures lost (command and exit code); goal 0",
             f"{ours['fails']} of {ours['fails_total']:,}",
             f"{peer['fails']:,} of {peer['fails_total']:,}", label, ""),
            (name, "next prompt fits / keeps the ask verbatim; goal all",
             f"{ours['fits']}/{ours['n']} / {ours['ask']}/{ours['n']}",
             f"{peer['fits']}/{peer['n']} / {peer['ask']}/{peer['n']}", label, ""),
        ]
    live = [c for c in cases if c["path"] == "live"]
    for window in dict.fromkeys(c["window"] for c in live):
        group = [c for c in live if c["window"] == window]
        ok = [c for c in group if c["fits"] and c["ask"] and c["finished"]]
        lost = sum(c["identifiers"]["lost"] + c["failures"]["lost"] for c in group)
        rows.append((
            f"Tool loop, live {group[0]['rounds']}-round turn, {window // 1000}k",
            f"every prompt fits with the ask, turn finished ({'/'.join(c['kind'] for c in group)} "
            "summarizer); compactions, s a compaction, identifiers + failures lost",
            f"{len(ok)}/{len(group)}; {max(c['compactions'] for c in group)} compactions, "
            f"{max(c['seconds_per_compaction'] for c in group):.2f} s; {lost} lost",
            "", "", "",
        ))
    return rows


def rows_compaction_timing(r: dict[str, Any]) -> list[Row]:
    engines = r["engines"]
    gh = engines["gatehouse"]
    lc = engines.get("langchain SummarizationMiddleware")
    peer = "langchain `SummarizationMiddleware` (defaults)" if lc else "langchain not installed"
    name = f"Compaction, {r['turns']}-turn transcript, L = {r['latency']:g} s"

    def pct(v: float) -> str:
        return f"{v:.0%}"

    measures: list[tuple[str, str, Callable[[Any], str], bool | None]] = [
        ("wall time", "wall_s", lambda v: f"{v:.2f} s", True),
        ("model calls", "calls", str, None),
        ("tokens after (summary + kept)", "tokens_after", lambda v: f"{v:,}", None),
        ("compression (after / before)", "compression_ratio", lambda v: f"{v:.3f}", None),
        ("planted identifiers kept", "identifiers_kept", pct, False),
        ("planted decisions kept", "decisions_kept", pct, False),
        ("planted TODOs kept", "todos_kept", pct, False),
        ("latest ask kept verbatim", "latest_ask_verbatim", lambda v: "yes" if v else "no", None),
    ]
    rows: list[Row] = []
    for title, key, fmt, lower in measures:
        compare = ""
        if lc is not None and lower is not None:
            compare = (
                _times(gh[key], lc[key]) if lower
                else f"{(gh[key] - lc[key]) * 100:+.0f} points"
            )
        rows.append((name, title, fmt(gh[key]), fmt(lc[key]) if lc else "—", peer, compare))
    for point in r["sweep"]:
        lc_s = point.get("langchain_s")
        rows.append((
            "Compaction wall time against L", f"L = {point['L']:g} s",
            f"{point['gatehouse_s']:.2f} s ({point['gatehouse_s'] / point['L']:.1f} L)",
            "—" if lc_s is None else f"{lc_s:.2f} s",
            f"{peer}; one at a time: {point['sequential_s']:.2f} s", "",
        ))
    return rows


def rows_pipeline(r: dict[str, Any]) -> list[Row]:
    floor, gh = r["rows"]
    name = f"Webchat pipeline, {gh['messages']:,} messages"
    peer = "bare openai SDK, same fake model (floor)"
    return [
        (name, "messages/s", f"{gh['msgs_per_s']:,.0f}", f"{floor['msgs_per_s']:,.0f}", peer,
         f"{gh['msgs_per_s'] / floor['msgs_per_s']:.2f}× the floor"),
        (name, "latency p50", _ms(gh["p50_ms"]), _ms(floor["p50_ms"]), peer,
         f"+{gh['p50_ms'] - floor['p50_ms']:,.1f} ms"),
        (name, "latency p99", _ms(gh["p99_ms"]), _ms(floor["p99_ms"]), peer,
         f"+{gh['p99_ms'] - floor['p99_ms']:,.1f} ms"),
    ]


def rows_channels(r: list[dict[str, Any]]) -> list[Row]:
    rows: list[Row] = []
    groups = dict.fromkeys((row["platform"], row.get("concurrency")) for row in r)
    for platform_name, concurrency in groups:
        same = [
            x for x in r
            if x["platform"] == platform_name and x.get("concurrency") == concurrency
        ]
        gh = next(x for x in same if x["path"] == "gatehouse")
        floors = [x for x in same if x["path"] != "gatehouse"]
        at_a_time = f", {concurrency} at a time" if concurrency is not None else ""
        name = f"{platform_name.capitalize()} end to end, {gh['messages']} messages{at_a_time}"
        for floor in floors:  # the echo bot, then the same bot asking the model first
            for q in ("p50", "p99"):
                rows.append((
                    name, f"latency {q}", _ms(gh[f"{q}_ms"]), _ms(floor[f"{q}_ms"]),
                    floor["path"], f"{paired_ratio(gh, floor, f'{q}_ms'):.1f}× the floor",
                ))
    return rows


def rows_instructions(r: list[dict[str, Any]]) -> list[Row]:
    rows: list[Row] = []
    for gh in (x for x in r if x["path"] == "gatehouse"):
        bare = next(x for x in r if x["platform"] == gh["platform"] and x["path"] != "gatehouse")
        name = f"{gh['platform'].capitalize()}, CPU instructions per message (valgrind)"
        for key, measure in (("instructions", "instructions"), ("d1_misses", "L1 data misses"),
                             ("i1_misses", "L1 instruction misses"),
                             ("l2_misses", "L2 misses (simulated, per-core size)"),
                             ("mispredicts", "mispredicted branches")):
            if key in gh and key in bare:
                rows.append((
                    name, f"{measure}, 20 at a time", f"{gh[key]:,.0f}", f"{bare[key]:,.0f}",
                    bare["path"], f"×{gh[key] / bare[key]:.2f}",
                ))
    return rows


def rows_memory_search(r: dict[str, Any]) -> list[Row]:
    overall = next(q for q in r["queries"] if q["kind"] == "overall")
    name = f"memory_search, {r['notes']:,} notes"
    rows: list[Row] = [
        (name, "query p50", _ms(overall["p50_ms"]), "—", "goal", ""),
        (name, "query p99", _ms(overall["p99_ms"]), f"< {r['goal_p99_ms']:g} ms", "goal",
         "met" if overall["p99_ms"] < r["goal_p99_ms"] else "missed"),
    ]
    if "recall" not in r:  # a result from before the recall section
        return rows
    modes = {m["mode"]: m for m in r["modes"]}
    hybrid, cost = modes["hybrid"], r["vector_cost"]
    encoder = r["encoder"]["name"].split("/")[0] + (
        "" if r["encoder"]["real"] else " (STAND-IN, no meaning)"
    )
    rows += [
        (name, "hybrid query p50 / p99 (query embedding included)",
         f"{_ms(hybrid['p50_ms'])} / {_ms(hybrid['p99_ms'])}", f"< {r['goal_hybrid_p99_ms']:g} ms",
         "goal (p99)", "met" if hybrid["p99_ms"] < r["goal_hybrid_p99_ms"] else "missed"),
        (name, "index build with vectors; embedding throughput",
         f"{cost['build_with_vectors_s']:,.1f} s; {cost['embed_texts_per_s']:,.0f} texts/s",
         f"{cost['build_fts_only_s']:,.2f} s", "FTS only", ""),
    ]
    recall = r["recall"]
    at, mrr_at = recall["recall_at"], recall["mrr_at"]
    name = f"memory_search recall, {recall['questions']} questions, {recall['notes']} notes, {encoder}"
    for row in (x for x in recall["rows"] if not x["subset"] and x["kind"] != "all"):
        def pair(mode: str, row: dict[str, Any] = row) -> str:
            return f"{row[f'recall@{at}_{mode}']:.2f} / {row[f'mrr@{mrr_at}_{mode}']:.2f}"
        gain = row[f"recall@{at}_hybrid"] - row[f"recall@{at}_bm25"]
        rows.append((
            name, f"{row['kind']} ({row['questions']}): hybrid recall@{at} / MRR@{mrr_at}",
            pair("hybrid"), pair("bm25"), f"BM25 alone (vector alone: {pair('vector')})",
            f"{gain * 100:+.0f} points",
        ))
    for goal in r["goals"][2:]:  # the recall goals (the first two are latency, above)
        verdict = {True: "met", False: "missed", None: "n/a"}[goal["met"]]
        rows.append((name, goal["goal"], goal["value"], "", "goal", verdict))
    return rows


def rows_crash(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for t in r["rows"]:
        name = f"kill -9 mid-burst, {t['messages']:,} messages / {t['sessions']} sessions"
        for title, key, goal in (
            ("stored exactly once", "stored_exactly_once", f"{t['messages']:,}"),
            ("answered exactly once", "answered_exactly_once", f"{t['messages']:,}"),
            ("lost", "lost", "0"),
            ("answered twice (in doubt at the kill)", "duplicated", f"≤ {t['replies_in_doubt']}"),
        ):
            rows.append((name, title, f"{t[key]:,}", goal, "goal", ""))
    return rows


def rows_load(r: dict[str, Any]) -> list[Row]:
    x = r["row"]
    in_flight = x.get("in_flight", 2 * x["sessions"])  # two messages in a row per session
    name = f"Load, {x['sessions']:,} Telegram sessions × {x['messages'] // x['sessions']} messages"
    return [
        (name, "lost / order violations", f"{x['lost']} / {x['order_violations']}", "0 / 0",
         "goal", ""),
        (name, "messages/s", f"{x['msgs_per_s']:,}", "—", "", ""),
        (name, "latency p50 / p99", f"{_ms(x['p50_ms'])} / {_ms(x['p99_ms'])}",
         f"{_ms(in_flight / x['msgs_per_s'] * 1000)}",
         f"queueing alone: {in_flight:,} messages in flight ÷ messages/s", ""),
        (name, "gateway peak RSS", f"{x['peak_rss_mb']} MiB", "—", "", ""),
    ]


def rows_prompt_cache(r: dict[str, Any]) -> list[Row]:
    """Per window: prefix breaks per compaction cycle, cached share of the chat calls' input,
    and the input cost at a 90 % cached-input discount, against today's code and trim_messages."""
    out: list[Row] = []
    for window in r["windows"]:
        rows = {x["variant"]: x for x in r["rows"] if x["window"] == window}
        gh = rows.get("compact")
        if gh is None:
            continue
        name = f"Prompt cache, {r['turns']}-turn chat at {window // 1024}k"
        for peer_name, peer in (("today's code", rows.get("today")),
                                ("langchain_core `trim_messages`", rows.get("trim"))):
            if peer is None:
                continue
            peer_breaks = (
                f"{peer['breaks_per_cycle']:.2f}" if peer["breaks_per_cycle"] is not None
                else f"{peer['prefix_breaks']} breaks, no compaction"
            )
            out += [
                (name, "prefix breaks per compaction cycle", f"{gh['breaks_per_cycle']:.2f}",
                 peer_breaks, peer_name, ""),
                (name, "cached share of chat input", f"{gh['cached_share_chat']:.1%}",
                 f"{peer['cached_share_chat']:.1%}", peer_name, ""),
                (name, "input cost, cached at 90 % off (M tokens)",
                 f"{gh['input_cost'] / 1e6:.2f}", f"{peer['input_cost'] / 1e6:.2f}", peer_name,
                 f"×{gh['input_cost'] / peer['input_cost']:.2f}"),
            ]
    return out


def rows_scale(r: list[dict[str, Any]]) -> list[Row]:
    sqlite, one_pg = r[0], r[1]
    rows: list[Row] = []
    for x in r[1:]:
        name = f"Scale-out, {x['messages']:,} messages"
        rows.append((
            name, f"msgs/s, {x['processes']} process(es) on {x['setup']}",
            f"{x['msgs_per_s']:,}", f"{sqlite['msgs_per_s']:,}", "1 process on SQLite",
            f"×{x['vs_sqlite']:.2f}",
        ))
        if x is not one_pg:
            versus = x.get("vs_pg1", x["msgs_per_s"] / one_pg["msgs_per_s"])  # paired, if there
            rows.append((
                name, f"msgs/s, {x['processes']} processes on PostgreSQL",
                f"{x['msgs_per_s']:,}", f"{one_pg['msgs_per_s']:,}", "1 process on PostgreSQL",
                f"×{versus:.2f}",
            ))
    return rows


def rows_hardening(r: dict[str, Any]) -> list[Row]:
    """One row per endpoint: what its attacks got, against the goal of 0 5xx / 0 unrefused /
    0 tracebacks / exactly one log line each; the same-message_id probe's wrong replies."""
    name = f"Hardening, {r['attacks']} attacks on every endpoint"
    rows: list[Row] = []
    for x in r["rows"]:
        if x["wrong_session"] is None:
            bad = x["5xx"] + x["other"] + x["tracebacks"] + x["log_lines_off"]
            rows.append((
                name, f"`{x['endpoint']}`: 4xx of tried; 5xx / not refused / tracebacks / "
                "log lines ≠ 1",
                f"{x['4xx']} of {x['tried']}; {x['5xx']} / {x['other']} / {x['tracebacks']} / "
                f"{x['log_lines_off']}",
                f"{x['tried']} of {x['tried']}; 0 / 0 / 0 / 0", "goal", "met" if not bad else "missed",
            ))
        else:
            rows.append((
                f"Webchat, {r['pairs']} pairs of users posting the same message_id at once",
                "replies to the wrong session / requests without their reply",
                f"{x['wrong_session']} / {x['unanswered']} of {x['tried']}", "0 / 0", "goal",
                "met" if not (x["wrong_session"] or x["unanswered"]) else "missed",
            ))
    trust = r.get("trust") or []
    if trust:
        tried = sum(x["tried"] for x in trust)
        name = f"Trust boundaries, {tried} attempts on what is another person's"
    for x in trust:
        bad = x["leaked"] + x["lost"] + x["through"]
        rows.append((
            name, f"{x['kind']}: refused of tried; leaked / lost / got through",
            f"{x['refused']} of {x['tried']}; {x['leaked']} / {x['lost']} / {x['through']}",
            "0 / 0 / 0", "goal", "met" if not bad else "missed",
        ))
    d = r.get("download")
    if d:
        limit = d["cap_bytes"] / 2**20 + 16
        rows.append((
            f"Oversized download, a {d['body_bytes'] / 2**20:.0f} MB Telegram file given as "
            f"{d['declared_bytes']} bytes",
            "refused; resident memory growth", f"{'yes' if d['refused'] else 'no'}; "
            f"{d['rss_growth_mib']} MiB", f"yes; ≤ {limit:.0f} MiB", "goal",
            "met" if d["refused"] and d["rss_growth_mib"] <= limit else "missed",
        ))
    return rows


ROWS: dict[str, Callable[[Any], list[Row]]] = {
    "context_assembly": rows_context_assembly,
    "compaction": rows_compaction,
    "tool_loop": rows_tool_loop,
    "prompt_cache": rows_prompt_cache,
    "pipeline": rows_pipeline,
    "channels": rows_channels,
    "instructions": rows_instructions,
    "memory_search": rows_memory_search,
    "crash": rows_crash,
    "load": rows_load,
    "scale": rows_scale,
    "hardening": rows_hardening,
}


# -- charts -------------------------------------------------------------------------------------


def draw_charts(results: dict[str, Any]) -> list[tuple[str, str]]:
    """PNG charts of the side-by-side figures; (file name, caption) of each drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    CHARTS.mkdir(exist_ok=True)
    drawn: list[tuple[str, str]] = []
    colors = {"gatehouse": "#2b6cb0", "peer": "#c05621", "other": "#718096"}

    def save(fig: Any, name: str, caption: str) -> None:
        fig.tight_layout()
        fig.savefig(CHARTS / name, dpi=110)
        plt.close(fig)
        drawn.append((name, caption))

    ca = _result(results, "context_assembly")
    if ca and ca.get("langchain"):
        fig, ax = plt.subplots(figsize=(5.2, 3.4))
        qs = ["p50", "p99"]
        xs = range(len(qs))
        ax.bar([x - 0.2 for x in xs], [ca["gatehouse"][f"{q}_ms"] for q in qs], 0.4,
               label="gatehouse assemble", color=colors["gatehouse"])
        ax.bar([x + 0.2 for x in xs], [ca["langchain"][f"{q}_ms"] for q in qs], 0.4,
               label="langchain trim_messages", color=colors["peer"])
        ax.set_xticks(list(xs), [f"per-turn {q}" for q in qs])
        ax.set_yscale("log")
        ax.set_ylim(top=ax.get_ylim()[1] * 30)  # room for the legend
        ax.set_ylabel("ms per turn (log scale)")
        ax.set_title(f"Context assembly, {ca['config']['messages']:,}-message session")
        ax.legend(loc="upper left", fontsize=8)
        save(fig, "context_assembly.png", "Next-turn prompt assembly vs trim_messages")

    co = _result(results, "compaction")
    if co and co.get("promise"):
        from bench.compaction import draw_recall_chart

        if draw_recall_chart(co["promise"], CHARTS / "compaction_recall.png") is not None:
            drawn.append((
                "compaction_recall.png",
                "Recall exam against tokens kept: gatehouse vs SummarizationMiddleware vs "
                "dropping old tool output, per window",
            ))
    tl = _result(results, "tool_loop")
    if tl and tl.get("cases"):
        from bench.tool_loop import draw_chart

        if draw_chart(tl, CHARTS / "tool_loop.png") is not None:
            drawn.append((
                "tool_loop.png",
                "One ask then 50-500 tool rounds: identifiers in the prompt or one lookup "
                "away against tokens kept, gatehouse vs SummarizationMiddleware vs dropping "
                "the oldest rounds",
            ))
    if co and co.get("engines"):
        engines = co["engines"]
        names = list(engines)
        keys = [("identifiers_kept", "identifiers"), ("decisions_kept", "decisions"),
                ("todos_kept", "TODOs")]
        fig, ax = plt.subplots(figsize=(5.2, 3.4))
        width = 0.8 / len(names)
        for n, engine in enumerate(names):
            ax.bar([k + n * width - 0.4 + width / 2 for k in range(len(keys))],
                   [engines[engine][key] * 100 for key, _ in keys], width,
                   label="gatehouse" if engine == "gatehouse" else engine,
                   color=colors["gatehouse" if engine == "gatehouse" else "peer"])
        ax.set_xticks(range(len(keys)), [label for _, label in keys])
        ax.set_ylabel("% of the planted ones in the next prompt")
        ax.set_ylim(0, 135)
        ax.set_yticks(range(0, 101, 20))
        ax.set_title(f"What survives compaction ({co['turns']} turns, same fake model)")
        ax.legend(loc="upper right", fontsize=8)
        save(fig, "compaction_survival.png", "What survives compaction vs SummarizationMiddleware")

        fig, ax = plt.subplots(figsize=(5.2, 3.4))
        ls = [p["L"] for p in co["sweep"]]
        ax.plot(ls, [p["gatehouse_s"] for p in co["sweep"]], "o-", color=colors["gatehouse"],
                label="gatehouse (parts in parallel, merge)")
        ax.plot(ls, [p["sequential_s"] for p in co["sweep"]], "s--", color=colors["other"],
                label="same calls one at a time")
        if all("langchain_s" in p for p in co["sweep"]):
            ax.plot(ls, [p["langchain_s"] for p in co["sweep"]], "^-", color=colors["peer"],
                    label="langchain SummarizationMiddleware (1 call)")
        ax.plot(ls, [2 * v for v in ls], ":", color="black", label="2 L")
        ax.set_xlabel("summarizer latency L (s)")
        ax.set_ylabel("compaction wall time (s)")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.35)
        ax.set_title("Compaction wall time against L")
        ax.legend(loc="upper left", fontsize=8)
        save(fig, "compaction_latency.png", "Compaction wall time against the model latency L")

    pc = _result(results, "prompt_cache")
    if pc and pc.get("rows"):
        from bench.prompt_cache import draw_chart as draw_prompt_cache

        if draw_prompt_cache(pc["rows"], CHARTS / "prompt_cache.png") is not None:
            drawn.append((
                "prompt_cache.png",
                "Share of each chat call's prompt read from the provider's cache: gatehouse vs "
                "today's code vs trim_messages",
            ))

    pairs: list[tuple[str, float, float]] = []
    pi = _result(results, "pipeline")
    if pi:
        floor, gh = pi["rows"]
        pairs.append(("webchat\n(openai SDK)", gh["p50_ms"], floor["p50_ms"]))
    ch = _result(results, "channels")
    if ch:
        busiest = max((x.get("concurrency") or 0 for x in ch), default=0)
        loaded = [x for x in ch if (x.get("concurrency") or 0) == busiest]
        for platform_name in dict.fromkeys(row["platform"] for row in loaded):
            same = [x for x in loaded if x["platform"] == platform_name]
            gh = next(x for x in same if x["path"] == "gatehouse")
            bare = next(x for x in same if x["path"] != "gatehouse")
            pairs.append((platform_name, gh["p50_ms"], bare["p50_ms"]))
    if pairs:
        fig, ax = plt.subplots(figsize=(5.2, 3.4))
        xs = range(len(pairs))
        ax.bar([x - 0.2 for x in xs], [p[1] for p in pairs], 0.4, label="gatehouse",
               color=colors["gatehouse"])
        ax.bar([x + 0.2 for x in xs], [p[2] for p in pairs], 0.4, label="bare SDK (floor)",
               color=colors["peer"])
        ax.set_xticks(list(xs), [p[0] for p in pairs])
        ax.set_ylabel("latency p50 (ms)")
        ax.set_ylim(0, max(max(p[1], p[2]) for p in pairs) * 1.3)
        ax.set_title("Gateway vs the bare SDK, zero-latency model")
        ax.legend(loc="upper left", fontsize=8, ncol=2)
        save(fig, "gateway_vs_floor.png", "Gateway vs the bare-SDK floor")
    return drawn


def _result(results: dict[str, Any], name: str) -> Any:
    entry = results.get(name)
    return entry.get("result") if entry else None


# -- the report ---------------------------------------------------------------------------------


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def render(report: dict[str, Any], charts: list[tuple[str, str]]) -> str:
    results = report["results"]
    machine = report["machine"]
    lines = [
        "# Gatehouse benchmark report",
        "",
        f"Generated by `bench/report.py` on {report['generated']} (commit `{report['commit']}`), "
        f"{machine['cpus']} CPUs, Python {machine['python']}, load average "
        f"{machine['load_before']} before and {machine['load_after']} after. Every figure comes "
        "from a script under `bench/` that anyone can rerun; the raw numbers are in "
        "[`report.json`](report.json). Latencies are wall-clock on a shared machine: compare the "
        "columns of one row, not runs of different days.",
        "",
        "| Benchmark | Measure | Gatehouse | Peer / floor | Peer | Gatehouse vs peer | Run |",
        "|---|---|---|---|---|---|---|",
    ]
    for script in SCRIPTS:
        entry = results.get(script.name)
        if entry is None:
            continue
        run = f"{entry['mode']}, {entry['seconds']:g} s"
        if entry["result"] is None:
            lines.append(
                f"| {script.name} | failed (exit {entry['exit_code']}) | | | | | {run} |"
            )
            continue
        if entry["exit_code"] != 0:
            run += f", exit {entry['exit_code']} (a goal was missed)"
        for row in ROWS[script.name](entry["result"]):
            lines.append("| " + " | ".join([*row, run]) + " |")
    if charts:
        lines += ["", "<p>"]
        lines += [
            f'<img src="charts/{name}" alt="{caption}" title="{caption}" width="49%">'
            for name, caption in charts
        ]
        lines += ["</p>"]
    lines += [
        "",
        "How each row is measured (details in each script's docstring):",
        "",
        "- **Context assembly**: `bench/context_assembly.py`; the same session, token counts and "
        "budget for both; langchain's counter recounts the session on every call, as it is used.",
        "- **Compaction**: `bench/compaction.py`; one fake OpenAI-compatible server answers both "
        "after L seconds with the same deterministic summarizer (it keeps the planted decisions, "
        "TODOs and rules it sees and every second identifier it sees). SummarizationMiddleware runs "
        "with its defaults (keep 20 messages, summarize at most the last 4,000 tokens, one call). "
        "\"Kept\" means still in the next prompt: summary plus the messages kept verbatim.",
        "- **Compaction promise**: `bench/compaction.py` (the path of "
        "`tests/gateway/turn/test_compaction_promise.py`): a ~59k-token operations transcript "
        "imported as a session, its latest ask sent through webchat, the gateway compacting on "
        "its own; the chat request the fake model receives is the next prompt. Summarizers: good "
        "(writes everything it is shown), lossy (drops half the identifiers, decisions and "
        "TODOs), empty, failing (HTTP 500), hanging (`summary_timeout` 1 s). A recall-exam "
        "question counts when its answer is in the prompt or in the top 5 results of one "
        "`history_search` of its key term; the peers have no such tool.",
        "- **Tool loop**: `bench/tool_loop.py`; real-shaped build-fixing runs "
        "(tests/fakes/tool_loops.py: one ask, 50/200/500 rounds, 1-50 KB outputs, failing "
        "commands with exit codes, a planted identifier a round) imported and compacted as "
        "`sessions import` + `sessions compact` do, at 16k/32k/128k with five summarizers, "
        "and a live 300-round turn through a gateway whose fake model keeps calling tools. "
        "An identifier or failure counts as kept when the next prompt states it or one "
        "`history_search` returns it; the peers have no lookup. SummarizationMiddleware with "
        "its defaults summarizes at most the last 4,000 tokens starting at a user message: on "
        "a tool loop that holds none, so it makes no model call and writes \"Previous "
        "conversation was too long to summarize.\"",
        "- **Prompt cache**: `bench/prompt_cache.py`; a 200-turn webchat conversation through "
        "the gateway at 32k and 128k windows; the fake model reports cached tokens as the "
        "longest common prefix (tool schemas, then messages; o200k tokens, 128-token steps from "
        "1,024) with the session's recent requests. Today's code is the commit before the "
        "change, exported and run the same way; `trim_messages` trims to the usable tokens "
        "every turn. Cost counts every call (the memory flush and summaries too).",
        "- **Gateway vs floor**: `bench/pipeline.py` (webchat HTTP → gateway → model vs the bare "
        "openai SDK) and `bench/channels.py` (each platform's real SDK against its fake server, "
        "gatehouse vs a bare echo bot on the same SDK), zero-latency model.",
        "- **Crash safety**: `bench/crash.py`, `gatehouse run` killed with SIGKILL mid-burst and "
        "restarted; \"in doubt\" replies had reached Telegram when the process died, before the "
        "gateway could record it (see README, *Crash safety*).",
        "- **Memory search**: `bench/memory_search.py`; latency over generated daily notes "
        "(hybrid includes embedding the query); recall on a separate set where each question "
        "has one answer note: exact identifiers among near misses (ORD-88123 beside "
        "ORD-88124), keyword questions, and hand-written paraphrases and English/Chinese "
        "questions that share no keyword with their note, among distractors about other people.",
        "- **Load**: `bench/load.py`, `gatehouse run` as a subprocess, every session sending two "
        "messages in a row, waiting for the answers, and going on; peak RSS is the gateway "
        "process's high-water mark.",
        "- **Hardening**: `bench/hardening.py`, the attack list of `tests/security/attacks.py` "
        "(malformed and deep JSON, wrong content types, oversized bodies, forged Origin/Referer, "
        "foreign Host headers, unsigned webhooks, a login brute force) sent once, one request at "
        "a time, to a real gateway web server on 127.0.0.1 with every endpoint on (webchat, "
        "admin with anonymous access and a token, Slack HTTP mode, Telegram webhook, /metrics, "
        "/healthz); log lines and tracebacks are counted from the process's own log.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--full", action="store_true", help="the full sizes (slow)")
    parser.add_argument(
        "--only", action="append", choices=[s.name for s in SCRIPTS],
        help="run only these scripts; the others' results are kept from bench/report.json",
    )
    parser.add_argument(
        "--render-only", action="store_true",
        help="rewrite REPORT.md and the charts from bench/report.json without running anything",
    )
    args = parser.parse_args()
    missing = unlisted_scripts()
    if missing:
        parser.error(f"bench scripts missing from report.py's SCRIPTS: {', '.join(missing)}")
    previous: dict[str, Any] = {}
    if REPORT_JSON.exists() and (args.only or args.render_only):
        previous = json.loads(REPORT_JSON.read_text())
    results: dict[str, Any] = dict(previous.get("results", {}))
    load_before = previous.get("machine", {}).get("load_before")
    if not args.render_only:
        load_before = round(os.getloadavg()[0], 2)
        for script in SCRIPTS:
            if args.only and script.name not in args.only:
                continue
            results[script.name] = run_script(script, args.full)
    report = {
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_before": load_before,
            "load_after": round(os.getloadavg()[0], 2),
        },
        "results": results,
    }
    charts = draw_charts(results)
    REPORT_JSON.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    REPORT_MD.write_text(render(report, charts))
    print(f"wrote {REPORT_MD.relative_to(ROOT)}, {REPORT_JSON.relative_to(ROOT)} and "
          f"{len(charts)} charts in {CHARTS.relative_to(ROOT)}/")
    failed = [name for name, entry in results.items() if entry.get("result") is None]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
