"""Hostile requests against every HTTP endpoint of a real gateway web server, and what came back.

`serve_target()` starts what `gatehouse run` serves over HTTP -- the webchat page and API, the
admin UI (anonymous access *and* a token: the worst case of both), Slack in HTTP mode and
Telegram in webhook mode (each against its fake platform server), `/metrics` and `/healthz` --
on 127.0.0.1 at a free port. `attack_list()` is every attack, one request each (a bounded list);
`run_attacks()` sends them one at a time and records the answer and what the gateway logged
meanwhile; `wrong_session_replies()` posts pairs of users with the same ``message_id`` at once
and counts the replies that reached the other user.

Used by `tests/security/test_attacks.py` and `bench/hardening.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

ADMIN_TOKEN = "hardening-admin-token-0123"
SLACK_SECRET = "5f1e2d3c4b5a69788796a5b4c3d2e1f0"
TELEGRAM_SECRET = "hardening-Secret_42"
WEBHOOK_URL = "https://bot.example.org/telegram/webhook"
EVIL = "https://evil.example"
OWN = "{origin}"
"""Stands for the server's own origin (``http://127.0.0.1:PORT``) in an attack's headers."""
PORT = "{port}"
OVERSIZED = 9 * 1024 * 1024
"""Past the web app's ``client_max_size`` (8 MiB)."""
DEEP = b"[" * 100_000 + b"]" * 100_000
SESSION_KEY = "agent:main:webchat:direct:alice"

JSON_TYPE = {"Content-Type": "application/json"}
FORM_TYPE = {"Content-Type": "application/x-www-form-urlencoded"}
REQUEST_LOGGERS = (
    "gateway.web.guard", "gateway.web.server", "gateway.web.admin", "channels.slack", "channels.telegram",
    "channels.webchat", "aiohttp", "slack_bolt", "telegram",
)
"""Where a line about one request can come from (the test server's access log aside)."""


@dataclass(frozen=True)
class Attack:
    endpoint: str
    """The row it counts in, e.g. ``POST /api/messages``."""
    name: str
    method: str
    path: str
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    expect: int | None = None
    """The exact status it must get; None: any 4xx."""
    oversized: bool = False
    """Send `OVERSIZED` bytes instead of `body`."""
    sign_slack: bool = False
    """Sign the body with the Slack signing secret (the attacks past the signature)."""


@dataclass
class Outcome:
    attack: Attack
    status: int | None
    error: str | None
    lines: list[logging.LogRecord]
    tracebacks: int

    @property
    def refused(self) -> bool:
        return self.status is not None and 400 <= self.status < 500

    @property
    def server_error(self) -> bool:
        return self.status is not None and self.status >= 500


def _post_attacks(endpoint: str, path: str, valid: bytes, ctype: dict[str, str]) -> list[Attack]:
    """What every state-changing endpoint gets: forged origins and a foreign Host."""
    return [
        Attack(endpoint, "forged Origin", "POST", path, valid, {**ctype, "Origin": EVIL}, 403),
        Attack(endpoint, "Origin: null", "POST", path, valid, {**ctype, "Origin": "null"}, 403),
        Attack(endpoint, "forged Referer, no Origin", "POST", path, valid,
               {**ctype, "Referer": f"{EVIL}/attack.html"}, 403),
        Attack(endpoint, "foreign Host (DNS rebinding)", "POST", path, valid,
               {**ctype, "Host": f"evil.example:{PORT}"}, 421),
        Attack(endpoint, "Host 127.0.0.1.evil.example", "POST", path, valid,
               {**ctype, "Host": "127.0.0.1.evil.example"}, 421),
        Attack(endpoint, f"oversized body ({OVERSIZED // 1024 // 1024} MiB)", "POST", path,
               headers=dict(ctype), expect=413, oversized=True),
    ]


def _read_only(endpoint: str, path: str) -> list[Attack]:
    return [
        Attack(endpoint, "foreign Host (DNS rebinding)", "GET", path,
               headers={"Host": f"evil.example:{PORT}"}, expect=421),
        Attack(endpoint, "Host 127.0.0.1.evil.example", "GET", path,
               headers={"Host": "127.0.0.1.evil.example"}, expect=421),
        Attack(endpoint, "deep JSON posted", "POST", path, DEEP, dict(JSON_TYPE), 405),
        Attack(endpoint, "cross-site POST (forged Origin)", "POST", path, DEEP,
               {**JSON_TYPE, "Origin": EVIL}, 403),
    ]


def _slack_event() -> bytes:
    from tests.fakes.slack_server import event_callback, im_message

    return json.dumps(event_callback(im_message("forged hello", user="U0BAD"))).encode()


TELEGRAM_UPDATE = json.dumps({
    "update_id": 900, "message": {
        "message_id": 1, "date": 0, "text": "forged hello", "chat": {"id": 7, "type": "private"},
        "from": {"id": 7, "is_bot": False, "first_name": "Mallory"},
    },
}).encode()


def attack_list() -> list[Attack]:
    """Every attack, in the order sent (the login brute force last: it locks the client out)."""
    attacks: list[Attack] = []

    # -- the webchat API: no authentication, so its body and content type are the whole guard
    ep, path = "POST /api/messages", "/api/messages"
    valid = b'{"user_id": "mallory", "text": "hi"}'
    attacks += [
        Attack(ep, "malformed JSON", "POST", path, b"{not json", dict(JSON_TYPE), 400),
        Attack(ep, "deep JSON (100,000 levels)", "POST", path, DEEP, dict(JSON_TYPE), 400),
        Attack(ep, "deep JSON in a field", "POST", path,
               b'{"user_id": "a", "text": ' + DEEP + b"}", dict(JSON_TYPE), 400),
        Attack(ep, "5,000-digit number", "POST", path,
               b'{"user_id": "a", "text": ' + b"9" * 5_000 + b"}", dict(JSON_TYPE), 400),
        Attack(ep, "not UTF-8", "POST", path, b'\xff\xfe{"user_id": 1}', dict(JSON_TYPE), 400),
        Attack(ep, "cross-site HTML form (urlencoded)", "POST", path, b"user_id=alice&text=hi",
               dict(FORM_TYPE), 415),
        Attack(ep, "text/plain (a fetch without preflight)", "POST", path, valid,
               {"Content-Type": "text/plain"}, 415),
        Attack(ep, "multipart form", "POST", path, b"--x\r\n\r\n--x--\r\n",
               {"Content-Type": "multipart/form-data; boundary=x"}, 415),
        *_post_attacks(ep, path, valid, JSON_TYPE),
    ]
    attacks += _read_only("GET / (chat page)", "/")

    # -- the webchat history: read-only, its query is the whole input
    ep, path = "GET /api/history", "/api/history"
    attacks += [
        *_read_only(ep, f"{path}?user_id=alice"),
        Attack(ep, "NUL in user_id", "GET", f"{path}?user_id=ev%00il", expect=422),
        Attack(ep, "user_id twice", "GET", f"{path}?user_id=alice&user_id=bob", expect=422),
        Attack(ep, "5,000-digit after", "GET", f"{path}?user_id=a&after={'9' * 5_000}",
               expect=422),
        Attack(ep, "a session key instead of a user", "GET",
               f"{path}?user_id=a&session_key=agent%3Amain%3Amain", expect=422),
    ]

    # -- the admin UI, anonymous: a browser on any page would be let in without these checks
    key = quote(SESSION_KEY, safe="")
    for page in ("/admin/", f"/admin/session?key={key}", "/admin/memory?q=ORD",
                 "/admin/pairing", "/admin/login"):
        attacks += _read_only("GET /admin/ pages", page)[:2]
    for path, form in (
        ("/admin/pairing/decide", b"code=ABCD2345&decision=approved"),
        (f"/admin/session/compact?key={key}", b"instructions=forget+everything"),
        ("/admin/logout", b""),
    ):
        ep = f"POST {path.split('?')[0]}"
        # Past the origin checks (our own Origin), each admin POST takes only a readable form.
        attacks += [
            Attack(ep, "no Origin, no Referer (anonymous admin)", "POST", path, form,
                   dict(FORM_TYPE), 403),
            *_post_attacks(ep, path, form, FORM_TYPE),
            Attack(ep, "bearer token with a forged Origin", "POST", path, form,
                   {**FORM_TYPE, "Authorization": f"Bearer {ADMIN_TOKEN}", "Origin": EVIL}, 403),
            Attack(ep, "JSON instead of a form", "POST", path, b'{"decision": "approved"}',
                   {**JSON_TYPE, "Origin": OWN}, 415),
            Attack(ep, "deep JSON", "POST", path, DEEP, {**JSON_TYPE, "Origin": OWN}, 415),
            Attack(ep, "malformed multipart", "POST", path, b"garbage",
                   {"Content-Type": "multipart/form-data; boundary=x", "Origin": OWN}, 400),
            Attack(ep, "form not UTF-8", "POST", path, b"code=\xff\xfe",
                   {**FORM_TYPE, "Origin": OWN}, 400),
        ]
    attacks.append(Attack("POST /admin/pairing/decide", "invalid decision", "POST",
                          "/admin/pairing/decide", b"code=X&decision=" + b"[" * 1000,
                          {**FORM_TYPE, "Origin": OWN}, 422))

    # -- Slack (HTTP mode): nothing is parsed before the signature is checked
    ep, path = "POST /slack/events", "/slack/events"
    event = _slack_event()
    form_deep = b"payload=" + DEEP
    attacks += [
        Attack(ep, "unsigned event", "POST", path, event, dict(JSON_TYPE), 401),
        Attack(ep, "unsigned deep JSON", "POST", path, DEEP, dict(JSON_TYPE), 401),
        Attack(ep, "unsigned deep form payload", "POST", path, form_deep, dict(FORM_TYPE), 401),
        Attack(ep, "forged signature", "POST", path, event,
               {**JSON_TYPE, "X-Slack-Request-Timestamp": str(int(time.time())),
                "X-Slack-Signature": "v0=" + "0" * 64}, 401),
        Attack(ep, "timestamp that is no number", "POST", path, event,
               {**JSON_TYPE, "X-Slack-Request-Timestamp": "soon",
                "X-Slack-Signature": "v0=" + "0" * 64}, 401),
        Attack(ep, "signed deep JSON", "POST", path, DEEP, dict(JSON_TYPE), 400, sign_slack=True),
        Attack(ep, "signed deep form payload", "POST", path, form_deep, dict(FORM_TYPE), 400,
               sign_slack=True),
        Attack(ep, "signed malformed JSON", "POST", path, b"{not json", dict(JSON_TYPE), 400,
               sign_slack=True),
        # Slack signs UTF-8 text; slack-sdk cannot verify other bytes, so they are unsigned.
        Attack(ep, "signed body not UTF-8", "POST", path, b'{"a": "\xff"}', dict(JSON_TYPE), 401,
               sign_slack=True),
        Attack(ep, "signed JSON array", "POST", path, b"[1, 2]", dict(JSON_TYPE), 400,
               sign_slack=True),
        *_post_attacks(ep, path, event, JSON_TYPE),
    ]

    # -- Telegram (webhook mode): the secret token header first, then a bounded parse
    ep, path = "POST /telegram/webhook", "/telegram/webhook"
    secret = {**JSON_TYPE, "X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET}
    attacks += [
        Attack(ep, "no secret token", "POST", path, TELEGRAM_UPDATE, dict(JSON_TYPE), 403),
        Attack(ep, "wrong secret token", "POST", path, TELEGRAM_UPDATE,
               {**JSON_TYPE, "X-Telegram-Bot-Api-Secret-Token": "guess"}, 403),
        Attack(ep, "deep JSON without the secret", "POST", path, DEEP, dict(JSON_TYPE), 403),
        Attack(ep, "deep JSON with the secret", "POST", path, DEEP, dict(secret), 400),
        Attack(ep, "deep update with the secret", "POST", path,
               b'{"update_id": 5, "message": ' + DEEP + b"}", dict(secret), 400),
        Attack(ep, "malformed JSON with the secret", "POST", path, b"{not json", dict(secret),
               400),
        Attack(ep, "not UTF-8 with the secret", "POST", path, b"\xff\xfe{}", dict(secret), 400),
        Attack(ep, "5,000-digit update_id with the secret", "POST", path,
               b'{"update_id": ' + b"9" * 5_000 + b"}", dict(secret), 400),
        *_post_attacks(ep, path, TELEGRAM_UPDATE, JSON_TYPE),
    ]

    attacks += _read_only("GET /metrics", "/metrics")
    attacks += _read_only("GET /healthz", "/healthz")

    # -- the admin login, last: 5 wrong tokens a minute, then even the right one waits
    ep, path = "POST /admin/login", "/admin/login"
    attacks += [
        Attack(ep, "forged Origin", "POST", path, f"token={ADMIN_TOKEN}".encode(),
               {**FORM_TYPE, "Origin": EVIL}, 403),
        Attack(ep, "foreign Host (DNS rebinding)", "POST", path, f"token={ADMIN_TOKEN}".encode(),
               {**FORM_TYPE, "Host": f"evil.example:{PORT}"}, 421),
        Attack(ep, "malformed multipart", "POST", path, b"garbage",
               {"Content-Type": "multipart/form-data; boundary=x"}, 400),
        Attack(ep, f"oversized body ({OVERSIZED // 1024 // 1024} MiB)", "POST", path,
               headers=dict(FORM_TYPE), expect=413, oversized=True),
        Attack("POST /admin/pairing/decide", "wrong bearer token", "POST",
               "/admin/pairing/decide", b"code=X&decision=approved",
               {**FORM_TYPE, "Authorization": "Bearer guess-0"}, 401),
    ]
    attacks += [
        Attack(ep, f"wrong token, try {n}", "POST", path, f"token=guess-{n}".encode(),
               dict(FORM_TYPE), 401 if n < 5 else 429)
        for n in range(1, 6)
    ]
    attacks.append(Attack(ep, "the right token after 5 failures", "POST", path,
                          f"token={ADMIN_TOKEN}".encode(), dict(FORM_TYPE), 429))
    return attacks


class LogCapture(logging.Handler):
    """Every record the process logs while it is installed (`capture_logs`)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def capture_logs() -> Iterator[LogCapture]:
    root = logging.getLogger()
    handler, level = LogCapture(), root.level
    root.addHandler(handler)
    if level == logging.NOTSET or level > logging.INFO:
        root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _about_requests(record: logging.LogRecord) -> bool:
    name = record.name
    return name != "aiohttp.access" and any(
        name == p or name.startswith(p + ".") for p in REQUEST_LOGGERS
    ) and record.levelno >= logging.INFO


def _traceback(record: logging.LogRecord) -> bool:
    return (
        record.exc_info is not None
        or record.stack_info is not None
        or "Traceback (most recent call last)" in record.getMessage()
    )


def slack_signature(body: bytes, secret: str = SLACK_SECRET) -> dict[str, str]:
    """Slack's request signature headers over the raw bytes (``v0=HMAC-SHA256``)."""
    ts = str(int(time.time()))
    digest = hmac.new(secret.encode(), b"v0:" + ts.encode() + b":" + body, hashlib.sha256)
    return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": f"v0={digest.hexdigest()}"}


async def send(http: aiohttp.ClientSession, url: str, attack: Attack) -> tuple[int | None, str | None]:
    port = url.rsplit(":", 1)[1]
    headers = {k: v.replace(OWN, url).replace(PORT, port) for k, v in attack.headers.items()}
    body = b"x" * OVERSIZED if attack.oversized else attack.body
    if attack.sign_slack:
        headers.update(slack_signature(body))
    try:
        async with http.request(
            attack.method, url + attack.path, data=body if body else None, headers=headers,
            allow_redirects=False, timeout=aiohttp.ClientTimeout(total=60),
        ) as response:
            await response.read()
            return response.status, None
    except (aiohttp.ClientError, TimeoutError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


async def run_attacks(url: str, attacks: list[Attack], logs: LogCapture) -> list[Outcome]:
    """Each attack in turn on a fresh connection, with the log lines it left."""
    outcomes: list[Outcome] = []
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        for attack in attacks:
            before = len(logs.records)
            status, error = await send(http, url, attack)
            await asyncio.sleep(0)  # a line logged as the answer went out
            records = logs.records[before:]
            outcomes.append(Outcome(
                attack, status, error,
                lines=[r for r in records if _about_requests(r)],
                tracebacks=sum(_traceback(r) for r in records),
            ))
    return outcomes


@dataclass
class SameIdResult:
    pairs: int
    answered: int = 0
    """Replies that reached the user who asked."""
    wrong: int = 0
    """Replies delivered to the other user (the other session's answer)."""
    unanswered: int = 0
    """Requests answered with an error (504 no reply, 409, ...) instead of a reply."""
    statuses: dict[int, int] = field(default_factory=dict)


async def wrong_session_replies(url: str, pairs: int) -> SameIdResult:
    """Two users post at the same moment with the same ``message_id``, `pairs` times (a new
    pair and id each time, so each session holds one message and the echo model answers it);
    each must get the echo of their own text, never the other's."""
    result = SameIdResult(pairs)

    async def ask(http: aiohttp.ClientSession, user: str, other: str, n: int) -> None:
        body = {"user_id": user, "text": f"{user} asks", "message_id": f"same-{n}"}
        async with http.post(f"{url}/api/messages", json=body,
                             timeout=aiohttp.ClientTimeout(total=120)) as response:
            data: Any = await response.json(content_type=None)
        result.statuses[response.status] = result.statuses.get(response.status, 0) + 1
        replies = " ".join(data.get("replies") or []) if isinstance(data, dict) else ""
        if f"{other} asks" in replies:
            result.wrong += 1
        elif response.status == 200 and f"{user} asks" in replies:
            result.answered += 1
        else:
            result.unanswered += 1

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(
            ask(http, a, b, n)
            for n in range(pairs)
            for a, b in ((f"alice{n}", f"bob{n}"), (f"bob{n}", f"alice{n}"))
        ))
    return result


@dataclass
class Target:
    url: str
    gateway: Any
    webchat: Any


@contextlib.asynccontextmanager
async def serve_target(
    data_dir: Path, database_url: str | None = None, reply_timeout: float = 5.0
) -> AsyncIterator[Target]:
    """The gateway's web server as `gatehouse run` builds it, every endpoint on (see above)."""
    from channels.webchat import WebchatChannel
    from gateway.adapters import add_channel_routes, platform_channels
    from gateway.app import Gateway
    from gateway.config import parse_config
    from gateway.web.server import WebServer, build_app
    from tests.fakes import FakeOpenAI
    from tests.fakes.slack_server import FakeSlack
    from tests.fakes.telegram_server import FakeTelegram

    async with FakeOpenAI() as llm, FakeSlack() as slack, FakeTelegram() as telegram:
        gateway_section: dict[str, Any] = {"data_dir": str(data_dir)}
        if database_url:
            gateway_section["database_url"] = database_url
        config = parse_config({
            "gateway": gateway_section,
            "web": {"host": "127.0.0.1", "port": 0, "admin_token": ADMIN_TOKEN,
                    "admin_anonymous": True},
            "llm": {"base_url": llm.base_url, "api_key": "x", "model": "fake-model",
                    "stream": False, "max_retries": 1, "timeout": 5},
            "channels": {
                "slack": {"enabled": True, "mode": "http", "bot_token": "xoxb-hardening",
                          "signing_secret": SLACK_SECRET, "base_url": slack.api_url,
                          "dm_policy": "open"},
                "telegram": {"enabled": True, "token": telegram.token,
                             "base_url": telegram.base_url, "mode": "webhook",
                             "webhook_url": WEBHOOK_URL, "webhook_secret": TELEGRAM_SECRET,
                             "dm_policy": "open"},
            },
        }, "hardening")
        gateway = Gateway(config)
        webchat = WebchatChannel(reply_timeout=reply_timeout)
        gateway.add_channel(webchat)
        platforms = platform_channels(config)
        for channel in platforms:
            gateway.add_channel(channel)
        await gateway.start()
        server = None
        try:
            app = build_app(gateway, webchat)
            add_channel_routes(app, platforms)
            server = WebServer(app, "127.0.0.1", 0)
            url = await server.start()
            yield Target(url, gateway, webchat)
        finally:
            if server is not None:
                await server.stop()
            await gateway.stop()
