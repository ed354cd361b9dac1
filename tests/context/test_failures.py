"""Tool failures from structure: the tool's flag, exit codes, JSON fields; text only at the edges."""

from __future__ import annotations

import json
from typing import Any

import pytest

from context.failures import DETAIL_CHARS, ToolFailure, exit_code_of, tool_failure
from context.history import message_has_error
from context.types import Message, ToolCall


def tool(
    content: str, *, flag: bool | None = None, name: str | None = "shell", seq: int | None = 7
) -> Message:
    meta: dict[str, Any] = {} if flag is None else {"tool_error": flag}
    return Message(role="tool", content=content, tool_call_id="c1", name=name, seq=seq, meta=meta)


def log_file(lines: int = 300) -> str:
    body = []
    for i in range(lines):
        if i % 37 == 5:
            body.append(f"2026-01-01 12:00:{i % 60:02d} ERROR worker: connection refused (retry {i})")
        elif i == 150:
            body.append("Traceback (most recent call last):")
        else:
            body.append(f"2026-01-01 12:00:{i % 60:02d} INFO request {i} served in 3 ms")
    body.append("2026-01-01 12:05:00 INFO shutdown complete")
    return "\n".join(body)


# ------------------------------------------------------------------------------ only tool roles


@pytest.mark.parametrize("role", ["user", "assistant", "system"])
def test_only_tool_messages_can_fail(role: str) -> None:
    message = Message(role=role, content="Error: x\nexit code 1", meta={"tool_error": True})  # type: ignore[arg-type]
    assert tool_failure(message) is None


# ------------------------------------------------------------------------------ the tool's flag


def test_flag_true_with_plain_text_is_a_failure() -> None:
    call = ToolCall("c1", "fetch", '{"url": "https://example.com"}')
    failure = tool_failure(tool("the page could not be reached", flag=True, name=None), call)
    assert failure == ToolFailure(
        tool="fetch",
        arguments='{"url": "https://example.com"}',
        exit_code=None,
        detail="the page could not be reached",
        seq=7,
    )


def test_flag_true_beats_a_zero_exit_code() -> None:
    failure = tool_failure(tool('{"exit_code": 0, "stdout": "fine"}', flag=True))
    assert failure is not None and failure.exit_code == 0


def test_flag_false_with_error_text_is_not_a_failure() -> None:
    assert tool_failure(tool("Error: x", flag=False)) is None
    assert tool_failure(tool("Traceback (most recent call last):\nValueError: x", flag=False)) is None


def test_flag_false_with_structured_non_zero_code_is_a_failure() -> None:
    failure = tool_failure(tool('{"exit_code": 3, "stderr": "disk full"}', flag=False))
    assert failure is not None and failure.exit_code == 3 and failure.detail == "disk full"
    assert tool_failure(tool("building…\n[exit 1]", flag=False)) is not None


def test_flag_from_the_database_may_be_an_int() -> None:
    assert tool_failure(Message(role="tool", content="x", meta={"tool_error": 1})) is not None
    assert tool_failure(Message(role="tool", content="Error: x", meta={"tool_error": 0})) is None


# ---------------------------------------------------------------------- structured exit codes


def test_json_exit_code_with_stderr() -> None:
    failure = tool_failure(tool('{"exit_code": 2, "stderr": "boom"}'))
    assert failure is not None
    assert failure.exit_code == 2
    assert failure.detail == "boom"
    assert failure.tool == "shell" and failure.arguments == "" and failure.seq == 7


@pytest.mark.parametrize("key", ["exit_code", "exitCode", "returncode", "return_code"])
def test_json_exit_code_spellings(key: str) -> None:
    failure = tool_failure(tool(json.dumps({key: 1, "stdout": ""})))
    assert failure is not None and failure.exit_code == 1
    assert exit_code_of(json.dumps({key: 5})) == 5


def test_json_zero_codes_and_ok_statuses_are_successes() -> None:
    assert tool_failure(tool('{"status": "ok", "exit_code": 0}')) is None
    assert tool_failure(tool('{"status": 0, "output": "Error count: 0"}')) is None
    assert tool_failure(tool('{"exit_code": 0, "stderr": "warning: deprecated"}')) is None
    # A zero code is a verdict: error-looking text next to it does not override it.
    assert tool_failure(tool('{"exit_code": 0}\nERROR: flaky test retried, passed')) is None


def test_json_stderr_error_line_is_the_detail() -> None:
    stderr = "Compiling…\nsrc/main.rs:3: error[E0425]: cannot find value `x`\nmore context"
    failure = tool_failure(tool(json.dumps({"returncode": 101, "stderr": stderr})))
    assert failure is not None
    assert failure.exit_code == 101
    assert failure.detail == "src/main.rs:3: error[E0425]: cannot find value `x`"


@pytest.mark.parametrize(
    "payload",
    [
        {"status": "error", "message": "quota exceeded"},
        {"status": "failed"},
        {"ok": False, "reason": "not found"},
        {"success": False},
        {"error": "permission denied on /etc/shadow"},
        {"error": {"message": "rate limited", "code": 429}},
        {"status_code": 404, "body": "nope"},
        {"status": 503},
    ],
)
def test_json_failure_fields(payload: dict[str, Any]) -> None:
    failure = tool_failure(tool(json.dumps(payload)))
    assert failure is not None
    assert failure.exit_code is None
    assert failure.detail


@pytest.mark.parametrize(
    "payload",
    [
        {"error": None, "result": 3},
        {"error": "", "result": 3},
        {"ok": True},
        {"success": True, "errors_seen": 0},
        {"status_code": 200, "body": "Error pages are served from /err"},
        {"path": "app.log", "content": "start\nERROR boom\nrecovered"},
    ],
)
def test_json_without_failure_fields_is_a_success(payload: dict[str, Any]) -> None:
    assert tool_failure(tool(json.dumps(payload))) is None


def test_whole_json_without_verdict_reads_only_its_stderr() -> None:
    failure = tool_failure(tool(json.dumps({"stdout": "", "stderr": "fatal: not a git repository"})))
    assert failure is not None and failure.detail == "fatal: not a git repository"


def test_flag_false_beats_error_text_in_a_json_stderr() -> None:
    text = json.dumps({"stdout": "3 files", "stderr": "error: ignored, retried"})
    assert tool_failure(tool(text, flag=False)) is None
    assert tool_failure(tool(text)) is not None


def test_first_json_line_states_the_outcome() -> None:
    text = '{"exit_code": 4, "error": "lint failed"}\nsrc/a.py:1:1: F401 unused import'
    failure = tool_failure(tool(text))
    assert failure is not None and failure.exit_code == 4 and failure.detail == "lint failed"


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("running…\nreturncode=1", 1),
        ("compiling\nexit code 2", 2),
        ("Killed\ncontainer exited with code 137", 137),
        ("make: *** [all] Error 1\nexit status 1", 1),
        ("$ false\n[exit 1]", 1),
        ("grep pattern file (exit 2)", 2),
        ("Process exited with status 3", 3),
        ("exit_code: -1", -1),
    ],
)
def test_text_exit_codes(text: str, code: int) -> None:
    assert exit_code_of(text) == code
    failure = tool_failure(tool(text))
    assert failure is not None and failure.exit_code == code


def test_text_zero_exit_code_is_a_success() -> None:
    text = "tests/test_a.py::test_error_path PASSED\nERROR lines above are expected\n[exit 0]"
    assert exit_code_of(text) == 0
    assert tool_failure(tool(text)) is None


def test_exit_code_of_ignores_the_middle_and_plain_text() -> None:
    assert exit_code_of("hello") is None
    assert exit_code_of("") is None
    middle = "\n".join(["start", "a", "b", "c", "exit code 9", *[f"line {i}" for i in range(20)]])
    assert exit_code_of(middle) is None
    # The latest statement wins: the tail's last line first.
    assert exit_code_of("exit code 1\nretrying\nexit code 0") == 0


# ------------------------------------------------------------------------------ text heuristic


def test_log_file_with_errors_in_the_middle_is_not_a_failure() -> None:
    content = log_file(300)
    assert content.count("ERROR") > 5
    call = ToolCall("c1", "read_file", '{"path": "logs/app.log"}')
    message = tool(content, name="read_file")
    assert tool_failure(message, call) is None
    assert not message_has_error(message)


def test_error_in_the_tail_is_a_failure() -> None:
    content = "\n".join(
        [*(f"step {i}" for i in range(50)), "Traceback (most recent call last):",
         '  File "x.py", line 1, in <module>', "ValueError: bad input", ""]
    )
    failure = tool_failure(tool(content))
    assert failure is not None
    assert failure.exit_code is None
    assert failure.detail == "ValueError: bad input"
    assert message_has_error(tool(content))


def test_error_in_the_head_is_a_failure() -> None:
    content = "\n".join(["bash: foo: command not found", *(f"line {i}" for i in range(50))])
    failure = tool_failure(tool(content))
    assert failure is not None and failure.detail == "bash: foo: command not found"


def test_short_plain_error_is_a_failure() -> None:
    failure = tool_failure(tool("error: unknown tool 'x'; available tools: a, b"))
    assert failure is not None and failure.detail.startswith("error: unknown tool")


def test_plain_success_is_not_a_failure() -> None:
    assert tool_failure(tool("saved to notes/2026-01-01.md (lines 1-3)")) is None
    assert tool_failure(tool("")) is None


# ------------------------------------------------------------------------------ detail, names


def test_detail_is_collapsed_and_clipped() -> None:
    long_line = "Error:   " + "x " * 400
    failure = tool_failure(tool(long_line, flag=True))
    assert failure is not None
    assert len(failure.detail) <= DETAIL_CHARS
    assert "  " not in failure.detail
    assert failure.detail.endswith("…")


def test_tool_name_falls_back_to_the_call_then_tool() -> None:
    assert (failure := tool_failure(tool("x", flag=True, name=None))) is not None
    assert failure.tool == "tool"
    call = ToolCall("c1", "web_fetch", '{"u": 1}')
    assert (failure := tool_failure(tool("x", flag=True, name="shell"), call)) is not None
    assert failure.tool == "shell" and failure.arguments == '{"u": 1}'


def test_image_parts_are_ignored() -> None:
    parts = [{"type": "image_url", "image_url": {"url": "data:,"}}, {"type": "text", "text": "ok"}]
    assert tool_failure(Message(role="tool", content=parts, tool_call_id="c1")) is None


def test_message_has_error_keeps_text_check_for_other_roles() -> None:
    assert message_has_error(Message(role="user", content="I got\nlots\nof\nlines\nand\nError: x"))
    assert message_has_error(Message(role="assistant", content="the build failed"))
    assert not message_has_error(Message(role="tool", content="Error: x", meta={"tool_error": False}))
