"""Tool failures recognised from structure first, text last (pure).

A tool result failed when, in this order:

1. the tool said so: ``message.meta["tool_error"] is True`` (the registry's own flag, stored
   with the result) — authoritative;
2. its output carries a structured verdict: a JSON object (the whole output, one of its first
   non-empty lines, or its last one) with a non-zero exit code (``exit_code``, ``exitCode``,
   ``returncode``, ``return_code``, ``exit_status``), an HTTP ``status_code`` >= 400,
   ``"status": "error"``/``"failed"``…, ``"ok": false``, ``"success": false`` or a non-empty
   ``"error"``; or a textual exit code such as ``returncode=1``, ``exit code 2``,
   ``exited with code 137``, ``[exit 1]`` or ``(exit 2)`` at the head or tail of the output.
   Zero codes and ``"status": "ok"`` are successes;
3. only when there is neither a flag nor a structured verdict: an error-looking line
   (`context.pruning.ERROR_RE`) among the first `HEAD_LINES` or last `TAIL_LINES` non-empty
   lines. Never the middle: a successful read of a log file whose body holds "ERROR" lines is
   not a failure. A whole-JSON result without a verdict is structured output: only the edges of
   its ``stderr`` field are looked at.

``tool_error`` explicitly False with no structured non-zero code means success, whatever the
text says.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from context.pruning import looks_like_error
from context.types import Message, ToolCall

__all__ = [
    "DETAIL_CHARS",
    "HEAD_LINES",
    "TAIL_LINES",
    "ToolFailure",
    "exit_code_of",
    "tool_failure",
]

#: Non-empty lines at the start and at the end of an output that the text checks look at.
HEAD_LINES = 3
TAIL_LINES = 5
#: `ToolFailure.detail` is clipped to this many characters.
DETAIL_CHARS = 200


@dataclass(frozen=True, slots=True)
class ToolFailure:
    """A failed tool result: which tool, with what arguments, and how it failed."""

    tool: str
    """The tool's name (the message's name, else the call's, else "tool")."""
    arguments: str
    """The call's JSON arguments ("" when the call is unknown)."""
    exit_code: int | None
    """The process exit code, when the output states one."""
    detail: str
    """The most informative failing line, whitespace-collapsed and clipped to `DETAIL_CHARS`."""
    seq: int | None


def tool_failure(message: Message, call: ToolCall | None = None) -> ToolFailure | None:
    """None unless `message` is a tool result that failed (see the module's rules).

    `call` is the assistant's call that `message` answers, for the tool name and arguments.
    """
    if message.role != "tool":
        return None
    text = message.text
    raw_flag = message.meta.get("tool_error")
    flag = None if raw_flag is None else bool(raw_flag)
    head, tail = _edges(text)
    verdict = _verdict(text, head, tail)
    if flag is True:
        failed = True
    elif verdict is not None and (verdict.structured or flag is None):
        failed = verdict.failed
    elif flag is False:
        failed = False
    else:
        # A read's output is what was read: a log whose last lines are errors is a successful
        # read of a log. Only its head can say the read itself failed ("error: no such file").
        tool = (message.name or (call.name if call is not None else "") or "").lower()
        edges = head if any(word in tool for word in READ_TOOLS) else (*head, *tail)
        failed = any(looks_like_error(line) for line in edges)
    if not failed:
        return None
    detail = verdict.detail if verdict is not None and verdict.detail else ""
    if not detail:
        detail = _error_line(head, tail) or _last_line(head, tail)
    return ToolFailure(
        tool=message.name or (call.name if call is not None and call.name else "") or "tool",
        arguments=call.arguments if call is not None else "",
        exit_code=verdict.exit_code if verdict is not None else None,
        detail=_clip(detail),
        seq=message.seq,
    )


def exit_code_of(text: str) -> int | None:
    """The exit code `text` states (JSON field or text form at its head or tail), or None."""
    verdict = _verdict(text, *_edges(text))
    return None if verdict is None else verdict.exit_code


# ------------------------------------------------------------------------------ internals


#: Tool names that read something (a file, a log, a page, search results): their output
#: quotes what they read, so error lines at its end are content, not a failure.
READ_TOOLS = (
    "read", "cat", "open", "view", "get", "load", "fetch", "search", "list", "grep", "tail",
    "head", "log", "show", "query", "find", "browse", "download",
)


@dataclass(frozen=True, slots=True)
class _Verdict:
    failed: bool
    exit_code: int | None
    detail: str
    structured: bool = True
    """False for a JSON result's `stderr` text: like any text, it never overrides the flag."""


_EXIT_KEYS = ("exit_code", "exitCode", "returncode", "return_code", "exit_status", "exitStatus")
_HTTP_KEYS = ("status_code", "statusCode")
_FAILED_STATUSES = frozenset(
    {"error", "errored", "fail", "failed", "failure", "fatal", "timeout", "timed_out"}
)
_OK_STATUSES = frozenset({"ok", "success", "succeeded", "done", "complete", "completed", "passed"})
_DETAIL_KEYS = ("error", "stderr", "message", "detail", "reason")

#: Exit codes written as text: `returncode=1`, `exit_code: 2`, `exit code 2`, `exit status 1`,
#: `exited with code 137`, `Process exited with status 3`, `[exit 1]`, `(exit code 2)`.
_EXIT_TEXT_RE = re.compile(
    r"\b(?:return_?code|exit_?code|exit_?status)\s*[=:]\s*(-?\d+)\b"
    r"|\bexit(?:ed)?(?:\s+with)?\s+(?:code|status)\s*:?\s*(-?\d+)\b"
    r"|[\[(]\s*exit(?:\s+(?:code|status))?\s*:?\s*(-?\d+)\s*[\])]"
    r"|\breturn(?:ed)?\s+code\s*:?\s*(-?\d+)\b",
    re.IGNORECASE,
)


def _edges(text: str) -> tuple[list[str], list[str]]:
    """The first `HEAD_LINES` and the last `TAIL_LINES` non-empty lines (they never overlap),
    found without splitting the whole text."""
    head: list[str] = []
    size = len(text)
    pos = 0
    while len(head) < HEAD_LINES and pos < size:
        end = text.find("\n", pos)
        end = size if end < 0 else end
        line = text[pos:end]
        if line.strip():
            head.append(line)
        pos = end + 1
    tail: list[str] = []
    end = size
    while len(tail) < TAIL_LINES and end > pos:
        start = text.rfind("\n", pos, end) + 1 or pos
        line = text[start:end]
        if line.strip():
            tail.append(line)
        end = start - 1
    tail.reverse()
    return head, tail


def _verdict(text: str, head: Sequence[str], tail: Sequence[str]) -> _Verdict | None:
    """The structured verdict (JSON fields, then text exit codes), or None if there is none."""
    whole = _whole_json(text)
    for obj in _json_objects(whole, head, tail):
        verdict = _dict_verdict(obj)
        if verdict is not None:
            return verdict
    if whole is not None:
        # Structured output without a verdict: its `stderr` is the only text to read.
        stderr = whole.get("stderr")
        if not isinstance(stderr, str):
            return _Verdict(False, None, "")
        head, tail = _edges(stderr)
        code = _text_exit_code(head, tail)
        line = _error_line(head, tail)
        if code is not None:
            return _Verdict(code != 0, code, "" if code == 0 else line)
        return _Verdict(bool(line), None, line, structured=False)
    code = _text_exit_code(head, tail)
    if code is not None:
        return _Verdict(code != 0, code, "" if code == 0 else _error_line(head, tail))
    return None


def _whole_json(text: str) -> dict[str, Any] | None:
    stripped = text.strip()
    if not (stripped.startswith("{") and stripped.endswith("}")):
        return None
    return _as_object(stripped)


def _as_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _json_objects(
    whole: dict[str, Any] | None, head: Sequence[str], tail: Sequence[str]
) -> Iterator[dict[str, Any]]:
    """JSON objects a result may state its outcome in: the whole output (`whole`), else one of
    its first lines, else its last line."""
    if whole is not None:
        yield whole
        return
    lines = [*head, *tail[-1:]]
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("{") and stripped.endswith("}"):
            obj = _as_object(stripped)
            if obj is not None:
                yield obj


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    return None


def _exit_code_in(obj: Mapping[str, Any]) -> int | None:
    for key in _EXIT_KEYS:
        code = _int(obj.get(key))
        if code is not None:
            return code
    return None


def _dict_verdict(obj: Mapping[str, Any]) -> _Verdict | None:
    code = _exit_code_in(obj)
    http = next((c for c in (_int(obj.get(k)) for k in _HTTP_KEYS) if c is not None), None)
    status = obj.get("status")
    status_text = status.strip().lower() if isinstance(status, str) else None
    status_code = _int(status) if not isinstance(status, str) else None
    error = obj.get("error")
    detail = _field_detail(obj)

    if code is not None and code != 0:
        return _Verdict(True, code, detail or f"exit code {code}")
    if http is not None and http >= 400:
        return _Verdict(True, code, detail or f"HTTP status {http}")
    if status_code is not None and 400 <= status_code < 600:
        return _Verdict(True, code, detail or f"HTTP status {status_code}")
    if (
        status_text in _FAILED_STATUSES
        or obj.get("ok") is False
        or obj.get("success") is False
        or _has_error(error)
    ):
        return _Verdict(True, code, detail or f"status {status_text or 'failed'}")
    if (
        code == 0
        or (http is not None and http < 400)
        or status_code == 0
        or status_text in _OK_STATUSES
        or obj.get("ok") is True
        or obj.get("success") is True
    ):
        return _Verdict(False, code, "")
    return None


def _has_error(value: Any) -> bool:
    """An `error` field that reports something: not null, false, 0, "" or empty."""
    return bool(value.strip()) if isinstance(value, str) else bool(value)


def _field_detail(obj: Mapping[str, Any]) -> str:
    """The best failure text among the object's fields: `error` (or its message), `stderr`'s
    error line, `message`/`detail`/`reason`."""
    for key in _DETAIL_KEYS:
        value = obj.get(key)
        if isinstance(value, Mapping):
            value = value.get("message") or value.get("detail") or json.dumps(value)
        if isinstance(value, str) and value.strip():
            if key == "stderr":
                head, tail = _edges(value)
                return _error_line(head, tail) or _last_line(head, tail)
            return value
    return ""


def _text_exit_code(head: Sequence[str], tail: Sequence[str]) -> int | None:
    """The exit code the output states at its end, else at its start (the latest line first)."""
    for line in (*reversed(tail), *reversed(head)):
        if "exit" not in line.lower() and "return" not in line.lower():
            continue
        found = list(_EXIT_TEXT_RE.finditer(line))
        if found:
            last = found[-1]
            return int(next(g for g in last.groups() if g is not None))
    return None


def _error_line(head: Sequence[str], tail: Sequence[str]) -> str:
    """The last error-looking line of the tail, else of the head ("" when none)."""
    for lines in (tail, head):
        for line in reversed(lines):
            if looks_like_error(line):
                return line
    return ""


def _last_line(head: Sequence[str], tail: Sequence[str]) -> str:
    lines = [*head, *tail]
    return lines[-1] if lines else ""


def _clip(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= DETAIL_CHARS else flat[: DETAIL_CHARS - 1].rstrip() + "…"
