"""The admin session page (issue 23 item 12): a heading naming the session, the compaction
quality report as a readable table collapsed by default (no JSON dump), compaction and memory
flush markers told apart when they fall between the same two turns, and the startup log line
that says where the admin UI is."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import pytest

from gateway import operations
from gateway.config import WebSection
from gateway.operations import CompactionMark, FlushMark, TokenHistory, TurnTokens
from gateway.web.admin import MARKER_GAP, admin_status, quality_rows, token_chart
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.helpers.admin import BEARER, TOKEN, Admin, serve
from tests.helpers.llm_scripts import KEY, scripted

TICKETS = " ".join(f"ORD-{n}" for n in range(10_000, 10_300))


@pytest.fixture
async def admin(make_config: MakeConfig) -> AsyncIterator[Admin]:
    async with FakeOpenAI(default=scripted) as fake:
        async for a in serve(make_config, fake, admin_token=TOKEN):
            yield a


async def test_session_page_heading_quality_table_and_markers(admin: Admin) -> None:
    await admin.rg.ask("Track these tickets: " + TICKETS)
    for i in range(4):
        await admin.rg.ask(f"short question {i}")
    # Compact now: the memory flush runs first, so both fall after the last turn.
    assert (await operations.compact(admin.rg.gateway, KEY)).committed
    status, page, _ = await admin.get(f"/admin/session?key={quote(KEY, safe='')}", headers=BEARER)
    assert status == 200

    heading = re.search(r'<h1 id="session-heading">(.*?)</h1>', page, re.S)
    assert heading is not None
    assert "Session: webchat, direct message" in heading[1] and KEY in heading[1]

    # The quality report: a <table> inside a <details> that is not open; no JSON anywhere.
    report = re.search(r'<details class="quality">(.*?)</details>', page, re.S)
    assert report is not None, "collapsed (no open attribute)"
    assert '<table class="quality">' in report[1]
    rows = dict(re.findall(r'<tr><th scope="row">(.*?)</th><td>(.*?)</td></tr>', report[1]))
    assert rows["result"] == "passed" and rows["sections"] == "5/5"
    assert rows["reason"].startswith("manual (")
    assert "ORD-10000, ORD-10001" in next(v for k, v in rows.items() if k.startswith("identifiers listed"))
    assert "<details open" not in page and "<details class=\"summary\" open" not in page
    for raw in ("&#34;sections_present&#34;", '"sections_present"', "identifier_retention&#34;"):
        assert raw not in page, "no raw JSON of the report"

    # The flush and the compaction: two lines apart, a glyph each, a legend for both.
    flush_x = re.findall(r'<line class="marker-flush" x1="([\d.]+)"', page)
    compaction_x = re.findall(r'<line class="marker-compaction" x1="([\d.]+)"', page)
    assert len(flush_x) == len(compaction_x) == 1
    assert float(compaction_x[0]) - float(flush_x[0]) == pytest.approx(MARKER_GAP)
    assert page.count('class="glyph-flush"') == page.count('class="glyph-compaction"') == 1
    legend = re.search(r'<ul class="legend" id="chart-legend">(.*?)</ul>', page, re.S)
    assert legend is not None
    assert "compaction (solid line)" in legend[1] and "memory flush (dotted line)" in legend[1]

    # The panel "Compact now" returns shows the new summary open; its report stays collapsed.
    for i in range(3):
        await admin.rg.ask(f"another question {i} " + TICKETS)
    status, panel, _ = await admin.post(
        f"/admin/session/compact?key={quote(KEY, safe='')}", {},
        headers={**BEARER, "HX-Request": "true"},
    )
    assert status == 200 and "Compacted the conversation" in panel
    assert panel.count('<details class="summary" open') == 1
    assert panel.count('<details class="quality">') == 2


def test_markers_between_the_same_turns_stand_apart_in_the_order_they_happened() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    turns = tuple(
        TurnTokens(at=t0 + timedelta(minutes=i), reply_seq=i, prompt_tokens=n,
                   local_prompt_tokens=n, error=None)
        for i, n in enumerate([1000, 9000, 2000])
    )
    between = t0 + timedelta(minutes=1, seconds=30)
    chart = token_chart(TokenHistory(
        window=10_000, compact_at=8_000, flush_at=6_000, turns=turns,
        compactions=(
            CompactionMark(between + timedelta(seconds=5), 1, 9000, 1500),
            CompactionMark(t0 + timedelta(minutes=5), 2, 9000, 1500),  # after the last turn
        ),
        flushes=(FlushMark(between, cycle=0, ok=True, notes=2),
                 FlushMark(between + timedelta(seconds=1), cycle=0, ok=False, notes=0)),
    ))
    flush, failed, compaction, late = chart.markers
    assert (flush.kind, failed.kind, compaction.kind) == ("flush", "flush-failed", "compaction")
    xs = [p.x for p in chart.points]
    assert xs[1] < flush.x < failed.x < compaction.x < xs[2]
    assert failed.x - flush.x == compaction.x - failed.x == MARKER_GAP
    assert flush.glyph_y < failed.glyph_y < compaction.glyph_y, "glyphs stacked"
    assert compaction.glyph != flush.glyph and compaction.glyph.count("L") == 1, "a triangle"
    assert late.x <= chart.left + chart.plot_width - 5, "kept inside the plot"


def test_quality_rows_read_a_stored_report() -> None:
    stored = {
        "sections_present": ["## Decisions", "## Open TODOs"], "sections_missing": ["## Rules"],
        "identifiers_total": 300, "identifiers_missing": ["ORD-9"],
        "identifier_retention": 0.9967, "latest_ask_reflected": False,
        "semantic_retention": 0.91, "compression_ratio": 0.25, "tokens_saved": 7219,
        "in_ideal_range": True, "passed": False, "problems": ["a section is missing"],
        "retries_used": 1, "fallback": None, "secrets_in_summary": 0,
        "identifiers_in_summary": 67, "identifiers_archived": 233, "reason": "overflow",
        "attempts": 2, "errors": [], "notes": ["merged 2 parts"],
        "model_identifier_retention": 0.0448,
        "identifiers": [f"ORD-{n}" for n in range(100)], "seconds": 3.25, "extra_field": 7,
    }
    rows = dict(quality_rows(stored))
    assert list(rows)[:3] == ["result", "reason", "sections"]
    assert rows["result"] == "did not pass: a section is missing"
    assert rows["reason"] == "overflow (2 attempts, 1 retry, 3.2 s)"
    assert rows["sections"] == "2/3; missing: ## Rules"
    assert rows["identifiers"] == (
        "300 in the compacted messages; retention 100%; 67 listed in the summary; "
        "233 archived (history_search finds them)"
    )
    assert rows["identifiers missing (1)"] == "ORD-9"
    assert rows["identifiers listed (100)"].endswith("ORD-59 … and 40 more")
    assert rows["latest ask"] == "not reflected"
    assert rows["compression"] == "0.25, 7,219 tokens saved (in the ideal range)"
    assert rows["notes"] == "merged 2 parts" and "errors" not in rows
    assert rows["extra field"] == "7", "an unknown key is shown, not dropped"
    assert quality_rows({"reason": "reset", "why": "/new"}) == [
        ("reason", "reset"), ("why", "/new"),
    ]
    assert quality_rows(None) == []


def test_admin_status_says_where_the_admin_ui_is_or_how_to_turn_it_on() -> None:
    url = "http://127.0.0.1:8787"
    on = admin_status(WebSection(admin_token="x" * 16), url)
    assert on == "admin UI at http://127.0.0.1:8787/admin/ (token required: [web] admin_token)"
    anonymous = admin_status(WebSection(admin_anonymous=True), url)
    assert anonymous.startswith("admin UI at http://127.0.0.1:8787/admin/ (no login")
    off = admin_status(WebSection(), url)
    assert off.startswith("admin UI is off: set [web] admin_token") and "restart" in off


@pytest.mark.parametrize("token", [TOKEN, None])
async def test_the_web_server_logs_the_admin_ui_line_when_it_starts(
    make_config: MakeConfig, caplog: pytest.LogCaptureFixture, token: str | None
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.web.server")
    async with FakeOpenAI(default=scripted) as fake:
        async for a in serve(make_config, fake, admin_token=token):
            lines = [r.getMessage() for r in caplog.records if "admin UI" in r.getMessage()]
            if token:
                assert lines == [f"admin UI at {a.url}/admin/ (token required: [web] admin_token)"]
            else:
                assert len(lines) == 1 and lines[0].startswith("admin UI is off: set [web]")
                assert f"{a.url}/admin/" in lines[0]
