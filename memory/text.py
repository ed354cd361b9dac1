"""Text splitting and query terms shared by the notes index and the history archive
(`memory.index`), with no I/O: notes chunked at headings, archived messages cut into searchable
pieces, a query split into terms and their FTS5 expressions, excerpts around what matched."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from memory.workspace import split_lines

CHUNK_CHARS = 1_600
"""About 400 tokens: small enough to point at a few lines, big enough to keep an entry whole."""
MIN_TRIGRAM = 3
MAX_TERMS = 16
MAX_TERM_CHARS = 100
SNIPPET_CHARS = 240
HISTORY_EXCERPT_CHARS = 300

_CJK = (
    "[\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
    "\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f]"
)
_SHORT_TOKENS = re.compile(f"({_CJK}+)|((?:(?!{_CJK})[^\\W_])+)")
_CJK_PAIR = re.compile(f"{_CJK}{{2}}")
_SHORT_WORD = re.compile(f"(?:(?!{_CJK})[^\\W_]){{1,2}}")
_HEADING = re.compile(r"^#{1,6}\s")
_FENCE = re.compile(r"^\s*(```|~~~)")
_EDGE_PUNCT = "\"'`“”‘’«»„,.;:!?()[]{}<>，。；：！？、（）「」『』【】《》"
_QUOTES = " \t\r\n\"'`“”‘’«»„"
_QUERY_PIECES = re.compile(f"\\s+|{_CJK}+")
"""Where a query splits into identifier candidates: CJK text has no spaces (`订单ORD-1042的`)."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """A searchable piece of a file: whole note entries where they fit (1-based lines)."""

    start_line: int
    end_line: int
    text: str


def chunk_markdown(text: str, max_chars: int = CHUNK_CHARS) -> list[Chunk]:
    """Split at headings (outside code fences): one note entry per chunk where it fits.

    A heading with no body (the `# YYYY-MM-DD` line of a daily note) joins the next section.
    Sections over `max_chars` are packed paragraph by paragraph; a paragraph over it, line by
    line; a line over it, by characters (those chunks share the line number).
    """
    lines = split_lines(text)
    bounds: list[tuple[int, int]] = []
    start, fenced = 0, False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and _HEADING.match(line) and i > start:
            bounds.append((start, i))
            start = i
    if start < len(lines):
        bounds.append((start, len(lines)))
    merged: list[tuple[int, int]] = []
    pending: int | None = None
    for index, (s, e) in enumerate(bounds):
        bare = all(not line.strip() for line in lines[s + 1 : e])
        if bare and _HEADING.match(lines[s]) and index < len(bounds) - 1:
            pending = s if pending is None else pending
            continue
        merged.append((s if pending is None else pending, e))
        pending = None
    chunks: list[Chunk] = []
    for s, e in merged:
        chunks.extend(_pack(lines, s, e, max_chars))
    return chunks


def _trimmed(lines: list[str], s: int, e: int) -> tuple[int, int]:
    while s < e and not lines[s].strip():
        s += 1
    while e > s and not lines[e - 1].strip():
        e -= 1
    return s, e


def _pack(lines: list[str], s: int, e: int, max_chars: int) -> list[Chunk]:
    s, e = _trimmed(lines, s, e)
    if s >= e:
        return []
    text = "\n".join(lines[s:e])
    if len(text) <= max_chars:
        return [Chunk(s + 1, e, text)]
    pieces: list[tuple[int, int]] = []  # paragraphs, then lines for oversized paragraphs
    i = s
    while i < e:
        if not lines[i].strip():
            i += 1
            continue
        j = i
        while j < e and lines[j].strip():
            j += 1
        if len("\n".join(lines[i:j])) <= max_chars:
            pieces.append((i, j))
        else:
            pieces.extend((k, k + 1) for k in range(i, j))
        i = j
    out: list[Chunk] = []
    group: tuple[int, int] | None = None
    for ps, pe in pieces:
        if group is not None and len("\n".join(lines[group[0] : pe])) <= max_chars:
            group = (group[0], pe)
            continue
        if group is not None:
            out.append(Chunk(group[0] + 1, group[1], "\n".join(lines[group[0] : group[1]])))
        group = None
        piece = "\n".join(lines[ps:pe])
        if len(piece) <= max_chars:
            group = (ps, pe)
        else:  # one enormous line
            out.extend(
                Chunk(ps + 1, pe, piece[k : k + max_chars]) for k in range(0, len(piece), max_chars)
            )
    if group is not None:
        out.append(Chunk(group[0] + 1, group[1], "\n".join(lines[group[0] : group[1]])))
    return out


def query_terms(query: str) -> list[str]:
    """The user's words, unique, stripped of edge punctuation and control characters.

    Every term is later quoted as an FTS5 string, so nothing the model types (`"`, `AND(`, `*`,
    `NEAR`) is read as query syntax.
    """
    terms: list[str] = []
    seen: set[str] = set()
    for raw in query.split():
        term = "".join(ch for ch in raw if ch.isprintable()).strip(_EDGE_PUNCT)[:MAX_TERM_CHARS]
        if term and term.lower() not in seen:
            seen.add(term.lower())
            terms.append(term)
        if len(terms) == MAX_TERMS:
            break
    return terms


def short_tokens(text: str) -> str:
    """The `short` column: CJK character pairs and 1-2 character words, space-delimited.

    Leading and trailing spaces make every token a 3+ character phrase (` go `, ` 会议 `) that
    the trigram index can find, and only as a whole token: ` go ` does not match "going".
    """
    tokens: list[str] = []
    for cjk, word in _SHORT_TOKENS.findall(text.lower()):
        if cjk:
            tokens.extend(cjk[i : i + 2] for i in range(len(cjk) - 1))
        elif len(word) <= 2:
            tokens.append(word)
    return f" {' '.join(tokens)} " if tokens else ""


def _fts_string(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


def fts_term(term: str) -> str | None:
    """The FTS5 expression for one term, or None when only a scan can answer it."""
    if len(term) >= MIN_TRIGRAM:
        return f"body : {_fts_string(term)}"
    if _CJK_PAIR.fullmatch(term) or _SHORT_WORD.fullmatch(term):
        return f"short : {_fts_string(' ' + term.lower() + ' ')}"
    return None


def centred_excerpt(text: str, needles: Sequence[str], width: int = HISTORY_EXCERPT_CHARS) -> str:
    """About `width` characters centred on the first of `needles` found (tried in order, exact
    case then any case), on one line; the start of `text` when none is found."""
    at, size = -1, 0
    for needle in needles:
        if not needle:
            continue
        at = text.find(needle)
        if at < 0:
            at = text.lower().find(needle.lower())
        if at >= 0:
            size = len(needle)
            break
    begin = 0 if at < 0 else max(0, at + size // 2 - width // 2)
    end = min(len(text), begin + width)
    begin = max(0, end - width)
    piece = " ".join(text[begin:end].split())
    return ("…" if begin > 0 else "") + piece + ("…" if end < len(text) else "")


OUTCOME_TAG_RE = re.compile(r"^\[failed(?:, exit code -?\d+)?\]")
"""How an archived tool call or result that failed begins (`outcome_tag`)."""


def outcome_tag(exit_code: int | None) -> str:
    """The tag an archived failed tool call and its result carry: found by words ("failed",
    "exit code 2") and shown with every hit of the message."""
    return f"[failed, exit code {exit_code}]" if exit_code is not None else "[failed]"


def with_outcome(excerpt: str, first_chunk: str) -> str:
    """`excerpt` of a message led by its outcome tag when the message has one (an excerpt
    centred deep in a long failed output would not show how it ended)."""
    tag = OUTCOME_TAG_RE.match(first_chunk)
    if tag is None or excerpt.lstrip("…").startswith(tag.group(0)):
        return excerpt
    return f"{tag.group(0)} {excerpt}"


def message_chunks(text: str, max_chars: int = CHUNK_CHARS) -> list[str]:
    """An archived message as searchable pieces: whole when it fits, else by paragraph, line,
    then characters (headings do not split a message, unlike a note)."""
    if not text.strip():
        return []
    if len(text) <= max_chars:
        return [text]
    lines = split_lines(text)
    return [chunk.text for chunk in _pack(lines, 0, len(lines), max_chars)]


def identifier_candidates(query: str) -> list[str]:
    """The query itself, then its pieces, as exact identifiers could be typed: stripped of
    quotes and backticks (pieces also of edge punctuation, as in "what failed on ORD-88123?")."""
    out: list[str] = []
    whole = query.strip(_QUOTES)
    for candidate in (whole, *(
        variant
        for piece in _QUERY_PIECES.split(whole)
        for variant in (piece.strip(_QUOTES), piece.strip(_EDGE_PUNCT + _QUOTES))
    )):
        if candidate and candidate not in out:
            out.append(candidate[:1_000])
        if len(out) > MAX_TERMS:
            break
    return out


def make_snippet(text: str, terms: Sequence[str], width: int = SNIPPET_CHARS) -> str:
    """About `width` characters around the first matching term, on one line."""
    folded = text.lower()
    found = [p for p in (folded.find(t.lower()) for t in terms) if p >= 0]
    at = min(found) if found else 0
    begin = max(0, at - width // 4)
    end = min(len(text), begin + width)
    begin = max(0, end - width)
    piece = " ".join(text[begin:end].split())
    return ("…" if begin > 0 else "") + piece + ("…" if end < len(text) else "")
