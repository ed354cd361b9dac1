"""Benchmark: compaction wall time against the summarizer latency L, and what survives.

A fake OpenAI-compatible server answers every summary call after a fixed latency L. A 2-part
compaction runs its chunk summaries concurrently and then one merge, so its wall time should be
about 2L, not (parts + 1)·L — printed side by side with the same compaction forced to run its
calls one at a time. On a generated 200-turn transcript with planted identifiers, decisions,
TODOs and tool failures it also prints identifier retention (what the model kept, and the final
summary after the code guarantee), compression ratio (ideal 0.1-0.3) and the quality report.

    .venv/bin/python bench/compaction.py [--latency 2.0] [--turns 200] [--json out.json]
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
    """A plausible summarizer: the five sections from planted sentences; keeps only some ids."""
    text = body["messages"][-1]["content"]
    decisions = sorted(set(re.findall(r"We decided to use plan \d+[^.]*\.", text)))[-10:]
    todos = sorted(set(re.findall(r"TODO: verify the rollout step \d+\.", text)))[-10:]
    rules = sorted(set(re.findall(r"Never restart the primary[^.]*\.", text)))[:1]
    ids = re.findall(r"- `([^`]+)`", text)
    kept_ids = ids[::2]  # a model that forgets half the identifiers
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


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=2.0, help="seconds per summarizer call")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--window", type=int, default=128_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    messages, planted = planted_transcript(args.turns)
    counter = load_counter("gpt-4o")
    messages = counter.ensure_counted(messages)
    async with FakeOpenAI(default=fake_summary, latency=args.latency) as fake:
        par, par_wall, par_calls = await run_once(fake, messages, args.window, True)
        _serial, seq_wall, seq_calls = await run_once(fake, messages, args.window, False)
    L = args.latency
    timing = Table(title=f"compaction wall time, summarizer latency L = {L:.2f} s")
    for col in ("mode", "calls", "wall s", "wall / L", "expected"):
        timing.add_column(col, justify="left" if col == "mode" else "right")
    timing.add_row("gatehouse (parts in parallel, then merge)", str(par_calls),
                   f"{par_wall:.2f}", f"{par_wall / L:.2f}", "≈ 2")
    timing.add_row("same calls one at a time", str(seq_calls), f"{seq_wall:.2f}",
                   f"{seq_wall / L:.2f}", f"≈ {seq_calls}")
    timing.add_row("speed-up", "", "", f"×{seq_wall / par_wall:.2f}", "")
    timing.add_row(
        "pipeline's own time (wall − 2L: chunking, ids, audits, SDK)", "",
        f"{par_wall - 2 * L:.2f}", "", "",
    )
    q = par.quality
    missing_planted = [p for p in planted if p not in par.summary and p not in "".join(m.text for m in par.kept)]
    quality = Table(title=f"what survives: {args.turns}-turn transcript, {len(planted)} planted identifiers")
    quality.add_column("measure")
    quality.add_column("value", justify="right")
    quality.add_column("goal", justify="right")
    rows = [
        ("tokens before → after", f"{par.tokens_before:,} → {par.tokens_after:,}", ""),
        ("compression ratio (after / before)", f"{q.compression_ratio:.3f}", "0.1 – 0.3"),
        ("identifiers extracted from the span", f"{len(par.identifiers)}", ""),
        ("identifier retention, model alone", f"{par.model_identifier_retention:.1%}", ""),
        ("identifier retention, final summary", f"{q.identifier_retention:.1%}", "100 %"),
        ("planted identifiers missing from the prompt", f"{len(missing_planted)}", "0"),
        ("sections present", f"{len(q.sections_present)}/5", "5/5"),
        ("latest ask reflected", str(q.latest_ask_reflected), "True"),
        ("semantic retention (salient-term recall)", f"{q.semantic_retention:.2f}", ""),
        ("tool failures in summary", str(par.summary.count("failed [")), ""),
        ("fallback", str(par.fallback), "None"),
    ]
    for r in rows:
        quality.add_row(*r)
    console = Console()
    console.print(timing)
    console.print(quality)
    if args.json:
        args.json.write_text(json.dumps({
            "latency": L, "parallel_wall": par_wall, "sequential_wall": seq_wall,
            "calls": par_calls, "quality": q.to_dict(),
            "model_identifier_retention": par.model_identifier_retention,
            "missing_planted": missing_planted,
        }, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
