"""Benchmark: prompts that keep the provider's prompt cache warm (issue 24).

Providers bill the cached part of a prompt at a fraction of the price (and answer it faster),
but only an unchanged prefix is cached: a prompt that drops its oldest turn, or rewrites a block
near its start, is read again from the first changed token on. A 200-turn webchat conversation
(~270-token asks, ~730-token answers: 9 compactions at 32k, one at 128k) runs through the real
gateway (webchat → gateway → the openai SDK → a fake OpenAI-compatible server on a socket) at a
32k and a 128k window. The fake
model reports `usage.prompt_tokens_details.cached_tokens` the way OpenAI does: the longest
common prefix of the request (tool schemas first, then the messages, tokens counted with o200k)
with the recent requests of the same session (it keeps 8, as a provider keeps prefixes for
minutes), in blocks of 128 tokens from 1,024 on. Measured per run:

- prefix breaks: chat calls whose prompt does not begin with the previous chat call's prompt
  (tool schemas included), per compaction cycle (goal ≤ 1: the compaction's own);
- cached share of the chat calls' input tokens (goal ≥ 90 % at 32k, ≥ 95 % at 128k), and of
  every call's (the memory flush and the summaries read prompts of their own);
- the input cost at a 90 % cached-input discount (uncached + 0.1 × cached tokens, every call).

Side by side on the same conversation: gatehouse as it is (`[context] small_overflow =
"compact"`: a prompt at most 5 % over the usable tokens compacts at once) and with
`small_overflow = "drop-blocks"` (drop the oldest turns a block at a time); today's code before
this change (the commit `BASELINE`, exported with `git archive` and run from a temporary
directory: it drops turns anew each turn in the ≤ 5 % tier and removes the refresh block after
one call); and langchain_core's `trim_messages` (strategy "last", the usable tokens less the
tool schemas, every turn; it shifts the prompt on every turn once over budget). Each run is a
process of its own. The chart `bench/charts/prompt_cache.png` (drawn by a full run and by
`bench/report.py`, not by `--quick`) plots the cached share of each chat call.

    .venv/bin/python bench/prompt_cache.py [--turns 200] [--windows 32768,131072] [--quick]
        [--baseline COMMIT] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# A run of today's code imports gateway/, context/... from an export of `BASELINE`.
CODE = os.environ.get("PROMPT_CACHE_CODE")
sys.path.insert(0, str(ROOT))
if CODE:
    sys.path.insert(0, CODE)

CHARTS = Path(__file__).resolve().parent / "charts"
BASELINE = "4c347bc"
"""The commit before issue 24's change: "today's code"."""
DISCOUNT = 0.9
"""What a cached input token costs less (OpenAI: 50-90 %, Anthropic: 90 %)."""
CACHE_BLOCK, CACHE_MIN = 128, 1_024
"""OpenAI caches prompts of 1,024 tokens and more, in steps of 128 tokens."""
KEPT_PREFIXES = 8
USER = "reader"
SESSION_KEY = f"agent:main:webchat:direct:{USER}"
GOALS = {32_768: 0.90, 131_072: 0.95}

VARIANTS = ("compact", "drop-blocks", "today", "trim")
LABELS = {
    "compact": "gatehouse, compact early",
    "drop-blocks": "gatehouse, drop blocks",
    "today": "today's code",
    "trim": "trim_messages",
}

AGENTS_MD = (
    "# Agent\n\n## Session Startup\n- Read MEMORY.md and greet the person by name.\n\n"
    "## Red Lines\n- Never paste credentials into a chat.\n- Never delete data without asking.\n"
)

SUBJECTS = (
    "The billing service", "Our staging cluster", "The nightly export", "The search index",
    "The payments queue", "The mobile release", "The data warehouse", "The on-call rotation",
)
VERBS = ("slows down", "needs a review of", "keeps retrying", "was moved next to",
         "depends on", "reports errors about", "was rebuilt with", "should be compared with")
OBJECTS = ("the invoice batch", "the replica lag", "the cache layer", "the rollout plan",
           "the customer report", "the alert thresholds", "the schema migration",
           "the weekly dashboard", "the retry budget", "the canary hosts")
TAILS = (" since Tuesday", " after the last deploy", " only in production",
         " when the load is high", " during the backfill", "", " again")


def prose(rng: random.Random, words: int) -> str:
    out: list[str] = []
    count = 0
    while count < words:
        sentence = (
            f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
            f"{rng.choice(TAILS)}."
        )
        out.append(sentence)
        count += len(sentence.split())
    return " ".join(out)


def user_text(turn: int) -> str:
    return f"Turn {turn}. " + prose(random.Random(turn), 230)


def answer_text(turn: int) -> str:
    return f"About turn {turn}: " + prose(random.Random(100_000 + turn), 640)


# -- the fake model: answers, and reports cached tokens by longest common prefix --------------


def kind_of(body: dict[str, Any]) -> str:
    messages = body.get("messages") or []
    first = (messages[0].get("content") if messages else "") or ""
    last = messages[-1] if messages else {}
    if isinstance(first, str) and first.startswith(
        ("You compress part of", "You merge partial summaries")
    ):
        return "summary"
    content = last.get("content") or ""
    if isinstance(content, str) and content.startswith("[Memory flush"):
        return "flush"
    return "chat"


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of `a` and `b` (characters)."""
    low, high = 0, min(len(a), len(b))
    while low < high:  # a[:low] == b[:low]; binary search on slice comparisons (in C)
        mid = (low + high + 1) // 2
        if a[low:mid] == b[low:mid]:
            low = mid
        else:
            high = mid - 1
    return low


SUMMARY = (
    "## Decisions\n- Keep the rollout plan as agreed.\n## Open TODOs\n- Compare the replica "
    "lag after the backfill.\n## Constraints/Rules\n- Never paste credentials into a chat.\n"
    "## Pending user asks\n- {ask}\n## Exact identifiers\n{ids}"
)


class CachingModel:
    """The fake server's `default`: answers each call, and reports `cached_tokens` as the
    longest common prefix with the session's recent requests (the `prompt_cache_key`'s, or all
    requests without one: one session per run either way)."""

    def __init__(self) -> None:
        from gateway.model.tokenizer import load_counter

        self._count = load_counter("gpt-4o").count_text  # o200k, offline
        self._tokens: dict[str, int] = {}
        self._recent: dict[str, deque[tuple[list[str], list[int]]]] = {}
        self._last_chat: list[str] | None = None
        self.calls: list[dict[str, Any]] = []

    def count(self, part: str) -> int:
        hit = self._tokens.get(part)
        if hit is None:
            hit = self._tokens[part] = self._count(part)
        return hit

    def cached(self, parts: list[str], tokens: list[int], bucket: str) -> int:
        best = 0
        for old_parts, old_tokens in self._recent.get(bucket, ()):
            common = 0
            for i, (new, old) in enumerate(zip(parts, old_parts, strict=False)):
                if new == old:
                    common += tokens[i]
                    continue
                same = common_prefix(new, old)
                common += int(tokens[i] * same / max(1, len(new)))
                break
            best = max(best, min(common, old_tokens[-1]))
        return best // CACHE_BLOCK * CACHE_BLOCK if best >= CACHE_MIN else 0

    def __call__(self, body: dict[str, Any]) -> Any:
        from tests.fakes import reply

        kind = kind_of(body)
        dumps = json.dumps
        parts = [dumps(body.get("tools") or [], ensure_ascii=False)] + [
            dumps(m, ensure_ascii=False, sort_keys=True) for m in body["messages"]
        ]
        tokens = [self.count(p) for p in parts]
        prompt = sum(tokens)
        bucket = str(body.get("prompt_cache_key") or "")
        cached = self.cached(parts, tokens, bucket)
        recent = self._recent.setdefault(bucket, deque(maxlen=KEPT_PREFIXES))
        recent.append((parts, [*tokens[:-1], prompt]))
        broke = None
        if kind == "chat":
            last = self._last_chat
            broke = None if last is None else parts[: len(last)] != last
            self._last_chat = parts
        self.calls.append({"kind": kind, "prompt": prompt, "cached": cached, "broke": broke})
        usage = {"prompt_tokens": prompt, "prompt_tokens_details": {"cached_tokens": cached}}
        if kind == "summary":
            text = body["messages"][-1].get("content") or ""
            ids = re.findall(r"`([^`\n]+)`", text)[:20]
            asks = re.findall(r"Turn \d+\.", text)
            return reply(
                SUMMARY.format(
                    ask=asks[-1] if asks else "none",
                    ids="\n".join(f"- `{i}`" for i in ids) or "- none",
                ),
                usage=usage,
            )
        if kind == "flush":
            return reply("NO_REPLY", usage=usage)
        asked = body["messages"][-1].get("content") or ""
        match = re.match(r"Turn (\d+)\.", asked if isinstance(asked, str) else "")
        return reply(answer_text(int(match[1]) if match else -1), usage=usage)


# -- one run per process ----------------------------------------------------------------------


def gateway_config(base_url: str, data_dir: str, window: int, mode: str | None) -> Any:
    from gateway.config import parse_config

    context: dict[str, Any] = {"summary_timeout": 60}
    if mode is not None:  # today's code has no such setting
        context["small_overflow"] = mode
    return parse_config(
        {
            "gateway": {"data_dir": data_dir},
            "web": {"port": 0},
            "llm": {"base_url": base_url, "api_key": "x", "model": "gpt-4o", "stream": False,
                    "max_retries": 0, "timeout": 120},
            "models": {"gpt-4o": {"context_window": window}},
            "context": context,
            "memory": {"embeddings": False},
            "scheduler": {"enabled": False},
        },
        "prompt-cache bench",
    )


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    import logging

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


async def run_gateway(window: int, turns: int, mode: str | None) -> dict[str, Any]:
    """The conversation through a real gateway (webchat → gateway → fake model)."""
    from channels.webchat import WebchatChannel
    from gateway.app import Gateway
    from tests.fakes import FakeOpenAI

    model = CachingModel()
    async with FakeOpenAI(default=model) as fake:
        with tempfile.TemporaryDirectory(prefix="gatehouse-prompt-cache-") as data:
            config = gateway_config(fake.base_url, data, window, mode)
            config.workspace.mkdir(parents=True, exist_ok=True)
            (config.workspace / "AGENTS.md").write_text(AGENTS_MD, encoding="utf-8")
            gateway = Gateway(config)
            webchat = WebchatChannel(reply_timeout=300)
            gateway.add_channel(webchat)
            await gateway.start()
            try:
                for turn in range(turns):
                    answer = await webchat.submit(USER, user_text(turn))
                    if not answer.replies:
                        raise RuntimeError(f"turn {turn}: no reply ({answer.reason})")
                    fake.requests.clear()  # the model keeps what it needs
                    fake.request_headers.clear()
                session = await gateway.store.get_session(SESSION_KEY)
                compactions = 0
                if session is not None and session.id is not None:
                    compactions = len(await gateway.store.compactions(session.id))
            finally:
                await gateway.stop()
    return {"calls": model.calls, "compactions": compactions}


async def run_trim(window: int, turns: int) -> dict[str, Any]:
    """The same conversation, trimmed every turn by langchain_core's `trim_messages` to the
    usable tokens less the tool schemas, sent with the gateway's own system prompt and tools."""
    import openai
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
    from langchain_core.messages import trim_messages as lc_trim

    from context.budget import make_budget
    from context.types import Message
    from gateway.app import Gateway
    from gateway.model.tokenizer import load_counter
    from tests.fakes import FakeOpenAI

    model = CachingModel()
    counter = load_counter("gpt-4o")
    role = {"system": "system", "human": "user", "ai": "assistant"}
    counts: dict[int, int] = {}

    def count(messages: list[BaseMessage]) -> int:
        total = 0
        for m in messages:
            n = counts.get(id(m))
            if n is None:
                n = counts[id(m)] = counter.count_message(
                    Message(role=role[m.type], content=str(m.content))  # type: ignore[arg-type]
                )
            total += n
        return total

    async with FakeOpenAI(default=model) as fake:
        with tempfile.TemporaryDirectory(prefix="gatehouse-prompt-cache-") as data:
            config = gateway_config(fake.base_url, data, window, None)
            config.workspace.mkdir(parents=True, exist_ok=True)
            (config.workspace / "AGENTS.md").write_text(AGENTS_MD, encoding="utf-8")
            gateway = Gateway(config)
            await gateway.start()
            try:
                system = gateway.runner.system_prompt()
                tools = gateway.runner.prompts.tool_specs()[2]
                budget = make_budget(window, gateway.resolver.budget)
            finally:
                await gateway.stop()
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="x", max_retries=0)
        history: list[BaseMessage] = [SystemMessage(system)]
        limit = budget.usable - counter.count_tools(tools)
        try:
            for turn in range(turns):
                history.append(HumanMessage(user_text(turn)))
                sent = lc_trim(
                    history, max_tokens=limit, token_counter=count, strategy="last",
                    start_on="human", include_system=True, allow_partial=False,
                )
                wire: list[Any] = [
                    {"role": role[m.type], "content": str(m.content)} for m in sent
                ]
                done = await client.chat.completions.create(
                    model="gpt-4o", messages=wire, tools=tools,  # type: ignore[arg-type]
                )
                history.append(AIMessage(done.choices[0].message.content or ""))
                fake.requests.clear()
                fake.request_headers.clear()
        finally:
            await client.close()
    return {"calls": model.calls, "compactions": 0}


def summarize(variant: str, window: int, turns: int, run: dict[str, Any]) -> dict[str, Any]:
    calls = run["calls"]
    chats = [c for c in calls if c["kind"] == "chat"]
    side = [c for c in calls if c["kind"] != "chat"]
    prompt_chat = sum(c["prompt"] for c in chats)
    cached_chat = sum(c["cached"] for c in chats)
    prompt_all = sum(c["prompt"] for c in calls)
    cached_all = sum(c["cached"] for c in calls)
    breaks = sum(1 for c in chats if c["broke"])
    compactions = run["compactions"]
    return {
        "variant": variant,
        "label": LABELS[variant],
        "window": window,
        "turns": turns,
        "chat_calls": len(chats),
        "side_calls": len(side),
        "compactions": compactions,
        "prefix_breaks": breaks,
        "breaks_per_cycle": round(breaks / compactions, 2) if compactions else None,
        "input_tokens": prompt_all,
        "chat_input_tokens": prompt_chat,
        "cached_share_chat": round(cached_chat / prompt_chat, 4) if prompt_chat else 0.0,
        "cached_share_all": round(cached_all / prompt_all, 4) if prompt_all else 0.0,
        "input_cost": round(prompt_all - DISCOUNT * cached_all),
        "per_call_share": [round(c["cached"] / c["prompt"], 3) if c["prompt"] else 0.0
                           for c in chats],
    }


def child(variant: str, window: int, turns: int) -> dict[str, Any]:
    with quiet_logs():
        if variant == "trim":
            run = asyncio.run(run_trim(window, turns))
        else:
            run = asyncio.run(
                run_gateway(window, turns, None if variant == "today" else variant)
            )
    return summarize(variant, window, turns, run)


# -- the parent: every run in a process of its own, the table, the chart -----------------------


@contextlib.contextmanager
def baseline_code(commit: str) -> Iterator[str | None]:
    """An export of `commit` (today's code) in a temporary directory; None without git."""
    with tempfile.TemporaryDirectory(prefix="gatehouse-baseline-") as tmp:
        try:
            archive = subprocess.run(
                ["git", "archive", commit], cwd=ROOT, capture_output=True, check=True
            )
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"today's code ({commit}) not run: {exc}", file=sys.stderr)
            yield None
            return
        yield tmp


def run_child(variant: str, window: int, turns: int, code: str | None) -> dict[str, Any] | None:
    env = {**os.environ}
    env.pop("PROMPT_CACHE_CODE", None)
    if code is not None:
        env["PROMPT_CACHE_CODE"] = code
    with tempfile.TemporaryDirectory(prefix="gatehouse-prompt-cache-out-") as tmp:
        out = Path(tmp) / "run.json"
        began = time.perf_counter()
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", variant,
             "--windows", str(window), "--turns", str(turns), "--json", str(out)],
            cwd=code or ROOT, env=env, capture_output=True, text=True,
        )
        if done.returncode != 0 or not out.exists():
            print(f"{LABELS[variant]} at {window:,}: failed\n{done.stderr[-3000:]}",
                  file=sys.stderr)
            return None
        result: dict[str, Any] = json.loads(out.read_text())
    result["seconds"] = round(time.perf_counter() - began, 1)
    return result


def table(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    turns = rows[0]["turns"] if rows else 0
    t = Table(title=f"Prompt cache: a {turns}-turn webchat conversation, the fake model caching "
                    "by longest common prefix; cost = uncached + 10 % of cached input tokens")
    for name in ("window", "engine", "compactions", "prefix breaks", "breaks/cycle",
                 "cached, chat calls", "cached, all calls", "input Mtok", "cost Mtok",
                 "cost vs today"):
        if name == "engine":
            t.add_column(name, no_wrap=True)
        else:
            t.add_column(name, justify="right")
    for row in rows:
        today = next((r for r in rows if r["window"] == row["window"]
                      and r["variant"] == "today"), None)
        goal = GOALS.get(row["window"])
        share = f"{row['cached_share_chat']:.1%}"
        if goal is not None and row["variant"] == "compact":
            share += " ✓" if row["cached_share_chat"] >= goal else f" (goal {goal:.0%})"
        t.add_row(
            f"{row['window'] // 1024}k", row["label"], str(row["compactions"]),
            str(row["prefix_breaks"]),
            "—" if row["breaks_per_cycle"] is None else f"{row['breaks_per_cycle']:.2f}",
            share, f"{row['cached_share_all']:.1%}", f"{row['input_tokens'] / 1e6:.2f}",
            f"{row['input_cost'] / 1e6:.2f}",
            f"×{row['input_cost'] / today['input_cost']:.2f}" if today else "—",
        )
    return t


def draw_chart(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """The cached share of each chat call, one line per engine, one panel per window."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    windows = sorted({r["window"] for r in rows})
    if not windows:
        return None
    colors = {"compact": "#2b6cb0", "drop-blocks": "#38a169", "today": "#718096",
              "trim": "#c05621"}
    fig, axes = plt.subplots(len(windows), 1, figsize=(7.2, 2.6 * len(windows)), squeeze=False)
    for ax, window in zip(axes[:, 0], windows, strict=True):
        for row in (r for r in rows if r["window"] == window):
            shares = row["per_call_share"]
            ax.plot(range(1, len(shares) + 1), [s * 100 for s in shares],
                    color=colors[row["variant"]], linewidth=1.1,
                    label=f"{row['label']}: {row['cached_share_chat']:.0%}")
        ax.set_ylim(-3, 103)
        ax.set_ylabel("cached %")
        ax.set_title(f"{window // 1024}k window: share of each chat call's prompt read from cache",
                     fontsize=9)
        ax.legend(loc="lower left", fontsize=7)
    axes[-1, 0].set_xlabel("chat call")
    fig.tight_layout()
    path.parent.mkdir(exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--windows", default="32768,131072")
    parser.add_argument("--quick", action="store_true",
                        help="100 turns at 32k only (well under a minute)")
    parser.add_argument("--baseline", default=BASELINE, help="the commit of today's code")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    windows = [int(w) for w in args.windows.split(",")]
    if args.child:
        result = child(args.child, windows[0], args.turns)
        if args.json:
            args.json.write_text(json.dumps(result))
        return 0
    turns = args.turns
    if args.quick:
        windows, turns = [32_768], 100
    variants = [v for v in args.variants.split(",") if v]
    rows: list[dict[str, Any]] = []
    with baseline_code(args.baseline) as code:
        for window in windows:
            for variant in variants:
                if variant == "today" and code is None:
                    continue
                if variant == "trim":
                    try:
                        import langchain_core  # noqa: F401
                    except ImportError:
                        print("langchain-core not installed (the bench extra): trim_messages "
                              "not run", file=sys.stderr)
                        continue
                row = run_child(variant, window, turns, code if variant == "today" else None)
                if row is not None:
                    rows.append(row)
    from rich.console import Console

    Console(width=max(150, Console().width)).print(table(rows))
    if not args.quick:  # the report's chart is of the full run
        chart = draw_chart(rows, CHARTS / "prompt_cache.png")
        if chart is not None:
            print(f"chart: {chart.relative_to(ROOT)}")
    if args.json:
        args.json.write_text(json.dumps(
            {"turns": turns, "windows": windows, "baseline": args.baseline, "rows": rows},
            indent=2,
        ))
    missed = [
        r for r in rows if r["variant"] == "compact" and (
            (r["breaks_per_cycle"] or 0) > 1
            or r["cached_share_chat"] < GOALS.get(r["window"], 0.0)
        )
    ]
    return 1 if missed or len(rows) < len(windows) else 0


if __name__ == "__main__":
    sys.exit(main())
