"""Identifier-heavy operations-agent transcripts, and the harness that runs one through a real
gateway: the compaction promise's test (tests/gateway/turn/test_compaction_promise.py) and its
benchmark (bench/compaction.py) share both.

`generate(seed)` builds, deterministically, a ~59k-token (gpt-4o tiktoken) chat between an
on-call engineer and an operations agent over 106 user turns, in English and Chinese:

- three big tool outputs full of row numbers, order ids, hosts, paths and uuids: an orders CSV
  (24 KB), a worker log whose successful read is full of ERROR lines (50 KB), an invoice
  reconciliation CSV (12 KB); ~27k tokens together (CSV rows cost ~2.7 characters a token, so
  the bytes are below "~50 KB each" to keep the total near 59k);
- ~27k tokens of the conversation's own text: more than a 32k window's usable 24k, so pruning
  tool outputs alone cannot make it fit and compaction must run at 16k and 32k (not at 128k);
- tool failures with exit codes in the forms tools print them (`{"exit_code": 2, "stderr":
  ...}`, `returncode=1`, `[exit 1]`, `exit code 137`, `exit status 255`);
- planted decisions with their reasons, TODOs, constraints ("Never ...", "Always ...", and in
  Chinese) and pending asks; identifiers said in prose (`github.com/acme/infra-config`,
  `release/2026.12`), in tool arguments and in failures.

The last message is the latest user ask. The `Transcript` it returns lists what was planted, and
an `exam` of 30 questions an agent should still be able to answer after compaction, each with
the term it would search for.

`run_case(...)` imports the transcript (all but the latest ask) as a session with the
`sessions import` operation, sends the latest ask through webchat like any inbound message, lets
the gateway compact on its own and records the chat request the fake model receives: the next
prompt. `summarizer_fake(kind, transcript)` is the fake model for each summarizer behaviour:
good, lossy, empty, failing, hanging.
"""

from __future__ import annotations

import json
import random
import re
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from context.types import Message, ToolCall

__all__ = [
    "AGENTS_MD",
    "RED_LINES",
    "SECTION_HEADINGS",
    "SUMMARIZER_KINDS",
    "CaseResult",
    "Decision",
    "ExamQuestion",
    "Fact",
    "Failure",
    "Transcript",
    "case_queries",
    "case_summary_timeout",
    "generate",
    "is_flush_request",
    "is_summary_request",
    "promise_config",
    "promise_sections",
    "prompt_text",
    "run_case",
    "search_hits",
    "summarizer_fake",
    "summary_step",
]

SECTION_HEADINGS = (
    "## Decisions",
    "## Open TODOs",
    "## Constraints/Rules",
    "## Pending user asks",
    "## Exact identifiers",
)

RED_LINES = (
    "- Never run `terraform apply` or `helm uninstall` against the prod cluster from this agent.\n"
    "- Never paste customer personal data (names, e-mails, card digits) into tickets or chats.\n"
    "- Never print or store secrets; refer to them by their vault path."
)

AGENTS_MD = f"""# AGENTS.md — billing on-call agent

You help the billing on-call engineer at ACME operate the billing platform.

## Session Startup

- Read the runbook before touching prod: https://wiki.acme.io/ops/billing/runbook

## Red Lines

{RED_LINES}

## Style

- Short answers; quote identifiers exactly.
"""


# -- what is planted ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decision:
    key: str
    """A phrase that must survive (what was decided)."""
    reason: str
    """The phrase that carries why."""
    text: str
    """The sentence as said."""


@dataclass(frozen=True, slots=True)
class Fact:
    """A TODO, a constraint or a pending ask: `key` must survive; `text` is the sentence."""

    key: str
    text: str


@dataclass(frozen=True, slots=True)
class Failure:
    command: str
    exit_code: int
    form: str
    """How the tool printed the exit code, e.g. `returncode=1`."""
    key: str
    """A distinctive part of the command (what an agent would search for)."""


def exit_code_pattern(code: int) -> str:
    """An exit code in any of the forms tools and summaries write it (`exit code 2`,
    `"exit_code": 2`, `returncode=2`, `[exit 2]`, `exit status 2`, `exited with 2`)."""
    return rf"(?:exit|exited|returncode|status|code)[^0-9a-z]{{0,12}}(?:with[^0-9a-z]{{1,3}})?{code}(?!\d)"


@dataclass(frozen=True, slots=True)
class ExamQuestion:
    """One recall question: `answer` is a planted fact; `key_term` what an agent would search
    for; `needles` the regular expressions (case-insensitive) that must all match the text that
    answers it. Unpacks as `(question, key_term, answer)`."""

    question: str
    key_term: str
    answer: str
    kind: str
    needles: tuple[str, ...]

    def __iter__(self) -> Iterator[str]:
        return iter((self.question, self.key_term, self.answer))

    def answered_by(self, text: str) -> bool:
        flat = " ".join(text.split())
        return all(re.search(n, flat, re.IGNORECASE) for n in self.needles)


@dataclass(frozen=True, eq=False)
class Transcript:
    seed: int
    messages: list[Message]
    identifiers: list[str]
    decisions: list[Decision]
    todos: list[Fact]
    constraints: list[Fact]
    pending_asks: list[Fact]
    failures: list[Failure]
    latest_ask: str
    exam: list[ExamQuestion]

    @property
    def history(self) -> list[Message]:
        """Everything before the latest ask (what is imported as the session)."""
        return self.messages[:-1]

    def jsonl(self) -> str:
        """The history as an OpenAI-format JSONL transcript (`gatehouse sessions import`)."""
        return "".join(
            json.dumps(m.to_openai(), ensure_ascii=False) + "\n" for m in self.history
        )


def _needle(text: str) -> str:
    """A literal needle, tolerant of the whitespace a summary may reflow."""
    return r"\s*".join(re.escape(w) for w in text.split()) if text.strip() else re.escape(text)


# -- text material ------------------------------------------------------------------------------

EN_FILLER = (
    "I checked the dashboards again and the error budget for the month is at 61 percent.",
    "The change freeze starts Thursday at 18:00 CET, so anything risky has to land before.",
    "Finance asked for the numbers by end of day, but they care about totals, not row level.",
    "The pager went off twice overnight; both were the same alert flapping on latency.",
    "Let's keep notes in the incident doc as we go so the handover is painless.",
    "Capacity looks fine on the API tier; the workers are the ones under pressure.",
    "The vendor's status page says degraded performance in eu-west since 01:50 UTC.",
    "I'd rather fix this properly than add another retry loop on top of the retries.",
    "Support has three tickets open from merchants asking about delayed captures.",
    "The last time this happened the root cause was a stuck advisory lock in the ledger.",
)
ZH_FILLER = (
    "我刚看了监控面板，本月的错误预算已经用掉了百分之六十一。",
    "周四晚上六点（CET）开始封版，有风险的改动必须在那之前合进去。",
    "财务今天下班前要数字，不过他们只关心总额，不看逐行明细。",
    "昨晚告警响了两次，都是同一个延迟告警在来回抖动。",
    "我们边做边把笔记写进事故文档，交接的时候会轻松很多。",
    "API 层容量没问题，压力主要在 worker 那边。",
    "供应商的状态页显示 eu-west 从 UTC 01:50 开始性能下降。",
    "我宁愿把问题真正修好，也不想在重试上面再套一层重试。",
    "客服那边有三个商户工单在问扣款延迟的事。",
    "上次出现这种情况，根因是账本里一个卡住的 advisory lock。",
)
ASSISTANT_FILLER = (
    "Noted; I will keep the incident doc updated with each step and its outcome.",
    "Understood. I'll stay read-only on prod unless you explicitly ask for a change.",
    "That matches what the metrics show: the spike lines up with the worker restarts.",
    "好的，我会把每一步和结果都记到事故文档里。",
    "明白，除非你明确要求，否则我对生产环境只做只读操作。",
)
REGIONS = ("eu-west-1", "eu-central-1", "us-east-1", "ap-southeast-1")
MERCHANTS = (
    "Northwind GmbH", "Contoso Retail", "Fabrikam Outdoor", "Tailspin Toys", "Wide World Imports",
    "Adventure Works", "Litware Books", "Proseware Labs",
)
NOTES = (
    "settled by the nightly batch", "captured on first attempt", "customer asked for invoice copy",
    "partial refund pending review", "retried after gateway timeout", "manual capture by support",
    "flagged by fraud rules then cleared", "merchant changed the delivery address",
)
LOG_EVENTS = (
    "invoice rendered and queued for delivery to the merchant's billing contact",
    "ledger write acknowledged by the primary after the settlement window closed",
    "settlement batch closed without warnings and the summary was handed to finance",
    "customer notification sent through the mailer with the updated delivery estimate",
    "capture confirmed by the payment gateway and recorded against the open invoice",
    "tax lines recomputed after the address change and the invoice was rendered again",
    "retry scheduled with exponential backoff because the gateway asked us to slow down",
    "webhook from the payment provider accepted and matched to the pending capture",
)
HOSTS = (
    "billing-api-03.acme.internal", "billing-api-07.acme.internal", "ledger-01.acme.internal",
    "kafka-2.acme.internal:9092", "redis-billing.acme.internal:6379", "mailer.acme.internal",
    "payments-gw.acme.internal:8443", "pgbouncer-eu.acme.internal:6432",
)
METRICS = ("p99 latency", "error rate", "queue depth", "CPU", "connection count", "GC pauses")
QUEUES = ("billing.invoices.v2", "billing.captures", "ledger.postings", "mailer.outbound")
SETTINGS = ("worker_batch_size", "capture_retry_limit", "ledger_flush_ms", "api_pool_size")
CHAT_STATUSES = ("pending_capture", "captured", "awaiting 3-D Secure", "refund_requested")
USER_EN = (
    "Quick one: what does {host} say about {metric} right now?",
    "Status for the incident doc: {order} is still {status}, and {pod} restarted {n} times "
    "since {time}.",
    "Merchant {merchant} is asking about {order} again; what can I tell them?",
    "Look at {path} and tell me whether {setting} changed since commit {commit}.",
    "The queue {queue} has {k} messages waiting; is that normal for this hour?",
    "Can you compare {metric} on {host} with yesterday at {time}?",
)
USER_ZH = (
    "{host} 现在的 {metric} 怎么样？",
    "事故文档更新一下：{order} 还是 {status}，{pod} 从 {time} 起重启了 {n} 次。",
    "商户 {merchant} 又在问 {order} 的情况，我该怎么回复？",
    "看一下 {path}，{setting} 这个值从提交 {commit} 之后有没有变？",
    "{queue} 队列里现在积压了 {k} 条消息，这个时间点正常吗？",
)
ASSISTANT_EN = (
    "{host} reports {metric} at {value} over the last 15 minutes, inside the normal band for "
    "this time of day.",
    "{order} is {status}; the last attempt went through {host} at {time} and got HTTP {http}.",
    "I compared {path} with commit {commit}: {setting} is unchanged at {value}.",
    "{queue} is draining at about {k} messages a minute, so it should be empty within the hour.",
    "Nothing here needs action yet; I will keep watching {pod} and tell you if it restarts again.",
    "For the incident doc: {order} ({merchant}) is {status}, retried {n} times, last at {time}.",
    "The dashboards for {host} show {metric} flat since {time}; the spike we saw earlier is gone.",
)
ASSISTANT_ZH = (
    "{host} 最近 15 分钟的 {metric} 是 {value}，在这个时段的正常范围内。",
    "{order} 目前是 {status}；最后一次尝试在 {time} 经过 {host}，返回 HTTP {http}。",
    "我对比了 {path} 和提交 {commit}：{setting} 没有变化，仍然是 {value}。",
    "{queue} 每分钟大约消化 {k} 条，一小时内应该能清空。",
    "目前不需要处理；我会继续盯着 {pod}，如果再重启会告诉你。",
)
STATUSES = ("captured", "captured", "captured", "settled", "settled", "refunded", "failed")


class _Builder:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.messages: list[Message] = []
        self._calls = 0
        self._round = 0

    def uuid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def hexid(self, n: int) -> str:
        while True:
            value = f"{self.rng.getrandbits(4 * n):0{n}x}"
            if re.search(r"\d", value) and re.search(r"[a-f]", value):
                return value

    def customer(self) -> str:
        letters = "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
        chars = [self.rng.choice(letters) for _ in range(9)] + [
            self.rng.choice("23456789") for _ in range(3)
        ]
        self.rng.shuffle(chars)
        return "cus_" + "".join(chars)

    def filler(self, zh: bool = False, n: int = 2) -> str:
        pool = ZH_FILLER if zh else EN_FILLER
        return (" " if not zh else "").join(self.rng.sample(pool, n))

    def slots(self) -> dict[str, Any]:
        r = self.rng
        return {
            "host": r.choice(HOSTS),
            "metric": r.choice(METRICS),
            "order": f"ORD-{r.randint(10_000, 79_999)}",
            "status": r.choice(CHAT_STATUSES),
            "pod": f"billing-worker-5f7c9d8b6-{self.hexid(5)}",
            "n": r.randint(2, 9),
            "time": f"{r.randint(0, 11):02d}:{r.randint(0, 59):02d}Z",
            "merchant": r.choice(MERCHANTS),
            "path": f"/srv/billing/releases/2026.12.{r.randint(0, 3)}/{r.choice(['worker', 'api', 'ledger'])}.yaml",
            "setting": r.choice(SETTINGS),
            "commit": self.hexid(9),
            "queue": r.choice(QUEUES),
            "k": r.randint(40, 9_000),
            "value": f"{r.randint(2, 950)}{r.choice(['ms', '%', ''])}",
            "http": r.choice((200, 202, 402, 409, 502, 503)),
        }

    def chatter(self, rounds: int) -> None:
        """Everyday on-call back-and-forth (no planted fact), half of it with a small tool
        output: what makes a day's session long."""
        for _ in range(rounds):
            self._round += 1
            zh = self._round % 3 == 0
            v = self.slots()
            ask = self.rng.choice(USER_ZH if zh else USER_EN).format(**v)
            self.user(ask + (" " if not zh else "") + self.filler(zh, 2))
            if self._round % 4 == 0:
                self.tool(
                    "run_command",
                    {"cmd": f"kubectl -n billing get pods -l app=billing-worker -o wide  # {v['time']}"},
                    "\n".join(
                        f"billing-worker-5f7c9d8b6-{self.hexid(5)}   1/1   Running   "
                        f"{self.rng.randint(0, 3)}   {self.rng.randint(1, 59)}m   "
                        f"10.40.{self.rng.randint(1, 250)}.{self.rng.randint(1, 250)}"
                        for _ in range(5)
                    ),
                )
            pool = ASSISTANT_ZH if zh else ASSISTANT_EN
            picked = self.rng.sample(pool, 5)
            said = [t.format(**{**v, **self.slots(), "order": v["order"]}) for t in picked]
            self.assistant(("" if zh else " ").join(said) + (" " if not zh else "") + self.filler(zh, 2))

    def user(self, text: str) -> None:
        self.messages.append(Message(role="user", content=text))

    def assistant(self, text: str) -> None:
        self.messages.append(Message(role="assistant", content=text))

    def tool(self, name: str, args: dict[str, Any], output: str, text: str | None = None) -> None:
        """One tool round: the assistant's call (with optional text) and its result."""
        self._calls += 1
        call = ToolCall(
            id=f"call_{self._calls:03d}_{self.hexid(8)}",
            name=name,
            arguments=json.dumps(args, ensure_ascii=False),
        )
        self.messages.append(Message(role="assistant", content=text, tool_calls=(call,)))
        self.messages.append(
            Message(role="tool", tool_call_id=call.id, name=name, content=output)
        )


def _orders_csv(b: _Builder, planted: dict[int, tuple[str, str, str]], size: int) -> str:
    """An orders export: `row,order_id,customer_id,status,...`, `size` bytes or a bit more."""
    lines = ["row,order_id,customer_id,status,amount_eur,region,merchant,api_host,note"]
    row = 4001
    total = len(lines[0])
    while total < size:
        if row in planted:
            order, customer, status = planted[row]
        else:
            order = f"ORD-{b.rng.randint(10_000, 79_999)}"
            customer = b.customer()
            status = b.rng.choice(STATUSES)
        line = (
            f"{row},{order},{customer},{status},{b.rng.randint(5, 4_000)}.00,"
            f"{b.rng.choice(REGIONS)},{b.rng.choice(MERCHANTS)},"
            f"billing-api-{b.rng.randint(1, 12):02d}.acme.internal,{b.rng.choice(NOTES)}"
        )
        lines.append(line)
        total += len(line) + 1
        row += 1
    assert all(r < row for r in planted), "the planted rows must fit in the export"
    return "\n".join(lines)


def _worker_log(b: _Builder, pod: str, planted_error: str, size: int) -> str:
    """A worker log, read successfully, with ERROR lines in its body."""
    out = [f"[fetch_logs] ok: {pod} /var/log/billing/worker.log since 2026-12-03T02:00:00Z"]
    total = len(out[0])
    second = 0
    planted_at = size // 3
    while total < size:
        second += b.rng.randint(1, 4)
        stamp = f"{2 + second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}"
        if planted_error and total >= planted_at:
            line = f"{stamp} {planted_error}"
            planted_error = ""
        elif b.rng.random() < 0.08:
            line = (
                f"{stamp} ERROR {pod} [req={b.uuid()}] upstream timeout after 5000ms talking to "
                f"payments-gw.acme.internal:8443 for ORD-{b.rng.randint(10_000, 79_999)}"
            )
        else:
            line = f"{stamp} INFO  invoice_sync: {b.rng.choice(LOG_EVENTS)}"
            if b.rng.random() < 0.3:
                line += f" (ORD-{b.rng.randint(10_000, 79_999)}, {b.rng.choice(MERCHANTS)})"
        out.append(line)
        total += len(line) + 1
    out.append("[fetch_logs] exit 0, end of log")
    return "\n".join(out)


def _invoice_csv(b: _Builder, planted: dict[int, str], size: int) -> str:
    lines = ["row,invoice_id,order_id,merchant,expected_eur,ledger_eur,delta_eur,check"]
    total = len(lines[0])
    row = 1
    while total < size:
        if row in planted:
            line = planted[row]
        else:
            expected = b.rng.randint(5, 3_000)
            delta = 0 if b.rng.random() < 0.97 else b.rng.randint(-90, 90)
            check = "matches the ledger" if delta == 0 else "mismatch, needs review"
            line = (
                f"{row},INV-2026-{b.rng.randint(1, 29_999):07d},ORD-{b.rng.randint(10_000, 79_999)},"
                f"{b.rng.choice(MERCHANTS)},{expected}.00,{expected + delta}.00,{delta}.00,{check}"
            )
        lines.append(line)
        total += len(line) + 1
        row += 1
    assert all(r < row for r in planted), "the planted rows must fit in the reconciliation"
    return "\n".join(lines)


# -- the transcript -----------------------------------------------------------------------------


@lru_cache(maxsize=4)
def generate(
    seed: int = 20261203,
    output_bytes: tuple[int, int, int] = (24_000, 50_000, 12_000),
    chatter_rounds: int = 80,
) -> Transcript:
    """The transcript for `seed` (the same every time for the same arguments).

    `output_bytes`: the sizes of the three big tool outputs (orders CSV, worker log, invoice
    CSV); `chatter_rounds`: everyday rounds spread between the planted episodes (they make the
    conversation's own text, which no tool-output pruning can shrink, outgrow a 32k window)."""
    rng = random.Random(seed)
    b = _Builder(rng)
    gaps = 19
    gap = [chatter_rounds // gaps + (1 if i < chatter_rounds % gaps else 0) for i in range(gaps)]
    ids: list[str] = []

    def ident(value: str) -> str:
        if value not in ids:
            ids.append(value)
        return value

    decisions: list[Decision] = []
    todos: list[Fact] = []
    constraints: list[Fact] = []
    asks: list[Fact] = []
    failures: list[Failure] = []

    def decision(key: str, reason: str, text: str) -> str:
        assert key in text and reason in text, (key, reason)
        decisions.append(Decision(key, reason, text))
        return text

    def fact(into: list[Fact], key: str, text: str) -> str:
        assert key in text, key
        into.append(Fact(key, text))
        return text

    repo = ident("github.com/acme/infra-config")
    branch = ident("release/2026.12")
    export = ident("s3://acme-billing-exports/2026/12/orders-2026-12-02.csv")
    stuck = [ident("ORD-88123"), ident("ORD-88507"), ident("ORD-88940")]
    stuck_rows = (4067, 4118, 4153)
    customers = [ident(b.customer()) for _ in stuck]
    primary = ident("db-primary-03.acme.internal:5432")
    primary_ip = ident("10.40.12.7")
    replica = ident("db-replica-07.acme.internal")
    config_path = ident("/srv/billing/releases/2026.12.1/config.yaml")
    commit = ident(b.hexid(10))
    pr_url = ident("https://github.com/acme/infra-config/pull/1482")
    log_path = ident("/var/log/billing/worker.log")
    pod = ident(f"billing-worker-5f7c9d8b6-{b.hexid(5)}")
    first_req = ident(b.uuid())
    refund_order = ident("ORD-90211")
    values_file = ident("./charts/billing-api/values-prod.yaml")
    invoice = ident("INV-2026-0031337")
    invoice_twin = ident("INV-2026-0031338")
    ledger = ident("/ledger/2026/12/eu-west-1/batch-417.parquet")
    tls_ticket = ident("INC-4821")
    jira = ident("OPS-1377")
    plan_file = ident("/tmp/plan-2026-12-03.tfplan")
    lock_id = ident(b.uuid())
    lock_holder = ident("priya@ci-runner-12")
    oncall = ident("oncall-billing@acme.io")
    image = ident("registry.acme.io/billing-api:2026.12.3")
    grafana = ident("https://grafana.acme.io/d/billing-latency/overview?orgId=1&from=1764727200000")
    bastion = ident("bastion-02.acme.internal")
    payments = ident("payments-gw.acme.internal:8443")
    runbook = ident("https://wiki.acme.io/ops/billing/runbook#failover")
    eu_bucket = ident("s3://acme-billing-exports-eu")
    canary_rs = ident(f"billing-api-canary-{b.hexid(9)}")
    stripe_customer = ident("cus_Q8nV2xLp4TzR")
    cert_serial = ident(f"{b.hexid(16)}")
    tf_state = ident("acme-tfstate/prod/billing.tfstate")
    flag = ident("invoice_batching_v2")

    # 1. Hand-over, the repo and branch in prose, a red-line style constraint.
    b.user(
        "Morning. I'm taking over the billing on-call from Priya. Everything we touch this week "
        f"lives in {repo}, and the branch we ship from is {branch}. "
        + fact(
            constraints,
            "second engineer has reviewed",
            "Never run `terraform apply` on prod unless a second engineer has reviewed the "
            "saved plan file.",
        )
        + f" Start by pulling yesterday's orders export ({export}) so we can see what is stuck."
    )
    planted_rows = {
        row: (order, customer, "pending_capture")
        for row, order, customer in zip(stuck_rows, stuck, customers, strict=True)
    }
    b.tool(
        "query_db",
        {"sql": "SELECT * FROM orders_export WHERE export_date = '2026-12-02'", "source": export},
        _orders_csv(b, planted_rows, output_bytes[0]),
        "Pulling the export.",
    )
    b.assistant(
        f"The export read fine. Three orders are stuck in `pending_capture` for more than six "
        f"hours: {stuck[0]} (row {stuck_rows[0]}, customer {customers[0]}), {stuck[1]} (row "
        f"{stuck_rows[1]}, customer {customers[1]}) and {stuck[2]} (row {stuck_rows[2]}, "
        f"customer {customers[2]}). Everything else captured or settled. " + b.filler()
    )

    b.chatter(gap[0])

    # 2. Chinese: a host:port in prose; psql fails with a JSON exit code.
    b.user(
        f"{stuck[0]} 是哪个客户的？另外请查一下 {primary} 的复制延迟，昨晚告警了。" + b.filler(True)
    )
    psql = (
        "psql -h db-primary-03.acme.internal -p 5432 -U ops -c 'select * from pg_stat_replication'"
    )
    failures.append(Failure(psql, 2, '"exit_code": 2', "pg_stat_replication"))
    b.tool(
        "run_command",
        {"cmd": psql},
        json.dumps(
            {
                "cmd": psql,
                "exit_code": 2,
                "stdout": "",
                "stderr": (
                    'psql: error: connection to server at "db-primary-03.acme.internal" '
                    f"({primary_ip}), port 5432 failed: FATAL:  sorry, too many clients already"
                ),
            }
        ),
    )
    b.assistant(
        f"{stuck[0]} 属于客户 {customers[0]}。psql 连接 db-primary-03 失败（exit_code 2）："
        "too many clients already —— 主库的连接数打满了（max_connections=500）。"
    )

    b.chatter(gap[1])

    # 3. A decision with its reason; a TODO with a ticket; a file read.
    b.user(
        "Ugh. OK. "
        + decision(
            f"move the reporting reads to {replica}",
            "the primary is pinned at max_connections=500",
            f"We decided to move the reporting reads to {replica} because the primary is pinned "
            "at max_connections=500 and reporting is 60% of the sessions.",
        )
        + " "
        + fact(
            todos,
            f"raise the pgbouncer pool on db-primary-03 ({jira})",
            f"TODO: open a ticket to raise the pgbouncer pool on db-primary-03 ({jira}).",
        )
        + f" Show me where the reporting DSN is set in {config_path}."
    )
    config_lines = [f"# {config_path} (deployed from {branch})"]
    for i in range(1, 80):
        if i == 42:
            config_lines.append(
                "reporting_dsn: postgres://reporting@db-primary-03.acme.internal:5432/billing"
            )
        else:
            config_lines.append(
                f"{b.rng.choice(['worker', 'api', 'ledger', 'export'])}_{b.rng.choice(['timeout_ms', 'pool_size', 'batch', 'retries'])}_{i}: {b.rng.randint(1, 9000)}"
            )
    b.tool("read_file", {"path": config_path}, "\n".join(config_lines))
    b.assistant(
        "Line 42 has `reporting_dsn: postgres://reporting@db-primary-03.acme.internal:5432/billing`. "
        f"I'll point it at {replica} in a PR against {branch}. " + b.filler()
    )

    b.chatter(gap[2])

    # 4. The PR (a commit hash, a PR URL in a tool output).
    b.user("Do it and open the PR. " + b.filler())
    git_cmd = (
        "git -C /work/infra-config checkout -b ops/reporting-replica origin/release/2026.12 && "
        "git commit -am 'reporting reads -> db-replica-07' && git push -u origin HEAD"
    )
    b.tool(
        "run_command",
        {"cmd": git_cmd},
        f"[ops/reporting-replica {commit}] reporting reads -> db-replica-07\n 1 file changed, 1 "
        "insertion(+), 1 deletion(-)\nremote: Create a pull request for 'ops/reporting-replica':"
        f"\nremote:   {pr_url}\nexit 0",
    )
    b.assistant(f"Opened {pr_url} (commit {commit}) against {branch}.")

    b.chatter(gap[3])

    # 5. Chinese: read the worker log (success, ERROR lines inside).
    b.user(f"好的。然后看看 worker 的日志，{log_path}，昨晚 02:00 以后的。" + b.filler(True))
    planted_error = (
        f"ERROR {pod} [req={first_req}] upstream timeout after 5000ms talking to {payments} "
        f"for {refund_order} (first of the night)"
    )
    b.tool(
        "fetch_logs",
        {"path": log_path, "since": "2026-12-03T02:00:00Z", "pod": pod},
        _worker_log(b, pod, planted_error, output_bytes[1]),
    )
    b.assistant(
        "The log read fine (the read itself succeeded; the ERROR lines are the worker's). "
        f"The first ERROR is an upstream timeout against {payments} with request id {first_req}, "
        f"for {refund_order}. The pod {pod} restarted at 02:31. " + b.filler()
    )

    b.chatter(gap[4])

    # 6. OOM: exit code 137.
    b.user("Check whether the reconcile job is what blew the worker's memory. " + b.filler())
    reconcile = f"kubectl -n billing exec {pod} -- python /srv/billing/jobs/reconcile.py --date 2026-12-02"
    failures.append(Failure(reconcile, 137, "exit code 137", "reconcile.py --date 2026-12-02"))
    b.tool(
        "run_command",
        {"cmd": reconcile},
        f"$ {reconcile}\nloading 412,118 ledger rows for 2026-12-02 ...\nKilled\n"
        "command terminated with exit code 137",
    )
    b.assistant(
        f"Yes: reconcile.py was killed with exit code 137 (OOM) inside {pod}; the pod's memory "
        "limit is 512Mi and the job loads the whole day's ledger at once."
    )

    b.chatter(gap[5])

    # 7. A constraint; helm fails with returncode=1.
    b.user(
        fact(
            constraints,
            "--dry-run first",
            "Always run the reconcile job with --dry-run first when it touches prod data.",
        )
        + f" Bump the worker memory limit to 1Gi in {values_file} and upgrade the release."
    )
    helm = (
        "helm upgrade billing-api ./charts/billing-api -f ./charts/billing-api/values-prod.yaml "
        "--namespace billing --atomic"
    )
    failures.append(Failure(helm, 1, "returncode=1", "helm upgrade billing-api"))
    b.tool(
        "run_command",
        {"cmd": helm},
        f"$ {helm}\nError: UPGRADE FAILED: another operation (install/upgrade/rollback) is in "
        "progress\nreturncode=1",
    )
    b.assistant(
        "helm upgrade failed (returncode=1): another operation is in progress — the release is "
        "stuck in pending-upgrade at revision 57."
    )

    b.chatter(gap[6])

    # 8. A decision in Chinese; rollback succeeds.
    b.user(
        decision(
            "回滚到 revision 56",
            "57 卡在 pending-upgrade 状态",
            "我们决定先回滚到 revision 56，因为 57 卡在 pending-upgrade 状态，没法继续升级。",
        )
        + "回滚完再升级一次。"
    )
    b.tool(
        "run_command",
        {"cmd": "helm rollback billing-api 56 --namespace billing && " + helm},
        "Rollback was a success! Happy Helming!\nRelease \"billing-api\" has been upgraded. "
        "Happy Helming!\nREVISION: 58\nexit 0",
    )
    b.assistant("回滚到 revision 56 成功，随后升级成功，现在是 revision 58，worker 内存上限 1Gi。")

    b.chatter(gap[7])

    # 9. The invoice reconciliation (big CSV #2).
    b.user("Pull the invoice reconciliation diff for December so far. " + b.filler())
    invoice_row = 137
    planted_invoices = {
        invoice_row: (
            f"{invoice_row},{invoice},{stuck[2]},Contoso Retail,1212.50,800.00,-412.50,"
            f"mismatch, ledger file {ledger}"
        ),
        invoice_row + 1: (
            f"{invoice_row + 1},{invoice_twin},{stuck[2]},Contoso Retail,1212.50,1212.50,0.00,"
            f"matches the ledger, ledger file {ledger}"
        ),
    }
    b.tool(
        "query_db",
        {"sql": "SELECT * FROM invoice_reconciliation WHERE month = '2026-12' ORDER BY row"},
        _invoice_csv(b, planted_invoices, output_bytes[2]),
    )
    b.assistant(
        f"Most rows reconcile. The largest mismatch is {invoice} for {stuck[2]} at -412.50 EUR "
        f"(row {invoice_row}, ledger file {ledger}); {invoice_twin} right after it has the same "
        "amount, which looks like a duplicate invoice number. " + b.filler()
    )

    b.chatter(gap[8])

    # 10. Two TODOs; a successful openssl read.
    b.user(
        fact(
            todos,
            f"refund {refund_order} once payments-gw is healthy",
            f"TODO: refund {refund_order} once payments-gw is healthy — not before.",
        )
        + " "
        + fact(
            todos,
            f"rotate the TLS cert for api.acme.io ({tls_ticket})",
            f"The TLS cert for api.acme.io expires 2026-12-15; TODO: rotate the TLS cert for "
            f"api.acme.io ({tls_ticket}).",
        )
        + " Check the expiry date to be sure."
    )
    b.tool(
        "run_command",
        {"cmd": "openssl s_client -connect api.acme.io:443 -servername api.acme.io </dev/null"},
        f"subject=CN=api.acme.io\nserial={cert_serial}\nnotAfter=Dec 15 23:59:59 2026 GMT\nexit 0",
    )
    b.assistant(f"Confirmed: notAfter=Dec 15 23:59:59 2026 GMT, serial {cert_serial}.")

    b.chatter(gap[9])

    # 11. terraform plan fails: [exit 1], a lock uuid and holder.
    b.user("Plan the terraform change for the new replica's security group. " + b.filler())
    tf = (
        f"terraform -chdir=/work/infra-config/envs/prod plan -out={plan_file} "
        "-target=module.billing_db"
    )
    failures.append(Failure(tf, 1, "[exit 1]", "module.billing_db"))
    b.tool(
        "run_command",
        {"cmd": tf},
        f"$ {tf}\nError: Error acquiring the state lock\n\nLock Info:\n  ID:        {lock_id}\n"
        f"  Path:      {tf_state}\n  Operation: OperationTypeApply\n  Who:       {lock_holder}\n"
        "  Created:   2026-12-02 22:40:11 UTC\n[exit 1]",
    )
    b.assistant(
        f"terraform plan failed [exit 1]: the state lock {lock_id} on {tf_state} is held by "
        f"{lock_holder} since 2026-12-02 22:40 UTC."
    )

    b.chatter(gap[10])

    # 12. A constraint; an e-mail.
    b.user(
        fact(
            constraints,
            "force-unlock",
            "Never force-unlock the terraform state while a CI run holds it; ask #infra-oncall "
            "first.",
        )
        + f" Mail {oncall} about the lock. "
        + fact(
            todos,
            "re-run the terraform plan",
            f"TODO: re-run the terraform plan (-out={plan_file}) once the lock is released.",
        )
    )
    b.tool(
        "send_email",
        {"to": oncall, "subject": f"terraform state lock {lock_id} on {tf_state}"},
        '{"status": "sent", "message_id": "<20261203.0912@acme.io>"}',
    )
    b.assistant(f"Sent to {oncall}.")

    b.chatter(gap[11])

    # 13. A decision with a URL for a reason; the canary image.
    b.user(
        decision(
            "ship billing-api 2026.12.3 to the canary only",
            "2026.12.2 leaked connections under retry storms",
            "We decided to ship billing-api 2026.12.3 to the canary only, because 2026.12.2 "
            f"leaked connections under retry storms (see {grafana}).",
        )
        + f" The image is {image}."
    )
    b.tool(
        "run_command",
        {"cmd": f"kubectl -n billing set image deploy/billing-api-canary api={image}"},
        f"deployment.apps/billing-api-canary image updated\nreplicaset {canary_rs} created\nexit 0",
    )
    b.assistant(f"The canary runs {image} (replicaset {canary_rs}). " + b.filler())

    b.chatter(gap[12])

    # 14. ssh fails: exit status 255.
    b.user(f"Restart pgbouncer on the replica through {bastion}. " + b.filler())
    ssh = f"ssh {bastion} 'sudo systemctl restart pgbouncer@db-replica-07'"
    failures.append(Failure(ssh, 255, "exit status 255", "systemctl restart pgbouncer"))
    b.tool(
        "run_command",
        {"cmd": ssh},
        f"$ {ssh}\nssh: connect to host {bastion} port 22: Connection timed out\n"
        "Process exited with exit status 255",
    )
    b.assistant(
        f"The ssh to {bastion} timed out (exit status 255); the bastion may be behind the VPN "
        "change from last night."
    )

    b.chatter(gap[13])

    # 15. Chinese constraint and pending ask.
    b.user(
        fact(
            constraints,
            "不要在工作时间",
            "绝对不要在工作时间（CET 09:00–18:00）重启 db-primary-03，哪怕只是 pgbouncer。",
        )
        + fact(
            asks,
            f"{stuck[1]} 什么时候能扣款成功",
            f"另外客户那边在问 {stuck[1]} 什么时候能扣款成功，能给个预计时间吗？",
        )
    )
    b.assistant(
        f"等 {payments} 恢复之后重新 capture {stuck[1]}；按目前的趋势，预计今天 UTC 18:00 之前。"
    )

    b.chatter(gap[14])

    # 16. pgbouncer decision; curl healthcheck fails (JSON exit code 22).
    b.user(
        decision(
            "transaction pooling on db-replica-07",
            "session pooling exhausted the 200 server connections",
            "We'll go with transaction pooling on db-replica-07 — we decided this because "
            "session pooling exhausted the 200 server connections in yesterday's load test.",
        )
        + " Is payments-gw healthy yet?"
    )
    curl = f"curl -sf https://{payments}/healthz"
    failures.append(Failure(curl, 22, '"exit_code": 22', "/healthz"))
    b.tool(
        "run_command",
        {"cmd": curl},
        json.dumps(
            {
                "exit_code": 22,
                "stderr": "curl: (22) The requested URL returned error: 503",
                "cmd": curl,
            }
        ),
    )
    b.assistant(f"Not yet: the health check of {payments} returns 503 (curl exit 22).")

    b.chatter(gap[15])

    # 17. A decision about the reconcile cron; a Chinese TODO.
    b.user(
        decision(
            "pause the nightly-reconcile cron until Friday",
            "it double-posts ledger entries when the worker restarts mid-batch",
            "We decided to pause the nightly-reconcile cron until Friday because it double-posts "
            "ledger entries when the worker restarts mid-batch.",
        )
        + " "
        + fact(todos, "reconcile.py 的内存问题", "TODO：周五之前把 reconcile.py 的内存问题修掉，改成分批加载。")
    )
    b.tool(
        "run_command",
        {"cmd": "kubectl -n billing patch cronjob nightly-reconcile -p '{\"spec\":{\"suspend\":true}}'"},
        "cronjob.batch/nightly-reconcile patched\nexit 0",
    )
    b.assistant("nightly-reconcile is suspended. " + b.filler())

    b.chatter(gap[16])

    # 18. Data residency decision; a customer id; a constraint on personal data.
    b.user(
        decision(
            f"keep the EU exports in {eu_bucket}",
            "the data-residency clause in the Northwind contract",
            f"We decided to keep the EU exports in {eu_bucket} because of the data-residency "
            "clause in the Northwind contract.",
        )
        + f" Northwind's Stripe customer is {stripe_customer}. "
        + fact(
            constraints,
            "use the customer uuid",
            "Never paste customer e-mails into tickets; always use the customer uuid instead.",
        )
    )
    b.assistant(f"Noted: EU exports stay in {eu_bucket}; I'll refer to Northwind by {customers[0]}.")

    b.chatter(gap[17])

    # 19. Chinese decision on the timeout.
    b.user(
        decision(
            "超时从 5 秒提高到 15 秒",
            "p99 是 11 秒",
            "我们决定把 payments-gw 的超时从 5 秒提高到 15 秒，因为上游 PSP 在高峰期的 p99 是 11 秒。",
        )
        + b.filler(True)
    )
    b.assistant("好的，我会在 values-prod.yaml 里把 payments_gw_timeout_ms 改成 15000，等你确认再发。")

    b.chatter(gap[18])

    # 20. Feature flag decision; two TODOs and a pending ask.
    b.user(
        decision(
            f"roll back the feature flag {flag}",
            "it produced duplicate invoice numbers",
            f"We decided to roll back the feature flag {flag} because it produced duplicate "
            f"invoice numbers ({invoice} and {invoice_twin}).",
        )
        + " "
        + fact(
            todos,
            "update the failover runbook",
            f"TODO: update the failover runbook at {runbook} with the replica switch.",
        )
        + " "
        + fact(
            todos,
            f"re-capture {stuck[0]}, {stuck[1]} and {stuck[2]}",
            f"TODO: re-capture {stuck[0]}, {stuck[1]} and {stuck[2]} after payments-gw recovers.",
        )
        + " "
        + fact(
            asks,
            "list of all orders stuck in pending_capture",
            "Later today, send me the list of all orders stuck in pending_capture with their row "
            "numbers.",
        )
    )
    b.tool(
        "run_command",
        {"cmd": f"flagctl set {flag}=false --env prod --reason 'duplicate invoice numbers'"},
        f"flag {flag}: true -> false (prod)\nexit 0",
    )
    b.assistant(f"{flag} is off in prod. " + b.filler())

    # 21-25. Chatter with small tool outputs; a pending ask; the last TODO.
    b.user(
        fact(
            asks,
            "draft the postmortem",
            "Can you draft the postmortem for the 02:14Z payments-gw timeouts by tomorrow morning?",
        )
        + " "
        + fact(
            todos,
            "delete the ops/reporting-replica branch",
            "TODO: delete the ops/reporting-replica branch after PR 1482 merges.",
        )
    )
    b.assistant("Yes — I'll draft it from the incident doc and the worker log. " + b.filler())
    b.user(
        fact(
            constraints,
            "#billing-oncall before touching prod data",
            "Always post in #billing-oncall before touching prod data.",
        )
        + " " + b.filler()
    )
    b.assistant(b.filler())
    b.chatter(3)

    latest = (
        f"Given all that: is {pr_url} safe to merge into {branch} now, and which of today's "
        "failed commands do I still need to re-run, with their exit codes?"
    )
    asks.append(Fact(latest, latest))
    b.user(latest)

    messages = [
        Message(
            role=m.role, content=m.content, tool_calls=m.tool_calls,
            tool_call_id=m.tool_call_id, name=m.name, seq=i,
        )
        for i, m in enumerate(b.messages, 1)
    ]
    exam = _exam(
        decisions, constraints, failures,
        repo=repo, branch=branch, row=stuck_rows[0], order=stuck[0], customer=customers[0],
        req=first_req, pr=pr_url, commit=commit, pod=pod, image=image, invoice=invoice,
        tls=tls_ticket, lock_holder=lock_holder,
    )
    return Transcript(
        seed=seed, messages=messages, identifiers=ids, decisions=decisions, todos=todos,
        constraints=constraints, pending_asks=asks, failures=failures, latest_ask=latest,
        exam=exam,
    )


def _exam(
    decisions: list[Decision], constraints: list[Fact], failures: list[Failure], **v: Any
) -> list[ExamQuestion]:
    def q(question: str, key: str, answer: str, kind: str = "identifier") -> ExamQuestion:
        return ExamQuestion(question, key, answer, kind, (_needle(answer),))

    out = [
        q("Which repository holds the infra config?", "infra-config", v["repo"]),
        q("Which branch do we ship from?", "branch we ship from", v["branch"]),
        q(f"Which order is at row {v['row']} of the export?", f"row {v['row']}", v["order"]),
        q(f"Which customer does {v['order']} belong to?", v["order"], v["customer"]),
        q(
            "What is the request id of the first payments-gw timeout of the night?",
            "first of the night", v["req"],
        ),
        q("Which pull request moves the reporting reads?", "reporting reads", v["pr"]),
        q("Which commit moved the reporting DSN?", "reporting-replica", v["commit"]),
        q("Which worker pod was OOM-killed?", "OOM", v["pod"]),
        q("Which image runs on the canary?", "canary image", v["image"]),
        q("Which invoice had the largest mismatch?", "largest mismatch", v["invoice"]),
        q("Which ticket tracks the TLS cert rotation?", "TLS cert", v["tls"]),
        q("Who holds the terraform state lock?", "state lock", v["lock_holder"]),
    ]
    questions = (
        "Why did we move the reporting reads to the replica?",
        "Why did we roll back to revision 56? (我们为什么回滚到 revision 56？)",
        "Why does billing-api 2026.12.3 go to the canary only?",
        "Why transaction pooling on the replica?",
        "Why is the nightly-reconcile cron paused?",
        "Why do the EU exports stay where they are?",
        "Why was the payments-gw timeout raised? (为什么提高 payments-gw 的超时？)",
        "Why was the invoice batching flag rolled back?",
    )
    keys = (
        "reporting reads", "revision 56", "canary", "transaction pooling", "nightly-reconcile",
        "EU exports", "payments-gw 的超时", "invoice_batching_v2",
    )
    for d, question, key in zip(decisions, questions, keys, strict=True):
        out.append(
            ExamQuestion(question, key, d.text, "decision", (_needle(d.key), _needle(d.reason)))
        )
    for f in failures[:6]:
        out.append(
            ExamQuestion(
                f"What exit code did `{f.command}` end with?", f.key,
                f"`{f.command}` failed with {f.form}", "failure",
                (_needle(f.key), exit_code_pattern(f.exit_code)),
            )
        )
    wanted = {"second engineer has reviewed", "force-unlock", "不要在工作时间", "--dry-run first"}
    keys_c = {
        "second engineer has reviewed": "terraform plan review",
        "force-unlock": "force-unlock",
        "不要在工作时间": "重启 db-primary-03",
        "--dry-run first": "dry-run",
    }
    for c in constraints:
        if c.key in wanted:
            out.append(
                ExamQuestion(
                    f"What is the rule about {keys_c[c.key]}?", keys_c[c.key], c.text,
                    "constraint", (_needle(c.key),),
                )
            )
    assert len(out) == 30, len(out)
    return out


# -- the fake summarizers -----------------------------------------------------------------------

SUMMARIZER_KINDS = ("good", "lossy", "empty", "failing", "hanging")


def is_summary_request(body: dict[str, Any]) -> bool:
    system = (body.get("messages") or [{}])[0].get("content") or ""
    return isinstance(system, str) and system.startswith(
        ("You compress part of", "You merge partial summaries")
    )


def is_flush_request(body: dict[str, Any]) -> bool:
    last = (body.get("messages") or [{}])[-1].get("content") or ""
    return isinstance(last, str) and last.startswith("[Memory flush")


def _stable_odd(value: str) -> bool:
    return zlib.crc32(value.encode()) % 2 == 1


def _listed_identifiers(text: str) -> list[str]:
    """The identifiers the compaction prompt asks to keep verbatim (backticked after the
    'Identifiers that must appear verbatim' line), in order."""
    at = text.find("Identifiers that must appear verbatim")
    if at < 0:
        return []
    tail = text[at:]
    end = tail.find("\n\nThe latest user ask")
    if end > 0:
        tail = tail[:end]
    return list(dict.fromkeys(re.findall(r"`([^`\n]+)`", tail)))


def good_summary(text: str, t: Transcript, lossy: bool = False) -> str:
    """What a summarizer that keeps everything it is shown writes (the lossy one drops half the
    identifiers and half the decisions and TODOs, the same half every call)."""

    def keep(i: int) -> bool:
        return not lossy or i % 2 == 0

    decisions = [d.text for i, d in enumerate(t.decisions) if keep(i) and d.key in text]
    todos = [f.text for i, f in enumerate(t.todos) if keep(i) and f.key in text]
    rules = [f.text for f in t.constraints if f.key in text]
    asks = [f.text for f in t.pending_asks if f.key in text]
    latest = re.search(r"The latest user ask \(quote it under ## Pending user asks\): (.+)", text)
    if latest and latest.group(1).strip() not in asks:
        asks.append(latest.group(1).strip())
    ids = list(dict.fromkeys([*_listed_identifiers(text), *(i for i in t.identifiers if i in text)]))
    if lossy:
        ids = [i for i in ids if not _stable_odd(i)]

    def section(title: str, items: list[str], code: bool = False) -> str:
        lines = [f"- `{i}`" if code else f"- {i}" for i in items] or ["- none"]
        return f"## {title}\n" + "\n".join(lines)

    return "\n".join(
        [
            "## State\nBilling on-call: stuck captures, replica switch, payments-gw timeouts.",
            section("Decisions", decisions),
            section("Open TODOs", todos),
            section("Constraints/Rules", rules),
            section("Pending user asks", asks),
            section("Exact identifiers", ids, code=True),
        ]
    )


def summary_step(kind: str, body: dict[str, Any], write: Callable[[str, bool], str]) -> Any:
    """How a summarizer of `kind` answers the summary request `body`: empty, HTTP 500, never,
    or `write(prompt text, lossy)` (good and lossy)."""
    from tests.fakes.openai_server import error, hang, reply

    if kind not in SUMMARIZER_KINDS:
        raise ValueError(f"unknown summarizer kind {kind!r}")
    if kind == "empty":
        return reply("")
    if kind == "failing":
        return error(500)
    if kind == "hanging":
        return hang()
    text = "\n".join(str(m.get("content") or "") for m in body["messages"])
    return reply(write(text, kind == "lossy"))


def summarizer_fake(
    kind: str, transcript: Transcript, chat_reply: str = "On it.", *, every_call: bool = False
) -> Callable[[dict[str, Any]], Any]:
    """The fake server's `default`: summary calls behave as `kind`, the memory flush answers
    NO_REPLY, chat calls get `chat_reply`. `every_call`: every request is a summary call (for a
    peer whose summary prompt is its own, e.g. langchain's)."""
    from tests.fakes.openai_server import reply

    if kind not in SUMMARIZER_KINDS:
        raise ValueError(f"unknown summarizer kind {kind!r}")

    def write(text: str, lossy: bool) -> str:
        return good_summary(text, transcript, lossy=lossy)

    def answer(body: dict[str, Any]) -> Any:
        if not every_call and is_flush_request(body):
            return reply("NO_REPLY")
        if not every_call and not is_summary_request(body):
            return reply(chat_reply)
        return summary_step(kind, body, write)

    return answer


# -- one case through a real gateway ------------------------------------------------------------

WEBCHAT_USER = "oncall"
SESSION_KEY = f"agent:main:webchat:direct:{WEBCHAT_USER}"


def prompt_text(messages: list[dict[str, Any]]) -> str:
    """Everything the model reads in a chat request: contents and tool-call arguments."""
    parts: list[str] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
        for call in m.get("tool_calls") or ():
            parts.append(str((call.get("function") or {}).get("arguments", "")))
    return "\n".join(parts)


_HIT_HEADER = re.compile(r"^seq \d+ ·", re.MULTILINE)


def search_hits(output: str) -> str:
    """The result blocks of a `history_search` output (from the first `seq N · time · role`
    header on): what counts as found, never an echo of the query or a "no matches" note."""
    first = _HIT_HEADER.search(output or "")
    return output[first.start():] if first else ""


@dataclass
class CaseResult:
    window: int
    kind: str
    usable: int
    prompt: list[dict[str, Any]]
    """The chat request's messages: the next prompt."""
    prompt_tokens: int
    tokens_before: int
    """Tokens of the imported session plus the latest ask and the system prompt."""
    reply: list[str]
    summary_calls: int
    seconds: float
    compactions: list[dict[str, Any]] = field(default_factory=list)
    search_registered: bool = False
    searches: dict[str, str] = field(default_factory=dict)
    """{query: history_search output} for every identifier and exam key term."""

    @property
    def text(self) -> str:
        return prompt_text(self.prompt)

    @property
    def summary(self) -> str | None:
        from context.compaction import REFERENCE_HEADER

        for m in self.prompt:
            content = m.get("content")
            if m.get("role") == "system" and isinstance(content, str) and (
                content.startswith(REFERENCE_HEADER) or "## Exact identifiers" in content
            ):
                return content
        return None

    @property
    def fits(self) -> bool:
        return self.prompt_tokens <= self.usable


@lru_cache(maxsize=4)
def _history_tokens(transcript: Transcript) -> int:
    from gateway.model.tokenizer import load_counter

    counter = load_counter("gpt-4o")
    return sum(counter.count_message(m) for m in transcript.messages)


def write_agents_md(workspace: Path) -> None:
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "AGENTS.md").write_text(AGENTS_MD, encoding="utf-8")


SLOW_SUMMARY_TIMEOUT = 30.0


def case_summary_timeout(kind: str, hanging_timeout: float = 1.0) -> float:
    """`[context] summary_timeout` for a case: short for the hanging summarizer (it must be cut
    off), long for the others, which answer at once, so that a loaded machine never turns them
    into timeouts (a fallback the case did not ask for)."""
    return hanging_timeout if kind == "hanging" else SLOW_SUMMARY_TIMEOUT


def promise_sections(
    window: int, summary_timeout: float = 1.0, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The config sections of a promise case (merged over the caller's base config)."""
    sections: dict[str, Any] = {
        "models": {"gpt-4o": {"context_window": window}},
        "context": {"summary_timeout": summary_timeout},
        "llm": {"model": "gpt-4o", "max_retries": 0, "timeout": 30, "stream": False},
        "scheduler": {"enabled": False},
    }
    for key, value in (extra or {}).items():
        sections[key] = {**sections.get(key, {}), **value}
    return sections


def promise_config(
    base_url: str, data_dir: Path, window: int, summary_timeout: float = 1.0
) -> Any:
    """A whole Config for one case (the tests build theirs with the `make_config` fixture and
    `promise_sections`)."""
    from gateway.config import parse_config

    data: dict[str, Any] = {
        "gateway": {"data_dir": str(data_dir)},
        "web": {"port": 0},
        "llm": {"base_url": base_url, "api_key": "test"},
    }
    for key, value in promise_sections(window, summary_timeout).items():
        data[key] = {**data.get(key, {}), **value}
    return parse_config(data, "promise case")


async def run_case(
    config: Any,
    fake: Any,
    transcript: Transcript,
    kind: str,
    *,
    queries: list[str] | None = None,
    reply_timeout: float = 120.0,
) -> CaseResult:
    """Import `transcript` as the webchat session of `oncall`, send its latest ask, and record
    the next prompt. `config` is a parsed Config whose LLM points at `fake` (a FakeOpenAI), with
    `promise_sections(...)` merged in. `queries`: history_search calls to make afterwards (each
    `{"query": q, "limit": 5}`), e.g. every identifier and every exam key term."""
    from channels.webchat import WebchatChannel
    from context.budget import make_budget
    from gateway.app import Gateway
    from gateway.model.tokenizer import load_counter
    from gateway.operations import import_messages
    from gateway.tools.registry import ToolContext

    fake.default = summarizer_fake(kind, transcript)
    write_agents_md(config.workspace)
    gateway = Gateway(config)
    webchat = WebchatChannel(reply_timeout=reply_timeout)
    gateway.add_channel(webchat)
    await gateway.start()
    try:
        path = config.data_dir / "promise-transcript.jsonl"
        path.write_text(transcript.jsonl(), encoding="utf-8")
        await import_messages(gateway, path, SESSION_KEY)
        before = len(fake.requests)
        started = time.perf_counter()
        answer = await webchat.submit(WEBCHAT_USER, transcript.latest_ask)
        seconds = time.perf_counter() - started
        requests = fake.requests[before:]
        chats = [r for r in requests if not is_summary_request(r) and not is_flush_request(r)]
        if not chats:
            raise AssertionError(
                f"window {gateway.resolver.window().tokens}, {kind}: no chat request "
                f"reached the model; reply: {answer.replies or answer.reason}"
            )
        prompt = chats[-1]["messages"]
        counter = load_counter("gpt-4o")
        tokens = sum(counter.count_message(Message.from_openai(m)) for m in prompt)
        tokens += counter.count_tools(chats[-1].get("tools") or [])
        resolution = gateway.resolver.window()
        usable = make_budget(resolution.tokens, gateway.resolver.budget).usable
        tokens_before = (
            _history_tokens(transcript)
            + counter.count_message(Message(role="system", content=gateway.runner.system_prompt()))
            + counter.count_tools(gateway.tools.specs())
        )
        session = await gateway.store.get_session(SESSION_KEY)
        compactions: list[dict[str, Any]] = []
        if session is not None and session.id is not None:
            for row in await gateway.store.compactions(session.id):
                compactions.append(
                    {
                        "first_seq": row.first_seq, "last_seq": row.last_seq,
                        "tokens_before": row.tokens_before, "tokens_after": row.tokens_after,
                        "quality": row.quality,
                    }
                )
        registered = "history_search" in gateway.tools.tools
        searches: dict[str, str] = {}
        if registered:
            ctx = ToolContext(session_key=SESSION_KEY)
            for query in dict.fromkeys(queries or []):
                result = await gateway.tools.call(
                    "history_search", json.dumps({"query": query, "limit": 5}), ctx
                )
                searches[query] = result.content
        return CaseResult(
            window=resolution.tokens, kind=kind, usable=usable, prompt=prompt,
            prompt_tokens=tokens, tokens_before=tokens_before, reply=answer.replies,
            summary_calls=sum(1 for r in requests if is_summary_request(r)), seconds=seconds,
            compactions=compactions, search_registered=registered, searches=searches,
        )
    finally:
        await gateway.stop()


def case_queries(t: Transcript) -> list[str]:
    """Every history_search a case makes: each identifier, then each exam key term."""
    return list(dict.fromkeys([*t.identifiers, *(q.key_term for q in t.exam)]))
