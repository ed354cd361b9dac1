"""The admin memory page's search: the configured mode or the one picked, why each hit ranks
where it does (BM25 rank, cosine, fused score, the mode used), BM25 said out loud while there
is no model, and bad query parameters refused with a 400 and one log line."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from urllib.parse import urlencode

import pytest

from memory.embeddings import HashingEncoder
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.helpers.admin import BEARER, TOKEN, Admin, serve
from tests.helpers.llm_scripts import scripted

NOTE = (
    "# 2026-01-02\n\n## 09:00\n\n- Deploy window is Monday 09:00; ticket ORD-5521.\n\n"
    "## 10:00\n\n- Reset the staging password on Tuesdays.\n"
)


@pytest.fixture
async def admin(make_config: MakeConfig) -> AsyncIterator[Admin]:
    async with FakeOpenAI(default=scripted) as fake:
        async for a in serve(make_config, fake, admin_token=TOKEN):
            (a.rg.gateway.config.workspace / "memory" / "2026-01-02.md").write_text(
                NOTE, encoding="utf-8"
            )
            yield a


async def search(admin: Admin, **params: str) -> tuple[int, str]:
    status, body, _ = await admin.get(f"/admin/memory?{urlencode(params)}", headers=BEARER)
    return status, body


def cells(body: str, name: str) -> list[str]:
    """The text of the hits table's cells of class `name`, top to bottom."""
    return re.findall(rf'<td class="[^"]*\b{name}">([^<]*)</td>', body)


def selected_mode(body: str) -> str:
    select = body[body.index('id="memory-mode"') :]
    found = re.search(r'<option value="(\w+)" selected>', select[: select.index("</select>")])
    assert found, select
    return found.group(1)


async def test_without_the_model_the_configured_mode_falls_back_to_bm25_and_says_so(
    admin: Admin,
) -> None:
    status, body = await search(admin, q="ORD-5521")
    assert status == 200, body
    assert selected_mode(body) == "hybrid", "[memory] search_mode is the default"
    assert 'id="memory-bm25-only"' in body and "embeddings = false" in body
    assert "Ranked by <strong>bm25</strong> (asked for hybrid)" in body
    assert cells(body, "mode-used") == ["bm25"]
    assert cells(body, "bm25-rank") == ["1"]
    assert cells(body, "cosine") == ["-"] and cells(body, "fused") == ["-"]
    assert "memory/2026-01-02.md:" in body and "AGENTS.md" in body, "hit and file list"
    # Asking for BM25 is not a fallback: no notice.
    status, body = await search(admin, q="ORD-5521", mode="bm25")
    assert status == 200 and 'id="memory-bm25-only"' not in body
    assert selected_mode(body) == "bm25"


async def test_with_a_model_each_mode_shows_why_a_hit_ranks_there(admin: Admin) -> None:
    admin.rg.gateway.memory_index.use_encoder(HashingEncoder())
    status, body = await search(admin, q="staging password", mode="hybrid")
    assert status == 200, body
    assert 'id="memory-bm25-only"' not in body
    assert "Ranked by <strong>hybrid</strong>." in body
    modes, ranks = cells(body, "mode-used"), cells(body, "bm25-rank")
    cosines, fused = cells(body, "cosine"), cells(body, "fused")
    assert modes and set(modes) == {"hybrid"}
    assert ranks[0] == "1", "the chunk with both words leads the BM25 list"
    assert all(re.fullmatch(r"-?\d\.\d{3}", c) for c in cosines), cosines
    assert all(float(f) > 0 for f in fused), fused
    assert "staging password" in body
    status, body = await search(admin, q="staging password", mode="vector")
    assert status == 200 and selected_mode(body) == "vector"
    assert set(cells(body, "mode-used")) == {"vector"}
    assert set(cells(body, "bm25-rank")) == {"-"} and set(cells(body, "fused")) == {"-"}
    assert all(c != "-" for c in cells(body, "cosine"))
    status, body = await search(admin, q="staging password", mode="bm25", corpus="all")
    assert status == 200
    assert set(cells(body, "mode-used")) == {"bm25"} and set(cells(body, "cosine")) == {"-"}
    assert cells(body, "bm25-rank")[:2] == ["1", "2"]


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ({"q": "x", "mode": "fuzzy"}, "mode must be hybrid, bm25 or vector"),
        ({"q": "x", "corpus": "secrets"}, "corpus must be notes, transcripts or all"),
        ({"q": "x" * 501}, "at most 500"),
    ],
    ids=["unknown-mode", "unknown-corpus", "long-query"],
)
async def test_bad_query_parameters_are_a_400_with_one_log_line(
    admin: Admin, caplog: pytest.LogCaptureFixture, params: dict[str, str], said: str
) -> None:
    caplog.set_level(logging.INFO)
    status, body = await search(admin, **params)
    assert status == 400
    assert said in body and 'id="memory-error"' in body
    assert 'id="hits"' not in body and "AGENTS.md" in body, "no search; the browser still works"
    refusals = [
        r for r in caplog.records
        if r.name.startswith("gateway") and r.levelno >= logging.WARNING
    ]
    assert len(refusals) == 1 and said in refusals[0].getMessage(), refusals
    assert refusals[0].exc_info is None and "Traceback" not in caplog.text
    # 500 characters are still searched.
    status, _ = await search(admin, q="x" * 500)
    assert status == 200
