"""Trust-boundary attacks: the people who share one agent trying to read, search or steer what
belongs to another, through every memory, file and scheduling tool and argument.

`people()` starts a real gateway (SQLite, the memory index, the scheduler) with three people:
Alice and Bob, each in a webchat conversation of their own, and a Telegram group. Alice's
conversation holds her secrets four ways: a note the agent wrote for her, the automatic
memory-flush note quoted from what she said (the real flush, with a model that writes nothing),
a file she sent (under her conversation's inbox folder) and a whole tool output (under her
artifacts folder); her compacted messages are archived; she has a reminder. Carol (Telegram)
is an owner; a webchat visitor who calls themselves an owner's name is not.
`trust_attacks()` is every attempt, each a tool call as the model would make it, from Bob's
conversation, from the group (Alice writing there too), or a stranger's flood and pairing codes,
and the Slack token's destinations; `run_trust()` runs them and says of each whether it was
refused, leaked one of Alice's secrets, or lost something (a note of Bob's own not written).

Used by tests/security/test_trust.py and bench/hardening.py.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from context.engine import DefaultContextEngine, default_settings
from context.types import Message
from gateway.app import Gateway
from gateway.config import Config, parse_config
from gateway.tools.registry import ToolContext
from gateway.tools.scope import Caller
from gateway.turn.artifacts import cap_tool_output
from memory.index import ArchivedMessage
from memory.workspace import conversation_folder
from tests.fakes.openai_server import FakeOpenAI, reply

ALICE = "agent:main:webchat:direct:alice"
BOB = "agent:main:webchat:direct:bob"
CAROL = "agent:main:telegram:direct:555"
GROUP = "agent:main:telegram:group:-100555"
SECRETS = (
    "12 Rue des Lilas",  # her home address, said in her conversation (the flush quotes it)
    "locker 4417",  # a note the agent wrote for her
    "PASSPORT-X99",  # inside the file she sent
    "db-alice-7.internal",  # inside a tool output saved whole
    "TICKET-88841",  # in her archived (compacted) messages
)
"""What belongs to Alice: none of it may reach anyone else."""


@dataclass
class Person:
    caller: Caller
    ctx: ToolContext


@dataclass
class People:
    gateway: Gateway
    alice: Person
    bob: Person
    group: Person
    alice_in_group: Person
    carol: Person
    inbox_file: str
    """Alice's file, relative to the workspace."""
    artifact: str
    note_file: str
    job_id: str


def people_config(data_dir: Path, base_url: str) -> Config:
    return parse_config(
        {
            "gateway": {"data_dir": str(data_dir), "owners": ["telegram:555"]},
            "web": {"port": 0},
            "llm": {"base_url": base_url, "api_key": "test", "model": "fake-model",
                    "max_retries": 0, "timeout": 5, "stream": False},
            "memory": {"embeddings": False},
            "scheduler": {"max_jobs_per_platform": 5},
            "channels": {"telegram": {"enabled": True, "token": "1:x",
                                      "base_url": "http://127.0.0.1:9/bot"}},
        },
        "trust",
    )


async def _person(gateway: Gateway, key: str, platform: str, chat_type: str, sender: str,
                  chat_id: str) -> Person:
    caller = await gateway.scopes.caller(key, platform, chat_type, sender)
    ctx = ToolContext(session_key=key, platform=platform, chat_id=chat_id, chat_type=chat_type,
                      caller=caller)
    return Person(caller, ctx)


async def call(gateway: Gateway, name: str, args: dict[str, Any], ctx: ToolContext) -> str:
    result = await gateway.tools.call(name, json.dumps(args), ctx)
    return result.content


@contextlib.asynccontextmanager
async def people(tmp: Path) -> AsyncIterator[People]:
    async with FakeOpenAI(default=lambda body: reply("NO_REPLY")) as fake:
        config = people_config(tmp / "data", fake.base_url)
        gateway = Gateway(config)
        await gateway.start()
        try:
            alice = await _person(gateway, ALICE, "webchat", "direct", "alice", "alice")
            bob = await _person(gateway, BOB, "webchat", "direct", "bob", "bob")
            carol = await _person(gateway, CAROL, "telegram", "direct", "555", "555")
            group = await _person(gateway, GROUP, "telegram", "group", "77", "-100555")
            in_group = await _person(gateway, GROUP, "telegram", "group", "alice", "-100555")
            planted = await _plant(gateway, config, alice)
            yield People(gateway, alice, bob, group, in_group, carol, *planted)
        finally:
            await gateway.stop()


async def _plant(gateway: Gateway, config: Config, alice: Person) -> tuple[str, str, str, str]:
    """Alice's secrets, each the way the gateway itself stores them."""
    from gateway.store import SessionInfo

    # A note the agent wrote for her.
    written = await call(gateway, "memory_write",
                         {"text": "Alice keeps her climbing gear in locker 4417."}, alice.ctx)
    note_file = written.split("saved to ", 1)[1].split(" ", 1)[0]
    # The automatic flush of her conversation (the model writes nothing: a note is quoted).
    session = await gateway.store.ensure_session(
        SessionInfo(key=ALICE, platform="webchat", chat_type="direct", chat_id="alice")
    )
    flush = gateway.runner.flush
    assert flush is not None
    said = [
        Message(role="user", content="We decided the parcel goes to 12 Rue des Lilas."),
        Message(role="assistant", content="Agreed, I will remember that."),
    ]
    await flush.run(session, said)
    # A file she sent, where the intake saves it.
    folder = conversation_folder(ALICE)
    inbox_file = f"inbox/{folder}/{datetime.now():%Y-%m-%d}/webchat-alice-1-0-passport.txt"
    target = config.workspace / inbox_file
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("Passport number PASSPORT-X99\n", encoding="utf-8")
    # A tool output too large for a prompt, saved whole.
    settings = default_settings(16_000)
    capped = await cap_tool_output(
        DefaultContextEngine(), settings, config.workspace,
        "db-alice-7.internal is the primary\n" * 3_000, "run_command", "c1", ALICE,
    )
    artifact = capped.split("full output saved to ", 1)[1].split(" ", 1)[0]
    # Her compacted messages, archived.
    gateway.memory_index.archive_messages(
        ALICE, [ArchivedMessage(5, "user", "my ticket is TICKET-88841", None, None)]
    )
    gateway.memory_index.archive_identifiers(ALICE, [("TICKET-88841", "ticket", [5])])
    # A reminder of hers.
    made = await call(gateway, "reminder_create",
                      {"text": "call the locksmith", "delay": "2 days"}, alice.ctx)
    job_id = made.split()[1]
    return inbox_file, artifact, note_file, job_id


@dataclass(frozen=True)
class TrustAttack:
    kind: str
    """The row it counts in: "memory_get", "memory_search", "memory_write",
    "history_search", "scheduling", "group", "strangers", "slack token"."""
    name: str
    run: Callable[[People], Awaitable[str]]
    """The attempt; returns what the attacker got back."""
    must: str = "not leak"
    """"not leak" (no secret in the answer), "refuse" (an error answer), or "keep" (the
    attacker's own write must happen)."""


@dataclass
class TrustOutcome:
    attack: TrustAttack
    answer: str
    leaked: list[str] = field(default_factory=list)
    refused: bool = False
    lost: bool = False

    @property
    def ok(self) -> bool:
        if self.leaked or self.lost:
            return False
        return self.refused or self.attack.must != "refuse"


def _get(path: Callable[[People], str], who: str = "bob", **extra: Any) -> Callable[
    [People], Awaitable[str]
]:
    async def run(p: People) -> str:
        person: Person = getattr(p, who)
        return await call(p.gateway, "memory_get", {"path": path(p), **extra}, person.ctx)

    return run


def _search(query: str, who: str = "bob", **extra: Any) -> Callable[[People], Awaitable[str]]:
    async def run(p: People) -> str:
        person: Person = getattr(p, who)
        return await call(p.gateway, "memory_search", {"query": query, **extra}, person.ctx)

    return run


def _tool(name: str, args: Callable[[People], dict[str, Any]], who: str = "bob") -> Callable[
    [People], Awaitable[str]
]:
    async def run(p: People) -> str:
        person: Person = getattr(p, who)
        return await call(p.gateway, name, args(p), person.ctx)

    return run


def trust_attacks() -> list[TrustAttack]:
    """Every attempt (see the module docstring)."""
    attacks: list[TrustAttack] = []
    file_paths: list[tuple[str, Callable[[People], str]]] = [
        ("her file by its path", lambda p: p.inbox_file),
        ("her file with ./", lambda p: "./" + p.inbox_file),
        ("her file with a doubled slash", lambda p: p.inbox_file.replace("/", "//", 1)),
        ("her file through memory/..", lambda p: "memory/../" + p.inbox_file),
        ("her file through bob's own folder",
         lambda p: p.inbox_file.replace(conversation_folder(ALICE),
                                        f"{conversation_folder(BOB)}/..")),
        ("her file by its absolute path",
         lambda p: str(p.gateway.config.workspace / p.inbox_file)),
        ("her file with backslashes", lambda p: p.inbox_file.replace("/", "\\")),
        ("her inbox folder", lambda p: p.inbox_file.rsplit("/", 2)[0]),
        ("her tool output by its path", lambda p: p.artifact),
        ("her tool output through bob's folder",
         lambda p: p.artifact.replace(conversation_folder(ALICE),
                                      f"{conversation_folder(BOB)}/..")),
        ("the database file", lambda p: "../gatehouse.db"),
        ("the memory index", lambda p: "../memory-index.db"),
        ("the config", lambda p: "../../gatehouse.toml"),
    ]
    for name, path in file_paths:
        attacks.append(TrustAttack("memory_get", name, _get(path), "refuse"))
    attacks += [
        TrustAttack("memory_get", "the daily note holding her entries", _get(lambda p: p.note_file)),
        TrustAttack("memory_get", "the daily note from her entry's line",
                    _get(lambda p: p.note_file, start=3)),
    ]
    for secret in ("Rue des Lilas", "locker 4417", "4417", "PASSPORT-X99", "db-alice-7.internal",
                   "TICKET-88841", "parcel address"):
        for corpus in ("all", "notes", "history"):
            attacks.append(TrustAttack(
                "memory_search", f"{secret!r} in {corpus}", _search(secret, corpus=corpus)
            ))
    attacks += [
        TrustAttack("memory_write", "her note's text, to learn from a 'not saved again'",
                    _tool("memory_write",
                          lambda p: {"text": "Alice keeps her climbing gear in locker 4417."}),
                    "keep"),
        TrustAttack("memory_write", "a note shared with everyone, as a guest",
                    _tool("memory_write", lambda p: {"text": "PHISH", "shared": True}), "refuse"),
        TrustAttack("history_search", "her ticket id",
                    _tool("history_search", lambda p: {"query": "TICKET-88841"})),
        TrustAttack("history_search", "her words", _tool("history_search",
                                                         lambda p: {"query": "my ticket is"})),
        TrustAttack("scheduling", "a cron post to a Telegram chat",
                    _tool("cron_create", lambda p: {
                        "schedule": "* * * * *", "prompt": "PHISH: your account is locked",
                        "target": {"platform": "telegram", "chat_id": "7001"}}), "refuse"),
        TrustAttack("scheduling", "a cron post into her webchat conversation",
                    _tool("cron_create", lambda p: {
                        "schedule": "* * * * *", "prompt": "PHISH",
                        "target": {"platform": "webchat", "chat_id": "alice"}}), "refuse"),
        TrustAttack("scheduling", "cancelling her reminder",
                    _tool("job_cancel", lambda p: {"id": p.job_id}), "refuse"),
        TrustAttack("scheduling", "listing the jobs", _tool("jobs_list", lambda p: {})),
        TrustAttack("scheduling", "five new webchat ids past the platform's quota",
                    _quota_flood, "refuse"),
        TrustAttack("group", "the group searching her notes",
                    _search("locker 4417", who="group")),
        TrustAttack("group", "the group searching her address", _search("Rue des Lilas",
                                                                        who="group")),
        TrustAttack("group", "Alice in the group searching her own DM notes",
                    _search("locker 4417", who="alice_in_group")),
        TrustAttack("group", "the group reading her file",
                    _get(lambda p: p.inbox_file, who="group"), "refuse"),
        TrustAttack("group", "the group reading the daily note",
                    _get(lambda p: p.note_file, who="group")),
        TrustAttack("memory_search", "a web visitor calling themselves the owner",
                    _as_visitor("555", "locker 4417")),
        TrustAttack("memory_search", "a web visitor using the owner's telegram id as theirs",
                    _as_visitor("telegram:555", "Rue des Lilas")),
        TrustAttack("strangers", "a stranger's 30 messages get one refusal", _stranger_flood),
        TrustAttack("strangers", "3 throwaway accounts cannot block a 4th person's code",
                    _pairing_exhaustion),
    ]
    for url in ("http://slack.com/x", "https://slack.com:8443/x", "https://files.slack.com.evil.example/x",
                "https://evil.example/files.slack.com/x", "https://slack.com@evil.example/x",
                "http://127.0.0.1:9/x", "https://evil.example/x"):
        attacks.append(TrustAttack("slack token", f"the token to {url}", _token_to(url), "refuse"))
    return attacks


def _as_visitor(user_id: str, query: str) -> Callable[[People], Awaitable[str]]:
    """A webchat visitor picks their own id: no id makes them an owner."""

    async def run(p: People) -> str:
        key = f"agent:main:webchat:direct:{user_id}"
        person = await _person(p.gateway, key, "webchat", "direct", user_id, user_id)
        return await call(p.gateway, "memory_search", {"query": query}, person.ctx)

    return run


async def _quota_flood(p: People) -> str:
    """Six fresh webchat ids each ask for a reminder; the per-platform quota (5, with Alice's
    one) stops them: the last answers are refusals."""
    answers = []
    for n in range(6):
        key = f"agent:main:webchat:direct:visitor{n}"
        person = await _person(p.gateway, key, "webchat", "direct", f"visitor{n}", f"visitor{n}")
        answers.append(await call(p.gateway, "reminder_create",
                                  {"text": "spam", "delay": "1 day"}, person.ctx))
    return answers[-1]


async def _stranger_flood(p: People) -> str:
    from tests.helpers.recording_channel import RecordingChannel

    channel = RecordingChannel("telegram")
    p.gateway.add_channel(channel)
    await channel.start(p.gateway.handle_inbound)
    for n in range(30):
        await channel.dm("666", f"hello {n}")
    return f"{len(channel.sent)} replies"


async def _pairing_exhaustion(p: People) -> str:
    from tests.helpers.recording_channel import RecordingChannel

    channel = p.gateway.channels.get("telegram")
    if not isinstance(channel, RecordingChannel):
        channel = RecordingChannel("telegram")
        p.gateway.add_channel(channel)
        await channel.start(p.gateway.handle_inbound)
    p.gateway.config.channels.telegram.dm_policy = "pairing"
    for account in ("901", "902", "903"):
        for n in range(3):
            await channel.dm(account, f"let me in {n}")
    before = len(channel.sent)
    await channel.dm("904", "hello, I am the real person")
    got = channel.sent[before:]
    return "code issued" if any("pairing code is " in m.text for m in got) else "no code"


def _token_to(url: str) -> Callable[[People], Awaitable[str]]:
    async def run(p: People) -> str:
        import yarl

        from channels.settings import SlackSettings
        from channels.slack import SlackChannel

        slack = SlackChannel(SlackSettings(enabled=True, bot_token="xoxb-test",
                                           app_token="xapp-test"))
        return "error: refused" if not slack._token_may_go_to(yarl.URL(url)) else "sent"

    return run


async def run_trust(tmp: Path) -> list[TrustOutcome]:
    outcomes: list[TrustOutcome] = []
    async with people(tmp) as p:
        for attack in trust_attacks():
            try:
                answer = await attack.run(p)
            except Exception as exc:  # an attempt that crashes is no refusal
                answer = f"crash: {type(exc).__name__}: {exc}"
            outcome = TrustOutcome(attack, answer)
            outcome.leaked = [s for s in SECRETS if s in answer]
            outcome.refused = answer.startswith(("error", "no matches")) or _refused(attack, answer)
            if attack.must == "keep":
                outcome.lost = not answer.startswith("saved to ")
            outcomes.append(outcome)
    return outcomes


def _refused(attack: TrustAttack, answer: str) -> bool:
    if attack.kind == "strangers":
        return answer in ("1 replies", "code issued")
    return False
