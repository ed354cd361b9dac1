"""The admin web UI under `/admin/`: sessions and their token pressure, a session's transcript,
token chart and compaction history ("compact now"), the memory browser, pairing approvals.

Server-rendered with Jinja2; htmx (vendored, no build step) swaps the compaction panel in place.
Every page reads through `gateway.operations` and the store, the same code the CLI uses.

Access: `[web] admin_token` as a bearer token, or typed once into the login form, which sets a
signed, HttpOnly, SameSite=Strict cookie (valid 12 hours; changing the token invalidates it).
`admin_anonymous = true` skips the login, and only on a loopback host (enforced by the config)
for requests that did not come through a proxy. With neither, `/admin/` answers 403 and says how
to turn it on.

Against other sites (the gateway app's middleware, `gateway.web.guard`, refuses foreign Host
headers and foreign Origin/Referer first): a state-changing request authenticated by the cookie
or anonymously must name the admin's own origin in Origin or Referer (a browser always sends one
of them; a forged page cannot send ours); bearer-token clients need neither. Failed logins
(form or bearer) are limited to `LOGIN_FAILURES` a minute per client address, then 429 with
Retry-After. Every admin response forbids framing and carries a Content-Security-Policy that
allows only the admin's own script (htmx, served locally) and stylesheet.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
import time
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from importlib import resources
from typing import Any, Literal
from urllib.parse import quote, urlsplit

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from multidict import MultiDict, MultiDictProxy

from gateway import operations
from gateway.app import Gateway
from gateway.config import WebSection
from gateway.store.models import utcnow
from gateway.web.guard import BadBody, HostPolicy, log_refusal
from memory.index import Corpus, Hit, SearchMode
from memory.notes import NoteError, read_lines
from memory.workspace import WorkspacePathError, list_workspace_files

COOKIE = "gatehouse_admin"
COOKIE_TTL_SECONDS = 12 * 3600
TRANSCRIPT_LIMIT = 500
"""Most messages a session page shows (the newest); `gatehouse sessions export` has them all."""
PROXY_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Real-IP")
CORPORA: dict[str, Corpus] = {"notes": "notes", "transcripts": "transcripts", "all": "all"}
SEARCH_MODES: dict[str, SearchMode] = {"hybrid": "hybrid", "bm25": "bm25", "vector": "vector"}
MAX_QUERY_CHARS = 500
"""Longest memory search query the admin takes (a query is words, not a document)."""

AuthResult = Literal["ok", "missing", "wrong", "off"]
AUTH_KEY = web.RequestKey("admin_auth", str)
"""How the request was let in: "bearer", "cookie" or "anonymous"."""
LOGIN_FAILURES = 5
"""Failed logins (wrong form token or bearer token) a client address may make per minute."""
PUBLIC_PATHS = ("/admin/login", "/admin/static/htmx.min.js", "/admin/static/admin.css")
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


class LoginLimiter:
    """At most `limit` failed logins per client address in any `window` seconds; then every
    login attempt from that address (even with the right token, which would otherwise tell a
    guesser it was right) waits until the oldest failure leaves the window."""

    def __init__(self, limit: int = LOGIN_FAILURES, window: float = 60.0,
                 max_clients: int = 10_000) -> None:
        self.limit = limit
        self.window = window
        self.max_clients = max_clients
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, client: str, now: float) -> deque[float]:
        times = self._failures.get(client)
        if times is None:
            return deque()
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[client]
        return times

    def retry_after(self, client: str, now: float | None = None) -> int | None:
        """Seconds until `client` may try again, or None when it may now."""
        now = time.monotonic() if now is None else now
        times = self._recent(client, now)
        if len(times) < self.limit:
            return None
        return max(1, math.ceil(times[0] + self.window - now))

    def failed(self, client: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        times = self._recent(client, now)
        times.append(now)
        self._failures[client] = times
        self._failures.move_to_end(client)
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)


def admin_status(settings: WebSection, url: str) -> str:
    """The startup log line saying where the admin UI is and how one gets in, or that it is off
    and how to turn it on (`url`: the web server's base URL)."""
    if settings.admin_token:
        return f"admin UI at {url}/admin/ (token required: [web] admin_token)"
    if settings.admin_anonymous:
        return f"admin UI at {url}/admin/ (no login: [web] admin_anonymous = true, loopback only)"
    return (
        "admin UI is off: set [web] admin_token (at least 16 characters, e.g. "
        "\"${GATEHOUSE_ADMIN_TOKEN}\") and restart to serve it at " + f"{url}/admin/"
    )


class AdminAuth:
    """Checks a request against `[web] admin_token` (bearer or cookie) or anonymous access."""

    def __init__(self, settings: WebSection) -> None:
        self.token = settings.admin_token
        self.anonymous = settings.admin_anonymous

    @property
    def enabled(self) -> bool:
        return bool(self.token) or self.anonymous

    def _signature(self, expires: int) -> str:
        assert self.token is not None
        return hmac.new(
            self.token.encode(), f"gatehouse-admin:{expires}".encode(), hashlib.sha256
        ).hexdigest()

    def issue_cookie(self, now: float | None = None) -> str:
        """`<expiry>.<HMAC>`: the token itself never travels in a cookie."""
        expires = int((now if now is not None else time.time()) + COOKIE_TTL_SECONDS)
        return f"{expires}.{self._signature(expires)}"

    def cookie_valid(self, value: str, now: float | None = None) -> bool:
        if not self.token:
            return False
        expiry, _, signature = value.partition(".")
        if not expiry.isdigit() or int(expiry) < (now if now is not None else time.time()):
            return False
        return hmac.compare_digest(signature, self._signature(int(expiry)))

    def token_matches(self, candidate: str) -> bool:
        return bool(self.token) and hmac.compare_digest(
            candidate.encode(), (self.token or "").encode()
        )

    def check(self, request: web.Request) -> tuple[AuthResult, str]:
        """(result, how): how is "bearer", "cookie" or "anonymous"."""
        if not self.enabled:
            return "off", ""
        header = request.headers.get("Authorization", "")
        if header:
            scheme, _, value = header.partition(" ")
            if scheme.lower() == "bearer" and self.token_matches(value.strip()):
                return "ok", "bearer"
            return "wrong", "bearer"
        cookie = request.cookies.get(COOKIE)
        if cookie and self.cookie_valid(cookie):
            return "ok", "cookie"
        proxied = any(h in request.headers for h in PROXY_HEADERS)
        if self.anonymous and not proxied:
            return "ok", "anonymous"
        return "missing", ""


@dataclass(frozen=True, slots=True)
class ChartPoint:
    x: float
    y: float
    turn: int
    tokens: int
    label: str


MarkerKind = Literal["compaction", "flush", "flush-failed"]
MARKER_GAP = 7
"""Pixels between events that fall between the same two turns (a flush, then its compaction)."""


@dataclass(frozen=True, slots=True)
class ChartMarker:
    """A compaction or memory flush: a vertical line, and a glyph at the top of the plot (a
    triangle for a compaction, a diamond for a flush, hollow when it failed); events between
    the same two turns stand side by side, their glyphs stacked, in the order they happened."""

    x: float
    kind: MarkerKind
    label: str
    glyph_y: float = 0.0

    @property
    def glyph(self) -> str:
        """The glyph's SVG path, centred on (x, glyph_y)."""
        x, y, r = self.x, self.glyph_y, 5
        if self.kind == "compaction":
            return f"M{x - r:.1f},{y - r:.1f}H{x + r:.1f}L{x:.1f},{y + r:.1f}Z"
        return f"M{x:.1f},{y - r:.1f}L{x + r:.1f},{y:.1f}L{x:.1f},{y + r:.1f}L{x - r:.1f},{y:.1f}Z"


@dataclass(frozen=True, slots=True)
class ChartLine:
    y: float
    kind: Literal["window", "compact", "flush"]
    tokens: int
    label: str


@dataclass(frozen=True, slots=True)
class TokenChart:
    """Geometry of the per-turn prompt-token chart, rendered as SVG by the template."""

    width: int
    height: int
    left: int
    top: int
    plot_width: int
    plot_height: int
    points: list[ChartPoint]
    markers: list[ChartMarker]
    lines: list[ChartLine]
    cached: list[ChartPoint] = field(default_factory=list)
    """Of each turn's prompt tokens, those the provider read from its prompt cache (turns whose
    endpoint reported them)."""

    @property
    def polyline(self) -> str:
        return " ".join(f"{p.x:.1f},{p.y:.1f}" for p in self.points)

    @property
    def cached_polyline(self) -> str:
        return " ".join(f"{p.x:.1f},{p.y:.1f}" for p in self.cached)


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def token_chart(
    history: operations.TokenHistory, width: int = 760, height: int = 240
) -> TokenChart:
    """Prompt tokens per turn against the window, with the thresholds as horizontal lines and
    each compaction and memory flush as a vertical marker between the turns it fell between."""
    left, top, right, bottom = 64, 16, 16, 28
    plot_w, plot_h = width - left - right, height - top - bottom
    window = max(1, history.window)
    turns = [(t, t.tokens) for t in history.turns if t.tokens is not None]
    slots = max(1, len(turns))

    def x_at(position: float) -> float:
        return left + plot_w * (position + 0.5) / slots

    def y_at(tokens: int) -> float:
        return top + plot_h * (1 - min(tokens, window) / window)

    times = [_aware(t.at) for t, _ in turns]

    def between(at: datetime) -> float:
        """Position of an event among the turns: just before the first turn that ended later."""
        later = next((i for i, t in enumerate(times) if t >= _aware(at)), len(times))
        return later - 0.5

    points = [
        ChartPoint(
            x_at(i), y_at(tokens), i + 1, tokens,
            f"turn {i + 1}: {tokens:,} prompt tokens"
            + (" (gateway count)" if t.prompt_tokens is None else "")
            + (
                f", {t.cached_tokens:,} from the provider's cache"
                f" ({t.cached_tokens / tokens:.0%})"
                if t.cached_tokens is not None and tokens else ""
            )
            + (f" — failed: {t.error}" if t.error else ""),
        )
        for i, (t, tokens) in enumerate(turns)
    ]
    cached = [
        ChartPoint(
            x_at(i), y_at(t.cached_tokens), i + 1, t.cached_tokens,
            f"turn {i + 1}: {t.cached_tokens:,} of {tokens:,} prompt tokens from the "
            "provider's cache",
        )
        for i, (t, tokens) in enumerate(turns)
        if t.cached_tokens is not None
    ]
    events: list[tuple[datetime, MarkerKind, str]] = [
        (
            _aware(c.at), "compaction",
            f"compaction #{c.id}: {c.tokens_before:,} → {c.tokens_after:,} tokens",
        )
        for c in history.compactions
    ] + [
        (
            _aware(f.at), "flush" if f.ok else "flush-failed",
            f"memory flush (cycle {f.cycle}): "
            + (f"{f.notes} notes written" if f.ok else "failed"),
        )
        for f in history.flushes
    ]
    slot_events: dict[float, list[tuple[datetime, MarkerKind, str]]] = {}
    for event in sorted(events, key=lambda e: e[0]):
        slot_events.setdefault(between(event[0]), []).append(event)

    def centre(position: float, events: int) -> float:
        """Where a group of events sits: between its turns, kept inside the plot (with room
        for the glyphs) when it falls before the first turn or after the last."""
        half = MARKER_GAP * (events - 1) / 2 + 6
        return min(max(x_at(position), left + half), left + plot_w - half)

    markers = [
        ChartMarker(
            centre(position, len(group)) + MARKER_GAP * (i - (len(group) - 1) / 2), kind, label,
            glyph_y=top + 7 + 12 * i,
        )
        for position, group in slot_events.items()
        for i, (_at, kind, label) in enumerate(group)
    ]
    compact_at, flush_at = history.compact_at, history.flush_at
    lines = [
        ChartLine(y_at(window), "window", window, f"window {window:,} tokens"),
        ChartLine(y_at(compact_at), "compact", compact_at, f"compaction at {compact_at:,}"),
        ChartLine(y_at(flush_at), "flush", flush_at, f"memory flush at {flush_at:,}"),
    ]
    return TokenChart(width, height, left, top, plot_w, plot_h, points, markers, lines, cached)


def _safe_next(target: str | None) -> str:
    """Only a path inside /admin/ may be a post-login destination (no open redirect)."""
    if not target:
        return "/admin/"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/admin/"):
        return "/admin/"
    return target


def _memory_query_problem(query: str, corpus: str, mode: str) -> str | None:
    """What is wrong with the memory page's query parameters, in one sentence, or None."""
    if corpus not in CORPORA:
        return f"corpus must be notes, transcripts or all, not {corpus[:40]!r}"
    if mode not in SEARCH_MODES:
        return f"mode must be hybrid, bm25 or vector, not {mode[:40]!r}"
    if len(query) > MAX_QUERY_CHARS:
        return f"the query is {len(query):,} characters; at most {MAX_QUERY_CHARS} are searched"
    return None


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int | float) else ("-" if value is None else str(value))


def _when(value: Any) -> str:
    if isinstance(value, datetime):
        return _aware(value).strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value or "")


LISTED_IDENTIFIERS = 60
"""Identifiers a quality report row names before "… and N more" (the summary lists them all)."""


def _percent(value: Any) -> str:
    return f"{100 * value:.0f}%" if isinstance(value, int | float) else "-"


def _names(values: Any, limit: int = LISTED_IDENTIFIERS) -> str:
    items = [str(v) for v in values] if isinstance(values, list) else []
    more = len(items) - limit
    return ", ".join(items[:limit]) + (f" … and {more:,} more" if more > 0 else "")


def quality_rows(quality: dict[str, Any] | None) -> list[tuple[str, str]]:
    """A stored compaction quality report (`Compactor` writes it) as (what, value) rows a person
    reads: the verdict first, then sections, identifiers, retention and compression; keys this
    does not know are shown as they are, so nothing stored is hidden."""
    q = dict(quality or {})
    rows: list[tuple[str, str]] = []

    def take(*keys: str) -> list[Any]:
        return [q.pop(k, None) for k in keys]

    reason, why, attempts, seconds = take("reason", "why", "attempts", "seconds")
    retries, fallback = take("retries_used", "fallback")
    if "passed" in q:
        passed, problems = take("passed", "problems")
        verdict = "passed" if passed else "did not pass"
        rows.append(("result", verdict + (f": {'; '.join(map(str, problems))}" if problems else "")))
    if reason is not None:
        how = [f"{attempts} attempt{'s' if attempts != 1 else ''}"] if attempts else []
        if retries:
            how.append(f"{retries} retr{'ies' if retries != 1 else 'y'}")
        if isinstance(seconds, int | float):
            how.append(f"{seconds:,.1f} s")
        rows.append(("reason", str(reason) + (f" ({', '.join(how)})" if how else "")))
    if why is not None:
        rows.append(("why", str(why)))
    if fallback:
        rows.append(("fallback", str(fallback)))
    present, missing = take("sections_present", "sections_missing")
    if present is not None or missing is not None:
        have = len(present or [])
        text = f"{have}/{have + len(missing or [])}"
        rows.append(("sections", text + (f"; missing: {_names(missing)}" if missing else "")))
    total, retention, in_summary, archived, lost, listed = take(
        "identifiers_total", "identifier_retention", "identifiers_in_summary",
        "identifiers_archived", "identifiers_missing", "identifiers",
    )
    if total is not None:
        parts = [f"{_number(total)} in the compacted messages", f"retention {_percent(retention)}"]
        if in_summary is not None:
            parts.append(f"{_number(in_summary)} listed in the summary")
        if archived:
            parts.append(f"{_number(archived)} archived (history_search finds them)")
        rows.append(("identifiers", "; ".join(parts)))
    if lost:
        rows.append((f"identifiers missing ({len(lost):,})", _names(lost)))
    if listed:
        rows.append((f"identifiers listed ({len(listed):,})", _names(listed)))
    (model_kept,) = take("model_identifier_retention")
    if model_kept is not None:
        rows.append(("identifiers the model kept itself", _percent(model_kept)))
    (ask,) = take("latest_ask_reflected")
    if ask is not None:
        rows.append(("latest ask", "reflected" if ask else "not reflected"))
    (semantic,) = take("semantic_retention")
    if semantic is not None:
        rows.append(("semantic retention", _percent(semantic)))
    ratio, saved, ideal = take("compression_ratio", "tokens_saved", "in_ideal_range")
    if ratio is not None:
        text = f"{ratio:.2f}" if isinstance(ratio, int | float) else str(ratio)
        if saved is not None:
            text += f", {_number(saved)} tokens saved"
        if ideal is not None:
            text += " (in the ideal range)" if ideal else " (outside the ideal range)"
        rows.append(("compression", text))
    (secrets,) = take("secrets_in_summary")
    if secrets:
        rows.append(("secrets in the summary", _number(secrets)))
    for key in ("errors", "notes"):
        values = q.pop(key, None)
        if values:
            rows.append((key, "; ".join(map(str, values)) if isinstance(values, list) else str(values)))
    for key, value in q.items():
        if value not in (None, [], {}, ""):
            if isinstance(value, bool):
                text = "yes" if value else "no"
            else:
                text = _names(value) if isinstance(value, list) else _number(value)
            rows.append((key.replace("_", " "), text))
    return rows


class AdminUI:
    """Handlers for `/admin/`, bound to one live gateway."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.auth = AdminAuth(gateway.config.web)
        self.hosts = HostPolicy.for_config(gateway.config)
        self.limiter = LoginLimiter()
        self.env = Environment(
            loader=PackageLoader("gateway.web", "templates/admin"),
            autoescape=select_autoescape(["html"]),
            trim_blocks=True,
            lstrip_blocks=True,
            undefined=StrictUndefined,  # a typo in a template is an error, not an empty cell
        )
        self.env.filters["num"] = _number
        self.env.filters["when"] = _when
        self.env.filters["quality_rows"] = quality_rows
        self.env.filters["q"] = lambda value: quote(str(value), safe="")

    # -- plumbing -----------------------------------------------------------------------------

    def render(self, name: str, request: web.Request, status: int = 200, **context: Any) -> web.Response:
        html = self.env.get_template(name).render(
            auth=request.get(AUTH_KEY, ""), request_path=request.path, **context
        )
        return web.Response(text=html, content_type="text/html", status=status)

    @cached_property
    def htmx(self) -> bytes:
        return (resources.files("gateway.web") / "static" / "admin" / "htmx.min.js").read_bytes()

    @cached_property
    def css(self) -> bytes:
        return (resources.files("gateway.web") / "static" / "admin" / "admin.css").read_bytes()

    def _limited(self, request: web.Request) -> web.Response | None:
        """429 while this client address has used up its failed logins."""
        wait = self.limiter.retry_after(request.remote or "unknown")
        if wait is None:
            return None
        return web.json_response(
            {"error": f"too many failed logins; try again in {wait} s"}, status=429,
            headers={"Retry-After": str(wait)},
        )

    @web.middleware
    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Authentication for every /admin/ route, and a same-origin check on every
        state-changing request a browser could have been tricked into sending."""
        if request.path in PUBLIC_PATHS:
            if not self.auth.enabled:
                return self._off()
            return await handler(request)
        if "Authorization" in request.headers and (limited := self._limited(request)):
            return limited
        result, how = self.auth.check(request)
        if result == "off":
            return self._off()
        if result == "wrong":
            self.limiter.failed(request.remote or "unknown")
            return web.json_response(
                {"error": "wrong admin token"}, status=401,
                headers={"WWW-Authenticate": 'Bearer realm="gatehouse-admin", error="invalid_token"'},
            )
        if result == "missing":
            if request.method == "GET" and "text/html" in request.headers.get("Accept", ""):
                target = quote(request.path_qs, safe="")
                raise web.HTTPFound(f"/admin/login?next={target}")
            return web.json_response(
                {"error": "log in at /admin/login or send Authorization: Bearer <admin_token>"},
                status=401, headers={"WWW-Authenticate": 'Bearer realm="gatehouse-admin"'},
            )
        if (
            how != "bearer"
            and request.method not in ("GET", "HEAD", "OPTIONS")
            and self.hosts.cross_site(request) is not False
        ):
            # Cookie or anonymous: the browser sends those on its own, so the request must show
            # it came from our pages (the app middleware already refused a foreign Origin).
            return web.json_response(
                {"error": "cross-site request refused (no Origin or Referer of this admin)"},
                status=403,
            )
        request[AUTH_KEY] = how
        try:
            return await handler(request)
        except BadBody as exc:
            return web.json_response({"error": exc.reason}, status=exc.status)

    def _off(self) -> web.Response:
        return web.Response(
            status=403,
            text="The admin UI is off. Set [web] admin_token in gatehouse.toml (at least 16 "
            "characters, e.g. \"${GATEHOUSE_ADMIN_TOKEN}\"), or admin_anonymous = true with "
            "host = \"127.0.0.1\", and restart the gateway.\n",
        )

    # -- login --------------------------------------------------------------------------------

    async def login_form(self, request: web.Request) -> web.Response:
        if self.auth.anonymous and self.auth.check(request)[0] == "ok":
            raise web.HTTPFound("/admin/")
        return self.render(
            "login.html", request, next=_safe_next(request.query.get("next")), error=None
        )

    async def login(self, request: web.Request) -> web.Response:
        if limited := self._limited(request):
            return limited
        try:
            form = await _form(request)
        except BadBody as exc:
            return web.json_response({"error": exc.reason}, status=exc.status)
        target = _safe_next(str(form.get("next") or ""))
        if not self.auth.token_matches(str(form.get("token") or "")):
            self.limiter.failed(request.remote or "unknown")
            log_refusal(request, 401, "wrong admin token in the login form")
            return self.render(
                "login.html", request, status=401, next=target,
                error="That is not the admin token ([web] admin_token).",
            )
        response = web.HTTPSeeOther(target)
        response.set_cookie(
            COOKIE, self.auth.issue_cookie(), max_age=COOKIE_TTL_SECONDS, path="/admin/",
            httponly=True, samesite="Strict", secure=request.secure,
        )
        raise response

    async def logout(self, request: web.Request) -> web.Response:
        await _form(request)  # nothing in it is used; like every admin POST, it must be a form
        response = web.HTTPSeeOther("/admin/login")
        response.del_cookie(COOKIE, path="/admin/")
        raise response

    async def static_htmx(self, _request: web.Request) -> web.Response:
        return web.Response(
            body=self.htmx, content_type="application/javascript",
            headers={"Cache-Control": "public, max-age=86400"},
        )

    async def static_css(self, _request: web.Request) -> web.Response:
        return web.Response(
            body=self.css, content_type="text/css",
            headers={"Cache-Control": "public, max-age=3600"},
        )

    # -- pages --------------------------------------------------------------------------------

    async def sessions(self, request: web.Request) -> web.Response:
        rows = await operations.session_overview(self.gateway)
        return self.render("sessions.html", request, sessions=rows,
                           llm_model=self.gateway.llm.model)

    async def session(self, request: web.Request) -> web.Response:
        key = request.query.get("key", "")
        detail = await operations.session_detail(self.gateway, key, show_all=True)
        if detail is None:
            return self.render("missing.html", request, status=404, key=key)
        history = await operations.token_history(self.gateway, key)
        facts = await operations.session_explanation(self.gateway, key, fetch_metadata=False)
        assert history is not None and facts is not None
        # The transcript and the facts in their JSON form, as `sessions show --json` and
        # `context explain --json` give them.
        messages = detail.messages
        return self.render(
            "session.html", request,
            s=detail, facts=facts.to_json(), chart=token_chart(history),
            cache=detail.prompt_cache,
            messages=[m.to_json() for m in messages[-TRANSCRIPT_LIMIT:]],
            hidden=max(0, len(messages) - TRANSCRIPT_LIMIT),
            compactions=detail.compactions[::-1], outcome=None,
        )

    async def compact(self, request: web.Request) -> web.StreamResponse:
        key = request.query.get("key", "")
        form = await _form(request)
        instructions = str(form.get("instructions") or "").strip()
        try:
            outcome = await operations.compact(self.gateway, key, instructions)
        except KeyError:
            return self.render("missing.html", request, status=404, key=key)
        if request.headers.get("HX-Request") != "true":
            raise web.HTTPSeeOther(f"/admin/session?key={quote(key, safe='')}")
        detail = await operations.session_detail(self.gateway, key, show_all=True)
        assert detail is not None
        return self.render(
            "_compactions.html", request, s=detail, compactions=detail.compactions[::-1],
            outcome=outcome,
        )

    async def memory(self, request: web.Request) -> web.Response:
        """The memory browser: the workspace's files, and a search ranked the way the agent's
        memory_search ranks ([memory] search_mode, or the mode picked), each hit with why it
        ranks there (its BM25 rank, cosine, fused score) and the mode actually used."""
        raw_query = request.query.get("q", "")
        corpus_name = request.query.get("corpus") or "notes"
        mode_name = request.query.get("mode") or self.gateway.config.memory.search_mode
        problem = _memory_query_problem(raw_query, corpus_name, mode_name)
        workspace = self.gateway.config.workspace
        files = await asyncio.to_thread(list_workspace_files, workspace)
        index = self.gateway.memory_index
        page: dict[str, Any] = {
            "files": files, "workspace": workspace, "query": raw_query.strip(),
            "corpus": CORPORA.get(corpus_name, "notes"),
            "mode": mode_name if mode_name in SEARCH_MODES else "bm25", "modes": SEARCH_MODES,
            "hits": [], "used": None, "error": problem, "bm25_only": self._bm25_only(),
        }
        if problem is not None:
            log_refusal(request, 400, f"admin memory search: {problem}")
            return self.render("memory.html", request, status=400, **page)
        corpus, mode = CORPORA[corpus_name], SEARCH_MODES[mode_name]
        if page["query"]:

            def search() -> list[Hit]:
                index.refresh()
                return index.search(page["query"], limit=20, corpus=corpus, mode=mode)

            hits = await asyncio.to_thread(search)
            page["hits"] = [{**asdict(h), "location": h.location} for h in hits]
            page["used"] = hits[0].mode_used if hits else None
        return self.render("memory.html", request, **page)

    def _bm25_only(self) -> str | None:
        """Why memory search ranks by words alone right now, or None when it has the model."""
        if self.gateway.memory_index.encoder is not None:
            return None
        if not self.gateway.config.memory.embeddings:
            return "[memory] embeddings = false"
        return (
            "the embedding model is not loaded (yet: it loads in the background after the "
            "gateway starts; if it cannot load, the gateway's log says why)"
        )

    async def memory_file(self, request: web.Request) -> web.Response:
        path = request.query.get("path", "")
        try:
            start = max(1, int(request.query.get("start", "1")))
        except ValueError:
            start = 1
        try:
            result = await asyncio.to_thread(
                read_lines, self.gateway.config.workspace, path, start, None
            )
        except (WorkspacePathError, NoteError, ValueError, OSError) as exc:
            return self.render("memory_file.html", request, status=404, path=path, error=str(exc),
                               result=None)
        return self.render("memory_file.html", request, path=path, result=result, error=None)

    async def pairing(self, request: web.Request) -> web.Response:
        rows = await self.gateway.store.list_pairings()
        now = utcnow()
        pending = [r for r in rows if r.status == "pending" and _aware(r.expires_at) > now]
        decided = [r for r in rows if r not in pending][::-1][:50]
        return self.render("pairing.html", request, pending=pending, decided=decided,
                           owners=self.gateway.scopes.owners,
                           message=request.query.get("message"))

    async def decide(self, request: web.Request) -> web.Response:
        form = await _form(request)
        code = str(form.get("code") or "")
        decision = str(form.get("decision") or "")
        if decision not in ("approved", "denied"):
            return web.json_response({"error": "decision must be approved or denied"}, status=422)
        row = await self.gateway.store.decide_pairing(code, decision)
        if row is None:
            message = f"No pending, unexpired pairing code {code!r}."
        else:
            message = f"{decision.capitalize()} {row.platform} user {row.sender_name or row.sender_id}."
        raise web.HTTPSeeOther(f"/admin/pairing?message={quote(message, safe='')}")


async def _form(request: web.Request) -> MultiDictProxy[str]:
    """The posted form; `BadBody` (400/413/415) for anything that is not a readable one."""
    if not request.body_exists:
        return MultiDictProxy(MultiDict())
    if request.content_type not in FORM_TYPES:
        raise BadBody(415, "the admin takes HTML form posts (application/x-www-form-urlencoded)")
    try:
        form = await request.post()
    except web.HTTPRequestEntityTooLarge:
        raise BadBody(413, "the form is too large") from None
    except (ValueError, LookupError, HttpProcessingError) as exc:  # bad multipart, charset...
        raise BadBody(400, f"unreadable form: {exc}") from None
    return MultiDictProxy(MultiDict([(k, v) for k, v in form.items() if isinstance(v, str)]))


async def _security_headers(_request: web.Request, response: web.StreamResponse) -> None:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)


async def _to_admin(_request: web.Request) -> web.Response:
    raise web.HTTPPermanentRedirect("/admin/")


def add_admin_routes(app: web.Application, gateway: Gateway) -> AdminUI:
    """Mount the admin UI under /admin/ on the gateway's web app."""
    ui = AdminUI(gateway)
    admin = web.Application(middlewares=[ui.guard])
    admin.on_response_prepare.append(_security_headers)
    admin.router.add_get("/", ui.sessions)
    admin.router.add_get("/login", ui.login_form)
    admin.router.add_post("/login", ui.login)
    admin.router.add_post("/logout", ui.logout)
    admin.router.add_get("/static/htmx.min.js", ui.static_htmx)
    admin.router.add_get("/static/admin.css", ui.static_css)
    admin.router.add_get("/session", ui.session)
    admin.router.add_post("/session/compact", ui.compact)
    admin.router.add_get("/memory", ui.memory)
    admin.router.add_get("/memory/file", ui.memory_file)
    admin.router.add_get("/pairing", ui.pairing)
    admin.router.add_post("/pairing/decide", ui.decide)
    app.router.add_get("/admin", _to_admin)
    app.add_subapp("/admin/", admin)
    return ui
