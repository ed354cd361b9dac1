"""AGENTS.md sections: the parts re-injected after compaction and kept in every prompt.

Headings are H2/H3 (`##`, `###`), matched case-insensitively; headings inside fenced code blocks
are not headings. A section runs until the next heading of the same or a higher level.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass(frozen=True, slots=True)
class Section:
    title: str
    level: int
    body: str

    def render(self) -> str:
        return f"{'#' * self.level} {self.title}\n{self.body}".rstrip()


def parse_sections(text: str) -> list[Section]:
    """Every heading's section (body up to the next heading of the same or higher level)."""
    lines = text.splitlines()
    heads: list[tuple[int, int, str]] = []  # (line index, level, title)
    fence: str | None = None
    for i, line in enumerate(lines):
        fence_match = _FENCE.match(line)
        if fence_match:
            marker = fence_match.group(1)
            fence = None if fence == marker else (fence or marker)
            continue
        if fence is not None:
            continue
        match = _HEADING.match(line)
        if match:
            heads.append((i, len(match.group(1)), match.group(2).strip()))
    sections: list[Section] = []
    for n, (i, level, title) in enumerate(heads):
        end = len(lines)
        for j, other_level, _title in heads[n + 1 :]:
            if other_level <= level:
                end = j
                break
        sections.append(Section(title, level, "\n".join(lines[i + 1 : end]).strip()))
    return sections


def extract_sections(text: str, names: Sequence[str], max_chars: int | None = None) -> str:
    """The named H2/H3 sections, in the order asked, as Markdown; '' when none exist."""
    wanted = [n.strip().lower() for n in names]
    found: dict[str, Section] = {}
    for section in parse_sections(text):
        if section.level in (2, 3) and section.body:
            found.setdefault(section.title.lower(), section)  # the first one wins
    out = "\n\n".join(found[n].render() for n in wanted if n in found)
    if max_chars is not None and len(out) > max_chars:
        out = out[: max(0, max_chars - 1)].rstrip() + "…"
    return out


POST_COMPACTION_HEADER = (
    "[Post-compaction context refresh] Earlier messages were compacted into the summary above. "
    "The summary is a hint, not a substitute for these standing instructions from AGENTS.md:"
)
RED_LINES = "Red Lines"


class AgentsFile:
    """AGENTS.md in the workspace, re-read only when it changes (people edit it by hand)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._text = ""
        # Extracted sections for the current text: every turn asks for the same few.
        self._extracted: dict[tuple[tuple[str, ...], int | None], str] = {}

    def text(self) -> str:
        try:
            stat = self.path.stat()
        except OSError:
            self._stamp, self._text = None, ""
            return ""
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            try:
                self._text = self.path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                self._text = ""
            self._stamp = stamp
            self._extracted.clear()
        return self._text

    def sections(self, names: Sequence[str], max_chars: int | None = None) -> str:
        text = self.text()
        key = (tuple(names), max_chars)
        found = self._extracted.get(key)
        if found is None:
            found = self._extracted[key] = extract_sections(text, names, max_chars)
        return found

    def red_lines(self) -> str:
        """The "Red Lines" section, for every turn's system prompt."""
        return self.sections([RED_LINES], 3_000)

    def refresh_block(self, names: Sequence[str], max_chars: int = 3_000) -> str | None:
        """The block injected before the first model call after a compaction."""
        body = self.sections(names, max_chars)
        return f"{POST_COMPACTION_HEADER}\n\n{body}" if body else None
