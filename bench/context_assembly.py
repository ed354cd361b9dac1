"""Benchmark: assembling the next turn's prompt in a 10,000-message session.

A deterministic (seeded) transcript mixes English prose, Chinese, code blocks and assistant tool
calls with their results (some long, some failing). Every stored message is counted once with
the model's tiktoken counter, as the gateway does (counts are cached in the store), and that
one-time cost is reported apart. Then K turns are simulated: each appends a new user message,
and we time what the gateway does per turn — count the new message and
`DefaultContextEngine().assemble(...)` over the whole history — side by side, in the same run and
on the same transcript, with `langchain_core.messages.trim_messages(strategy="last")` using the
same tiktoken counts and the same token budget (`usable` = window - reserve). langchain's
`token_counter` recounts the messages it is given on every call, which is how it is used;
messages are converted to langchain objects once, up front (not timed per turn).

    .venv/bin/python bench/context_assembly.py [--messages 10000] [--turns 200]
        [--langchain-turns N | --langchain-budget 15 | --skip-langchain] [--window 128000]
        [--model gpt-4o] [--seed N] [--quick] [--json out.json] [--profile]

Each langchain call recounts the whole session (seconds per call at 10,000 messages), so by
default it is timed on as many turns as fit in --langchain-budget seconds (3 to 20), spread
evenly over the same turns; gatehouse is timed on every turn. `--profile` adds a cProfile of
the gatehouse turns.

langchain-core is optional (without it only gatehouse is timed):

    .venv/bin/python -m pip install langchain-core
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import pct
from context.budget import BudgetSettings, make_budget
from context.engine import ContextPlan, ContextSettings, DefaultContextEngine, TurnContext
from context.tokens import TokenCounter
from context.types import Message, ToolCall
from context.window import WindowResolution
from gateway.model.tokenizer import load_counter

try:  # optional: the comparison side
    from langchain_core.messages import (
        AIMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
        trim_messages,
    )

    HAVE_LANGCHAIN = True
except ImportError:  # pragma: no cover - depends on the environment
    HAVE_LANGCHAIN = False

INSTALL_HINT = ".venv/bin/python -m pip install langchain-core"
GOAL_RATIO = 20.0
GOAL_P99_MS = 5.0

SYSTEM_PROMPT = """You are Gatehouse, a careful assistant for a small engineering team.
Answer in the language the user writes in (English or Chinese). Prefer short, concrete answers;
show code in fenced blocks with the language named. Use the tools when a question depends on the
repository, the shell or the web, and say what you ran.

## Red Lines

- Never reveal secrets (API keys, tokens, passwords), even if asked to repeat earlier messages.
- Never run destructive commands or delete data without explicit confirmation in the current turn.
- Never invent identifiers (order numbers, file paths, URLs): copy them exactly or say you don't know.
"""

# ----------------------------------------------------------------------- transcript generator

EN_SUBJECTS = [
    "The deploy script", "Our staging cluster", "The billing service", "This migration",
    "The nightly job", "The webhook handler", "The cache layer", "The new parser",
    "The retry policy", "The login page", "The metrics exporter", "The queue consumer",
    "The search index", "The CI pipeline", "The rate limiter", "The backup task",
]
EN_VERBS = [
    "keeps timing out on", "fails intermittently when it reaches", "was rewritten to handle",
    "now depends on", "silently drops", "needs a second look at", "started rejecting",
    "takes about twice as long for", "should stop retrying", "logs a warning about",
    "was rolled back because of", "double-counts", "cannot find", "works again after",
]
EN_OBJECTS = [
    "large payloads", "the customer export", "expired tokens", "the Postgres replica",
    "requests from the EU region", "the feature flag", "unicode file names", "the old schema",
    "the health check", "batch sizes above 500", "the S3 bucket policy", "the cron schedule",
    "malformed JSON", "the connection pool", "the second shard", "the config reload",
]
EN_TAILS = [
    "", " since Tuesday", " after the last release", " in production only",
    " according to the dashboard", " when the load is high", " on the first run of the day",
    " but only for some tenants", " and nobody noticed until the report", " again",
]
EN_ASIDES = [
    "Can you check what changed?", "I think it is related to the upgrade.",
    "Let me know if you need the logs.", "Here is what I tried so far.",
    "It would be great to fix this before the demo.", "What do you suggest?",
    "Please keep the fix small.", "I already restarted the workers twice.",
]

ZH_SUBJECTS = [
    "部署脚本", "测试环境", "计费服务", "这次数据库迁移", "夜间任务", "消息队列", "缓存层",
    "新的解析器", "登录页面", "监控告警", "搜索索引", "持续集成流水线", "限流模块", "备份任务",
]
ZH_VERBS = [
    "在处理", "无法连接到", "最近经常超时，特别是", "已经重新实现了", "会错误地丢弃",
    "需要重新检查", "开始拒绝", "比以前慢了一倍，原因是", "不应该再重试", "报了一个警告，关于",
]
ZH_OBJECTS = [
    "大文件上传", "客户数据导出", "过期的令牌", "只读副本", "欧洲区域的请求", "功能开关",
    "中文文件名", "旧的表结构", "健康检查", "超过五百条的批量写入", "存储桶权限", "定时任务",
    "格式错误的请求体", "连接池配置", "第二个分片",
]
ZH_TAILS = [
    "。", "，从周二开始就这样了。", "，上次发布之后出现的。", "，只在生产环境出现。",
    "，负载高的时候更明显。", "，请帮忙看一下。", "，但是日志里没有看到错误。",
    "，我们已经重启过两次了。", "，能不能在演示之前修好？",
]

IDENTS = [
    "user", "order", "invoice", "session", "token", "payload", "batch", "record", "retry",
    "config", "queue", "shard", "cursor", "result", "export", "tenant", "metric", "bucket",
]
TOOLS = ["shell", "read_file", "web_search", "run_tests", "python"]


def _ident(rng: random.Random) -> str:
    return "_".join(rng.sample(IDENTS, rng.randint(1, 3)))


def english(rng: random.Random, sentences: int) -> str:
    out = []
    for _ in range(sentences):
        s = f"{rng.choice(EN_SUBJECTS)} {rng.choice(EN_VERBS)} {rng.choice(EN_OBJECTS)}"
        s += rng.choice(EN_TAILS)
        if rng.random() < 0.3:
            s += f" (about {rng.randint(2, 9_999):,} {rng.choice(['ms', 'rows', 'requests', 'MB'])})"
        out.append(s + ".")
        if rng.random() < 0.25:
            out.append(rng.choice(EN_ASIDES))
    return " ".join(out)


def chinese(rng: random.Random, sentences: int) -> str:
    out = []
    for _ in range(sentences):
        s = rng.choice(ZH_SUBJECTS) + rng.choice(ZH_VERBS) + rng.choice(ZH_OBJECTS)
        if rng.random() < 0.3:
            s += f"（大约 {rng.randint(2, 9_999)} 条记录）"
        out.append(s + rng.choice(ZH_TAILS))
    return "".join(out)


def python_code(rng: random.Random, functions: int) -> str:
    lines = ["import json", "from pathlib import Path", ""]
    for _ in range(functions):
        name, arg = _ident(rng), rng.choice(IDENTS)
        limit = rng.randint(10, 5_000)
        lines += [
            "",
            f"def {name}({arg}s: list[dict], limit: int = {limit}) -> dict[str, int]:",
            f'    """Group {arg}s by key, at most {limit} per group."""',
            "    counts: dict[str, int] = {}",
            f"    for item in {arg}s:",
            f"        key = str(item.get('{rng.choice(IDENTS)}_id', 'unknown'))",
            "        if counts.get(key, 0) >= limit:",
            "            continue",
            "        counts[key] = counts.get(key, 0) + 1",
            f"    Path('{rng.choice(IDENTS)}.json').write_text(json.dumps(counts))",
            "    return counts",
        ]
    return "\n".join(lines)


def other_code(rng: random.Random) -> tuple[str, str]:
    kind = rng.choice(["sql", "bash", "ts"])
    a, b = rng.choice(IDENTS), rng.choice(IDENTS)
    if kind == "sql":
        return kind, (
            f"SELECT {a}.id, count(*) AS n, max({b}.created_at) AS last_seen\n"
            f"FROM {a}s AS {a}\nJOIN {b}s AS {b} ON {b}.{a}_id = {a}.id\n"
            f"WHERE {a}.created_at > now() - interval '{rng.randint(1, 90)} days'\n"
            f"GROUP BY {a}.id\nHAVING count(*) > {rng.randint(1, 50)}\nORDER BY n DESC\n"
            f"LIMIT {rng.randint(10, 500)};"
        )
    if kind == "bash":
        return kind, (
            "set -euo pipefail\n"
            f"for f in /var/log/{a}/*.log; do\n"
            f"  grep -c '{b.upper()}' \"$f\" || true\ndone\n"
            f"kubectl -n {a} rollout restart deploy/{b}-worker\n"
            f"kubectl -n {a} rollout status deploy/{b}-worker --timeout={rng.randint(30, 300)}s"
        )
    return kind, (
        f"export async function fetch{a.title()}(id: string): Promise<{b.title()}[]> {{\n"
        f"  const res = await fetch(`/api/{a}s/${{id}}/{b}s?limit={rng.randint(10, 200)}`);\n"
        f"  if (!res.ok) throw new Error(`{a} ${{id}}: ${{res.status}}`);\n"
        f"  return (await res.json()) as {b.title()}[];\n}}"
    )


def code_block(rng: random.Random) -> str:
    if rng.random() < 0.6:
        return f"```python\n{python_code(rng, rng.randint(1, 3))}\n```"
    lang, code = other_code(rng)
    return f"```{lang}\n{code}\n```"


def traceback_text(rng: random.Random) -> str:
    frames = []
    for _ in range(rng.randint(2, 6)):
        frames.append(
            f'  File "/srv/app/{rng.choice(IDENTS)}/{_ident(rng)}.py", line {rng.randint(1, 900)},'
            f" in {_ident(rng)}\n    {_ident(rng)} = {_ident(rng)}({rng.choice(IDENTS)})"
        )
    err = rng.choice(["KeyError", "ValueError", "TimeoutError", "ConnectionRefusedError"])
    return (
        "Traceback (most recent call last):\n" + "\n".join(frames)
        + f"\n{err}: '{rng.choice(IDENTS)}_id' ({rng.randint(1, 99999)})"
    )


def log_lines(rng: random.Random, n: int) -> str:
    lines = []
    for i in range(n):
        level = rng.choice(["INFO", "INFO", "INFO", "DEBUG", "WARN"])
        lines.append(
            f"2025-03-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:"
            f"{rng.randint(0, 59):02d}Z {level} {rng.choice(IDENTS)}-worker[{rng.randint(1, 64)}] "
            f"{_ident(rng)} processed={rng.randint(0, 10_000)} took={rng.randint(1, 5_000)}ms "
            f"seq={i}"
        )
    return "\n".join(lines)


def tool_call_args(rng: random.Random, tool: str) -> dict[str, Any]:
    if tool == "shell":
        return {"command": f"kubectl -n {rng.choice(IDENTS)} logs deploy/{_ident(rng)} --tail=200"}
    if tool == "read_file":
        return {"path": f"src/{rng.choice(IDENTS)}/{_ident(rng)}.py"}
    if tool == "web_search":
        if rng.random() < 0.4:
            return {"query": chinese(rng, 1)[:30], "max_results": 5}
        return {"query": f"{rng.choice(EN_OBJECTS)} {rng.choice(EN_VERBS)}", "max_results": 5}
    if tool == "run_tests":
        return {"path": f"tests/test_{_ident(rng)}.py", "args": ["-x", "-q"]}
    return {"code": f"print(sum(len(x) for x in {_ident(rng)}))"}


def tool_result(rng: random.Random, tool: str, size: str, error: bool) -> str:
    """A tool output: size is "short" (a few hundred chars), "medium" (2-8k) or "long" (15-60k)."""
    n = {"short": rng.randint(3, 15), "medium": rng.randint(30, 100), "long": rng.randint(150, 600)}[
        size
    ]
    if tool == "read_file":
        body = python_code(rng, max(1, n // 10))
    elif tool == "web_search":
        items = [
            {
                "title": english(rng, 1)[:80] if rng.random() < 0.6 else chinese(rng, 1),
                "url": f"https://docs.example.com/{_ident(rng)}/{rng.randint(1, 999)}",
                "snippet": english(rng, 2) if rng.random() < 0.6 else chinese(rng, 2),
            }
            for _ in range(max(2, n // 3))
        ]
        body = json.dumps({"results": items}, ensure_ascii=False, indent=1)
    elif tool == "run_tests":
        body = "\n".join(
            f"tests/test_{_ident(rng)}.py::test_{_ident(rng)} PASSED" for _ in range(n)
        )
        body += f"\n{n} passed in {rng.uniform(0.2, 30):.2f}s"
    else:
        body = log_lines(rng, n)
    if error:
        if tool == "run_tests":
            body += f"\nFAILED tests/test_{_ident(rng)}.py::test_{_ident(rng)}\n" + traceback_text(rng)
        elif tool == "shell":
            body += f"\nError from server: {english(rng, 1)}\ncommand exited with code 1"
        else:
            body += "\n" + traceback_text(rng)
    return body


@dataclass
class TranscriptGenerator:
    """Deterministic turns: a user message, optional tool rounds, an assistant reply."""

    seed: int
    rng: random.Random = field(init=False)
    calls: int = 0
    stats: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def _bump(self, key: str) -> None:
        self.stats[key] = self.stats.get(key, 0) + 1

    def _prose(self, lo: int, hi: int) -> str:
        rng = self.rng
        if rng.random() < 0.3:
            self._bump("chinese")
            text = chinese(rng, rng.randint(lo, hi))
            if rng.random() < 0.3:  # code-switching
                text += " " + english(rng, 1)
            return text
        return english(rng, rng.randint(lo, hi))

    def user(self) -> Message:
        rng = self.rng
        text = self._prose(1, 5)
        if rng.random() < 0.15:
            self._bump("user_code")
            text += "\n\n" + code_block(rng)
        if rng.random() < 0.05:
            self._bump("user_pasted_log")
            text += "\n\n```\n" + log_lines(rng, rng.randint(5, 40)) + "\n```"
        return Message(role="user", content=text)

    def assistant(self) -> Message:
        rng = self.rng
        parts = [self._prose(2, 8)]
        if rng.random() < 0.35:
            self._bump("assistant_code")
            parts.append(code_block(rng))
            parts.append(self._prose(1, 3))
        return Message(role="assistant", content="\n\n".join(parts))

    def tool_round(self) -> list[Message]:
        rng = self.rng
        calls: list[ToolCall] = []
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            self.calls += 1
            tool = rng.choice(TOOLS)
            args = json.dumps(tool_call_args(rng, tool), ensure_ascii=False)
            calls.append(ToolCall(id=f"call_{self.calls:06d}", name=tool, arguments=args))
        text = self._prose(1, 2) if rng.random() < 0.4 else None
        out = [Message(role="assistant", content=text, tool_calls=tuple(calls))]
        for call in calls:
            r = rng.random()
            size = "short" if r < 0.75 else "medium" if r < 0.95 else "long"
            error = rng.random() < 0.15
            self._bump(f"tool_result_{size}")
            if error:
                self._bump("tool_result_error")
            out.append(
                Message(
                    role="tool",
                    content=tool_result(rng, call.name, size, error),
                    tool_call_id=call.id,
                    name=call.name,
                )
            )
        return out

    def turn(self) -> list[Message]:
        """One user turn; messages have no seq yet."""
        rng = self.rng
        out = [self.user()]
        if rng.random() < 0.35:
            for _ in range(rng.choice([1, 1, 2])):
                out += self.tool_round()
        out.append(self.assistant())
        return out


def with_seq(messages: Sequence[Message], first: int) -> list[Message]:
    return [
        Message(
            role=m.role, content=m.content, tool_calls=m.tool_calls,
            tool_call_id=m.tool_call_id, name=m.name, seq=first + i,
        )
        for i, m in enumerate(messages)
    ]


def build_session(gen: TranscriptGenerator, n: int) -> list[Message]:
    """Exactly `n` messages of whole turns (the last turn is shortened to a plain exchange)."""
    out: list[Message] = []
    while len(out) < n:
        turn = gen.turn()
        left = n - len(out)
        if len(turn) > left:  # don't cut a tool call from its result: close with plain messages
            turn = [gen.user() if i % 2 == 0 else gen.assistant() for i in range(left)]
        out += turn
    return with_seq(out, 1)


# ------------------------------------------------------------------------------- langchain


def to_langchain(m: Message) -> Any:
    text = m.text
    if m.role == "system":
        return SystemMessage(content=text)
    if m.role == "user":
        return HumanMessage(content=text)
    if m.role == "assistant":
        calls = [
            {"name": c.name, "args": json.loads(c.arguments), "id": c.id, "type": "tool_call"}
            for c in m.tool_calls
        ]
        return AIMessage(content=text, tool_calls=calls)
    return ToolMessage(content=text, tool_call_id=m.tool_call_id or "", name=m.name)


def langchain_counter(counter: TokenCounter) -> Callable[[list[Any]], int]:
    """A trim_messages token_counter: recounts every message it is given with `counter`
    (the same tiktoken encoding and the same per-message rules as gatehouse's counts)."""

    role = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}

    def one(m: Any) -> int:
        content = m.content if isinstance(m.content, str) else None
        calls = tuple(
            ToolCall(
                id=c["id"] or "", name=c["name"],
                arguments=json.dumps(c["args"], ensure_ascii=False),
            )
            for c in getattr(m, "tool_calls", None) or ()
        )
        return counter.count_message(
            Message(
                role=role[m.type],  # type: ignore[arg-type]
                content=content or None,
                tool_calls=calls,
                tool_call_id=getattr(m, "tool_call_id", None),
                name=m.name,
            )
        )

    def count(messages: list[Any]) -> int:
        return sum(one(m) for m in messages)

    return count


# ------------------------------------------------------------------------------------ runs


def summarize(times_ns: Sequence[int]) -> dict[str, float]:
    ms = [t / 1e6 for t in times_ns]
    return {
        "turns": len(ms),
        "p50_ms": pct(ms, 0.50),
        "p99_ms": pct(ms, 0.99),
        "mean_ms": statistics.fmean(ms),
        "max_ms": max(ms),
    }


@dataclass
class Turn:
    user: Message  # not yet counted: the gateway counts it in this turn
    rest: list[Message]  # the assistant's tool rounds and reply, stored with counts afterwards


def make_settings(counter: TokenCounter, window: int) -> ContextSettings:
    return ContextSettings(
        window=WindowResolution(tokens=window, source="bench"), counter=counter
    )


def gatehouse_turn(
    engine: DefaultContextEngine,
    counter: TokenCounter,
    settings: ContextSettings,
    history: list[Message],
    user: Message,
    model: str,
) -> ContextPlan:
    incoming = counter.ensure_counted([user])
    return engine.assemble(
        TurnContext(
            session_key="bench:session",
            system_prompt=SYSTEM_PROMPT,
            history=history,
            incoming=incoming,
            model=model,
            settings=settings,
        )
    )


def run_gatehouse(
    base: list[Message],
    turns: list[Turn],
    counter: TokenCounter,
    settings: ContextSettings,
    model: str,
    usable: int,
    check_at: set[int],
) -> dict[str, Any]:
    engine = DefaultContextEngine()
    history = list(base)
    stored = {m.seq: m.tokens for m in base}
    for _ in range(3):  # warm-up on the initial state (not timed)
        gatehouse_turn(engine, counter, settings, history, turns[0].user, model)
    times: list[int] = []
    per_turn: list[dict[str, Any]] = []
    problems: list[str] = []
    gc.collect()
    for i, turn in enumerate(turns):
        t0 = time.perf_counter_ns()
        plan = gatehouse_turn(engine, counter, settings, history, turn.user, model)
        t1 = time.perf_counter_ns()
        times.append(t1 - t0)
        tokens = plan.tokens.prompt if plan.tokens is not None else None
        # The runner stores every count in plan.counted under the message's id; a stored
        # message reported with a different count (a pruned copy) would overwrite its count.
        overwrites = sum(
            1 for m in plan.counted if m.seq in stored and stored[m.seq] != m.tokens
        )
        per_turn.append(
            {
                "turn": i,
                "ms": (t1 - t0) / 1e6,
                "messages": len(plan.messages),
                "tokens": tokens,
                "tier": plan.tier.value,
                "pruned_tool_results": plan.facts.pruned_tool_results if plan.facts else None,
                "dropped_turns": len(plan.facts.dropped_turns or ()) if plan.facts else 0,
                "counted": len(plan.counted),
                "counted_overwrites": overwrites,
            }
        )
        if plan.error:
            problems.append(f"turn {i}: error {plan.error}")
        elif not plan.messages or plan.messages[-1].seq != turn.user.seq:
            problems.append(f"turn {i}: the new user message is not the last message sent")
        if tokens is None or tokens > usable:
            problems.append(f"turn {i}: prompt tokens {tokens} > usable {usable}")
        if i in check_at:  # recount what is sent, ignoring every cached count
            recount = sum(counter.count_message(m) for m in plan.messages)
            per_turn[-1]["recounted_tokens"] = recount
            if recount > usable:
                problems.append(f"turn {i}: recounted prompt {recount} > usable {usable}")
        history.append(counter.ensure_counted([turn.user])[0])
        history.extend(turn.rest)
        stored.update((m.seq, m.tokens) for m in history[-1 - len(turn.rest) :])
    return {**summarize(times), "per_turn": per_turn, "problems": problems}


def run_langchain(
    base: list[Any],
    turns: list[tuple[Any, list[Any]]],
    count: Callable[[list[Any]], int],
    usable: int,
    requested: int,
    budget_s: float,
) -> dict[str, Any]:
    """Time trim_messages on `requested` turns spread evenly (0 = as many as the first call's
    time says fit in `budget_s` seconds, between 3 and 20)."""
    messages = list(base)
    times: list[int] = []
    per_turn: list[dict[str, Any]] = []
    problems: list[str] = []
    timed = {0}
    gc.collect()
    for i, (user, rest) in enumerate(turns):
        messages.append(user)
        if i in timed:
            t0 = time.perf_counter_ns()
            out = trim_messages(
                messages,
                max_tokens=usable,
                token_counter=count,
                strategy="last",
                start_on="human",
                include_system=True,
                allow_partial=False,
            )
            t1 = time.perf_counter_ns()
            times.append(t1 - t0)
            tokens = count(out)
            per_turn.append(
                {"turn": i, "ms": (t1 - t0) / 1e6, "messages": len(out), "tokens": tokens}
            )
            if not out or out[-1] is not user:
                problems.append(f"turn {i}: the new user message is not the last message kept")
            if not out or not isinstance(out[0], SystemMessage):
                problems.append(f"turn {i}: the system message was not kept")
            if tokens > usable:
                problems.append(f"turn {i}: prompt tokens {tokens} > usable {usable}")
            if i == 0:
                n = requested or max(3, min(20, int(budget_s / max((t1 - t0) / 1e9, 1e-9))))
                timed = set(spaced(len(turns), n))
        messages.extend(rest)
    return {**summarize(times), "per_turn": per_turn, "problems": problems}


def profile_gatehouse(
    base: list[Message],
    turns: list[Turn],
    counter: TokenCounter,
    settings: ContextSettings,
    model: str,
) -> str:
    engine = DefaultContextEngine()
    history = list(base)
    prof = cProfile.Profile()
    for turn in turns:
        prof.enable()
        gatehouse_turn(engine, counter, settings, history, turn.user, model)
        prof.disable()
        history.append(counter.ensure_counted([turn.user])[0])
        history.extend(turn.rest)
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf).strip_dirs()
    stats.sort_stats("tottime").print_stats(20)
    stats.sort_stats("cumulative").print_stats(25)
    return buf.getvalue()


# ------------------------------------------------------------------------------------ main


def spaced(k: int, n: int) -> list[int]:
    """`n` indices spread evenly over range(k), first and last included."""
    if n <= 0 or k <= 0:
        return []
    if n >= k:
        return list(range(k))
    if n == 1:
        return [k - 1]
    return sorted({round(j * (k - 1) / (n - 1)) for j in range(n)})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000, help="session length")
    parser.add_argument("--turns", type=int, default=200, help="turns timed for gatehouse")
    parser.add_argument(
        "--langchain-turns", type=int, default=0,
        help="turns timed for langchain, spread evenly over the same turns (each call recounts "
        "the whole session); 0 = as many as fit in --langchain-budget, 3 to 20",
    )
    parser.add_argument("--langchain-budget", type=float, default=15.0, metavar="SECONDS")
    parser.add_argument("--skip-langchain", action="store_true")
    parser.add_argument("--window", type=int, default=128_000, help="context window (tokens)")
    parser.add_argument("--model", default="gpt-4o", help="model whose tiktoken encoding counts")
    parser.add_argument("--seed", type=int, default=20_250_301)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--profile", action="store_true", help="cProfile the gatehouse turns")
    parser.add_argument(
        "--quick", action="store_true", help="3,000 messages, 50 turns, langchain budget 5 s"
    )
    args = parser.parse_args()
    if args.quick:
        args.messages, args.turns, args.langchain_budget = 3_000, 50, 5.0
    console = Console()
    if not console.is_terminal:
        console = Console(width=120)
    if args.turns < 1 or args.messages < 1:
        parser.error("--turns and --messages must be positive")

    counter = load_counter(args.model)
    if not counter.exact:
        console.print(f"[yellow]tiktoken unavailable: counting with {counter.name}[/]")
    budget = make_budget(args.window, BudgetSettings())
    usable = budget.usable
    settings = make_settings(counter, args.window)

    # 1. The transcript, and the turns to come (deterministic).
    t0 = time.perf_counter()
    gen = TranscriptGenerator(args.seed)
    raw = build_session(gen, args.messages)
    future_raw = [gen.turn() for _ in range(args.turns)]
    gen_s = time.perf_counter() - t0

    # 2. Count every stored message once (the gateway caches these counts in the store).
    t0 = time.perf_counter()
    base = counter.ensure_counted(raw)
    count_s = time.perf_counter() - t0
    seq = args.messages + 1
    turns: list[Turn] = []
    for msgs in future_raw:
        numbered = with_seq(msgs, seq)
        seq += len(numbered)
        turns.append(Turn(numbered[0], counter.ensure_counted(numbered[1:])))
    session_tokens = sum(m.tokens or 0 for m in base)
    by_role: dict[str, int] = {}
    for m in base:
        by_role[m.role] = by_role.get(m.role, 0) + 1

    check_at = set(spaced(args.turns, 5))
    gh = run_gatehouse(base, turns, counter, settings, args.model, usable, check_at)

    lc: dict[str, Any] | None = None
    convert_s = 0.0
    equivalence: str | None = None
    if HAVE_LANGCHAIN and not args.skip_langchain:
        # 3. Convert once, up front (not timed per turn).
        t0 = time.perf_counter()
        lc_base = [SystemMessage(content=SYSTEM_PROMPT), *(to_langchain(m) for m in base)]
        lc_turns = [(to_langchain(t.user), [to_langchain(m) for m in t.rest]) for t in turns]
        convert_s = time.perf_counter() - t0
        lc_count = langchain_counter(counter)
        # Same counts on both sides (a sample of each kind, plus the system prompt).
        rng = random.Random(args.seed)
        sample = rng.sample(range(len(base)), min(400, len(base)))
        mismatches = [
            i for i in sample if lc_count([lc_base[i + 1]]) != counter.count_message(base[i])
        ]
        system_same = lc_count([lc_base[0]]) == counter.count_message(
            Message(role="system", content=SYSTEM_PROMPT)
        )
        equivalence = (
            f"{len(sample) - len(mismatches)}/{len(sample)} sampled messages + system prompt "
            f"count the same on both sides" if not mismatches and system_same
            else f"COUNTS DIFFER: {len(mismatches)} of {len(sample)} sampled messages"
            + ("" if system_same else " and the system prompt")
        )
        lc = run_langchain(
            lc_base, lc_turns, lc_count, usable, args.langchain_turns, args.langchain_budget
        )

    # 4. Report.
    def mean_of(run: dict[str, Any], key: str) -> float:
        return statistics.fmean(t[key] for t in run["per_turn"])

    title = (
        f"context assembly: {args.messages:,}-message session ({session_tokens:,} tokens), "
        f"window {args.window:,}, usable {usable:,}, {counter.name}"
    )
    table = Table(title=title)
    for col in ("engine", "turns", "p50 ms", "p99 ms", "mean ms", "max ms",
                "msgs in prompt", "prompt tokens"):
        table.add_column(col, justify="left" if col == "engine" else "right")
    rows = [("gatehouse assemble", gh)]
    if lc is not None:
        rows.append(("langchain trim_messages", lc))
    for name, r in rows:
        table.add_row(
            name, str(r["turns"]), f"{r['p50_ms']:.3f}", f"{r['p99_ms']:.3f}",
            f"{r['mean_ms']:.3f}", f"{r['max_ms']:.3f}",
            f"{mean_of(r, 'messages'):.0f}", f"{mean_of(r, 'tokens'):,.0f}",
        )
    ratio_p50 = ratio_mean = None
    if lc is not None:
        ratio_p50 = lc["p50_ms"] / gh["p50_ms"]
        ratio_mean = lc["mean_ms"] / gh["mean_ms"]
        table.add_row(
            "ratio langchain/gatehouse", "", f"×{ratio_p50:,.1f}", "",
            f"×{ratio_mean:,.1f}", "", "", "", style="bold",
        )
    console.print(table)

    setup = Table(title="one-time costs (not in the per-turn times)")
    setup.add_column("step")
    setup.add_column("seconds", justify="right")
    setup.add_row("generate transcript + future turns", f"{gen_s:.2f}")
    setup.add_row(f"count {len(base):,} stored messages once (gatehouse caches)", f"{count_s:.2f}")
    if lc is not None:
        setup.add_row("convert to langchain messages once", f"{convert_s:.2f}")
    console.print(setup)

    tiers: dict[str, int] = {}
    for t in gh["per_turn"]:
        tiers[t["tier"]] = tiers.get(t["tier"], 0) + 1
    console.print(
        f"transcript: {dict(sorted(by_role.items()))}, {gen.calls:,} tool calls; "
        f"generator stats {dict(sorted(gen.stats.items()))}"
    )
    console.print(
        f"gatehouse tiers over the run: {tiers}; mean old tool results pruned per turn "
        f"{mean_of(gh, 'pruned_tool_results'):.1f}, mean turns dropped "
        f"{mean_of(gh, 'dropped_turns'):.1f}"
    )
    overwrites = mean_of(gh, "counted_overwrites")
    if overwrites:
        console.print(
            f"[yellow]note:[/] plan.counted holds {mean_of(gh, 'counted'):.1f} messages per turn, "
            f"{overwrites:.1f} of them stored messages with a different count (pruned copies): "
            "the runner would store those counts under the original message ids"
        )
    if lc is not None:
        console.print(f"counter check: {equivalence}")
        console.print(
            f"langchain timed on {lc['turns']} of the {args.turns} turns, spread evenly (each "
            "call recounts the session with tiktoken); gatehouse on all of them"
        )
    elif not HAVE_LANGCHAIN and not args.skip_langchain:
        console.print(
            f"[yellow]langchain-core is not installed: only gatehouse was timed. "
            f"Install it with: {INSTALL_HINT}[/]"
        )

    problems = gh["problems"] + (lc["problems"] if lc else [])
    goals = {
        "p99_under_5ms": gh["p99_ms"] < GOAL_P99_MS,
        "ratio_at_least_20x": (
            None if ratio_p50 is None or ratio_mean is None
            else min(ratio_p50, ratio_mean) >= GOAL_RATIO
        ),
        "sanity": not problems and (equivalence is None or "DIFFER" not in equivalence),
    }
    goal_table = Table(title="goals")
    goal_table.add_column("goal")
    goal_table.add_column("result")
    goal_table.add_column("met", justify="center")

    def mark(ok: bool | None) -> str:
        return "[yellow]n/a[/]" if ok is None else "[green]yes[/]" if ok else "[red]NO[/]"

    goal_table.add_row(
        f"gatehouse p99 < {GOAL_P99_MS:g} ms", f"{gh['p99_ms']:.3f} ms",
        mark(goals["p99_under_5ms"]),
    )
    goal_table.add_row(
        f"≥ {GOAL_RATIO:g}× faster than langchain (p50 and mean)",
        "-" if ratio_p50 is None else f"p50 ×{ratio_p50:,.1f}, mean ×{ratio_mean:,.1f}",
        mark(goals["ratio_at_least_20x"]),
    )
    goal_table.add_row(
        "sanity: newest user message kept, gatehouse prompt ≤ usable (recounted), same counts",
        "ok" if goals["sanity"] else f"{len(problems)} problem(s)",
        mark(goals["sanity"]),
    )
    console.print(goal_table)
    for p in problems[:20]:
        console.print(f"[red]problem:[/] {p}")

    if args.profile:
        console.print(profile_gatehouse(base, turns, counter, settings, args.model))

    if args.json:
        result = {
            "config": {
                "messages": args.messages, "turns": args.turns,
                "langchain_turns_requested": args.langchain_turns,
                "langchain_budget_s": args.langchain_budget, "window": args.window,
                "usable": usable, "model": args.model, "counter": counter.name,
                "seed": args.seed, "python": sys.version.split()[0],
            },
            "transcript": {
                "tokens": session_tokens, "by_role": by_role, "tool_calls": gen.calls,
                "generator": gen.stats,
            },
            "one_time_s": {
                "generate": gen_s, "count_once": count_s,
                "langchain_convert": convert_s if lc is not None else None,
            },
            "gatehouse": gh,
            "langchain": lc,
            "langchain_available": HAVE_LANGCHAIN,
            "ratio": {"p50": ratio_p50, "mean": ratio_mean},
            "counter_check": equivalence,
            "goals": goals,
        }
        args.json.write_text(json.dumps(result, indent=2, ensure_ascii=False))
    return 0 if all(v is not False for v in goals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
