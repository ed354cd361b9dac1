"""Every HTTP endpoint the gateway serves, under the same attacks (`attacks.py`): malformed and
deep JSON, wrong content types, oversized bodies, forged origins, foreign Host headers, unsigned
webhooks, a login brute force. Each is answered with a 4xx -- never a 5xx -- and leaves exactly
one log line and no traceback; none of them stores a message or changes anything."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.security.attacks import (
    SESSION_KEY,
    Attack,
    Target,
    attack_list,
    capture_logs,
    run_attacks,
    serve_target,
)

ENDPOINTS = {
    "POST /api/messages", "GET / (chat page)", "GET /api/history", "GET /admin/ pages", "POST /admin/login",
    "POST /admin/logout", "POST /admin/session/compact", "POST /admin/pairing/decide",
    "POST /slack/events", "POST /telegram/webhook", "GET /metrics", "GET /healthz",
}


@pytest.fixture
async def target(tmp_path: Path, database_url: str) -> AsyncIterator[Target]:
    async with serve_target(tmp_path / "data", database_url) as served:
        yield served


def _label(attack: Attack) -> str:
    return f"{attack.endpoint}: {attack.name}"


def test_the_attack_list_covers_every_endpoint() -> None:
    attacks = attack_list()
    assert {a.endpoint for a in attacks} == ENDPOINTS
    for endpoint in ENDPOINTS - {"GET /admin/ pages"}:
        names = {a.name for a in attacks if a.endpoint == endpoint}
        assert "foreign Host (DNS rebinding)" in names, endpoint
        assert any("Origin" in n for n in names), endpoint
    for endpoint in ("POST /api/messages", "POST /slack/events", "POST /telegram/webhook"):
        every = " ".join(a.name for a in attacks if a.endpoint == endpoint)
        assert "deep" in every and "oversized" in every, endpoint


async def test_every_attack_is_refused_with_a_4xx_one_log_line_and_no_traceback(
    target: Target,
) -> None:
    attacks = attack_list()
    with capture_logs() as logs:
        outcomes = await run_attacks(target.url, attacks, logs)
    problems: list[str] = []
    for o in outcomes:
        label = _label(o.attack)
        if o.status is None:
            problems.append(f"{label}: no answer ({o.error})")
        elif o.attack.expect is not None and o.status != o.attack.expect:
            problems.append(f"{label}: {o.status}, expected {o.attack.expect}")
        elif not o.refused:
            problems.append(f"{label}: {o.status}, not a 4xx")
        if o.tracebacks:
            problems.append(f"{label}: {o.tracebacks} traceback(s) in the log")
        if len(o.lines) != 1:
            problems.append(
                f"{label}: {len(o.lines)} log lines " + repr([r.getMessage()[:160] for r in o.lines])
            )
    assert problems == []
    assert len(outcomes) == len(attacks) > 100
    # Nothing got through: no message stored, no pairing approved, no compaction.
    store = target.gateway.store
    assert await store.message_count() == 0
    assert await store.approved_senders("telegram") == set()
    assert await store.get_session(SESSION_KEY) is None


async def test_admin_pages_cannot_be_framed(target: Target) -> None:
    async with aiohttp.ClientSession() as http:
        for page in ("/admin/", "/admin/pairing", "/admin/memory"):
            async with http.get(f"{target.url}{page}", headers={"Accept": "text/html"}) as r:
                assert r.status == 200
                assert r.headers["X-Frame-Options"] == "DENY"
                assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
