"""A note already in memory is not written again; a note that changes a fact always is."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from memory.dedupe import NEAR_COSINE, find_duplicate, folded, restates, tokens
from memory.embeddings import Encoder
from memory.index import MemoryIndex
from memory.notes import append_note
from memory.workspace import ensure_workspace

EARLIER = [
    "TODO: renew the TLS certificate for api.example.com before Friday.",
    "The staging database is db7.",
    "We decided not to use MongoDB for the event log.",
    "Alice pays Bob every Friday.",
    "用户喜欢深色主题，编辑器也是。",
]


def notes(root: Path) -> Path:
    ws = root / "ws"
    ensure_workspace(ws)
    for text in EARLIER:
        append_note(ws, text, session_key="agent:main:webchat:direct:alice", tz="UTC")
    return ws


@pytest.fixture
def with_model(tmp_path: Path, use: Encoder) -> Iterator[tuple[MemoryIndex, Path]]:
    ws = notes(tmp_path)
    with MemoryIndex(tmp_path / "i.db", ws, encoder=use) as index:
        index.refresh()
        yield index, ws


@pytest.fixture
def without_model(tmp_path: Path) -> Iterator[tuple[MemoryIndex, Path]]:
    ws = notes(tmp_path)
    with MemoryIndex(tmp_path / "i.db", ws) as index:
        index.refresh()
        yield index, ws


@pytest.mark.parametrize(
    "text",
    [
        "Renew the TLS certificate for api.example.com.",  # inside it
        "Renew TLS certificate for api.example.com",  # fewer words, same order
        "the staging database is db7",
        "用户喜欢深色主题",
    ],
)
def test_restating_an_earlier_note_is_a_duplicate(
    with_model: tuple[MemoryIndex, Path], text: str
) -> None:
    index, ws = with_model
    found = find_duplicate(index, ws, text)
    assert found is not None, text
    assert found.path.startswith("memory/") and found.start_line >= 1
    if found.how == "near":
        assert found.cosine is not None and found.cosine >= NEAR_COSINE


@pytest.mark.parametrize(
    "text",
    [
        "The staging database is db8.",  # a changed value (cosine 0.94 to the db7 note)
        "We decided to use MongoDB for the event log.",  # the negation dropped
        "Bob pays Alice every Friday.",  # the roles swapped (cosine 0.97)
        "The TLS certificate for api.example.com was renewed on Tuesday.",  # news
        "用户不喜欢深色主题",
    ],
)
def test_a_note_that_changes_a_fact_is_never_a_duplicate(
    with_model: tuple[MemoryIndex, Path], text: str
) -> None:
    index, ws = with_model
    assert find_duplicate(index, ws, text) is None, text


def test_without_the_model_only_an_exact_copy_counts(
    without_model: tuple[MemoryIndex, Path],
) -> None:
    index, ws = without_model
    exact = find_duplicate(index, ws, "  the STAGING database is: db7 ")
    assert exact is not None and exact.how == "exact" and exact.cosine is None
    inside = find_duplicate(index, ws, "Renew the TLS certificate for api.example.com.")
    assert inside is not None and inside.how == "exact"
    assert find_duplicate(index, ws, "Renew TLS certificate for api.example.com") is None
    assert find_duplicate(index, ws, "The staging database is db8.") is None


def test_a_hand_edit_counts_once_refreshed(without_model: tuple[MemoryIndex, Path]) -> None:
    index, ws = without_model
    (ws / "MEMORY.md").write_text("# Memory\n\nThe office wifi is called gh-5g.\n", "utf-8")
    assert find_duplicate(index, ws, "The office wifi is called gh-5g") is None  # not indexed
    index.refresh()
    found = find_duplicate(index, ws, "The office wifi is called gh-5g")
    assert found is not None and found.path == "MEMORY.md"


def test_headings_are_not_facts(without_model: tuple[MemoryIndex, Path]) -> None:
    index, ws = without_model
    # The attribution heading's session key is not part of what a note says.
    assert find_duplicate(index, ws, "agent main webchat direct alice") is None


def test_word_rules() -> None:
    assert folded("The  STAGING-db, is db7!") == "the staging db is db7"
    assert tokens("用户 likes 深色") == ["用", "户", "likes", "深", "色"]
    assert restates(tokens("decided to use X"), tokens("we don't mind. we decided to use X"))
    assert not restates(tokens("decided to use X"), tokens("we decided not to use X"))
    assert not restates(tokens("we never"), tokens(""))
    assert not restates([], tokens("anything"))
