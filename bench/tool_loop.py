"""Benchmark: long agent work — one ask followed by 50, 200 or 500 tool rounds — at 16k, 32k
and 128k with five summarizers, side by side with langchain's `SummarizationMiddleware` and
with "drop the oldest rounds".

The transcripts are real-shaped build-fixing runs (tests/fakes/tool_loops.py: one ask, rounds
of one to three tool calls with 1-50 KB outputs, failing commands with exit codes in text and
JSON, a planted identifier a round: paths, CI URLs, commit hashes, uuids, tickets).

Paths measured, each with the summarizer good (writes what it is shown), lossy (keeps every
second identifier), empty, failing (HTTP 500) or hanging (`summary_timeout` 1 s):

- **import + compact**: the run imported as a session and compacted, as `gatehouse sessions
  import` and `sessions compact` do; the next prompt is the one the session's next model call
  would carry (the engine's plan after the compaction).
- **live**: a 300-round turn through a real gateway: the run's ask sent through webchat, a
  scripted fake model calling the run's tools round after round; every chat request the
  model receives is a prompt. Compactions per turn and seconds per compaction are the turn's.

Per case: fits (every prompt within the usable tokens, counted with tiktoken), ask kept
(verbatim in every prompt), failures and identifiers each in the prompt, one `history_search`
away, or lost, and the tokens of the (last) prompt.

The peers, on the same transcripts with the same fake summarizer: `SummarizationMiddleware`
(langchain 1.x defaults: keep the last 20 messages, summarize at most the last 4,000 tokens,
one call; triggered at the usable tokens; `timeout` = `summary_timeout`), and "drop the oldest
rounds" (the ask and the newest rounds that fit, nothing summarized, nothing archived). They
have no lookup tool. With its defaults SummarizationMiddleware summarizes at most the last
4,000 tokens, starting at a user message; a tool loop's last 4,000 tokens hold none, so it
makes no model call and its summary reads "Previous conversation was too long to summarize."
(what a user of it gets on this shape). langchain is in the `bench` extra; without it only the
others run.

Goals (exit status 1 when one is missed): every gatehouse case fits and keeps the ask, loses no
failure and no identifier, and the live 300-round turn finishes with the summarizer hanging.

    .venv/bin/python bench/tool_loop.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.compaction import langchain_available, to_langchain
from context.budget import BudgetSettings, make_budget
from context.types import Message
from gateway.config import Config, parse_config
from gateway.model.tokenizer import load_counter
from tests.fakes import FakeOpenAI
from tests.fakes.tool_loops import (
    AgentRun,
    agent_run,
    agent_summary,
    run_import,
    run_live,
    where_failure,
    where_identifier,
)
from tests.fakes.transcripts import (
    AGENTS_MD,
    RED_LINES,
    SUMMARIZER_KINDS,
    prompt_text,
    summary_step,
)

WINDOWS = (16_000, 32_000, 128_000)
ROUNDS = (50, 200, 500)
LIVE_ROUNDS = 300
SUMMARY_TIMEOUT = 1.0
COUNTER = load_counter("gpt-4o")


def config_for(base_url: str, data_dir: Path, window: int, kind: str) -> Config:
    return parse_config(
        {
            "gateway": {"data_dir": str(data_dir)},
            "web": {"port": 0},
            "llm": {"base_url": base_url, "api_key": "bench", "model": "gpt-4o",
                    "max_retries": 0, "timeout": 30, "stream": False, "max_tool_rounds": 1_000},
            "models": {"gpt-4o": {"context_window": window}},
            "context": {"summary_timeout": SUMMARY_TIMEOUT if kind == "hanging" else 30.0},
            "memory": {"embeddings": False},
            "scheduler": {"enabled": False},
        },
        "bench",
    )


def usable(window: int) -> int:
    return make_budget(window, BudgetSettings()).usable


def prompt_tokens(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> int:
    return sum(COUNTER.count_message(Message.from_openai(dict(m))) for m in messages) + (
        COUNTER.count_tools(list(tools))
    )


def tally(run: AgentRun, text: str, searches: dict[str, str]) -> dict[str, Any]:
    ids = [where_identifier(i, text, searches) for i in run.identifiers]
    fails = [where_failure(run, f, text, searches) for f in run.failures]
    return {
        "identifiers": {w: ids.count(w) for w in ("prompt", "lookup", "lost")},
        "failures": {w: fails.count(w) for w in ("prompt", "lookup", "lost")},
        "identifiers_total": len(ids),
        "failures_total": len(fails),
    }


def has_ask(messages: Sequence[dict[str, Any]], run: AgentRun) -> bool:
    return any(m.get("role") == "user" and m.get("content") == run.ask for m in messages)


# -- gatehouse: import + compact ----------------------------------------------------------------


async def gatehouse_import(run: AgentRun, window: int, kind: str, tmp: Path) -> dict[str, Any]:
    async with FakeOpenAI() as fake:
        config = config_for(fake.base_url, tmp / "data", window, kind)
        result = await run_import(config, fake, run, kind, tmp, queries=run.identifiers,
                                  agents_md=AGENTS_MD)
    messages = [m.to_openai() for m in result.prompt]
    tokens = prompt_tokens(messages, result.tools)
    return {
        "engine": "gatehouse", "path": "import + compact", "rounds": run.rounds,
        "window": window, "kind": kind, "committed": result.committed,
        "fits": tokens <= usable(window), "ask": has_ask(messages, run),
        "red_lines": RED_LINES.splitlines()[0] in str(messages[0].get("content")),
        "tokens": tokens, "seconds_per_compaction": round(result.seconds, 3), "compactions": 1,
        **tally(run, prompt_text(messages), result.searches),
    }


# -- gatehouse: live --------------------------------------------------------------------------


async def gatehouse_live(run: AgentRun, window: int, kind: str, tmp: Path) -> dict[str, Any]:
    async with FakeOpenAI() as fake:
        config = config_for(fake.base_url, tmp / "data", window, kind)
        result = await run_live(
            config, fake, run, kind, queries=run.identifiers, agents_md=AGENTS_MD
        )
    sizes = [prompt_tokens(c["messages"], c.get("tools") or []) for c in result.chats]
    finished = bool(result.reply) and len(result.chats) == run.rounds + 1
    return {
        "engine": "gatehouse", "path": "live", "rounds": run.rounds, "window": window,
        "kind": kind, "finished": finished, "seconds": round(result.seconds, 2),
        "fits": all(s <= result.usable for s in sizes),
        "ask": all(has_ask(c["messages"], run) for c in result.chats),
        "red_lines": all(RED_LINES.splitlines()[0] in str(c["messages"][0].get("content"))
                         for c in result.chats),
        "tokens": sizes[-1] if sizes else 0, "largest_prompt": max(sizes, default=0),
        "compactions": result.compactions,
        "seconds_per_compaction": round(
            sum(result.compaction_seconds) / max(1, len(result.compaction_seconds)), 3
        ),
        **tally(run, prompt_text(result.final_prompt), result.searches),
    }


# -- the peers ----------------------------------------------------------------------------------


def peer_summarizer(kind: str) -> Any:
    """Every request is a summary call (langchain's prompt is its own)."""
    return lambda body: summary_step(kind, body, agent_summary)


def from_langchain(message: Any) -> dict[str, Any]:
    kind = getattr(message, "type", "")
    role = {"human": "user", "ai": "assistant", "tool": "tool", "system": "system"}.get(kind, "user")
    out: dict[str, Any] = {"role": role, "content": str(message.content or "")}
    calls = getattr(message, "tool_calls", None) or []
    if calls:
        out["tool_calls"] = [
            {"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["args"])}}
            for c in calls
        ]
    if role == "tool":
        out["tool_call_id"] = getattr(message, "tool_call_id", "")
    return out


async def langchain_case(run: AgentRun, window: int, kind: str) -> dict[str, Any]:
    from langchain.agents.middleware import SummarizationMiddleware
    from langchain_openai import ChatOpenAI

    system = {"role": "system", "content": f"You are a coding agent.\n\n{RED_LINES}"}
    async with FakeOpenAI(default=peer_summarizer(kind)) as fake:
        model = ChatOpenAI(
            base_url=fake.base_url, api_key="x", model="gpt-4o", max_retries=0,  # type: ignore[arg-type]
            timeout=SUMMARY_TIMEOUT if kind == "hanging" else 30.0,
        )
        middleware = SummarizationMiddleware(model=model, trigger=("tokens", usable(window)))
        history = to_langchain(run.messages)
        began = time.perf_counter()
        error_text = None
        try:
            update = await middleware.abefore_model({"messages": history}, None)  # type: ignore[arg-type]
        except Exception as exc:  # a failed summary call: the peer raises
            update, error_text = None, f"{type(exc).__name__}"
        seconds = time.perf_counter() - began
    if update is None:
        kept = [from_langchain(m) for m in history]
    else:
        kept = [from_langchain(m) for m in update["messages"][1:]]
    messages = [system, *kept]
    tokens = prompt_tokens(messages, [])
    return {
        "engine": "langchain SummarizationMiddleware", "path": "import + compact",
        "rounds": run.rounds, "window": window, "kind": kind, "error": error_text,
        "fits": tokens <= usable(window), "ask": has_ask(messages, run), "red_lines": True,
        "tokens": tokens, "seconds_per_compaction": round(seconds, 3), "compactions": 1,
        **tally(run, prompt_text(messages), {}),
    }


def drop_oldest_case(run: AgentRun, window: int) -> dict[str, Any]:
    """The ask and the newest whole rounds that fit; nothing summarized or archived."""
    system = {"role": "system", "content": f"You are a coding agent.\n\n{RED_LINES}"}
    ask = run.messages[0].to_openai()
    room = usable(window) - prompt_tokens([system, ask], [])
    kept: list[dict[str, Any]] = []
    for index in range(run.rounds - 1, -1, -1):
        unit = [m.to_openai() for m in run.round_messages(index)]
        cost = prompt_tokens(unit, [])
        if cost > room:
            break
        room -= cost
        kept[:0] = unit
    messages = [system, ask, *kept]
    tokens = prompt_tokens(messages, [])
    return {
        "engine": "drop the oldest rounds", "path": "import + compact", "rounds": run.rounds,
        "window": window, "kind": "-", "fits": tokens <= usable(window),
        "ask": has_ask(messages, run), "red_lines": True, "tokens": tokens,
        "seconds_per_compaction": 0.0, "compactions": 0,
        **tally(run, prompt_text(messages), {}),
    }


# -- the run ------------------------------------------------------------------------------------


async def measure(quick: bool) -> dict[str, Any]:
    rounds = ROUNDS[:2] if quick else ROUNDS
    windows = WINDOWS[:2] if quick else WINDOWS
    kinds = ("good", "hanging") if quick else SUMMARIZER_KINDS
    live_cases = [(16_000, "hanging")] if quick else [(w, k) for w in WINDOWS for k in kinds]
    cases: list[dict[str, Any]] = []
    with_langchain = langchain_available()
    base = Path(tempfile.mkdtemp(prefix="gatehouse-tool-loop-"))
    try:
        n = 0
        for r in rounds:
            run = agent_run(r)
            for window in windows:
                cases.append(drop_oldest_case(run, window))
                for kind in kinds:
                    n += 1
                    tmp = base / f"case{n}"
                    tmp.mkdir()
                    cases.append(await gatehouse_import(run, window, kind, tmp))
                    if with_langchain:
                        cases.append(await langchain_case(run, window, kind))
                    print(f"import {r} rounds, {window:,}, {kind}: done", file=sys.stderr)
        live = agent_run(LIVE_ROUNDS)
        for window, kind in live_cases:
            n += 1
            tmp = base / f"case{n}"
            tmp.mkdir()
            cases.append(await gatehouse_live(live, window, kind, tmp))
            print(f"live {LIVE_ROUNDS} rounds, {window:,}, {kind}: done", file=sys.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return {"quick": quick, "langchain": with_langchain, "cases": cases,
            "goals": goals(cases)}


def goals(cases: list[dict[str, Any]]) -> dict[str, bool]:
    ours = [c for c in cases if c["engine"] == "gatehouse"]
    hanging_live = [c for c in ours if c["path"] == "live" and c["kind"] == "hanging"]
    return {
        "fits 100 %": all(c["fits"] for c in ours),
        "ask 100 %": all(c["ask"] for c in ours),
        "0 failures lost": all(c["failures"]["lost"] == 0 for c in ours),
        "0 identifiers lost": all(c["identifiers"]["lost"] == 0 for c in ours),
        "live turn finishes with the summarizer hanging": bool(hanging_live)
        and all(c["finished"] for c in hanging_live),
    }


def share(part: dict[str, int], total: int) -> str:
    return " / ".join(f"{part[w]}" for w in ("prompt", "lookup", "lost")) + f" of {total}"


def print_tables(result: dict[str, Any], console: Console) -> None:
    table = Table(title="One ask, then N tool rounds: the next prompt after compaction")
    for col in ("path", "rounds", "window", "engine", "summarizer", "fits", "ask",
                "failures prompt/lookup/lost", "identifiers prompt/lookup/lost", "tokens kept",
                "s/compaction", "compactions"):
        table.add_column(col, justify="right" if col in ("rounds", "window") else "left")
    for c in result["cases"]:
        table.add_row(
            c["path"], f"{c['rounds']}", f"{c['window'] // 1000}k", c["engine"], c["kind"],
            "yes" if c["fits"] else "[red]no[/red]", "yes" if c["ask"] else "[red]no[/red]",
            share(c["failures"], c["failures_total"]),
            share(c["identifiers"], c["identifiers_total"]),
            f"{c['tokens']:,}", f"{c['seconds_per_compaction']:.2f}",
            f"{c['compactions']}" + ("" if c.get("finished", True) else " (unfinished)"),
        )
    console.print(table)
    summary = Table(title="Across every case, by engine")
    for col in ("engine", "cases", "fits", "ask kept", "failures lost", "identifiers lost"):
        summary.add_column(col)
    engines: dict[str, list[dict[str, Any]]] = {}
    for c in result["cases"]:
        engines.setdefault(c["engine"], []).append(c)
    for name, group in engines.items():
        failures = sum(c["failures"]["lost"] for c in group)
        failures_total = sum(c["failures_total"] for c in group)
        ids = sum(c["identifiers"]["lost"] for c in group)
        ids_total = sum(c["identifiers_total"] for c in group)
        summary.add_row(
            name, f"{len(group)}", f"{sum(c['fits'] for c in group) / len(group):.0%}",
            f"{sum(c['ask'] for c in group) / len(group):.0%}",
            f"{failures:,} of {failures_total:,} ({failures / max(1, failures_total):.0%})",
            f"{ids:,} of {ids_total:,} ({ids / max(1, ids_total):.0%})",
        )
    console.print(summary)
    for goal, met in result["goals"].items():
        console.print(f"goal {goal}: {'met' if met else '[red]MISSED[/red]'}")
    if not result["langchain"]:
        console.print("[yellow]langchain is not installed: pip install -e '.[bench]'[/]")


def draw_chart(result: dict[str, Any], path: Path) -> Path | None:
    """Identifiers reachable (in the prompt or one lookup away) against tokens kept, one point
    per engine × case of the import path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [c for c in result["cases"] if c["path"] == "import + compact"]
    if not cases:
        return None
    styles = {
        "gatehouse": ("#2b6cb0", "o"),
        "langchain SummarizationMiddleware": ("#c05621", "s"),
        "drop the oldest rounds": ("#718096", "^"),
    }
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for engine, (color, marker) in styles.items():
        group = [c for c in cases if c["engine"] == engine]
        if not group:
            continue
        xs = [c["tokens"] for c in group]
        ys = [
            (c["identifiers"]["prompt"] + c["identifiers"]["lookup"]) / c["identifiers_total"]
            for c in group
        ]
        ax.scatter(xs, ys, label=engine, color=color, marker=marker, alpha=0.75)
    ax.set_xscale("log")
    ax.set_xlabel("tokens of the next prompt (log scale)")
    ax.set_ylabel("identifiers in the prompt or one lookup away")
    ax.set_ylim(-0.05, 1.08)
    ax.set_title("One ask, 50-500 tool rounds, 16k-128k windows")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer sizes, windows, summarizers")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    result = asyncio.run(measure(args.quick))
    print_tables(result, Console(width=200))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if all(result["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
