"""The admin UI over a real socket: access control, pages, compaction, memory, pairing."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import pytest
from markupsafe import escape
from yarl import URL

from gateway.config import ConfigError, WebSection
from gateway.inbound.access import new_code
from gateway.operations import CompactionMark, FlushMark, TokenHistory, TurnTokens
from gateway.store import PairingRow
from gateway.web.admin import COOKIE, AdminAuth, _safe_next, token_chart
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import FakeOpenAI
from tests.helpers.admin import BEARER, TOKEN, Admin, serve
from tests.helpers.llm_scripts import FILLER, KEY, scripted


@pytest.fixture
async def admin(make_config: MakeConfig) -> AsyncIterator[Admin]:
    async with FakeOpenAI(default=scripted) as fake:
        async for a in serve(make_config, fake, admin_token=TOKEN):
            yield a


async def test_admin_is_off_without_a_token_and_says_how_to_turn_it_on(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    async for a in serve(make_config, fake_llm):
        status, body, _ = await a.get("/admin/", headers=BEARER)
        assert status == 403
        assert "[web] admin_token" in body
        status, body, _ = await a.get("/admin/login")
        assert status == 403


async def test_unauthenticated_browser_is_redirected_to_login_and_api_gets_401(
    admin: Admin,
) -> None:
    status, _, r = await admin.get("/admin/session?key=x", headers={"Accept": "text/html"})
    assert status == 302
    location = URL(r.headers["Location"])
    assert location.path == "/admin/login"
    assert location.query["next"] == "/admin/session?key=x"
    status, body, r = await admin.get("/admin/")
    assert status == 401
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert "admin_token" in body
    status, body, _ = await admin.get("/admin/", headers={"Authorization": "Bearer wrong-token"})
    assert status == 401
    assert "wrong admin token" in body
    status, _, _ = await admin.get("/admin/", headers={"Authorization": f"Basic {TOKEN}"})
    assert status == 401
    status, body, _ = await admin.get("/admin/", headers=BEARER)
    assert status == 200
    assert "Sessions" in body
    status, _, r = await admin.get("/admin")
    assert status == 308 and r.headers["Location"] == "/admin/"


async def test_login_form_sets_a_signed_cookie_and_logout_clears_it(admin: Admin) -> None:
    status, body, _ = await admin.post("/admin/login", {"token": "nope", "next": "/admin/"})
    assert status == 401
    assert "not the admin token" in body
    status, _, r = await admin.post("/admin/login", {"token": TOKEN, "next": "/admin/pairing"})
    assert status == 303 and r.headers["Location"] == "/admin/pairing"
    cookie = r.cookies[COOKIE]
    assert TOKEN not in cookie.value
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/admin/"
    jar = {"Cookie": f"{COOKIE}={cookie.value}"}
    assert (await admin.get("/admin/", headers=jar))[0] == 200
    flipped = "1" if cookie.value[-1] == "0" else "0"
    tampered = {"Cookie": f"{COOKIE}={cookie.value[:-1]}{flipped}"}
    assert (await admin.get("/admin/", headers=tampered))[0] == 401
    # A cookie-authenticated POST must come from our own pages.
    status, body, _ = await admin.post("/admin/logout", {}, headers=jar)
    assert status == 403 and "cross-site" in body
    status, _, r = await admin.post(
        "/admin/logout", {}, headers={**jar, "Origin": admin.url}
    )
    assert status == 303 and r.cookies[COOKIE].value == ""
    # The login page never redirects off-site.
    status, _, r = await admin.post("/admin/login", {"token": TOKEN, "next": "//evil.example/"})
    assert r.headers["Location"] == "/admin/"


def test_cookie_expires_and_changing_the_token_invalidates_it() -> None:
    auth = AdminAuth(WebSection(admin_token=TOKEN))
    now = time.time()
    cookie = auth.issue_cookie(now)
    assert auth.cookie_valid(cookie, now + 60)
    assert not auth.cookie_valid(cookie, now + 13 * 3600)
    assert not AdminAuth(WebSection(admin_token=TOKEN + "x")).cookie_valid(cookie, now)
    assert not auth.cookie_valid("garbage", now)
    assert _safe_next("https://evil.example/admin/") == "/admin/"
    assert _safe_next("/elsewhere") == "/admin/"
    assert _safe_next("/admin/memory?q=x") == "/admin/memory?q=x"


def test_anonymous_admin_only_on_loopback(make_config: MakeConfig) -> None:
    with pytest.raises(ConfigError, match=r"admin_anonymous = true needs host"):
        make_config(web={"admin_anonymous": True, "host": "0.0.0.0"})
    with pytest.raises(ConfigError, match="at least 16 characters"):
        make_config(web={"admin_token": "short"})
    assert make_config(web={"admin_anonymous": True}).web.admin_anonymous


async def test_anonymous_access_is_refused_through_a_proxy(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    async for a in serve(make_config, fake_llm, admin_anonymous=True):
        assert (await a.get("/admin/"))[0] == 200
        assert (await a.get("/admin/", headers={"X-Forwarded-For": "203.0.113.9"}))[0] == 401


async def test_sessions_list_and_session_page_show_pressure_chart_and_compaction(
    admin: Admin,
) -> None:
    await admin.rg.ask("Remember ticket ORD-1042. " + FILLER)
    for i in range(6):
        await admin.rg.ask(f"message {i} " + FILLER)
    status, body, _ = await admin.get("/admin/", headers=BEARER)
    assert status == 200
    assert KEY in body
    assert re.search(r'<meter min="0" max="16000" low="\d+" high="\d+"', body)
    assert "last 40 user turns" in body
    assert "[channels.webchat] dm_history_limit" in body, "where the limit comes from"

    status, page, _ = await admin.get(f"/admin/session?key={quote(KEY, safe='')}", headers=BEARER)
    assert status == 200
    assert page.count('class="turn"') == 7, "one chart point per turn"
    assert 'class="marker-compaction"' in page, "the automatic compaction is marked"
    assert 'class="marker-flush"' in page, "the memory flush before it is marked"
    assert "Remember ticket ORD-1042." in page, "the transcript keeps compacted originals"
    assert "compacted" in page
    assert 'id="compaction-history"' in page

    # Compact now, the way htmx posts it: the panel comes back with the new summary.
    for i in range(3):
        await admin.rg.ask(f"short question {i}")
    store = admin.rg.gateway.store
    session = await store.get_session(KEY)
    assert session is not None and session.id is not None
    before = len(await store.compactions(session.id))
    status, panel, _ = await admin.post(
        f"/admin/session/compact?key={quote(KEY, safe='')}", {"instructions": "focus on tickets"},
        headers={**BEARER, "HX-Request": "true"},
    )
    assert status == 200
    assert panel.startswith('<div id="compactions">')
    assert "Compacted the conversation" in panel
    rows = await store.compactions(session.id)
    assert len(rows) == before + 1
    assert str(escape(rows[-1].summary)) in panel
    assert rows[-1].quality["reason"] == "manual"

    status, _, r = await admin.post(
        f"/admin/session/compact?key={quote(KEY, safe='')}", {}, headers=BEARER
    )
    assert status == 303 and r.headers["Location"].startswith("/admin/session?key=")
    status, _, _ = await admin.get("/admin/session?key=nope", headers=BEARER)
    assert status == 404


async def test_memory_browser_searches_notes_and_refuses_escapes(admin: Admin) -> None:
    workspace = admin.rg.gateway.config.workspace
    (workspace / "memory" / "2026-01-02.md").write_text(
        "- Deploy window is Monday 09:00; ticket ORD-5521.\n", encoding="utf-8"
    )
    status, body, _ = await admin.get("/admin/memory?q=ORD-5521", headers=BEARER)
    assert status == 200
    assert "memory/2026-01-02.md:1-1" in body
    assert "AGENTS.md" in body, "the file list"
    status, body, _ = await admin.get(
        "/admin/memory/file?path=memory/2026-01-02.md", headers=BEARER
    )
    assert status == 200 and "Deploy window is Monday" in body
    status, body, _ = await admin.get("/admin/memory/file?path=../../etc/passwd", headers=BEARER)
    assert status == 404 and "root:" not in body


async def test_pairing_requests_are_approved_from_the_admin_ui(admin: Admin) -> None:
    store = admin.rg.gateway.store
    code = new_code()
    await store.add_pairing(PairingRow(
        platform="telegram", sender_id="777", sender_name="Zoe", code=code,
        expires_at=datetime.now(UTC) + timedelta(hours=1),
    ))
    status, body, _ = await admin.get("/admin/pairing", headers=BEARER)
    assert status == 200 and code in body and "Zoe" in body
    assert "No owners are configured: every remote person is a guest." in body
    status, _, r = await admin.post(
        "/admin/pairing/decide", {"code": code, "decision": "approved"}, headers=BEARER
    )
    assert status == 303
    status, body, _ = await admin.get(r.headers["Location"], headers=BEARER)
    assert "Approved telegram user Zoe." in body
    assert await store.approved_senders("telegram") == {"777"}
    status, _, r = await admin.post(
        "/admin/pairing/decide", {"code": code, "decision": "approved"}, headers=BEARER
    )
    status, body, _ = await admin.get(r.headers["Location"], headers=BEARER)
    assert "No pending, unexpired pairing code" in body


def test_token_chart_places_events_between_the_turns_they_fell_between() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    turns = tuple(
        TurnTokens(at=t0 + timedelta(minutes=i), reply_seq=i, prompt_tokens=n,
                   local_prompt_tokens=n, error=None)
        for i, n in enumerate([1000, 5000, 9000, 2000])
    )
    chart = token_chart(TokenHistory(
        window=10_000, compact_at=8_000, flush_at=6_000, turns=turns,
        compactions=(CompactionMark(t0 + timedelta(minutes=2, seconds=-5), 1, 9000, 1500),),
        flushes=(FlushMark(t0 + timedelta(minutes=2, seconds=-10), cycle=0, ok=True, notes=2),),
    ))
    xs = [p.x for p in chart.points]
    compaction = next(m for m in chart.markers if m.kind == "compaction")
    assert xs[1] < compaction.x < xs[2]
    assert chart.points[0].y > chart.points[2].y, "more tokens are higher up"
    window_line = next(line for line in chart.lines if line.kind == "window")
    assert window_line.y == chart.top


# -- hardening (issue 20, item 4) -----------------------------------------------------------


async def _pending_code(rg: RunningGateway) -> str:
    code = new_code()
    await rg.gateway.store.add_pairing(PairingRow(
        platform="telegram", sender_id="666", sender_name="Mallory", code=code,
        expires_at=datetime.now(UTC) + timedelta(hours=1),
    ))
    return code


async def test_anonymous_admin_refuses_cross_site_posts(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    """A page on another origin cannot approve a pairing or compact a session through a
    browser that reaches an anonymous admin: Origin (or Referer) must be the admin's own."""
    async for a in serve(make_config, fake_llm, admin_anonymous=True):
        await a.rg.ask("hello")
        code = await _pending_code(a.rg)
        decide = {"code": code, "decision": "approved"}
        compact = f"/admin/session/compact?key={quote('agent:main:webchat:direct:tester', safe='')}"
        for forged in ({}, {"Origin": "https://evil.example"}, {"Origin": "null"},
                       {"Referer": "https://evil.example/attack.html"},
                       {"Origin": a.url.replace("127.0.0.1", "localhost")}):
            status, body, _ = await a.post("/admin/pairing/decide", decide, headers=forged)
            assert status == 403 and "cross-site" in body, forged
            status, body, _ = await a.post(compact, {}, headers=forged)
            assert status == 403 and "cross-site" in body, forged
        assert await a.rg.gateway.store.approved_senders("telegram") == set()
        # The admin's own pages post with their own origin (or, in old browsers, Referer).
        status, _, _ = await a.post("/admin/pairing/decide", decide, headers={"Origin": a.url})
        assert status == 303
        assert await a.rg.gateway.store.approved_senders("telegram") == {"666"}
        status, _, _ = await a.post(compact, {}, headers={"Referer": f"{a.url}/admin/session"})
        assert status == 303


async def test_bearer_clients_need_no_origin_but_a_forged_one_is_refused(admin: Admin) -> None:
    code = await _pending_code(admin.rg)
    decide = {"code": code, "decision": "denied"}
    status, _, _ = await admin.post(
        "/admin/pairing/decide", decide, headers={**BEARER, "Origin": "https://evil.example"}
    )
    assert status == 403
    status, _, _ = await admin.post("/admin/pairing/decide", decide, headers=BEARER)
    assert status == 303


async def test_admin_refuses_a_foreign_host_header(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    """DNS rebinding: a name the attacker controls resolves to 127.0.0.1, same-origin to them."""
    async for a in serve(make_config, fake_llm, admin_anonymous=True):
        for host in ("evil.example", "evil.example:8787", "127.0.0.1.evil.example"):
            status, _, _ = await a.get("/admin/", headers={"Host": host})
            assert status in (400, 421), host
        for host in ("127.0.0.1", "localhost:8787", "[::1]:8787"):
            assert (await a.get("/admin/", headers={"Host": host}))[0] == 200, host


async def test_admin_pages_cannot_be_framed_and_carry_a_content_security_policy(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    async for a in serve(make_config, fake_llm, admin_token=TOKEN):
        await a.rg.ask("hello")
        key = quote("agent:main:webchat:direct:tester", safe="")
        for path in ("/admin/", f"/admin/session?key={key}", "/admin/pairing", "/admin/memory",
                     "/admin/login"):
            status, body, r = await a.get(path, headers={**BEARER, "Accept": "text/html"})
            assert status == 200, path
            assert r.headers["X-Frame-Options"] == "DENY"
            csp = r.headers["Content-Security-Policy"]
            assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp
            assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
            assert "<script>" not in body and " style=" not in body  # nothing inline to allow
        for asset in ("/admin/static/htmx.min.js", "/admin/static/admin.css"):
            assert (await a.get(asset))[0] == 200, asset


async def test_failed_admin_logins_are_rate_limited(admin: Admin) -> None:
    for _ in range(5):
        status, _, _ = await admin.post("/admin/login", {"token": "guess-0123456789ab"})
        assert status == 401
    status, _, r = await admin.post("/admin/login", {"token": TOKEN})
    assert status == 429, "even the right token: a limited client learns nothing"
    assert 0 < int(r.headers["Retry-After"]) <= 60
    status, _, r = await admin.get("/admin/", headers={"Authorization": "Bearer guess"})
    assert status == 429 and "Retry-After" in r.headers


def test_login_limiter_frees_the_client_after_the_window() -> None:
    from gateway.web.admin import LoginLimiter

    limiter = LoginLimiter(limit=5, window=60.0)
    for i in range(5):
        assert limiter.retry_after("10.0.0.1", now=100.0 + i) is None
        limiter.failed("10.0.0.1", now=100.0 + i)
    assert limiter.retry_after("10.0.0.1", now=105.0) == 55
    assert limiter.retry_after("10.0.0.2", now=105.0) is None, "per client address"
    assert limiter.retry_after("10.0.0.1", now=160.5) is None
