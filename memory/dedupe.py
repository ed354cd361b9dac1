"""Is a new note already in memory? Exact and near-duplicate detection before a write.

An agent that flushes every compaction cycle tends to save the same fact again ("staging DB is
db7" on Monday, Wednesday and Friday), and search results fill with copies. Before a note is
appended, the notes most like it are looked up; it is skipped when one of them already says
it:

- exactly: its text (case, spacing and punctuation folded) is inside an earlier entry;
- nearly: the embedding model puts it within `NEAR_COSINE` of an earlier entry AND the new
  note's words appear in that entry in the same order, skipping no negation (`restates`).

The word check is not optional. A sentence encoder puts "the staging database is db7" and "…
is db8" closer together (cosine 0.94) than two paraphrases of one fact (0.92), "Bob pays
Alice" next to "Alice pays Bob" (0.97) and "we decided not to use X" next to "we decided to
use X" (0.93): a note that changes a fact must never be dropped as a copy of the fact it
changes. So a near-duplicate adds no word and reorders none; a paraphrase is written (it costs
a few lines, never a fact).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from memory.notes import read_lines
from memory.visibility import ATTRIBUTION, Visibility
from memory.workspace import WorkspacePathError

if TYPE_CHECKING:
    from memory.index import MemoryIndex

NEAR_COSINE = 0.75
"""Cosine to an earlier entry from which a note that restates it counts as a copy."""
CANDIDATES = 4
"""Earlier chunks compared with each new note."""

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The earlier entry that already holds a note."""

    path: str
    start_line: int
    end_line: int
    how: Literal["exact", "near"]
    cosine: float | None  # None for an exact copy found without the model

    @property
    def location(self) -> str:
        return f"{self.path}:{self.start_line}-{self.end_line}"

    def describe(self) -> str:
        """`memory/2026-12-01.md:3-4 (near-duplicate, cosine 0.93)`, for the log and the tool."""
        if self.how == "exact":
            return f"{self.location} (the same text)"
        return f"{self.location} (near-duplicate, cosine {self.cosine or 0.0:.2f}, no new word)"


def folded(text: str) -> str:
    """Text compared for an exact copy: NFKC, case-folded, words joined by single spaces."""
    return " ".join(_WORD.findall(unicodedata.normalize("NFKC", text).casefold()))


def tokens(text: str) -> list[str]:
    """The words and numbers of `text` in order; CJK runs count character by character."""
    out: list[str] = []
    for word in _WORD.findall(unicodedata.normalize("NFKC", text).casefold()):
        out.extend(word if _CJK.search(word) else (word,))
    return out


NEGATIONS = frozenset(
    # "don't" is read as "don" "t"; CJK text as single characters.
    "not no never nor neither without cannot t except instead 不 没 未 别 非 无 勿".split()
)
"""Words that turn a fact around; a near-duplicate may not skip one ("we decided not to …")."""


def restates(new: Sequence[str], earlier: Sequence[str]) -> bool:
    """True when `new`'s words appear in `earlier` in the same order, the words skipped
    between them include no negation ("Bob pays Alice" does not restate "Alice pays Bob";
    "we decided to use X" does not restate "we decided not to use X")."""
    if not new:
        return False
    return any(
        _restates_from(new, earlier, start)
        for start, word in enumerate(earlier)
        if word == new[0]
    )


def _restates_from(new: Sequence[str], earlier: Sequence[str], at: int) -> bool:
    """`restates`, with `new[0]` matched at `earlier[at]` (then each word at its next place)."""
    for word in new[1:]:
        at += 1
        while at < len(earlier) and earlier[at] != word:
            if earlier[at] in NEGATIONS:
                return False
            at += 1
        if at == len(earlier):
            return False
    return True


def _entry_body(text: str) -> str:
    """A chunk without its attribution headings (their times and session keys are not facts)."""
    return "\n".join(line for line in text.splitlines() if not ATTRIBUTION.match(line))


def find_duplicate(
    index: MemoryIndex, workspace: Path, text: str, visibility: Visibility | None = None
) -> Duplicate | None:
    """The earlier note entry that already says `text`, or None (write it).

    Compares with the few chunks most like it, among those `visibility` allows (a note is
    never skipped for a copy the writer may not see: that would tell them it exists): by
    meaning when the index has an encoder, else by BM25 (then only an exact copy counts).
    Call `index.refresh()` first so hand edits are seen. Never raises for a search or read
    failure: a note is better written twice than lost.
    """
    new_folded = folded(text)
    if not new_folded:
        return None
    meaning = index.encoder is not None
    try:
        hits = index.search(
            text, limit=CANDIDATES, corpus="notes", mode="vector" if meaning else "bm25",
            mmr_lambda=None, notes=visibility,
        )
    except Exception:  # deduplication is best effort: the write goes ahead
        return None
    new_tokens = tokens(text)
    bodies: list[tuple[str, int, int, str]] = []
    for hit in hits:
        try:
            window = read_lines(
                workspace, hit.path, hit.start_line, hit.end_line - hit.start_line + 1,
                visibility,
            )
        except (WorkspacePathError, ValueError, OSError):
            continue
        body = _entry_body("\n".join(window.lines))
        if new_folded in folded(body):
            return Duplicate(hit.path, hit.start_line, hit.end_line, "exact", None)
        bodies.append((hit.path, hit.start_line, hit.end_line, body))
    near = [b for b in bodies if restates(new_tokens, tokens(b[3]))]
    if not near or index.encoder is None:
        return None
    try:  # the stored vectors include the headings' times and keys: compare the bodies
        vectors = index.encoder.encode([text, *(b[3] for b in near)])
    except Exception:  # best effort, as above
        return None
    for (path, start, end, _body), row in zip(near, vectors[1:], strict=True):
        cosine = float(vectors[0] @ row)
        if cosine >= NEAR_COSINE:
            return Duplicate(path, start, end, "near", cosine)
    return None
