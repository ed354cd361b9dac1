"""Benchmark: compaction wall time against the summarizer latency L, what survives, and
langchain's `SummarizationMiddleware` on the same transcript with the same fake model.

A fake OpenAI-compatible server answers every summary call after a fixed latency L. A 2-part
compaction runs its chunk summaries concurrently and then one merge, so its wall time should be
about 2L, not (parts + 1)·L — printed side by side with the same compaction forced to run its
calls one at a time, for each L of ``--sweep``. On a generated 200-turn transcript with planted
identifiers, decisions, TODOs and tool failures it also prints identifier retention (what the
model kept, and the final summary after the code guarantee), compression ratio (ideal 0.1-0.3)
and the quality report.

The peer: ``langchain.agents.middleware.SummarizationMiddleware`` (langchain 1.x, its defaults:
keep the last 20 messages, trim what it summarizes to 4,000 tokens, one model call) driving
``langchain_openai.ChatOpenAI`` against the same fake server. The fake model is one
deterministic function of its prompt for both: it writes the planted decisions, TODOs and rules
it can see, and keeps every second identifier it can see (a model that forgets half). What
survives is measured the same way for both: in the prompt after compaction (summary + kept
messages). langchain is in the ``bench`` extra (``pip install -e '.[bench]'``); without it only
gatehouse is measured.

    .venv/bin/python bench/compaction.py [--latency 2.0] [--sweep 0.25,0.5,1,2] [--turns 200]
        [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from context.compaction import CompactionResult, CompactionSettings, SummaryCall
from context.engine import ContextSettings, DefaultContextEngine, TurnContext
from context.identifiers import extract_identifiers
from context.types import Message, ToolCall
from context.window import WindowResolution
from gateway.config import parse_config
from gateway.llm import LLMProvider
from gateway.summarizer import make_summary_call
from gateway.tokenizer import load_counter
from tests.fakes import FakeOpenAI, reply

WORDS = (
    "billing service migration replica schema index backfill rollout canary latency budget "
    "queue worker cache invoice customer report dashboard alert threshold retry timeout"
).split()


def planted_transcript(turns: int, seed: int = 7) -> tuple[list[Message], list[str]]:
    """A long chat with identifiers, decisions, TODOs and failing tools planted in it."""
    rng = random.Random(seed)
    msgs: list[Message] = []
    planted: list[str] = []

    def prose(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."

    for t in range(turns):
        ident = rng.choice(
            [
                f"ORD-{1000 + t}",
                f"https://git.example.com/acme/billing/pull/{200 + t}",
                f"/srv/app/releases/{t:03d}/config.yaml",
                f"{rng.getrandbits(40):010x}",
                f"10.0.{t % 250}.{(t * 7) % 250}:{5000 + t}",
            ]
        )
        planted.append(ident)
        user = f"{prose(25)} Please look at {ident}."
        if t % 10 == 0:
            user += f" We decided to use plan {t} because the canary was stable."
        if t % 7 == 0:
            user += f" TODO: verify the rollout step {t}."
        if t % 13 == 0:
            user += " Never restart the primary during business hours."
        msgs.append(Message(role="user", content=user))
        if t % 5 == 0:
            call = ToolCall(id=f"call_{t}", name="run_command",
                            arguments=json.dumps({"cmd": f"deploy --target {ident}"}))
            msgs.append(Message(role="assistant", tool_calls=(call,)))
            failed = t % 15 == 0
            output = prose(60) + (f"\nError: deploy failed, exit code {t % 5 + 1}" if failed else "\nok")
            msgs.append(Message(role="tool", name="run_command", tool_call_id=call.id, content=output))
        msgs.append(Message(role="assistant", content=f"{prose(45)} Done with {ident}."))
    msgs.append(Message(role="user", content="Summarise where we are and deploy the last release."))
    return [replace(m, seq=i + 1) for i, m in enumerate(msgs)], planted


def fake_summary(body: dict[str, Any]) -> Any:
    """The same plausible summarizer for every caller: the five sections from the planted
    sentences it can see, and every second identifier it can see (it forgets half)."""
    text = "\n".join(str(m.get("content") or "") for m in body["messages"])
    decisions = sorted(set(re.findall(r"We decided to use plan \d+[^.]*\.", text)))[-10:]
    todos = sorted(set(re.findall(r"TODO: verify the rollout step \d+\.", text)))[-10:]
    rules = sorted(set(re.findall(r"Never restart the primary[^.]*\.", text)))[:1]
    seen = [i.value for i in extract_identifiers([text]) if i.kind != "secret"]
    kept_ids = seen[::2]
    summary = (
        "## State\nRolling out billing releases one by one.\n"
        "## Decisions\n" + "\n".join(f"- {d}" for d in decisions or ["none"]) + "\n"
        "## Open TODOs\n" + "\n".join(f"- {t}" for t in todos or ["none"]) + "\n"
        "## Constraints/Rules\n" + "\n".join(f"- {r}" for r in rules or ["none"]) + "\n"
        "## Pending user asks\n- Summarise where we are and deploy the last release.\n"
        "## Exact identifiers\n" + "\n".join(f"- `{i}`" for i in kept_ids)
    )
    return reply(summary)


def serialized(call: SummaryCall) -> SummaryCall:
    lock = asyncio.Lock()

    async def one_at_a_time(prompt: list[Message]) -> str:
        async with lock:
            return await call(prompt)

    return one_at_a_time


async def run_once(
    fake: FakeOpenAI, messages: list[Message], window: int, parallel: bool
) -> tuple[CompactionResult, float, int]:
    config = parse_config(
        {
            "llm": {"base_url": fake.base_url, "api_key": "x", "model": "gpt-4o", "stream": False},
            "context": {"quality_retries": 0},
        }
    )
    provider = LLMProvider(config.llm)
    call = make_summary_call(config, provider)
    counter = load_counter("gpt-4o")
    # quality_retries=0: the timing shows the pipeline itself (parts, then merge); the fake
    # model below drops identifiers on purpose, which the code guarantee then restores.
    settings = ContextSettings(
        window=WindowResolution(tokens=window, source="bench"),
        counter=counter,
        compaction=CompactionSettings(window=window, quality_retries=0),
    )
    turn = TurnContext("bench", "You are helpful.", messages, [], "gpt-4o", settings)
    before = len(fake.requests)
    started = time.perf_counter()
    result = await DefaultContextEngine().compact(turn, call if parallel else serialized(call))
    wall = time.perf_counter() - started
    await provider.close()
    assert result is not None
    return result, wall, len(fake.requests) - before


def langchain_available() -> bool:
    try:
        import langchain.agents.middleware  # noqa: F401
        import langchain_openai  # noqa: F401
    except ImportError:
        return False
    return True


def to_langchain(messages: list[Message]) -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    out: list[Any] = []
    for m in messages:
        if m.role == "user":
            out.append(HumanMessage(content=m.text))
        elif m.role == "assistant":
            calls = [
                {"name": c.name, "args": json.loads(c.arguments), "id": c.id, "type": "tool_call"}
                for c in m.tool_calls
            ]
            out.append(AIMessage(content=m.text or "", tool_calls=calls))
        elif m.role == "tool":
            out.append(ToolMessage(content=m.text, tool_call_id=m.tool_call_id or ""))
    return out


async def run_langchain(
    fake: FakeOpenAI, messages: list[Message]
) -> tuple[str, list[str], float, int]:
    """SummarizationMiddleware with its defaults, forced to summarize now: (summary, kept
    message texts, wall seconds, model calls)."""
    from langchain.agents.middleware import SummarizationMiddleware
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(base_url=fake.base_url, api_key="x", model="gpt-4o", max_retries=0)  # type: ignore[arg-type]
    middleware = SummarizationMiddleware(model=model, trigger=("tokens", 1))
    history = to_langchain(messages)
    before = len(fake.requests)
    started = time.perf_counter()
    update = await middleware.abefore_model({"messages": history}, None)  # type: ignore[arg-type]
    wall = time.perf_counter() - started
    assert update is not None, "SummarizationMiddleware did not summarize"
    summary, *kept = update["messages"][1:]  # [RemoveMessage(all), summary, *kept]
    return str(summary.content), [str(k.content) for k in kept], wall, len(fake.requests) - before


def survival(
    summary: str, kept: list[str], turns: int, planted: list[str], tokens_before: int
) -> dict[str, Any]:
    """What the next prompt still holds, measured the same way for every engine."""
    counter = load_counter("gpt-4o")
    prompt = "\n".join([summary, *kept])
    decisions = [f"plan {t}" for t in range(turns) if t % 10 == 0]
    todos = [f"rollout step {t}." for t in range(turns) if t % 7 == 0]
    tokens_after = counter.count_text(summary) + sum(counter.count_text(k) for k in kept)
    return {
        "tokens_before": tokens_before,
        "tokens_after": tokens_after,
        "compression_ratio": round(tokens_after / tokens_before, 3),
        "identifiers_kept": sum(1 for p in planted if p in prompt) / len(planted),
        "decisions_kept": sum(1 for d in decisions if d in prompt) / len(decisions),
        "todos_kept": sum(1 for t in todos if t in prompt) / len(todos),
        "latest_ask_verbatim": any(k.strip() == LATEST_ASK for k in kept),
    }


LATEST_ASK = "Summarise where we are and deploy the last release."


async def measure(
    turns: int, window: int, latency: float, sweep: list[float]
) -> dict[str, Any]:
    messages, planted = planted_transcript(turns)
    counter = load_counter("gpt-4o")
    messages = counter.ensure_counted(messages)
    tokens_before = sum(m.tokens or 0 for m in messages)
    with_langchain = langchain_available()
    result: dict[str, Any] = {"turns": turns, "latency": latency, "langchain": with_langchain}
    async with FakeOpenAI(default=fake_summary, latency=latency) as fake:
        par, par_wall, par_calls = await run_once(fake, messages, window, True)
        _serial, seq_wall, _ = await run_once(fake, messages, window, False)
        engines = {
            "gatehouse": {
                "wall_s": par_wall, "calls": par_calls,
                **survival(par.summary, [m.text for m in par.kept], turns, planted, tokens_before),
            }
        }
        if with_langchain:
            summary, kept, lc_wall, lc_calls = await run_langchain(fake, messages)
            engines["langchain SummarizationMiddleware"] = {
                "wall_s": lc_wall, "calls": lc_calls,
                **survival(summary, kept, turns, planted, tokens_before),
            }
        points = []
        for value in sweep:
            fake.latency = value
            point = {"L": value}
            point["gatehouse_s"] = (await run_once(fake, messages, window, True))[1]
            point["sequential_s"] = (await run_once(fake, messages, window, False))[1]
            if with_langchain:
                point["langchain_s"] = (await run_langchain(fake, messages))[2]
            points.append(point)
    missing_planted = [
        p for p in planted if p not in par.summary and p not in "".join(m.text for m in par.kept)
    ]
    result.update(
        parallel_wall=par_wall, sequential_wall=seq_wall, calls=par_calls,
        quality=par.quality.to_dict(),
        model_identifier_retention=par.model_identifier_retention,
        missing_planted=missing_planted, engines=engines, sweep=points,
        tool_failures_in_summary=par.summary.count("failed ["),
        fallback=par.fallback,
    )
    return result


def print_tables(r: dict[str, Any], planted: int) -> None:
    L = r["latency"]
    par_wall, seq_wall = r["parallel_wall"], r["sequential_wall"]
    timing = Table(title=f"compaction wall time, summarizer latency L = {L:.2f} s")
    for col in ("mode", "calls", "wall s", "wall / L", "expected"):
        timing.add_column(col, justify="left" if col == "mode" else "right")
    timing.add_row("gatehouse (parts in parallel, then merge)", str(r["calls"]),
                   f"{par_wall:.2f}", f"{par_wall / L:.2f}", "≈ 2")
    timing.add_row("same calls one at a time", str(r["calls"]), f"{seq_wall:.2f}",
                   f"{seq_wall / L:.2f}", f"≈ {r['calls']}")
    timing.add_row("speed-up", "", "", f"×{seq_wall / par_wall:.2f}", "")
    timing.add_row(
        "pipeline's own time (wall − 2L: chunking, ids, audits, SDK)", "",
        f"{par_wall - 2 * L:.2f}", "", "",
    )
    q = r["quality"]
    quality = Table(title=f"what survives: {r['turns']}-turn transcript, {planted} planted identifiers")
    quality.add_column("measure")
    quality.add_column("value", justify="right")
    quality.add_column("goal", justify="right")
    gh = r["engines"]["gatehouse"]
    rows = [
        ("tokens before → after", f"{gh['tokens_before']:,} → {gh['tokens_after']:,}", ""),
        ("compression ratio (after / before)", f"{q['compression_ratio']:.3f}", "0.1 – 0.3"),
        ("identifiers extracted from the span", f"{q['identifiers_total']}", ""),
        ("identifier retention, model alone", f"{r['model_identifier_retention']:.1%}", ""),
        ("identifier retention, final summary", f"{q['identifier_retention']:.1%}", "100 %"),
        ("planted identifiers missing from the prompt", f"{len(r['missing_planted'])}", "0"),
        ("sections present", f"{len(q['sections_present'])}/5", "5/5"),
        ("latest ask reflected", str(q["latest_ask_reflected"]), "True"),
        ("semantic retention (salient-term recall)", f"{q['semantic_retention']:.2f}", ""),
        ("tool failures in summary", str(r["tool_failures_in_summary"]), ""),
        ("fallback", str(r["fallback"]), "None"),
    ]
    for row in rows:
        quality.add_row(*row)
    console = Console()
    console.print(timing)
    console.print(quality)

    versus = Table(title=f"same transcript, same fake model (L = {L:.2f} s): gatehouse vs langchain")
    names = list(r["engines"])
    versus.add_column("measure")
    for name in names:
        versus.add_column(name, justify="right")
    for title, key, fmt in (
        ("wall s", "wall_s", "{:.2f}"), ("model calls", "calls", "{}"),
        ("tokens after", "tokens_after", "{:,}"), ("compression ratio", "compression_ratio", "{:.3f}"),
        ("planted identifiers kept", "identifiers_kept", "{:.0%}"),
        ("planted decisions kept", "decisions_kept", "{:.0%}"),
        ("planted TODOs kept", "todos_kept", "{:.0%}"),
        ("latest ask kept verbatim", "latest_ask_verbatim", "{}"),
    ):
        versus.add_row(title, *(fmt.format(r["engines"][n][key]) for n in names))
    console.print(versus)
    if not r["langchain"]:
        console.print("[yellow]langchain is not installed: pip install -e '.[bench]'[/]")

    sweep = Table(title="compaction wall time against the summarizer latency L")
    sweep.add_column("L s", justify="right")
    for col in ("gatehouse s", "one at a time s", "langchain s", "gatehouse / L"):
        sweep.add_column(col, justify="right")
    for p in r["sweep"]:
        lc = p.get("langchain_s")
        sweep.add_row(
            f"{p['L']:.2f}", f"{p['gatehouse_s']:.2f}", f"{p['sequential_s']:.2f}",
            "—" if lc is None else f"{lc:.2f}", f"{p['gatehouse_s'] / p['L']:.2f}",
        )
    console.print(sweep)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=2.0, help="seconds per summarizer call")
    parser.add_argument("--sweep", default="0.25,0.5,1,2", help="latencies L for the wall-time curve")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--window", type=int, default=128_000)
    parser.add_argument("--quick", action="store_true", help="L = 0.25 s, sweep 0.1,0.25, 120 turns")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.latency, args.sweep, args.turns = 0.25, "0.1,0.25", 120
    sweep = [float(v) for v in args.sweep.split(",") if v.strip()]
    result = await measure(args.turns, args.window, args.latency, sweep)
    print_tables(result, len(planted_transcript(args.turns)[1]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
