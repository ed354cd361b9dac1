"""Tool-result caps (pure): one huge output must not poison a session.

Three tiers:

* `cap_tool_output` — the live cap, applied before a result enters the prompt or the store. It
  keeps a head and an error-aware tail: a failure is usually at the end, and it is what the agent
  needs to see. The caller saves the full output as a workspace artifact (it owns the I/O) and
  passes its relative path so the marker can point to it.
* `soft_trim_old_results` — old results over 4,000 chars shrink to head 1,500 + tail 1,500.
* `clear_old_results` — old results become a short placeholder.

Both old-result tiers keep every message (only the content changes), so a tool call is never
separated from its result, and reset `tokens` to None so the token authority recounts them.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

from context.types import Message

__all__ = [
    "CLEARED_PLACEHOLDER",
    "CappedOutput",
    "PruneResult",
    "artifact_path",
    "cap_tool_output",
    "clear_old_results",
    "last_error_block",
    "looks_like_error",
    "soft_trim_old_results",
    "tool_result_cap_chars",
]

CLEARED_PLACEHOLDER = "[old tool result cleared to save context; ask again if needed]"

#: Lines that look like a failure: tracebacks and exception names, compiler/npm/pytest errors,
#: panics, non-zero exit codes, shell errors and stderr prefixes. A heuristic: it only decides
#: which part of an output to keep and how long a turn survives, never what the agent is told.
ERROR_RE = re.compile(
    r"Traceback \(most recent call last\)"
    r"|\b\w*(?:Error|Exception)\b|\bERR!"
    r"|\bFAIL(?:ED|URE)?\b|\bfailed\b|\bfatal\b|\bpanic(?:ked)?\b"
    r"|\bexit(?:ed with)? (?:code|status)\W{0,3}-?[1-9]"
    r"|\bnon-zero exit|\bSegmentation fault|\bcore dumped|command not found"
    r"|No such file or directory|Permission denied"
    r"|^\s*\[?stderr\]?\s*[:>]",
    re.IGNORECASE | re.MULTILINE,
)

#: How far back (in lines) an error block may extend from its last error line, e.g. from
#: `ValueError: …` back over the indented frames to `Traceback (most recent call last):`.
_MAX_BLOCK_LINES = 40


#: Every `ERROR_RE` alternative contains one of these (case-insensitively). A plain substring
#: search is far cheaper than the regex, so texts without any of them skip it.
_ERROR_HINTS = (
    "traceback", "error", "exception", "err!", "fail", "fatal", "panic", "exit",
    "segmentation", "core dumped", "not found", "no such file", "permission denied", "stderr",
)


def _may_have_error(text: str) -> bool:
    lower = text.lower()
    return any(hint in lower for hint in _ERROR_HINTS)


def looks_like_error(text: str) -> bool:
    """True when `text` contains a line that looks like a failure (see `ERROR_RE`)."""
    return _may_have_error(text) and ERROR_RE.search(text) is not None


def _last_error_match(text: str, start: int) -> re.Match[str] | None:
    """The last `ERROR_RE` match at or after `start`, without running the regex over the whole
    text: every alternative contains a hint word, so only the lines holding the last hint
    occurrences are tried, from the end backwards (C-speed `rfind`, then one short regex)."""
    lower = text.lower()
    end = len(text)
    while end > start:
        hit = max(lower.rfind(hint, start, end) for hint in _ERROR_HINTS)
        if hit < 0:
            return None
        line_start = max(text.rfind("\n", start, hit) + 1, start)
        line_end = text.find("\n", hit)
        line_end = len(text) if line_end == -1 else line_end
        found = deque(ERROR_RE.finditer(text, line_start, line_end), maxlen=1)
        if found:
            return found[0]
        end = line_start
    return None


def last_error_block(text: str, start: int = 0) -> tuple[int, int] | None:
    """`(block_start, line_end)` of the last error-looking block at or after `start`, or None.

    The block ends with the last error line and extends back over contiguous error lines and
    indented lines (traceback frames), at most `_MAX_BLOCK_LINES` lines, never before `start`.
    """
    last = _last_error_match(text, start)
    if last is None:
        return None
    line_start = text.rfind("\n", 0, last.start()) + 1
    line_end = text.find("\n", last.end())
    line_end = len(text) if line_end == -1 else line_end
    block_start = line_start
    for _ in range(_MAX_BLOCK_LINES):
        if block_start <= start or block_start == 0:
            break
        prev_start = text.rfind("\n", 0, block_start - 1) + 1
        prev = text[prev_start : block_start - 1]
        if not prev.strip() or not (prev[:1].isspace() or ERROR_RE.search(prev)):
            break
        block_start = prev_start
    return max(block_start, start), line_end


@dataclass(frozen=True, slots=True)
class CappedOutput:
    """A tool output after the cap. `kept_head + kept_middle + kept_tail` original chars
    survive; `kept_middle` is an error excerpt kept when the error is far from the end."""

    text: str
    truncated: bool
    original_chars: int
    kept_head: int
    kept_tail: int
    kept_middle: int = 0

    @property
    def omitted_chars(self) -> int:
        return self.original_chars - self.kept_head - self.kept_middle - self.kept_tail


_ARTIFACT_RE = re.compile(
    r"characters omitted; full output saved to (artifacts/(?:[\w+-]+/)?[\w.-]+\.txt) \.\.\.\]"
)


def artifact_path(text: str) -> str | None:
    """The workspace-relative path a capped tool result names for its full output (the
    marker `cap_tool_output` writes), or None."""
    found = _ARTIFACT_RE.search(text)
    return found.group(1) if found else None


def cap_tool_output(text: str, max_chars: int, *, artifact: str | None = None) -> CappedOutput:
    """Cap `text` to at most `max_chars` characters (marker lines included).

    Over the cap, a head and a tail are kept around a marker line such as
    ``[... 123,456 characters omitted; full output saved to artifacts/x.txt ...]``. When the
    text after the head holds an error-looking block, the tail grows to include it (the head
    keeps at least a fifth of the budget); an error too far from the end for that is kept as a
    middle excerpt between two markers. `artifact` is the workspace-relative path where the
    caller saved the full output, or None ("full output not saved"). Tiny caps fall back to a
    shorter marker, and below five chars to a plain cut.
    """
    note = f"full output saved to {artifact}" if artifact else "full output not saved"
    note = note.replace("{", "{{").replace("}", "}}")  # the marker is a format string
    formats = (
        f"\n[... {{:,}} characters omitted; {note} ...]\n",
        "\n[... {:,} chars omitted ...]\n",
        "\n[…]\n",
    )
    return _cap(text, max_chars, formats, head_share=0.5)


def _cap(text: str, max_chars: int, formats: Sequence[str], head_share: float) -> CappedOutput:
    """Cap with the first marker format (longest first) that leaves room for any text."""
    n, max_chars = len(text), max(max_chars, 0)
    if n <= max_chars:
        return CappedOutput(text, False, n, n, 0)
    for fmt in formats:
        # The omitted count is < n, so formatting n bounds the marker's length from above.
        spans = _plan_spans(text, max_chars, len(fmt.format(n)), head_share)
        if spans is not None:
            return _render(text, spans, fmt)
    return CappedOutput(text[:max_chars], True, n, max_chars, 0)


def _plan_spans(
    text: str, max_chars: int, width: int, head_share: float
) -> list[tuple[int, int]] | None:
    """Kept `(start, end)` spans of `text`: head, optional error excerpt, tail."""
    n = len(text)
    budget = max_chars - width
    if budget < 0:
        return None
    head = int(budget * head_share)
    block = last_error_block(text, head)
    min_head = budget // 5
    if block is None or n - block[0] <= budget - min_head:
        tail = budget - head if block is None else max(budget - head, n - block[0])
        return [(0, budget - tail), (n - tail, n)]
    # The last error is too far from the end for one tail: keep it as a middle excerpt.
    budget3 = max_chars - 2 * width
    if budget3 < 4:
        return [(0, min_head), (n - (budget - min_head), n)]
    head, tail = budget3 // 4, budget3 // 4
    middle = budget3 - head - tail
    block_start, line_end = block
    mid_start = min(max(block_start, line_end - middle), n - tail)
    mid_end = min(mid_start + middle, n - tail)
    return [(0, head), (max(mid_start, head), mid_end), (n - tail, n)]


def _render(text: str, spans: list[tuple[int, int]], fmt: str) -> CappedOutput:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    parts: list[str] = []
    pos = 0
    for start, end in merged:
        if start > pos:
            parts.append(fmt.format(start - pos))
        parts.append(text[start:end])
        pos = end
    if pos < len(text):
        parts.append(fmt.format(len(text) - pos))
    head = merged[0][1] if merged and merged[0][0] == 0 else 0
    tail = len(text) - merged[-1][0] if merged and merged[-1][1] == len(text) else 0
    middle = sum(e - s for s, e in merged) - head - tail
    return CappedOutput("".join(parts), True, len(text), head, tail, middle)


def tool_result_cap_chars(
    window_tokens: int,
    share: float = 0.3,
    chars_per_token: float = 4.0,
    hard_max: int = 400_000,
) -> int:
    """The live per-result cap in chars: `share` of the window, at most `hard_max`.

    Derived from the window so a small local model is not flooded by one `cat`, while a 1M
    window still never stores a multi-megabyte blob.
    """
    if not 0 < share <= 1:
        raise ValueError("share must be in (0, 1]")
    if chars_per_token <= 0:
        raise ValueError("chars_per_token must be positive")
    return max(0, min(hard_max, int(max(window_tokens, 0) * share * chars_per_token)))


@dataclass(frozen=True, slots=True)
class PruneResult:
    """Messages after a pruning tier, and which ones (by index) it changed."""

    messages: list[Message]
    changed: tuple[int, ...] = ()
    chars_removed: int = 0

    @property
    def count(self) -> int:
        return len(self.changed)


def _old_result_indices(messages: Sequence[Message], keep_recent: int) -> list[int]:
    """Indices of tool results older than the `keep_recent` most recent ones."""
    if keep_recent < 0:
        raise ValueError("keep_recent must be >= 0")
    tools = [i for i, m in enumerate(messages) if m.role == "tool"]
    return tools[: max(len(tools) - keep_recent, 0)]


def _with_text(messages: Sequence[Message], new_text: dict[int, str]) -> PruneResult:
    out = list(messages)
    removed = 0
    for i, text in new_text.items():
        removed += len(out[i].text) - len(text)
        out[i] = replace(out[i], content=text, tokens=None)
    return PruneResult(out, tuple(sorted(new_text)), removed)


def soft_trim_old_results(
    messages: Sequence[Message],
    *,
    keep_recent: int,
    trim_above_chars: int = 4_000,
    head: int = 1_500,
    tail: int = 1_500,
) -> PruneResult:
    """Trim old tool results over `trim_above_chars` to `head` + `tail` chars around a marker.

    The tail is error-aware like the live cap. The newest `keep_recent` results are untouched;
    already-trimmed results are short enough to be left alone, so this is idempotent.
    """
    fmt = "\n[... {:,} characters of an old tool result trimmed ...]\n"
    changes: dict[int, str] = {}
    for i in _old_result_indices(messages, keep_recent):
        text = messages[i].text
        max_chars = head + tail + len(fmt.format(len(text)))
        if len(text) <= max(trim_above_chars, max_chars):
            continue
        changes[i] = _cap(text, max_chars, (fmt,), head / max(head + tail, 1)).text
    return _with_text(messages, changes)


def clear_old_results(
    messages: Sequence[Message],
    *,
    keep_recent: int,
    placeholder: str = CLEARED_PLACEHOLDER,
) -> PruneResult:
    """Replace old tool results (all but the newest `keep_recent`) with `placeholder`.

    The message stays, with its `tool_call_id`, so the call it answers remains valid.
    """
    changes = {
        i: placeholder
        for i in _old_result_indices(messages, keep_recent)
        if messages[i].content != placeholder
    }
    return _with_text(messages, changes)
