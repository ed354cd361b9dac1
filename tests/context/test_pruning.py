"""Tool-result caps: the live error-aware cap, the per-window cap, soft trim and clear."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from context.pruning import (
    CLEARED_PLACEHOLDER,
    cap_tool_output,
    clear_old_results,
    last_error_block,
    looks_like_error,
    soft_trim_old_results,
    tool_result_cap_chars,
)
from context.types import Message, ToolCall

LOG = "\n".join(f"compiling module {i:05d} ... ok" for i in range(3_000))
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/main.py", line 12, in <module>\n'
    "    main()\n"
    '  File "/srv/app/main.py", line 9, in main\n'
    '    raise ValueError("bad config key: db.port")\n'
    "ValueError: bad config key: db.port\n"
)


# --------------------------------------------------------------------------- error detection


@pytest.mark.parametrize(
    "line",
    [
        "Traceback (most recent call last):",
        "ValueError: x",
        "error: could not compile `foo`",
        "error[E0425]: cannot find value",
        "npm ERR! code ELIFECYCLE",
        "FAILED tests/test_a.py::test_b - assert 1 == 2",
        "thread 'main' panicked at src/main.rs:2:5",
        "panic: runtime error: index out of range",
        "Process exited with code 127",
        "exit code: 2",
        "subprocess returned non-zero exit status 1",
        "bash: foo: command not found",
        "cat: x: No such file or directory",
        "stderr: boom",
        "fatal: not a git repository",
    ],
)
def test_error_lines_detected(line: str) -> None:
    assert looks_like_error(f"some output\n{line}\nmore")


@pytest.mark.parametrize(
    "text", ["all 12 tests passed", "exit code 0", "exit status: 0", "0 errors, 0 warnings", ""]
)
def test_clean_output_not_an_error(text: str) -> None:
    assert not looks_like_error(text)


def test_error_block_extends_back_over_traceback_frames() -> None:
    text = LOG + "\n" + TRACEBACK + "done\n"
    block = last_error_block(text)
    assert block is not None
    start, end = block
    assert text[start:end] == TRACEBACK.rstrip("\n")
    assert last_error_block(LOG) is None
    assert last_error_block(text, start=len(text) - 3) is None


# ----------------------------------------------------------------------------- live cap


def test_short_text_untouched() -> None:
    out = cap_tool_output("hello", 100)
    assert (out.text, out.truncated, out.original_chars, out.omitted_chars) == (
        "hello",
        False,
        5,
        0,
    )
    assert cap_tool_output("x" * 100, 100).text == "x" * 100


def test_long_text_capped_with_marker() -> None:
    out = cap_tool_output(LOG, 2_000, artifact="artifacts/tool-7.txt")
    assert out.truncated and len(out.text) <= 2_000
    assert out.original_chars == len(LOG)
    assert out.text.startswith(LOG[: out.kept_head])
    assert out.text.endswith(LOG[-out.kept_tail :])
    marker = f"[... {out.omitted_chars:,} characters omitted; full output saved to "
    assert marker + "artifacts/tool-7.txt ...]" in out.text
    assert abs(out.kept_head - out.kept_tail) <= 1  # no error: an even split
    assert "full output not saved ...]" in cap_tool_output(LOG, 2_000).text
    assert (
        "saved to artifacts/{x}.txt ...]"
        in cap_tool_output(LOG, 500, artifact="artifacts/{x}.txt").text
    )


def test_error_at_the_end_is_kept_in_the_tail() -> None:
    text = LOG + "\n" + TRACEBACK
    out = cap_tool_output(text, 1_000)
    assert len(out.text) <= 1_000
    assert out.text.endswith(TRACEBACK)
    assert "Traceback (most recent call last):" in out.text
    assert out.kept_tail >= len(TRACEBACK)


def test_large_error_block_shifts_budget_to_the_tail() -> None:
    big = "Traceback (most recent call last):\n" + "  frame line\n" * 25 + "KeyError: 'x'\n"
    out = cap_tool_output(LOG + "\n" + big, 800)
    assert out.text.endswith(big)
    assert out.kept_tail > out.kept_head >= (800 - 80) // 5


def test_error_far_from_the_end_is_kept_as_a_middle_excerpt() -> None:
    text = LOG + "\n" + TRACEBACK + LOG
    out = cap_tool_output(text, 1_200, artifact="artifacts/x.txt")
    assert len(out.text) <= 1_200
    assert "ValueError: bad config key: db.port" in out.text
    assert out.kept_middle > 0
    assert out.text.count("characters omitted") == 2
    assert out.text.endswith(LOG[-out.kept_tail :])
    assert out.omitted_chars == len(text) - out.kept_head - out.kept_middle - out.kept_tail


@pytest.mark.parametrize("max_chars", [0, 1, 4, 5, 12, 40, 90])
def test_tiny_caps(max_chars: int) -> None:
    out = cap_tool_output(LOG + TRACEBACK, max_chars, artifact="artifacts/a.txt")
    assert out.truncated and len(out.text) <= max_chars


_text = st.lists(
    st.one_of(
        st.text(max_size=80),
        st.sampled_from(["Traceback (most recent call last):", "  File x", "error: e", "ok"]),
    ),
    max_size=60,
).map("\n".join)


@given(_text, st.integers(-5, 600), st.one_of(st.none(), st.text(min_size=1, max_size=40)))
def test_cap_length_bound(text: str, max_chars: int, artifact: str | None) -> None:
    out = cap_tool_output(text, max_chars, artifact=artifact)
    assert len(out.text) <= max(max_chars, 0)
    assert out.truncated == (len(text) > max(max_chars, 0))
    if not out.truncated:
        assert out.text == text
    else:
        assert out.kept_head + out.kept_middle + out.kept_tail < len(text)
        assert out.text.startswith(text[: out.kept_head])
        assert out.text.endswith(text[len(text) - out.kept_tail :])


@pytest.mark.parametrize(
    ("window", "expected"),
    [(16_000, 19_200), (128_000, 153_600), (200_000, 240_000), (1_000_000, 400_000), (0, 0)],
)
def test_tool_result_cap_chars(window: int, expected: int) -> None:
    assert tool_result_cap_chars(window) == expected


def test_tool_result_cap_chars_options() -> None:
    assert tool_result_cap_chars(100_000, share=0.1, chars_per_token=3.0) == 30_000
    assert tool_result_cap_chars(100_000, hard_max=5_000) == 5_000
    with pytest.raises(ValueError):
        tool_result_cap_chars(100_000, share=0)
    with pytest.raises(ValueError):
        tool_result_cap_chars(100_000, chars_per_token=0)


# -------------------------------------------------------------------- old-result tiers


def transcript(outputs: list[str]) -> list[Message]:
    msgs: list[Message] = [Message(role="user", content="go", seq=0, tokens=1)]
    for i, text in enumerate(outputs):
        msgs.append(
            Message(role="assistant", tool_calls=(ToolCall(f"c{i}", "shell"),), seq=2 * i + 1)
        )
        msgs.append(
            Message(
                role="tool", content=text, tool_call_id=f"c{i}", seq=2 * i + 2, tokens=len(text)
            )
        )
    return msgs


def test_soft_trim_trims_old_large_results_only() -> None:
    big = LOG + "\n" + TRACEBACK
    msgs = transcript([big, "small", big, big])
    res = soft_trim_old_results(msgs, keep_recent=1)
    assert len(res.messages) == len(msgs)
    assert res.changed == (2, 6) and res.count == 2
    trimmed = res.messages[2]
    assert trimmed.tokens is None and trimmed.tool_call_id == "c0" and trimmed.seq == 2
    assert len(trimmed.text) <= 1_500 + 1_500 + 80
    assert "characters of an old tool result trimmed" in trimmed.text
    assert trimmed.text.endswith(TRACEBACK)  # error-aware tail
    assert res.messages[4] is msgs[4]  # small result untouched
    assert res.messages[8] is msgs[8]  # the most recent result untouched
    assert res.chars_removed == 2 * len(big) - 2 * len(trimmed.text)
    # idempotent: a second pass finds nothing to trim
    assert soft_trim_old_results(res.messages, keep_recent=1).count == 0


def test_soft_trim_respects_threshold_and_sizes() -> None:
    msgs = transcript(["y" * 3_900, "z" * 5_000, "w"])
    res = soft_trim_old_results(msgs, keep_recent=1)
    assert res.changed == (4,)
    text = res.messages[4].text
    assert text.startswith("z" * 1_500) and text.endswith("z" * 1_500)
    assert "[... 2,000 characters of an old tool result trimmed ...]" in text
    res = soft_trim_old_results(msgs, keep_recent=0, trim_above_chars=100, head=10, tail=20)
    assert res.changed == (2, 4)  # "w" is under the threshold
    assert res.messages[2].text.startswith("y" * 10) and res.messages[2].text.endswith("y" * 20)


def test_clear_old_results_keeps_every_message_and_pair() -> None:
    msgs = transcript(["a", "b", "c"])
    res = clear_old_results(msgs, keep_recent=1)
    assert len(res.messages) == len(msgs)
    assert res.changed == (2, 4)
    for i in (2, 4):
        m = res.messages[i]
        assert m.text == CLEARED_PLACEHOLDER and m.tokens is None
        assert m.tool_call_id == msgs[i].tool_call_id and m.seq == msgs[i].seq
    assert res.messages[6] is msgs[6]
    assert [m.role for m in res.messages] == [m.role for m in msgs]
    assert clear_old_results(res.messages, keep_recent=1).count == 0  # already cleared
    custom = clear_old_results(msgs, keep_recent=0, placeholder="[gone]")
    assert custom.count == 3 and custom.messages[6].text == "[gone]"


@pytest.mark.parametrize("keep", [0, 1, 3, 10])
def test_recent_results_left_alone(keep: int) -> None:
    msgs = transcript([LOG] * 4)
    tool_idx = [i for i, m in enumerate(msgs) if m.role == "tool"]
    recent = tool_idx[len(tool_idx) - min(keep, 4) :] if keep else []
    for res in (
        soft_trim_old_results(msgs, keep_recent=keep),
        clear_old_results(msgs, keep_recent=keep),
    ):
        assert len(res.messages) == len(msgs)
        assert all(res.messages[i] is msgs[i] for i in recent)
        assert set(res.changed) == set(tool_idx) - set(recent)


def test_negative_keep_recent_rejected() -> None:
    with pytest.raises(ValueError):
        clear_old_results([], keep_recent=-1)
