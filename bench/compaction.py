"""Benchmark: compaction wall time against the summarizer latency L, what survives, langchain's
`SummarizationMiddleware` on the same transcript with the same fake model, and the compaction
promise through a real gateway at 16k, 32k and 128k with five summarizer behaviours.

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

The promise (the same path as tests/gateway/turn/test_compaction_promise.py, shared in
tests/fakes/transcripts.py): a ~59k-token operations transcript (EN/ZH, big CSV and log tool
outputs, failures with exit codes in several forms, planted decisions, TODOs, rules, asks and 40
identifiers) is imported as a session; its latest ask arrives through webchat; the gateway
compacts on its own; the chat request the fake model receives is the next prompt. For each
window × summarizer (good: writes everything it is shown; lossy: drops half the identifiers,
decisions and TODOs; empty; failing: HTTP 500; hanging: never answers, `summary_timeout` 1 s):
fits, tokens before → after, identifiers in the summary / in the prompt / found by one
``history_search`` call / lost, decisions, TODOs and rules kept, and the recall exam (30
questions; one counts when its answer is in the prompt or in the top 5 results of one
``history_search`` of its key term). Side by side on the same transcript: SummarizationMiddleware
triggered at the window's usable tokens, and the baseline "drop old tool output, keep all text"
(tool results older than the last 3 removed). Goals: every case fits, no identifier lost, recall
≥ 95 % at 32k (exit status 1 when one is missed). The chart
``bench/charts/compaction_recall.png`` plots recall against the tokens kept, one point per
engine × window.

    .venv/bin/python bench/compaction.py [--latency 2.0] [--sweep 0.25,0.5,1,2] [--turns 200]
        [--only timing|promise] [--parallel N] [--summary-timeout 1] [--quick] [--json out.json]
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
from gateway.model.llm import LLMProvider
from gateway.model.summarizer import make_summary_call
from gateway.model.tokenizer import load_counter
from tests.fakes import FakeOpenAI, reply
from tests.fakes.transcripts import (
    RED_LINES,
    SECTION_HEADINGS,
    SUMMARIZER_KINDS,
    Transcript,
    case_queries,
    case_summary_timeout,
    generate,
    promise_config,
    run_case,
    search_hits,
    summarizer_fake,
)

CHARTS = Path(__file__).resolve().parent / "charts"

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



# -- the compaction promise: windows × summarizers through a real gateway ----------------------

PROMISE_WINDOWS = (16_000, 32_000, 128_000)
RECALL_GOAL = 0.95
RECALL_GOAL_WINDOW = 32_000
PEER_KINDS_QUICK = ("good", "lossy")
BASELINE = "drop old tool output"
"""The baseline: remove tool results older than the last 3, keep every user/assistant text."""
LANGCHAIN = "langchain"
"""langchain's SummarizationMiddleware."""
GATEHOUSE = "gatehouse"


def _share(found: int, total: int) -> float:
    return found / total if total else 1.0


def score_prompt(
    t: Transcript, text: str, summary: str | None, searches: dict[str, str] | None
) -> dict[str, Any]:
    """What the next prompt keeps, what one `history_search` call finds, what is lost; and the
    recall exam. `searches` is None for an engine without the lookup tool."""
    searches = {q: search_hits(out) for q, out in (searches or {}).items()}
    in_summary = [i for i in t.identifiers if summary and i in summary]
    in_prompt = [i for i in t.identifiers if i in text]
    by_lookup = [i for i in t.identifiers if i not in text and i in searches.get(i, "")]
    lost = [i for i in t.identifiers if i not in text and i not in by_lookup]
    by_prompt = [q for q in t.exam if q.answered_by(text)]
    by_search = [
        q for q in t.exam if q not in by_prompt and q.answered_by(searches.get(q.key_term, ""))
    ]
    missed = [q for q in t.exam if q not in by_prompt and q not in by_search]
    flat = " ".join(text.split())
    return {
        "ids_total": len(t.identifiers),
        "ids_in_summary": len(in_summary),
        "ids_in_prompt": len(in_prompt),
        "ids_by_lookup": len(by_lookup),
        "ids_lost": lost,
        "decisions_kept": _share(
            sum(1 for d in t.decisions if d.key in flat and d.reason in flat), len(t.decisions)
        ),
        "todos_kept": _share(sum(1 for f in t.todos if f.key in flat), len(t.todos)),
        "constraints_kept": _share(sum(1 for f in t.constraints if f.key in flat), len(t.constraints)),
        "recall": _share(len(by_prompt) + len(by_search), len(t.exam)),
        "recall_in_prompt": _share(len(by_prompt), len(t.exam)),
        "recall_by_lookup": _share(len(by_search), len(t.exam)),
        "missed_questions": [q.question for q in missed],
    }


async def promise_case(t: Transcript, window: int, kind: str, summary_timeout: float) -> dict[str, Any]:
    """One window × summarizer through a real gateway (tests/fakes/transcripts.run_case)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gatehouse-promise-") as tmp:
        async with FakeOpenAI(models=["gpt-4o"]) as fake:
            timeout = case_summary_timeout(kind, summary_timeout)
            config = promise_config(fake.base_url, Path(tmp) / "data", window, timeout)
            r = await run_case(config, fake, t, kind, queries=case_queries(t))
    quality = r.compactions[-1]["quality"] if r.compactions else {}
    users = [m for m in r.prompt if m.get("role") == "user"]
    summary = r.summary
    return {
        "engine": GATEHOUSE, "window": window, "kind": kind, "usable": r.usable,
        "fits": r.fits, "tokens_before": r.tokens_before, "tokens_after": r.prompt_tokens,
        "turn_s": round(r.seconds, 2), "summary_calls": r.summary_calls,
        "compactions": len(r.compactions), "fallback": quality.get("fallback"),
        "lookup_tool": r.search_registered,
        "latest_ask_last": bool(users) and users[-1].get("content") == t.latest_ask,
        "red_lines": all(line in r.text for line in RED_LINES.splitlines()),
        "sections": sum(1 for h in SECTION_HEADINGS if summary and h in summary),
        **score_prompt(t, r.text, summary, r.searches),
    }


def peer_system_prompt() -> str:
    """What the gateway sends as its system prompt (base + AGENTS.md red lines), for peers."""
    return f"You are a helpful assistant.\n\n## Red Lines\n{RED_LINES}"


def count_prompt(messages: list[Message]) -> int:
    counter = load_counter("gpt-4o")
    return sum(counter.count_message(m) for m in messages)


def from_langchain(messages: list[Any]) -> list[Message]:
    from langchain_core.messages import AIMessage, ToolMessage

    out: list[Message] = []
    for m in messages:
        content = m.content if isinstance(m.content, str) else str(m.content)
        if isinstance(m, AIMessage):
            calls = tuple(
                ToolCall(id=c["id"] or "", name=c["name"], arguments=json.dumps(c["args"]))
                for c in m.tool_calls
            )
            out.append(Message(role="assistant", content=content or None, tool_calls=calls))
        elif isinstance(m, ToolMessage):
            out.append(Message(role="tool", content=content, tool_call_id=m.tool_call_id))
        else:
            out.append(Message(role="user", content=content))
    return out


def peer_row(
    engine: str, t: Transcript, window: int, kind: str, prompt: list[Message] | None,
    seconds: float, error: str | None = None,
) -> dict[str, Any]:
    """A peer's next prompt scored like gatehouse's (it has no lookup tool: what left the
    prompt is lost). `prompt` None: the turn could not be sent (the summarizer failed/hung)."""
    from context.budget import BudgetSettings, make_budget

    usable = make_budget(window, BudgetSettings()).usable
    tokens_before = count_prompt(
        [Message(role="system", content=peer_system_prompt()), *t.messages]
    )
    if prompt is None:
        empty = score_prompt(t, "", None, None)
        return {
            "engine": engine, "window": window, "kind": kind, "usable": usable, "fits": False,
            "tokens_before": tokens_before, "tokens_after": None, "turn_s": round(seconds, 2),
            "error": error, **empty,
        }
    text = "\n".join(
        [m.text for m in prompt] + [c.arguments for m in prompt for c in m.tool_calls]
    )
    tokens = count_prompt(prompt)
    users = [m for m in prompt if m.role == "user"]
    return {
        "engine": engine, "window": window, "kind": kind, "usable": usable,
        "fits": tokens <= usable, "tokens_before": tokens_before, "tokens_after": tokens,
        "turn_s": round(seconds, 2), "error": error,
        "latest_ask_last": bool(users) and users[-1].text == t.latest_ask,
        "red_lines": True,
        **score_prompt(t, text, None, None),
    }


def drop_old_tool_output(t: Transcript, keep: int = 3) -> list[Message]:
    """The baseline: every user/assistant text verbatim, only the last `keep` tool results (and
    their calls; an older call loses its tool calls but keeps its text)."""
    results = [m for m in t.messages if m.role == "tool"]
    kept_ids = {m.tool_call_id for m in results[-keep:]} if keep else set()
    out: list[Message] = [Message(role="system", content=peer_system_prompt())]
    for m in t.messages:
        if m.role == "tool":
            if m.tool_call_id in kept_ids:
                out.append(m)
        elif m.role == "assistant" and m.tool_calls:
            calls = tuple(c for c in m.tool_calls if c.id in kept_ids)
            if calls or m.text:
                out.append(replace(m, tool_calls=calls, tokens=None))
        else:
            out.append(m)
    return out


async def langchain_case(
    t: Transcript, window: int, kind: str, hang_after: float
) -> dict[str, Any]:
    """SummarizationMiddleware (its defaults: keep 20 messages, summarize at most the last 4,000
    tokens) triggered at the window's usable tokens, against the same fake summarizer."""
    from langchain.agents.middleware import SummarizationMiddleware
    from langchain_openai import ChatOpenAI

    from context.budget import BudgetSettings, make_budget

    usable = make_budget(window, BudgetSettings()).usable
    history = to_langchain(t.messages)
    async with FakeOpenAI(models=["gpt-4o"]) as fake:
        fake.default = summarizer_fake(kind, t, every_call=True)
        model = ChatOpenAI(base_url=fake.base_url, api_key="x", model="gpt-4o", max_retries=0)  # type: ignore[arg-type]
        middleware = SummarizationMiddleware(model=model, trigger=("tokens", usable))
        started = time.perf_counter()
        try:
            update = await asyncio.wait_for(
                middleware.abefore_model({"messages": history}, None),  # type: ignore[arg-type]
                timeout=hang_after,
            )
        except TimeoutError:
            return peer_row(LANGCHAIN, t, window, kind, None, time.perf_counter() - started,
                            f"no summary after {hang_after:g} s (it waits for ever)")
        except Exception as exc:
            return peer_row(LANGCHAIN, t, window, kind, None, time.perf_counter() - started,
                            f"{type(exc).__name__}: the turn fails")
        seconds = time.perf_counter() - started
    after = history if update is None else update["messages"][1:]  # [RemoveMessage(all), ...]
    prompt = [Message(role="system", content=peer_system_prompt()), *from_langchain(after)]
    return peer_row(LANGCHAIN, t, window, kind, prompt, seconds)


async def measure_promise(
    quick: bool, summary_timeout: float, kinds: tuple[str, ...] = SUMMARIZER_KINDS,
    parallel: int = 1,
) -> dict[str, Any]:
    t = generate()
    counter = load_counter("gpt-4o")
    # Cases run `parallel` at a time (each its own gateway, data dir and fake server): they
    # mostly wait (summarizer timeouts, HTTP, the database thread). Their turn seconds then
    # include each other's work; --parallel 1 for clean per-turn times.
    gate = asyncio.Semaphore(max(1, parallel))

    async def one(window: int, kind: str) -> dict[str, Any]:
        async with gate:
            return await promise_case(t, window, kind, summary_timeout)

    cases = list(
        await asyncio.gather(*(one(w, k) for w in PROMISE_WINDOWS for k in kinds))
    )
    peers: list[dict[str, Any]] = []
    baseline = drop_old_tool_output(t)
    for window in PROMISE_WINDOWS:
        peers.append(peer_row(BASELINE, t, window, "—", baseline, 0.0))
    if langchain_available():
        peer_kinds = [k for k in kinds if not quick or k in PEER_KINDS_QUICK]
        for window in PROMISE_WINDOWS:
            for kind in peer_kinds:
                # A failing summarizer takes langchain's own retries (~4 s); a hanging one
                # never returns: cut at 10 s.
                peers.append(await langchain_case(t, window, kind, max(10.0, 3 * summary_timeout)))
    at_goal = [c for c in cases if c["window"] == RECALL_GOAL_WINDOW]
    goals = {
        "fits_all": all(c["fits"] for c in cases),
        "no_identifier_lost": all(not c["ids_lost"] for c in cases),
        "recall_at_32k": bool(at_goal) and min(c["recall"] for c in at_goal) >= RECALL_GOAL,
    }
    return {
        "transcript": {
            "seed": t.seed,
            "messages": len(t.messages),
            "user_turns": sum(1 for m in t.messages if m.role == "user"),
            "tokens": sum(counter.count_message(m) for m in t.messages),
            "identifiers": len(t.identifiers), "decisions": len(t.decisions),
            "todos": len(t.todos), "constraints": len(t.constraints), "exam": len(t.exam),
        },
        "summary_timeout": summary_timeout,
        "cases": cases,
        "peers": peers,
        "goals": goals,
    }


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{v:.0%}"


def _kept(r: dict[str, Any]) -> str:
    return "/".join(
        f"{r[k] * 100:.0f}" for k in ("decisions_kept", "todos_kept", "constraints_kept")
    )


def _yes(v: bool | None) -> str:
    return "—" if v is None else ("[green]yes[/]" if v else "[red]no[/]")


def print_promise(p: dict[str, Any]) -> None:
    console = Console()
    if not console.is_terminal:
        console = Console(width=140)
    tr = p["transcript"]
    table = Table(
        title=(
            f"the compaction promise through the gateway: {tr['tokens']:,}-token ops transcript, "
            f"{tr['user_turns']} user turns, {tr['identifiers']} planted identifiers, "
            f"{tr['exam']}-question recall exam; summary_timeout {p['summary_timeout']:g} s for the "
            "hanging summarizer, 30 s for the others"
        ),
        caption=(
            "ids (of the planted ones): in the summary / in the prompt / + found only by one "
            "history_search / lost. "
            "kept %: decisions (with reason) / TODOs / rules in the prompt. "
            "recall: answerable from the prompt + from one history_search (top 5) of its key term."
        ),
    )
    for col in (
        "window", "summarizer", "fits", "tokens before → after", "÷ usable",
        "ids s/p/+l/lost", "kept % dec/todo/rule", "recall (prompt+lookup)",
        "turn s", "fallback",
    ):
        table.add_column(col, justify="left" if col in ("summarizer", "fallback") else "right")
    for c in p["cases"]:
        table.add_row(
            f"{c['window'] // 1000}k", c["kind"], _yes(c["fits"]),
            f"{c['tokens_before']:,} → {c['tokens_after']:,}",
            f"{c['tokens_after'] / c['usable']:.2f}",
            f"{c['ids_in_summary']}/{c['ids_in_prompt']}/+{c['ids_by_lookup']}/"
            + (f"[red]{len(c['ids_lost'])}[/]" if c["ids_lost"] else "0"),
            _kept(c),
            f"{c['recall']:.0%} ({c['recall_in_prompt']:.0%}+{c['recall_by_lookup']:.0%})",
            f"{c['turn_s']:.2f}", str(c["fallback"] or "—"),
        )
    table.add_row(
        "goal", "", "yes", "", "≤ 1.00", "lost 0", "", f"≥ {RECALL_GOAL:.0%} at "
        f"{RECALL_GOAL_WINDOW // 1000}k", "", "",
    )
    console.print(table)

    versus = Table(
        title="side by side, same transcript and fake summarizer (the peers have no lookup tool: "
        "what leaves their prompt is lost)",
    )
    for col in (
        "engine", "window", "summarizer", "fits", "tokens after", "÷ usable",
        "ids in prompt", "ids lost", "kept % dec/todo/rule", "recall", "note",
    ):
        versus.add_column(col, justify="left" if col in ("engine", "summarizer", "note") else "right")
    rows = [c for c in p["cases"] if c["kind"] in ("good", "lossy")] + p["peers"]
    order = {GATEHOUSE: 0, LANGCHAIN: 1, BASELINE: 2}
    for r in sorted(rows, key=lambda r: (r["window"], order.get(r["engine"], 9))):
        after = r["tokens_after"]
        note = r.get("error") or ""
        if r["engine"] == GATEHOUSE:
            note = f"+{r['ids_by_lookup']} by lookup"
        versus.add_row(
            r["engine"], f"{r['window'] // 1000}k", r["kind"], _yes(r["fits"]),
            "—" if after is None else f"{after:,}",
            "—" if after is None else f"{after / r['usable']:.2f}",
            f"{r['ids_in_prompt']}/{r['ids_total']}", f"{len(r['ids_lost'])}",
            _kept(r), _pct(r["recall"]), note,
        )
    console.print(versus)
    if not langchain_available():
        console.print("[yellow]langchain is not installed: pip install -e '.[bench]'[/]")
    for name, ok in p["goals"].items():
        console.print(f"goal {name}: " + ("[green]met[/]" if ok else "[red]missed[/]"))
    lost = sorted({i for c in p["cases"] for i in c["ids_lost"]})
    if lost:
        console.print(f"[red]identifiers lost in some case:[/] {lost}")
    missed = sorted({q for c in p["cases"] if c["kind"] in ("good", "lossy")
                     for q in c["missed_questions"]})
    if missed:
        console.print("exam questions missed with a good or lossy summarizer: " + "; ".join(missed))


def draw_recall_chart(p: dict[str, Any], path: Path) -> Path | None:
    """Recall against tokens kept, one point per engine × window (gatehouse and langchain with
    the good summarizer filled, the lossy one hollow; the baseline as squares); on the right
    the same points against tokens ÷ usable (a prompt fits left of 1)."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    colors = {16_000: "#c05621", 32_000: "#2b6cb0", 128_000: "#2f855a"}
    markers = {GATEHOUSE: "o", LANGCHAIN: "^", BASELINE: "s"}
    rows = [c for c in p["cases"] if c["kind"] in ("good", "lossy")] + [
        r for r in p["peers"] if r["kind"] in ("good", "lossy", "—") and r["tokens_after"]
    ]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.5, 4.2), sharey=True)
    seen: dict[tuple[str, int, float], int] = {}
    for r in rows:
        # Points that coincide (the same prompt at several windows) are nudged apart.
        spot = (r["engine"], round(r["tokens_after"], -2), round(r["recall"], 3))
        nudge = 1 + 0.06 * seen.get(spot, 0)
        seen[spot] = seen.get(spot, 0) + 1
        color = colors.get(r["window"], "#718096")
        style = {
            "marker": markers.get(r["engine"], "x"), "s": 60, "edgecolors": color,
            "facecolors": "none" if r["kind"] == "lossy" else color, "linewidths": 1.4,
        }
        left.scatter(r["tokens_after"] * nudge, r["recall"] * 100, **style)
        right.scatter(r["tokens_after"] / r["usable"] * nudge, r["recall"] * 100, **style)
    for window, color in colors.items():
        usable = next((r["usable"] for r in rows if r["window"] == window), None)
        if usable:
            left.axvline(usable, color=color, linestyle=":", linewidth=0.8)
    right.axvline(1.0, color="black", linestyle=":", linewidth=0.8)
    right.text(1.03, 2, "does not fit →", fontsize=7)
    for ax in (left, right):
        ax.axhline(RECALL_GOAL * 100, color="black", linestyle="--", linewidth=0.6)
        ax.set_xscale("log")
        ax.set_ylim(-5, 108)
    handles = [
        Line2D([], [], marker=m, linestyle="", color="#4a5568", label=name)
        for name, m in markers.items()
    ] + [
        Line2D([], [], marker="o", linestyle="", color=c, label=f"{w // 1000}k window")
        for w, c in colors.items()
    ] + [Line2D([], [], marker="o", linestyle="", markerfacecolor="none",
                    color="#4a5568", label="lossy summarizer (hollow)")]
    right.legend(handles=handles, fontsize=7, loc="center right")
    left.set_xlabel("tokens in the next prompt (log; dotted: each window's usable)")
    right.set_xlabel("tokens in the next prompt ÷ usable (log)")
    left.set_ylabel("recall exam: answerable questions (%)")
    fig.suptitle(
        f"Recall against tokens kept ({p['transcript']['tokens']:,}-token transcript; "
        f"dashed: the {RECALL_GOAL:.0%} goal)", fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=2.0, help="seconds per summarizer call")
    parser.add_argument("--sweep", default="0.25,0.5,1,2", help="latencies L for the wall-time curve")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--window", type=int, default=128_000)
    parser.add_argument(
        "--summary-timeout", type=float, default=1.0,
        help="[context] summary_timeout of the promise cases (the hanging summarizer waits it out)",
    )
    parser.add_argument(
        "--only", choices=("timing", "promise"),
        help="run only the wall-time part or only the promise part",
    )
    parser.add_argument(
        "--quick", action="store_true",
        help="L = 0.25 s, sweep 0.1,0.25, 120 turns; langchain with 3 summarizers (< 60 s)",
    )
    parser.add_argument(
        "--parallel", type=int, default=0,
        help="promise cases at a time (default 1; 4 with --quick)",
    )
    parser.add_argument("--chart", type=Path, default=CHARTS / "compaction_recall.png")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.latency, args.sweep, args.turns = 0.25, "0.1,0.25", 120
    sweep = [float(v) for v in args.sweep.split(",") if v.strip()]
    result: dict[str, Any] = {}
    if args.only != "promise":
        result = await measure(args.turns, args.window, args.latency, sweep)
        print_tables(result, len(planted_transcript(args.turns)[1]))
    code = 0
    if args.only != "timing":
        promise = await measure_promise(
            args.quick, args.summary_timeout,
            parallel=args.parallel or (4 if args.quick else 1),
        )
        print_promise(promise)
        chart = draw_recall_chart(promise, args.chart)
        if chart is not None:
            Console().print(f"chart: {chart}")
        result["promise"] = promise
        code = 0 if all(promise["goals"].values()) else 1
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, ensure_ascii=False))
    return code


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
