"""Daily notes the agent appends to (`memory_write`) and line reads of workspace files
(`memory_get`).

Notes are append-only: the file is opened in append mode and nothing already written is ever
rewritten, so a person's hand edits and earlier entries survive every flush. Each entry is
headed by its local time and the session that wrote it, so a reader can tell who remembered
what, and when.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from memory.visibility import ATTRIBUTION, Visibility, attribution_parts, visible_lines
from memory.workspace import (
    NOTES_DIR,
    exclusive,
    relative_name,
    resolve_in_workspace,
    split_lines,
)

MAX_ENTRY_CHARS = 8_000
"""One entry's limit: a note is a durable fact, not a transcript dump."""

MAX_READ_LINES = 400
"""Lines per `read_lines` call, so one read cannot flood the prompt."""

_TOP_HEADING = re.compile(r"^\s{0,3}#\s")
"""A level-1 heading: it would end an entry (`memory.visibility.entry_authors`)."""

class NoteError(ValueError):
    """A note or read request that cannot be honoured; the message is meant for the model."""


@dataclass(frozen=True, slots=True)
class NoteEntry:
    """Where an appended entry landed (1-based, inclusive lines)."""

    path: str  # e.g. "memory/2025-01-31.md"
    heading: str  # "## 14:03:12 · agent:main:telegram:direct:42"
    start_line: int  # the heading line
    end_line: int
    chars: int  # length of the stored text
    created_file: bool
    timestamp: datetime  # aware, in the note's timezone


@dataclass(frozen=True, slots=True)
class LinesResult:
    """A window of a file's lines plus enough context to ask for the next window."""

    path: str
    start_line: int
    end_line: int  # inclusive; start_line - 1 when the file is empty
    total_lines: int
    lines: list[str]
    capped: bool  # the requested count was larger than MAX_READ_LINES
    notice: str | None  # e.g. "showing lines 1-400 of 1,200; call again with start=401"

    @property
    def more(self) -> bool:
        """True when lines remain after this window."""
        return self.end_line < self.total_lines

    def render(self) -> str:
        """Numbered lines, the way the tool result shows them to the model."""
        head = f"{self.path} lines {self.start_line}-{self.end_line} of {self.total_lines}"
        width = len(str(max(self.end_line, 1)))
        body = [f"{n:>{width}} | {line}" for n, line in enumerate(self.lines, self.start_line)]
        tail = [f"[{self.notice}]"] if self.notice else []
        return "\n".join([head, *body, *tail])


def _zone(tz: str) -> ZoneInfo:
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise NoteError(f"unknown timezone {tz!r} (use an IANA name like 'Asia/Shanghai')") from exc


def _local_now(tz: str, now: datetime | None) -> datetime:
    """`now` in the gateway timezone; a naive `now` is taken as UTC, as the gateway stores it."""
    moment = now if now is not None else datetime.now(UTC)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(_zone(tz))


def today_note_path(root: Path, tz: str, now: datetime | None = None) -> Path:
    """`<root>/memory/YYYY-MM-DD.md` for the date in `tz`, where people expect "today" to be."""
    return root / NOTES_DIR / f"{_local_now(tz, now):%Y-%m-%d}.md"


def _clean(value: str) -> str:
    """Text that can be written as UTF-8: tool arguments decoded from JSON may hold lone
    surrogates, and a stray NUL would make the note look binary to editors."""
    return (
        value.encode("utf-8", errors="replace")
        .decode("utf-8")
        .replace("\x00", "")
        .replace("\r\n", "\n")
    )


def _one_line(value: str) -> str:
    """Attribution must stay a single heading line whatever a session key contains."""
    return " ".join(_clean(value).split())


def _escape_headings(text: str) -> str:
    """Stop an entry's text from forging another entry's attribution heading, or ending the
    entry early with a level-1 heading (what follows would read as written by hand)."""
    return "\n".join(
        "\\" + line.lstrip() if ATTRIBUTION.match(line) or _TOP_HEADING.match(line) else line
        for line in split_lines(text)
    )


def append_note(
    root: Path,
    text: str,
    *,
    session_key: str,
    tz: str,
    now: datetime | None = None,
    source: str = "agent",
    person: str | None = None,
    shared: bool = False,
) -> NoteEntry:
    """Append one attributed entry to today's note, creating the file with a date header.

    The heading names the conversation (`session_key`), the person it is for (`person`, in a
    direct conversation) and `shared` (an owner's note for everyone): who may see it
    (`memory.visibility`). `source` other than "agent" (e.g. "flush", "user") is added so a
    reader can tell an automatic pre-compaction flush from a deliberate write.
    """
    body = _escape_headings(_clean(text).strip())
    if not body:
        raise NoteError("note text is empty; nothing to remember")
    if len(body) > MAX_ENTRY_CHARS:
        raise NoteError(
            f"note entry is {len(body):,} characters; the limit is {MAX_ENTRY_CHARS:,} per entry. "
            "Keep only the durable facts, or split them into several entries."
        )
    local = _local_now(tz, now)
    key = _one_line(session_key) or "unknown-session"
    parts = [f"## {local:%H:%M:%S}", key]
    parts += [_one_line(p) for p in attribution_parts(person, shared)]
    if source and source != "agent":
        parts.append(_one_line(source))
    heading = " · ".join(parts)
    relative = f"{NOTES_DIR}/{local:%Y-%m-%d}.md"
    target = resolve_in_workspace(root, relative, write=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Held until written: appends come from worker threads and from every process on this
    # workspace.
    with exclusive(target), target.open("ab") as handle:
        existing = target.read_bytes()
        created = not existing
        if created:
            prefix = f"# {local:%Y-%m-%d}\n"
        elif not existing.endswith(b"\n"):
            prefix = "\n"  # a hand edit left no final newline: finish that line first
        else:
            prefix = ""
        lines_before = existing.count(b"\n") + prefix.count("\n")
        handle.write(f"{prefix}\n{heading}\n{body}\n".encode())  # one write: one O_APPEND chunk
    start = lines_before + 2  # a blank line, then the heading
    return NoteEntry(
        path=relative,
        heading=heading,
        start_line=start,
        end_line=start + 1 + body.count("\n"),
        chars=len(body),
        created_file=created,
        timestamp=local,
    )


def read_lines(
    root: Path, relative: str, start: int = 1, count: int | None = None,
    visibility: Visibility | None = None,
) -> LinesResult:
    """Lines `start`..`start+count-1` (1-based) of a workspace file, at most MAX_READ_LINES;
    entries `visibility` does not allow are blanked, their heading replaced by a line that says
    so (None: all shown)."""
    if start < 1:
        raise NoteError(f"start must be 1 or more (lines are numbered from 1), got {start}")
    if count is not None and count < 1:
        raise NoteError(f"count must be 1 or more, got {count}")
    path = resolve_in_workspace(root, relative)
    shown = relative_name(root, path)
    if not path.exists():
        raise NoteError(f"{shown} does not exist; memory_search or the file list shows what does")
    if not path.is_file():
        raise NoteError(f"{shown} is a folder, not a file")
    lines = split_lines(path.read_bytes().decode("utf-8", errors="replace"))
    lines = visible_lines(lines, visibility)
    total = len(lines)
    if total == 0 and start == 1:
        return LinesResult(shown, 1, 0, 0, [], False, f"{shown} is empty")
    if start > total:
        raise NoteError(f"{shown} has {total:,} lines; start={start} is past the end")
    wanted = MAX_READ_LINES if count is None else count
    capped = wanted > MAX_READ_LINES
    take = min(wanted, MAX_READ_LINES)
    window = lines[start - 1 : start - 1 + take]
    end = start + len(window) - 1
    notice: str | None = None
    if end < total:
        notice = f"showing lines {start:,}-{end:,} of {total:,}; call again with start={end + 1}"
        if capped:
            notice = f"capped at {MAX_READ_LINES} lines per call; " + notice
    return LinesResult(shown, start, end, total, window, capped, notice)
