"""Real-shaped agent runs: one ask followed by a long tool loop, as coding and operations agents
produce them (the commonest shape of real agent work, and the one a turn-level context engine
cannot cut).

`agent_run(rounds, seed, zh=False)` builds, deterministically, one user ask (English or
Chinese) followed by `rounds` tool rounds of a build-fixing agent: an assistant message with one
to three tool calls (`run_command`, `read_file`, `grep`, `http_get`, `edit_file`) and their
results, outputs from 1 KB to 50 KB (most of them a few KB, one in ten large), failing commands
with their exit codes in text (`exit code 2`, `Command failed with exit status 1`, `returncode=137`)
and in JSON (`{"exit_code": 2, "stderr": …}`), and in every round a planted identifier — a file
path, a CI URL, a commit hash, a run uuid or a ticket id — in the call's arguments or in its
output, the large ones deep inside it. A few rounds carry a line of the agent's own text.

The `AgentRun` it returns says what was planted (`identifiers`, `failures` with command and exit
code), so a test can check that after compaction each is in the prompt or one `history_search`
away, and `jsonl()` writes it as `gatehouse context compact` and `sessions import` read it.
`run_steps(run)` turns it into what a scripted fake model answers, round by round, for the live
path (`tool_call` steps), with the outputs a test tool returns (`outputs`).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from context.types import Message, ToolCall

__all__ = [
    "ASK_EN",
    "ASK_ZH",
    "FINAL",
    "SESSION_KEY",
    "AgentRun",
    "ImportResult",
    "LiveResult",
    "PlantedFailure",
    "agent_run",
    "agent_summary",
    "loop_model",
    "loop_tools",
    "prompt_problems",
    "request_tokens",
    "run_import",
    "run_live",
    "where_failure",
    "where_identifier",
]

ASK_EN = (
    "The nightly build of acme/billing on branch release/2026.12 has been red since Tuesday. "
    "Find out why, fix it on a branch, run the whole test suite, and open a PR against "
    "release/2026.12 that references BILL-4471. Do not touch the prod database and do not "
    "force-push."
)
ASK_ZH = (
    "acme/billing 的 release/2026.12 分支从周二开始夜间构建一直失败。请查明原因，在新分支上修复，"
    "跑完整个测试套件，然后向 release/2026.12 提一个引用 BILL-4471 的 PR。不要动生产数据库，"
    "也不要强制推送。"
)

_MODULES = (
    "invoices", "ledger", "payments", "refunds", "tax", "webhooks", "exports", "reconcile",
    "pricing", "dunning", "coupons", "usage",
)
_WORDS = (
    "retry backoff schema migration cache worker queue invoice ledger payment refund tax "
    "webhook export reconcile pricing timeout replica index rollout fixture assertion mock"
).split()
_FAIL_FORMS = ("text", "json", "status", "returncode")


@dataclass(frozen=True, slots=True)
class PlantedFailure:
    round: int
    tool: str
    command: str
    """The command (or path) the failing call was made with."""
    exit_code: int


@dataclass
class AgentRun:
    ask: str
    messages: list[Message]
    """The ask, then every round (assistant call message + its results), seq from 1."""
    identifiers: list[str] = field(default_factory=list)
    """One planted identifier per round, in round order (unique)."""
    failures: list[PlantedFailure] = field(default_factory=list)
    rounds: int = 0
    zh: bool = False

    def jsonl(self, system: str | None = None) -> str:
        lines = [json.dumps({"role": "system", "content": system})] if system else []
        lines += [json.dumps(m.to_openai(), ensure_ascii=False) for m in self.messages]
        return "\n".join(lines) + "\n"

    def round_messages(self, index: int) -> list[Message]:
        """Round `index` (0-based): its assistant message and its results."""
        start = self._starts[index]
        end = self._starts[index + 1] if index + 1 < len(self._starts) else len(self.messages)
        return self.messages[start:end]

    _starts: list[int] = field(default_factory=list, repr=False)


class _Gen:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def words(self, n: int) -> str:
        return " ".join(self.rng.choice(_WORDS) for _ in range(n))

    def sha(self, salt: str) -> str:
        return hashlib.sha1(f"{salt}{self.rng.random()}".encode()).hexdigest()

    def size(self) -> int:
        """Output bytes: most about 1 KB, one in ten up to 5 KB, one in fifty up to 50 KB
        (135 rounds come to about 75k tokens, as real runs of that length do)."""
        r = self.rng.random()
        if r < 0.88:
            return self.rng.randint(1_000, 1_400)
        if r < 0.98:
            return self.rng.randint(1_400, 5_000)
        return self.rng.randint(5_000, 50_000)

    def log_lines(self, size: int, module: str) -> list[str]:
        lines: list[str] = []
        total = 0
        n = 0
        while total < size:
            n += 1
            line = (
                f"{n:05d} {module}: {self.words(self.rng.randint(6, 14))} "
                f"({self.rng.randint(1, 999)} ms)"
            )
            lines.append(line)
            total += len(line) + 1
        return lines


def _plant(identifier: str, lines: list[str], rng: random.Random) -> None:
    """Put `identifier` on a line somewhere in the middle of `lines` (deep in a large one)."""
    at = len(lines) // 2 + rng.randint(-len(lines) // 4, len(lines) // 4) if lines else 0
    lines.insert(max(0, at), f"      note: see {identifier} for the earlier run")


def agent_run(rounds: int, seed: int = 11, zh: bool = False, final_reply: bool = False) -> AgentRun:
    """One ask, then `rounds` tool rounds (see the module docstring)."""
    rng = random.Random(seed * 1_000 + rounds + (7 if zh else 0))
    gen = _Gen(rng)
    ask = ASK_ZH if zh else ASK_EN
    messages: list[Message] = [Message(role="user", content=ask, seq=1)]
    run = AgentRun(ask=ask, messages=messages, rounds=rounds, zh=zh)
    seen: set[str] = set()
    call_no = 0

    def unique(make: Any) -> str:
        while True:
            value = str(make())
            if value not in seen:
                seen.add(value)
                return value

    for r in range(rounds):
        run._starts.append(len(messages))
        module = rng.choice(_MODULES)
        kind = r % 5
        planted = unique(lambda kind=kind, module=module, r=r: _identifier(gen, kind, module, r))
        run.identifiers.append(planted)
        failing = r % 9 == 4
        calls = 1 + (rng.random() < 0.15) + (rng.random() < 0.05)
        tool_calls: list[ToolCall] = []
        results: list[Message] = []
        text = None
        if rng.random() < 0.15:
            text = (
                f"步骤 {r + 1}：{gen.words(6)}" if zh else
                f"Step {r + 1}: {gen.words(8)}; checking {module} next."
            )
        for c in range(calls):
            call_no += 1
            call_id = f"call_{seed}_{call_no:06d}"
            planted_in_args = c == 0 and r % 2 == 0
            tool, args, output = _call(gen, rng, module, planted if planted_in_args else None)
            lines = gen.log_lines(gen.size(), module)
            if c == 0 and not planted_in_args:
                _plant(planted, lines, rng)
            body = "\n".join(lines)
            if output:
                body = output + "\n" + body
            meta: dict[str, Any] = {}
            if failing and c == 0:
                code = rng.choice((1, 2, 3, 124, 127, 137, 255))
                command = str(args.get("command") or args.get("path") or args.get("url"))
                run.failures.append(PlantedFailure(r, tool, command, code))
                form = _FAIL_FORMS[(r // 9) % len(_FAIL_FORMS)]
                error_line = f"FAIL {module}: {gen.words(5)}"
                if form == "json":
                    body = json.dumps({"exit_code": code, "stdout": body, "stderr": error_line})
                elif form == "status":
                    body = f"{body}\n{error_line}\nCommand failed with exit status {code}"
                elif form == "returncode":
                    body = f"{body}\n{error_line}\nreturncode={code}"
                else:
                    body = f"{body}\n{error_line}\nexit code {code}"
            tool_calls.append(ToolCall(call_id, tool, json.dumps(args, ensure_ascii=False)))
            results.append(
                Message(role="tool", content=body, tool_call_id=call_id, name=tool, meta=meta)
            )
        messages.append(Message(role="assistant", content=text, tool_calls=tuple(tool_calls)))
        messages.extend(results)
    if final_reply:
        messages.append(
            Message(
                role="assistant",
                content="完成了：PR 已提交。" if zh else "Done: the PR is open against release/2026.12.",
            )
        )
    run.messages = [
        Message(m.role, m.content, m.tool_calls, m.tool_call_id, m.name, seq=i + 1, meta=m.meta)
        for i, m in enumerate(messages)
    ]
    return run


def _identifier(gen: _Gen, kind: int, module: str, r: int) -> str:
    rng = gen.rng
    if kind == 0:
        return f"services/billing/{module}/handler_{rng.randint(100, 99_999)}.go"
    if kind == 1:
        return f"https://ci.acme.dev/acme/billing/builds/{rng.randint(100_000, 999_999)}"
    if kind == 2:
        return gen.sha(str(r))
    if kind == 3:
        return str(uuid.UUID(int=rng.getrandbits(128)))
    return f"BILL-{rng.randint(10_000, 99_999)}"


def _call(
    gen: _Gen, rng: random.Random, module: str, planted: str | None
) -> tuple[str, dict[str, Any], str]:
    """(tool, arguments, leading output line) of one call; `planted` goes into the
    arguments when given."""
    which = rng.choice(("run_command", "run_command", "read_file", "grep", "http_get", "edit_file"))
    target = planted
    if which == "read_file" or which == "edit_file":
        path = target if target and "/" in target and not target.startswith("http") else (
            f"services/billing/{module}/{gen.words(1)}_{rng.randint(1, 99)}.go"
        )
        args: dict[str, Any] = {"path": path}
        if which == "edit_file":
            args["old"] = gen.words(3)
            args["new"] = gen.words(3)
        if target and args["path"] != target:
            args["reason"] = f"follow-up to {target}"
        return which, args, f"--- {path}"
    if which == "http_get":
        url = target if target and target.startswith("http") else (
            f"https://ci.acme.dev/acme/billing/builds/{rng.randint(1_000, 99_999)}/log"
        )
        args = {"url": url}
        if target and url != target:
            args["ref"] = target
        return which, args, f"HTTP 200 {url}"
    if which == "grep":
        args = {"pattern": gen.words(1), "path": f"services/billing/{module}/"}
        if target:
            args["context"] = target
        return which, args, ""
    command = rng.choice(
        (
            f"go test ./services/billing/{module}/...",
            f"make -C services/billing {module}",
            f"git log --oneline -n 20 -- services/billing/{module}",
            "go vet ./...",
        )
    )
    if target:
        command += f"  # {target}"
    return "run_command", {"command": command}, f"$ {command}"


# -- the live path: a scripted model that keeps calling tools -----------------------------------

LOOP_TOOLS = ("run_command", "read_file", "grep", "http_get", "edit_file")
SESSION_USER = "builder"
SESSION_KEY = f"agent:main:webchat:direct:{SESSION_USER}"
FINAL = "Done: the nightly build is green again and the PR is open."


def agent_summary(text: str, lossy: bool = False) -> str:
    """What a summarizer writes from a compaction prompt `text`: the identifiers it was told
    to keep (a lossy one every second of them), the latest ask, the failures it saw."""
    from tests.fakes.transcripts import _listed_identifiers

    ids = _listed_identifiers(text)
    if lossy:
        ids = ids[::2]
    ask = re.search(r"The latest user ask \(quote it under ## Pending user asks\): (.+)", text)
    codes = sorted(set(re.findall(r"exit (?:code|status) (\d+)", text)))
    lines = [
        "## State\n- Fixing the nightly build of acme/billing, command by command.",
        "## Decisions\n- Work on a branch; run the whole suite before the PR.",
        "## Open TODOs\n- Open the PR against release/2026.12 referencing BILL-4471.",
        "## Constraints/Rules\n- Do not touch the prod database; never force-push.",
        "## Pending user asks\n- " + (ask.group(1).strip() if ask else "fix the nightly build"),
        "## Tool failures seen\n" + ("\n".join(f"- exit code {c}" for c in codes) or "- none"),
        "## Exact identifiers\n" + ("\n".join(f"- `{i}`" for i in ids) or "- none"),
    ]
    return "\n".join(lines)


def loop_model(
    run: AgentRun, kind: str, final: str = FINAL,
    prompt_tokens: Callable[[dict[str, Any]], int] | None = None,
) -> Callable[[dict[str, Any]], Any]:
    """The fake server's `default` for a live loop: chat requests get the run's rounds one
    after another (their calls' names and arguments), then `final`; summary requests behave
    as `kind` (good, lossy, empty, failing, hanging); the memory flush answers NO_REPLY.
    `prompt_tokens`: what the chat replies report as the prompt's size (default: the fake's
    estimate of four characters a token)."""
    from tests.fakes.openai_server import reply, tool_calls
    from tests.fakes.transcripts import (
        SUMMARIZER_KINDS,
        is_flush_request,
        is_summary_request,
        summary_step,
    )

    if kind not in SUMMARIZER_KINDS:
        raise ValueError(f"unknown summarizer kind {kind!r}")
    served = [0]

    def answer(body: dict[str, Any]) -> Any:
        if is_flush_request(body):
            return reply("NO_REPLY")
        if is_summary_request(body):
            return summary_step(kind, body, agent_summary)
        usage = None if prompt_tokens is None else {"prompt_tokens": prompt_tokens(body)}
        if served[0] >= run.rounds:
            return reply(final, usage=usage)
        calls = run.round_messages(served[0])[0].tool_calls
        served[0] += 1
        return tool_calls(*((c.name, c.arguments) for c in calls), usage=usage)

    return answer


def loop_tools(run: AgentRun) -> list[Any]:
    """The run's tools for a live gateway: each returns, call after call, the outputs the run
    planned for it (a failing command's output states its exit code, as real tools print it)."""
    from gateway.tools.registry import Tool, ToolContext

    queues: dict[str, list[str]] = {name: [] for name in LOOP_TOOLS}
    for m in run.messages:
        if m.role == "tool" and m.name:
            queues[m.name].append(m.text)
    for outputs in queues.values():
        outputs.reverse()

    def handler(name: str) -> Callable[[dict[str, Any], ToolContext], Awaitable[str]]:
        async def run_tool(_args: dict[str, Any], _ctx: ToolContext) -> str:
            return queues[name].pop() if queues[name] else "(no output)"

        return run_tool

    return [
        Tool(name, f"The build agent's {name}.", {"type": "object"}, handler(name))
        for name in LOOP_TOOLS
    ]


@dataclass
class LiveResult:
    usable: int
    chats: list[dict[str, Any]]
    """Every chat request the model received during the turn: the prompts."""
    reply: list[str]
    seconds: float
    searches: dict[str, str] = field(default_factory=dict)
    compactions: int = 0
    compaction_seconds: list[float] = field(default_factory=list)
    """How long each compaction of the turn took (its stored quality report)."""
    summary_calls: int = 0

    @property
    def final_prompt(self) -> list[dict[str, Any]]:
        return self.chats[-1]["messages"]


async def run_live(
    config: Any, fake: Any, run: AgentRun, kind: str, *,
    queries: Sequence[str] = (), reply_timeout: float = 600.0, agents_md: str | None = None,
) -> LiveResult:
    """Send the run's ask through webchat to a gateway whose model (`fake`, on `config`) keeps
    calling the run's tools round after round; record every prompt, then `history_search`
    each of `queries` in the session."""
    from channels.webchat import WebchatChannel
    from context.budget import make_budget
    from gateway.app import Gateway
    from gateway.tools.registry import ToolContext
    from tests.fakes.transcripts import is_flush_request, is_summary_request

    fake.default = loop_model(run, kind)
    if agents_md is not None:
        config.workspace.mkdir(parents=True, exist_ok=True)
        (config.workspace / "AGENTS.md").write_text(agents_md, encoding="utf-8")
    gateway = Gateway(config)
    for tool in loop_tools(run):
        gateway.tools.register(tool)
    webchat = WebchatChannel(reply_timeout=reply_timeout)
    gateway.add_channel(webchat)
    await gateway.start()
    try:
        before = len(fake.requests)
        started = time.perf_counter()
        answer = await webchat.submit(SESSION_USER, run.ask)
        seconds = time.perf_counter() - started
        requests = fake.requests[before:]
        chats = [r for r in requests if not is_summary_request(r) and not is_flush_request(r)]
        usable = make_budget(
            gateway.resolver.window().tokens, gateway.resolver.budget
        ).usable
        searches: dict[str, str] = {}
        ctx = ToolContext(session_key=SESSION_KEY)
        for query in dict.fromkeys(queries):
            result = await gateway.tools.call(
                "history_search", json.dumps({"query": query, "limit": 5}), ctx
            )
            searches[query] = result.content
        session = await gateway.store.get_session(SESSION_KEY)
        rows = []
        if session is not None and session.id is not None:
            rows = await gateway.store.compactions(session.id)
        return LiveResult(
            usable=usable, chats=chats, reply=answer.replies, seconds=seconds,
            searches=searches, compactions=len(rows),
            compaction_seconds=[float((r.quality or {}).get("seconds") or 0) for r in rows],
            summary_calls=sum(1 for r in requests if is_summary_request(r)),
        )
    finally:
        await gateway.stop()


# -- what survived --------------------------------------------------------------------------


def _hits(output: str) -> str:
    from tests.fakes.transcripts import search_hits

    return search_hits(output)


def where_identifier(identifier: str, prompt: str, searches: dict[str, str]) -> str:
    """"prompt" when `identifier` is in the prompt's text, "lookup" when one `history_search`
    of it returns it, else "lost"."""
    if identifier in prompt:
        return "prompt"
    if identifier in _hits(searches.get(identifier, "")):
        return "lookup"
    return "lost"


def where_failure(
    run: AgentRun, failure: PlantedFailure, prompt: str, searches: dict[str, str]
) -> str:
    """"prompt" when the prompt states the failing call with its exit code (verbatim, or a
    summary's failure line), "lookup" when one `history_search` of its round's identifier
    returns it with its exit code, else "lost"."""
    code = f"exit code {failure.exit_code}"
    command = json.dumps(failure.command, ensure_ascii=False)[1:-1]
    for line in prompt.splitlines():
        if code in line and command[:60] in line:
            return "prompt"
    outputs = [m.text for m in run.round_messages(failure.round)[1:2]]
    if outputs and outputs[0][-300:] in prompt:
        return "prompt"  # the round itself is in the prompt
    planted = run.identifiers[failure.round]
    hits = _hits(searches.get(planted, ""))
    if code in hits:
        return "lookup"
    return "lost"


def request_tokens(body: dict[str, Any], counter: Any) -> int:
    """A chat request's prompt tokens by `counter`: its messages and tool schemas."""
    from context.types import Message

    tokens = sum(counter.count_message(Message.from_openai(m)) for m in body["messages"])
    return int(tokens + counter.count_tools(body.get("tools") or []))


def prompt_problems(
    chats: Sequence[dict[str, Any]], ask: str, usable: int, counter: Any, red_line: str
) -> list[str]:
    """What each chat request (a prompt) breaks of the promise: over the usable tokens
    (`counter`: the gateway's token authority), without the ask verbatim or the red lines,
    a tool call without its result or a result without its call."""
    problems: list[str] = []
    for n, body in enumerate(chats):
        messages = body["messages"]
        tokens = request_tokens(body, counter)
        if tokens > usable:
            problems.append(f"prompt {n}: {tokens:,} tokens > {usable:,} usable")
        if not any(m["role"] == "user" and m.get("content") == ask for m in messages):
            problems.append(f"prompt {n}: the ask is not in it verbatim")
        if red_line not in (messages[0].get("content") or ""):
            problems.append(f"prompt {n}: the red lines are missing")
        calls = {c["id"] for m in messages for c in m.get("tool_calls") or ()}
        results = {m.get("tool_call_id") for m in messages if m["role"] == "tool"}
        if calls != results:
            problems.append(f"prompt {n}: orphaned tool messages {sorted(calls ^ results)[:3]}")
    return problems


@dataclass
class ImportResult:
    committed: bool
    message: str
    """What the operator is told (`describe_compaction`)."""
    prompt: list[Message]
    """The next model call's messages after the compaction."""
    tools: list[dict[str, Any]]
    pinned: list[Message]
    """The messages the summary pins, first in the history after it."""
    seconds: float
    """Of the compaction."""
    searches: dict[str, str] = field(default_factory=dict)


async def run_import(
    config: Any, fake: Any, run: AgentRun, kind: str, tmp: Any, *,
    queries: Sequence[str] = (), agents_md: str | None = None,
) -> ImportResult:
    """Import the run as a session and compact it, as `gatehouse sessions import` and
    `sessions compact` do (summarizer `kind` on `fake`); the prompt the session's next model
    call would carry, and `history_search` of each of `queries` in the session."""
    from gateway.app import Gateway
    from gateway.operations import import_messages
    from gateway.operations.compaction import compact
    from gateway.tools.registry import ToolContext

    path = tmp / "agent-run.jsonl"
    path.write_text(run.jsonl("You are a coding agent."), encoding="utf-8")
    fake.default = loop_model(run, kind)
    if agents_md is not None:
        config.workspace.mkdir(parents=True, exist_ok=True)
        (config.workspace / "AGENTS.md").write_text(agents_md, encoding="utf-8")
    gateway = Gateway(config)
    await gateway.start()
    try:
        key = "agent:main:import:direct:agent-run"
        await import_messages(gateway, path, key)
        started = time.perf_counter()
        outcome = await compact(gateway, key)
        seconds = time.perf_counter() - started
        session = await gateway.store.get_session(key)
        assert session is not None and session.id is not None
        view = await gateway.runner.view(session.id, use_cache=False)
        settings = gateway.runner.settings_for(session, None)
        plan = gateway.engine.assemble(gateway.runner.turn_context(key, view, 1 << 62, settings))
        pinned = [m for m in view.history if view.summary and (m.seq or 0) <= view.summary.last_seq]
        ctx = ToolContext(session_key=key)
        searches: dict[str, str] = {}
        for query in dict.fromkeys(queries):
            found = await gateway.tools.call(
                "history_search", json.dumps({"query": query, "limit": 5}), ctx
            )
            searches[query] = found.content
        return ImportResult(
            outcome.committed, outcome.message, list(plan.messages), gateway.tools.specs(),
            pinned, seconds, searches,
        )
    finally:
        await gateway.stop()
