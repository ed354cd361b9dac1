"""Outbound formatting: split a reply into platform-sized chunks, never inside a code fence.

Limits (characters): Telegram 4,096, Discord 2,000, Slack 4,000. A chunk boundary prefers a
blank line, then a line end, then a space; a fenced code block that must be split is closed at
the end of one chunk and re-opened (same language tag) at the start of the next, so every chunk
renders on its own.
"""

from __future__ import annotations

import re

TELEGRAM_LIMIT = 4_096
DISCORD_LIMIT = 2_000
DISCORD_MAX_LINES = 17
SLACK_LIMIT = 4_000

_FENCE = re.compile(r"^(\s*)(```|~~~)(.*)$")
_TAG = re.compile(r"[\w+#.-]{0,20}")


_SENTENCE_END = re.compile(r"[.!?。！？](?=\s)")

_PLAIN = re.compile(r"[^\W\d_][^`*_~\[\]()<>#!&|\\=+-]*")
"""One line that Markdown renders as itself: it starts with a letter (no list, heading or quote
marker) and holds no character with a Markdown or HTML meaning."""


def plain_line(text: str) -> str | None:
    """`text` without trailing blanks, when Markdown would render it as one plain paragraph
    (most short replies); None when it needs the parser (leading blanks too: four make code).
    Most replies then skip the Markdown parser entirely."""
    stripped = text.rstrip(" ")
    # isprintable: no control, format or separator character but the ASCII space.
    return stripped if stripped.isprintable() and _PLAIN.fullmatch(stripped) else None


def _break_at(text: str, limit: int, max_lines: int | None = None) -> int:
    """Best index <= limit to end a chunk at: paragraph, line, sentence, then word boundary."""
    if max_lines is not None:
        nth = -1
        for _ in range(max_lines):
            nth = text.find("\n", nth + 1)
            if nth < 0:
                break
        if 0 <= nth < limit:
            limit = nth + 1
    if len(text) <= limit:
        return len(text)
    window = text[:limit]
    for sep in ("\n\n", "\n"):
        at = window.rfind(sep)
        if at > limit // 3:
            return at + len(sep)
    ends = [m.end() for m in _SENTENCE_END.finditer(window)]
    if ends and ends[-1] > limit // 3:
        return ends[-1]
    at = window.rfind(" ")
    if at > limit // 3:
        return at + 1
    return limit


def _next_fence_state(fence: str | None, line: str) -> str | None:
    """Track fenced code the CommonMark way: an opening fence's info string has no backtick, a
    closing fence has nothing after its marker. Returns the open fence to re-open with (marker
    plus a short language tag), or None outside code."""
    match = _FENCE.match(line)
    if match is None:
        return fence
    marker, info = match.group(2), match.group(3).strip()
    if fence is None:
        if marker == "```" and "`" in info:
            return None
        tag = _TAG.match(info)
        return marker + (tag.group(0) if tag else "")
    if fence.startswith(marker) and not info:
        return None
    return fence


def chunk_text(text: str, limit: int, max_lines: int | None = None) -> list[str]:
    """Split `text` into chunks of at most `limit` characters (and `max_lines` lines, e.g.
    Discord's 17), keeping code fences balanced."""
    if limit < 16:
        raise ValueError("limit must be at least 16 characters")
    text = text.strip("\n")
    if not text:
        return []
    chunks: list[str] = []
    open_fence: str | None = None  # the opening line (e.g. "```python") of an unclosed fence
    rest = text
    while rest:
        prefix = f"{open_fence}\n" if open_fence else ""
        room = limit - len(prefix)
        # Reserve space to close a fence that may still be open at the end of this chunk.
        close_room = room - 4
        lines_room = None if max_lines is None else max(1, max_lines - bool(prefix) - 1)
        end = _break_at(rest, close_room if len(rest) > room else room, lines_room)
        body = rest[:end]
        rest = rest[end:]
        fence = open_fence
        for line in body.split("\n"):
            fence = _next_fence_state(fence, line)
        chunk = prefix + body.rstrip("\n")
        if fence and rest:
            chunk += "\n" + fence[:3]
        chunks.append(chunk)
        open_fence = fence if rest else None
        rest = rest.lstrip("\n") if not open_fence else rest
    return chunks


ELLIPSIS = "…"


def preview_tail(text: str, limit: int) -> str:
    """A streamed preview that fits one message: the text, or "…" and its last characters once
    it outgrows `limit` (the newest words are the ones worth showing while a reply is written;
    the finished reply is chunked properly)."""
    text = text.strip()
    if len(text) <= limit:
        return text
    tail = text[len(text) - (limit - len(ELLIPSIS)) :]
    space = tail.find(" ")
    if 0 <= space < len(tail) // 4:  # start at a word when one starts soon enough
        tail = tail[space + 1 :]
    return ELLIPSIS + tail
