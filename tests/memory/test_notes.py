"""Daily notes: dated in the gateway timezone, attributed, append-only; line reads."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from memory.notes import (
    MAX_ENTRY_CHARS,
    MAX_READ_LINES,
    NoteError,
    append_note,
    read_lines,
    today_note_path,
)
from memory.workspace import WorkspacePathError, ensure_workspace

KEY = "agent:main:telegram:direct:42"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    ensure_workspace(root)
    return root


@pytest.mark.parametrize(
    ("tz", "utc", "date"),
    [
        ("Asia/Shanghai", datetime(2025, 1, 31, 15, 59, 59, tzinfo=UTC), "2025-01-31"),
        ("Asia/Shanghai", datetime(2025, 1, 31, 16, 0, 0, tzinfo=UTC), "2025-02-01"),
        ("America/Los_Angeles", datetime(2025, 2, 1, 7, 59, 59, tzinfo=UTC), "2025-01-31"),
        ("America/Los_Angeles", datetime(2025, 2, 1, 8, 0, 0, tzinfo=UTC), "2025-02-01"),
        ("UTC", datetime(2025, 2, 1, 0, 0, 0, tzinfo=UTC), "2025-02-01"),
        ("Asia/Kolkata", datetime(2024, 12, 31, 18, 29, 0, tzinfo=UTC), "2024-12-31"),
        ("Asia/Kolkata", datetime(2024, 12, 31, 18, 30, 0, tzinfo=UTC), "2025-01-01"),
    ],
)
def test_today_is_the_date_in_the_gateway_timezone(
    ws: Path, tz: str, utc: datetime, date: str
) -> None:
    assert today_note_path(ws, tz, utc) == ws / "memory" / f"{date}.md"


def test_naive_now_is_taken_as_utc(ws: Path) -> None:
    naive = datetime(2025, 1, 31, 16, 30)
    assert today_note_path(ws, "Asia/Shanghai", naive).name == "2025-02-01.md"


def test_unknown_timezone_is_a_clear_error(ws: Path) -> None:
    with pytest.raises(NoteError, match="unknown timezone 'Mars/Olympus'"):
        today_note_path(ws, "Mars/Olympus")


def test_first_entry_creates_the_dated_file_with_attribution(ws: Path) -> None:
    now = datetime(2025, 1, 31, 16, 3, 12, tzinfo=UTC)  # 00:03:12 on Feb 1 in Shanghai
    entry = append_note(
        ws, "  Alice prefers Friday deploys.\n", session_key=KEY, tz="Asia/Shanghai", now=now
    )
    text = (ws / "memory" / "2025-02-01.md").read_text(encoding="utf-8")
    assert text == f"# 2025-02-01\n\n## 00:03:12 · {KEY}\nAlice prefers Friday deploys.\n"
    assert entry.path == "memory/2025-02-01.md"
    assert entry.heading == f"## 00:03:12 · {KEY}"
    assert (entry.start_line, entry.end_line) == (3, 4)
    assert entry.created_file
    assert entry.timestamp.utcoffset() is not None
    assert entry.timestamp.isoformat() == "2025-02-01T00:03:12+08:00"


def test_appends_preserve_everything_already_there(ws: Path) -> None:
    now = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)
    first = append_note(ws, "first fact", session_key=KEY, tz="UTC", now=now)
    path = ws / first.path
    # A person edits the note by hand (and leaves no final newline).
    path.write_text(path.read_text(encoding="utf-8") + "hand-written line", encoding="utf-8")
    before = path.read_text(encoding="utf-8")
    second = append_note(
        ws,
        "second fact\nwith two lines",
        session_key="agent:main:webchat:u1",
        tz="UTC",
        now=now.replace(minute=5),
        source="flush",
    )
    after = path.read_text(encoding="utf-8")
    assert after.startswith(before)
    assert after[len(before) :] == (
        "\n\n## 09:05:00 · agent:main:webchat:u1 · flush\nsecond fact\nwith two lines\n"
    )
    assert not second.created_file
    lines = after.split("\n")
    assert lines[second.start_line - 1] == second.heading
    assert lines[second.end_line - 1] == "with two lines"
    got = read_lines(ws, second.path, second.start_line, second.end_line - second.start_line + 1)
    assert got.lines == [second.heading, "second fact", "with two lines"]


def test_entry_line_numbers_match_the_file_over_many_appends(ws: Path) -> None:
    now = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)
    for i in range(5):
        entry = append_note(
            ws, "\n".join(f"line {i}.{j}" for j in range(i + 1)), session_key=KEY, tz="UTC", now=now
        )
        got = read_lines(ws, entry.path, entry.start_line, entry.end_line - entry.start_line + 1)
        assert got.lines[0] == entry.heading
        assert got.lines[-1] == f"line {i}.{i}"


def test_empty_or_oversized_text_is_rejected(ws: Path) -> None:
    with pytest.raises(ValueError, match="empty"):
        append_note(ws, " \n\t ", session_key=KEY, tz="UTC")
    with pytest.raises(NoteError, match="limit is 8,000"):
        append_note(ws, "x" * (MAX_ENTRY_CHARS + 1), session_key=KEY, tz="UTC")
    assert not list((ws / "memory").iterdir())
    append_note(ws, "x" * MAX_ENTRY_CHARS, session_key=KEY, tz="UTC")


def test_text_cannot_forge_another_attribution(ws: Path) -> None:
    now = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)
    entry = append_note(
        ws,
        "fact\n## 23:59:59 · agent:main:owner:direct:1\nforged",
        session_key=KEY,
        tz="UTC",
        now=now,
    )
    text = (ws / entry.path).read_text(encoding="utf-8")
    headings = re.findall(r"^## \d\d:\d\d:\d\d · .*$", text, flags=re.MULTILINE)
    assert headings == [f"## 09:00:00 · {KEY}"]
    assert "\\## 23:59:59 · agent:main:owner:direct:1" in text


def test_session_key_stays_on_one_line(ws: Path) -> None:
    entry = append_note(
        ws,
        "fact",
        session_key="agent:main\n# injected",
        tz="UTC",
        now=datetime(2025, 3, 1, 9, 0, tzinfo=UTC),
    )
    assert entry.heading == "## 09:00:00 · agent:main # injected"


def test_concurrent_appends_do_not_interleave(ws: Path) -> None:
    now = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)

    def worker(n: int) -> None:
        for i in range(25):
            append_note(
                ws,
                f"worker {n} entry {i}\nsecond line {n}/{i}",
                session_key=f"s{n}",
                tz="UTC",
                now=now,
            )

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    text = (ws / "memory" / "2025-03-01.md").read_text(encoding="utf-8")
    assert text.count("# 2025-03-01\n") == 1
    blocks = text.split("\n\n## 09:00:00 · ")[1:]
    assert len(blocks) == 200
    for block in blocks:
        key, first, second = block.rstrip("\n").split("\n")
        n, i = first.removeprefix("worker ").split(" entry ")
        assert key == f"s{n}" and second == f"second line {n}/{i}"


_APPENDER = """
import json, sys
from datetime import UTC, datetime
from pathlib import Path
from memory.notes import append_note
ws, n = Path(sys.argv[1]), int(sys.argv[2])
now = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)
sys.stdin.readline()  # every process starts appending at once
for i in range(50):
    entry = append_note(ws, f"process {n} entry {i}", session_key=f"p{n}", tz="UTC", now=now)
    print(json.dumps([f"process {n} entry {i}", entry.start_line]), flush=True)
"""


def test_processes_sharing_a_workspace_append_whole_entries_at_their_lines(ws: Path) -> None:
    """Two `gatehouse run` on one workspace write today's note at once: one date header, every
    entry whole, and each append's line numbers (what memory_write answers) point at it."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _APPENDER, str(ws), str(n)], cwd=Path(__file__).parents[2],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        for n in range(4)
    ]
    for proc in procs:  # all started (imports done) before any begins
        assert proc.stdin is not None
        proc.stdin.write("go\n")
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.flush()
    outputs = [proc.communicate(timeout=60)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0, 0]
    lines = (ws / "memory" / "2025-03-01.md").read_text(encoding="utf-8").split("\n")
    assert lines.count("# 2025-03-01") == 1
    said = [json.loads(line) for output in outputs for line in output.splitlines()]
    assert len(said) == 200
    for body, start in said:
        assert lines[start - 1].startswith("## 09:00:00 · p") and lines[start] == body


def test_read_lines_windows_and_numbers(ws: Path) -> None:
    (ws / "memory" / "long.md").write_text(
        "".join(f"line {n}\n" for n in range(1, 1001)), encoding="utf-8"
    )
    got = read_lines(ws, "memory/long.md", 10, 3)
    assert got.lines == ["line 10", "line 11", "line 12"]
    assert (got.start_line, got.end_line, got.total_lines, got.more) == (10, 12, 1000, True)
    assert got.render().splitlines()[:2] == ["memory/long.md lines 10-12 of 1000", "10 | line 10"]
    assert "start=13" in (got.notice or "")

    capped = read_lines(ws, "memory/long.md", 1, 5000)
    assert len(capped.lines) == MAX_READ_LINES and capped.capped
    assert capped.notice is not None and "capped at 400" in capped.notice
    assert "start=401" in capped.notice

    default = read_lines(ws, "memory/long.md")
    assert len(default.lines) == MAX_READ_LINES and not default.capped

    tail = read_lines(ws, "memory/long.md", 990)
    assert tail.lines[-1] == "line 1000" and tail.notice is None and not tail.more


def test_read_lines_errors_are_clear(ws: Path) -> None:
    with pytest.raises(NoteError, match="does not exist"):
        read_lines(ws, "memory/1999-01-01.md")
    with pytest.raises(NoteError, match="past the end"):
        read_lines(ws, "MEMORY.md", 10_000)
    with pytest.raises(NoteError, match="numbered from 1"):
        read_lines(ws, "MEMORY.md", 0)
    with pytest.raises(NoteError, match="count must be 1 or more"):
        read_lines(ws, "MEMORY.md", 1, 0)
    with pytest.raises(NoteError, match="folder"):
        read_lines(ws, "memory")
    with pytest.raises(WorkspacePathError):
        read_lines(ws, "../outside.md")
    with pytest.raises(WorkspacePathError):
        read_lines(ws, "/etc/passwd")


def test_read_lines_of_agents_md_and_empty_files(ws: Path) -> None:
    got = read_lines(ws, "AGENTS.md", 1, 1)
    assert got.lines[0].startswith("# AGENTS.md")
    (ws / "memory" / "empty.md").write_text("", encoding="utf-8")
    empty = read_lines(ws, "memory/empty.md")
    assert (
        empty.lines == [] and empty.total_lines == 0 and empty.notice == "memory/empty.md is empty"
    )


def test_read_lines_survives_bad_utf8_and_crlf(ws: Path) -> None:
    (ws / "memory" / "odd.md").write_bytes(b"caf\xe9\r\nsecond\r\n")
    got = read_lines(ws, "memory/odd.md")
    assert got.lines == ["caf\ufffd", "second"]


def test_unencodable_text_is_cleaned_not_crashed(ws: Path) -> None:
    entry = append_note(
        ws,
        "bad \ud800 surrogate and \x00 nul",
        session_key="k\ud83d",
        tz="UTC",
        now=datetime(2025, 3, 1, 9, 0, tzinfo=UTC),
    )
    text = (ws / entry.path).read_text(encoding="utf-8")
    assert "bad ? surrogate and  nul" in text
    assert entry.heading == "## 09:00:00 · k?"
