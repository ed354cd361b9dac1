"""`memory_search` is the one place to look: notes and this conversation's archived messages
together, an exact identifier in one call, never another session's messages; `memory_write`
does not save a note memory already holds."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.tools.memory import MemoryTools
from gateway.tools.registry import ToolContext, ToolRegistry
from memory.embeddings import Encoder, shared_encoder
from memory.index import ArchivedMessage, MemoryIndex
from memory.workspace import ensure_workspace

ALICE = "agent:main:webchat:direct:alice"
BOB = "agent:main:webchat:direct:bob"


def archived(seq: int, text: str, role: str = "user") -> ArchivedMessage:
    return ArchivedMessage(seq=seq, role=role, text=text, created_at=None, name=None)


def build(root: Path, encoder: Encoder | None) -> tuple[ToolRegistry, MemoryIndex, Path]:
    ws = root / "ws"
    ensure_workspace(ws)
    (ws / "MEMORY.md").write_text(
        "# Memory\n\nORD-88123 belongs to the Hamburg warehouse account.\n", "utf-8"
    )
    index = MemoryIndex(root / "index.db", ws, encoder=encoder)
    index.archive_messages(ALICE, [
        archived(3, "order ORD-88123 failed to ship, the courier lost it"),
        archived(4, "We settled on SQLite in WAL mode for the local store.", "assistant"),
    ])
    index.archive_messages(BOB, [archived(9, "Bob's private order ORD-88123-B and ORD-55501")])
    tools = ToolRegistry()
    for tool in MemoryTools(ws, index, "UTC").tools():
        tools.register(tool)
    return tools, index, ws


@pytest.fixture
def bm25(tmp_path: Path) -> Iterator[tuple[ToolRegistry, MemoryIndex, Path]]:
    tools, index, ws = build(tmp_path, None)
    yield tools, index, ws
    index.close()


async def call(tools: ToolRegistry, name: str, key: str = ALICE, **args: object) -> str:
    result = await tools.call(name, json.dumps(args), ToolContext(session_key=key))
    return result.content


async def test_an_identifier_finds_notes_and_this_conversation_in_one_call(
    bm25: tuple[ToolRegistry, MemoryIndex, Path],
) -> None:
    tools, _, _ = bm25
    found = await call(tools, "memory_search", query="ORD-88123")
    assert "MEMORY.md:" in found and "Hamburg" in found
    assert "earlier in this conversation (seq 3, user; history_search" in found
    assert "courier" in found
    assert "ORD-55501" not in found and "private" not in found  # Bob's archive


async def test_another_session_never_sees_this_one(
    bm25: tuple[ToolRegistry, MemoryIndex, Path],
) -> None:
    tools, _, _ = bm25
    for corpus in ("all", "history"):
        found = await call(tools, "memory_search", BOB, query="courier lost", corpus=corpus)
        assert "courier" not in found, corpus
    found = await call(tools, "memory_search", BOB, query="ORD-55501", corpus="history")
    assert "seq 9" in found


async def test_corpus_narrows_and_a_bad_one_is_refused(
    bm25: tuple[ToolRegistry, MemoryIndex, Path],
) -> None:
    tools, _, _ = bm25
    notes_only = await call(tools, "memory_search", query="ORD-88123", corpus="notes")
    assert "MEMORY.md:" in notes_only and "seq 3" not in notes_only
    history = await call(tools, "memory_search", query="ORD-88123", corpus="history")
    assert "seq 3" in history and "MEMORY.md" not in history
    for bad in ("everyone", "transcripts"):
        refused = await call(tools, "memory_search", query="ORD-88123", corpus=bad)
        assert refused.startswith("error") and bad in refused


async def test_a_note_already_held_is_not_written_again(
    bm25: tuple[ToolRegistry, MemoryIndex, Path], caplog: pytest.LogCaptureFixture
) -> None:
    tools, _, ws = bm25
    saved = await call(tools, "memory_write", text="The office wifi is gh-5g.")
    assert saved.startswith("saved to memory/")
    note = next((ws / "memory").glob("*.md"))
    before = note.read_text("utf-8")
    with caplog.at_level(logging.INFO, logger="gateway.tools.memory"):
        again = await call(tools, "memory_write", text="the office WiFi is gh-5g")
    assert again.startswith("not saved again: memory/") and "the same text" in again
    assert note.read_text("utf-8") == before
    assert [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()] == [
        f"memory note from {ALICE} skipped: already in {again.split(': ', 1)[1].rsplit(' already', 1)[0]}"
    ]
    # Another conversation cannot see Alice's note: its own copy is written (a "not saved
    # again" would tell Bob that someone else's note says it).
    theirs = await call(tools, "memory_write", BOB, text="the office WiFi is gh-5g")
    assert theirs.startswith("saved to memory/")
    changed = await call(tools, "memory_write", text="The office wifi is gh-6g now.")
    assert changed.startswith("saved to memory/")
    assert "gh-6g" in note.read_text("utf-8")


async def test_by_meaning_this_conversation_answers_a_paraphrase(tmp_path: Path) -> None:
    encoder, reason = shared_encoder()
    if encoder is None:
        pytest.skip(reason)
    tools, index, _ = build(tmp_path, encoder)
    try:
        found = await call(tools, "memory_search", query="which database did we pick?")
        assert found.splitlines()[0].startswith("earlier in this conversation (seq 4, assistant")
        assert found.endswith("(ranked by hybrid search)")
        theirs = await call(tools, "memory_search", BOB, query="which database did we pick?")
        assert "SQLite" not in theirs
    finally:
        index.close()


async def test_decay_from_the_config_puts_the_newer_of_two_equal_notes_first(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ensure_workspace(ws)
    notes = {  # the older one is the better match by words
        "2025-01-05": "The backup host is bk-7 (backup host bk-7 takes the nightly dumps).",
        "2026-11-30": "The backup host is bk-7, still.",
    }
    for day, text in notes.items():
        (ws / "memory" / f"{day}.md").write_text(
            f"# {day}\n\n## 09:00:00 · {ALICE}\n{text}\n", "utf-8"
        )
    with MemoryIndex(tmp_path / "index.db", ws) as index:
        for half_life, first in ((None, "2025-01-05"), (30.0, "2026-11-30")):
            tools = ToolRegistry()
            for tool in MemoryTools(ws, index, "UTC", half_life_days=half_life).tools():
                tools.register(tool)
            found = await call(tools, "memory_search", query="backup host bk-7", corpus="notes")
            assert found.startswith(f"memory/{first}.md:"), (half_life, found)
