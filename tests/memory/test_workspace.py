"""Workspace confinement: every path the agent names stays inside the workspace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory.workspace import (
    WorkspacePathError,
    agents_template,
    ensure_workspace,
    list_workspace_files,
    resolve_in_workspace,
    split_lines,
)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    ensure_workspace(root)
    (root / "memory" / "2025-01-31.md").write_text("# 2025-01-31\n\nhello\n", encoding="utf-8")
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "passwd.md").write_text("root:x:0:0\n", encoding="utf-8")
    return secret


def test_ensure_workspace_creates_once_and_never_overwrites(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    made = ensure_workspace(root)
    assert {p.name for p in made} >= {"ws", "memory", "artifacts", "AGENTS.md", "MEMORY.md"}
    assert (root / "AGENTS.md").read_text(encoding="utf-8") == agents_template()
    (root / "MEMORY.md").write_text("people wrote this", encoding="utf-8")
    assert ensure_workspace(root) == []
    assert (root / "MEMORY.md").read_text(encoding="utf-8") == "people wrote this"


@pytest.mark.parametrize(
    ("attempt", "reason"),
    [
        ("../x", "'..'"),
        ("memory/../../etc/passwd", "'..'"),
        ("memory/../MEMORY.md", "'..'"),
        ("..\\x", "'..'"),
        ("memory\\..\\..\\x", "'..'"),
        ("/etc/passwd", "absolute"),
        ("//etc/passwd", "absolute"),
        ("C:\\Windows", "absolute"),
        ("c:/Windows/system32", "absolute"),
        ("C:relative", "absolute"),
        ("\\\\server\\share\\x", "absolute"),
        ("\\Windows", "absolute"),
        ("~/notes.md", "home"),
        ("memory/a\x00.md", "NUL"),
        ("", "empty"),
        ("   ", "empty"),
        ("MEMORY.md::$DATA", "':'"),
        (".", "workspace itself"),
        ("./", "workspace itself"),
    ],
)
def test_traversal_attempts_are_rejected(ws: Path, attempt: str, reason: str) -> None:
    with pytest.raises(WorkspacePathError, match=reason):
        resolve_in_workspace(ws, attempt)
    with pytest.raises(WorkspacePathError):
        resolve_in_workspace(ws, attempt, write=True)


def test_plain_relative_paths_resolve_inside(ws: Path) -> None:
    base = ws.resolve()
    assert resolve_in_workspace(ws, "MEMORY.md") == base / "MEMORY.md"
    assert resolve_in_workspace(ws, "./memory//2025-01-31.md") == base / "memory/2025-01-31.md"
    assert resolve_in_workspace(ws, "memory\\2025-01-31.md") == base / "memory/2025-01-31.md"
    assert resolve_in_workspace(ws, "memory/not-yet.md") == base / "memory/not-yet.md"


def test_symlinked_file_pointing_outside_is_rejected(ws: Path, outside: Path) -> None:
    (ws / "memory" / "escape.md").symlink_to(outside / "passwd.md")
    with pytest.raises(WorkspacePathError, match="outside the workspace"):
        resolve_in_workspace(ws, "memory/escape.md")


def test_symlinked_folder_pointing_outside_is_rejected(ws: Path, outside: Path) -> None:
    (ws / "linked").symlink_to(outside, target_is_directory=True)
    with pytest.raises(WorkspacePathError, match="outside the workspace"):
        resolve_in_workspace(ws, "linked/passwd.md")
    (ws / "memory" / "deep").symlink_to(outside, target_is_directory=True)
    with pytest.raises(WorkspacePathError, match="outside the workspace"):
        resolve_in_workspace(ws, "memory/deep/new.md", write=True)


def test_symlink_that_stays_inside_is_allowed_for_reading(ws: Path) -> None:
    (ws / "memory" / "alias.md").symlink_to(ws / "memory" / "2025-01-31.md")
    target = resolve_in_workspace(ws, "memory/alias.md")
    assert target == (ws / "memory" / "2025-01-31.md").resolve()


@pytest.mark.parametrize(
    "name", ["MEMORY.md", "AGENTS.md", "agents.md", "Memory.MD", "./MEMORY.md", "MEMORY.md."]
)
def test_curated_files_are_read_only_to_the_agent(ws: Path, name: str) -> None:
    with pytest.raises(WorkspacePathError, match="read-only"):
        resolve_in_workspace(ws, name, write=True)


@pytest.mark.parametrize("name", ["notes.md", "artifacts/out.txt", "memory", "memory/"])
def test_writes_only_under_memory(ws: Path, name: str) -> None:
    with pytest.raises(WorkspacePathError, match="only write under memory/"):
        resolve_in_workspace(ws, name, write=True)


def test_write_through_a_symlink_to_memory_md_is_rejected(ws: Path) -> None:
    (ws / "memory" / "sneaky.md").symlink_to(ws / "MEMORY.md")
    with pytest.raises(WorkspacePathError, match="read-only"):
        resolve_in_workspace(ws, "memory/sneaky.md", write=True)


def test_write_to_a_daily_note_is_allowed(ws: Path) -> None:
    target = resolve_in_workspace(ws, "memory/2025-02-01.md", write=True)
    assert target == ws.resolve() / "memory" / "2025-02-01.md"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "a",
                "b",
                ".",
                "/",
                "\\",
                ":",
                "~",
                "\x00",
                " ",
                "C",
                "..",
                "MEMORY.md",
                "memory",
                "agents.MD",
            ]
        ),
        max_size=8,
    ).map("".join)
)
def test_any_input_is_rejected_or_confined(
    tmp_path_factory: pytest.TempPathFactory, raw: str
) -> None:
    root = tmp_path_factory.getbasetemp() / "prop-ws"
    root.mkdir(exist_ok=True)
    for write in (False, True):
        try:
            target = resolve_in_workspace(root, raw, write=write)
        except WorkspacePathError:
            continue
        assert target.is_relative_to(root.resolve())
        if write:
            assert target.is_relative_to(root.resolve() / "memory")


def test_list_workspace_files(ws: Path, outside: Path) -> None:
    (ws / "memory" / "escape.md").symlink_to(outside / "passwd.md")
    (ws / "memory" / "alias.md").symlink_to(ws / "memory" / "2025-01-31.md")
    (ws / "artifacts" / "tool-output.txt").write_text("a\nb", encoding="utf-8")
    (ws / "artifacts" / "image.png").write_bytes(b"\x89PNG")
    (ws / ".git").mkdir()
    (ws / ".git" / "HEAD.md").write_text("x", encoding="utf-8")
    (ws / "linked").symlink_to(outside, target_is_directory=True)
    files = {info.path: info for info in list_workspace_files(ws)}
    assert set(files) == {
        "AGENTS.md",
        "MEMORY.md",
        "artifacts/tool-output.txt",
        "memory/2025-01-31.md",
        "memory/alias.md",
    }
    assert files["memory/2025-01-31.md"].lines == 3
    assert files["artifacts/tool-output.txt"].lines == 2  # no final newline still counts
    assert files["memory/2025-01-31.md"].size == len("# 2025-01-31\n\nhello\n")
    assert files["MEMORY.md"].modified.tzinfo is not None


def test_list_workspace_files_of_a_missing_folder_is_empty(tmp_path: Path) -> None:
    assert list_workspace_files(tmp_path / "nope") == []


def test_split_lines_matches_editor_numbering() -> None:
    assert split_lines("") == []
    assert split_lines("a\nb\n") == ["a", "b"]
    assert split_lines("a\r\nb") == ["a", "b"]
    assert split_lines("a\x0cb\u2028c\n\n") == ["a\x0cb\u2028c", ""]


def test_paths_are_checked_without_touching_the_filesystem_outside(ws: Path) -> None:
    before = set(os.listdir(ws.parent))
    for attempt in ("../created.md", "/tmp/created.md"):
        with pytest.raises(WorkspacePathError):
            resolve_in_workspace(ws, attempt, write=True)
    assert set(os.listdir(ws.parent)) == before


def test_symlink_loops_and_bad_unicode_are_path_errors(ws: Path) -> None:
    (ws / "memory" / "loop.md").symlink_to(ws / "memory" / "loop.md")
    with pytest.raises(WorkspacePathError):
        resolve_in_workspace(ws, "memory/loop.md")
    with pytest.raises(WorkspacePathError, match="surrogate"):
        resolve_in_workspace(ws, "memory/\ud800.md")
    assert "memory/loop.md" not in {info.path for info in list_workspace_files(ws)}
