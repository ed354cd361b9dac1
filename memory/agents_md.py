"""AGENTS.md sections: the parts re-injected after compaction and kept in every prompt.

Headings are H2/H3 (`##`, `###`), matched case-insensitively; headings inside fenced code blocks
are not headings. A section runs until the next heading of the same or a higher level.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

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
    found = {
        s.title.lower(): s for s in parse_sections(text) if s.level in (2, 3) and s.body
    }
    out = "\n\n".join(found[n].render() for n in wanted if n in found)
    if max_chars is not None and len(out) > max_chars:
        out = out[: max(0, max_chars - 1)].rstrip() + "…"
    return out
