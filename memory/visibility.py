"""Who may see which note (pure): the attribution an entry's heading carries, and a caller's
visibility over entries.

Notes stay plain Markdown. An entry the agent (or the automatic flush) appends is headed by its
time, the conversation it came from and, in a direct conversation, the person:

    ## 14:03:12 · agent:main:telegram:direct:42 · person telegram+42
    ## 14:05:40 · agent:main:webchat:direct:alice · person alice · automatic flush
    ## 09:12:00 · agent:main:console:direct:owner · shared

A caller (`Visibility`) sees text without such a heading (written by hand, and MEMORY.md),
entries marked `shared`, entries of its own conversations (`sessions`) and entries written for
its own person (`people`: the same person in another conversation, through identity links).
`None` instead of a `Visibility` means everything (the owners). A person can change what an
entry is visible to by editing its heading: add `· shared`, or remove the entry.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

SHARED = "shared"
PERSON = "person "

ATTRIBUTION = re.compile(r"^\s{0,3}##\s+\d{2}:\d{2}:\d{2}\s+·")
"""An entry heading: `## 14:03:12 · <session key> …`."""


@dataclass(frozen=True, slots=True)
class NoteAuthor:
    """Whom an entry belongs to, from its heading."""

    session_key: str
    person: str | None = None
    shared: bool = False


def parse_attribution(line: str) -> NoteAuthor | None:
    """The author of an entry heading line, or None for any other line."""
    if not ATTRIBUTION.match(line):
        return None
    parts = [p.strip() for p in line.split("·")]
    key = parts[1] if len(parts) > 1 else ""
    person: str | None = None
    shared = False
    for part in parts[2:]:
        if part == SHARED:
            shared = True
        elif part.startswith(PERSON):
            person = part[len(PERSON):].strip() or None
    return NoteAuthor(key, person, shared)


def attribution_parts(person: str | None, shared: bool) -> list[str]:
    """What a heading adds after the session key for `person` and `shared`."""
    parts = [f"{PERSON}{person}"] if person else []
    if shared:
        parts.append(SHARED)
    return parts


def entry_authors(lines: Sequence[str]) -> list[NoteAuthor | None]:
    """The author of each line (None: written by hand): an entry runs from its heading to the
    next entry heading or level-1 heading (a daily note's date line, a hand-written part);
    a `##` section inside it stays its own, so nothing of an entry is shown by mistake."""
    out: list[NoteAuthor | None] = []
    current: NoteAuthor | None = None
    for line in lines:
        author = parse_attribution(line)
        if author is not None:
            current = author
        elif _SECTION.match(line):
            current = None
        out.append(current)
    return out


_SECTION = re.compile(r"^\s{0,3}#\s")


@dataclass(frozen=True, slots=True)
class Visibility:
    """What one caller may see of the notes (see the module docstring)."""

    sessions: tuple[str, ...] = ()
    people: tuple[str, ...] = ()

    def allows(self, author: NoteAuthor | None) -> bool:
        if author is None or author.shared:
            return True
        if author.session_key in self.sessions:
            return True
        return author.person is not None and author.person in self.people

    def sql(self, table: str = "chunks") -> tuple[str, list[str]]:
        """The same test as a SQL condition on `table`'s `author`, `person` and `shared`
        columns, with its parameters."""
        terms = [f"{table}.author IS NULL", f"{table}.shared = 1"]
        params: list[str] = []
        if self.sessions:
            terms.append(f"{table}.author IN ({','.join('?' * len(self.sessions))})")
            params.extend(self.sessions)
        if self.people:
            terms.append(f"{table}.person IN ({','.join('?' * len(self.people))})")
            params.extend(self.people)
        return "(" + " OR ".join(terms) + ")", params


@dataclass(frozen=True, slots=True)
class SearchScope:
    """What one search may return: archived messages of `session_key` only (None: any
    session's, for operators), and the notes `notes` allows (None: every note)."""

    session_key: str | None = None
    notes: Visibility | None = None

    def where(self, table: str) -> tuple[str, list[str]] | None:
        """The SQL condition confining rows of `table` ("chunks" or "transcripts") to this
        scope, with its parameters; None when nothing is confined."""
        if table == "transcripts":
            if self.session_key is None:
                return None
            return "transcripts.session_key = ?", [self.session_key]
        return None if self.notes is None else self.notes.sql("chunks")


HIDDEN_LINE = "(a note of another conversation: not shown)"
"""What stands for a hidden entry's heading when a caller reads a file; its other lines are
blank, so line numbers stay those of the file."""


def visible_lines(lines: Sequence[str], visibility: Visibility | None) -> list[str]:
    """`lines` with every entry `visibility` does not allow blanked (its heading replaced by
    `HIDDEN_LINE`); all of them for `None`."""
    if visibility is None:
        return list(lines)
    out: list[str] = []
    for line, author in zip(lines, entry_authors(lines), strict=True):
        if visibility.allows(author):
            out.append(line)
        elif parse_attribution(line) is not None:
            out.append(HIDDEN_LINE)
        else:
            out.append("")
    return out


__all__ = [
    "ATTRIBUTION",
    "HIDDEN_LINE",
    "NoteAuthor",
    "SearchScope",
    "Visibility",
    "attribution_parts",
    "entry_authors",
    "parse_attribution",
    "visible_lines",
]
