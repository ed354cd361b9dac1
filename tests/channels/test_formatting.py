from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from channels.formatting import DISCORD_LIMIT, chunk_text, preview_tail


def test_short_text_is_one_chunk() -> None:
    assert chunk_text("hello", 100) == ["hello"]
    assert chunk_text("", 100) == []


def test_prefers_paragraph_breaks() -> None:
    text = "a" * 60 + "\n\n" + "b" * 60
    assert chunk_text(text, 100) == ["a" * 60, "b" * 60]


def test_code_fence_is_closed_and_reopened() -> None:
    code = "```python\n" + "\n".join(f"print({i})" for i in range(300)) + "\n```\nafter"
    chunks = chunk_text(code, DISCORD_LIMIT)
    assert len(chunks) > 1
    for chunk in chunks:
        assert len(chunk) <= DISCORD_LIMIT
        assert chunk.count("```") % 2 == 0, chunk[:40]
    assert chunks[1].startswith("```python\n")
    assert chunks[-1].endswith("after")


@settings(max_examples=200, deadline=None)
@given(
    parts=st.lists(
        st.one_of(
            st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300),
            st.just("```js\nconst x = 1;\n```"),
            st.just("\n\n"),
            st.just("```\n" + "line\n" * 80 + "```"),
        ),
        max_size=30,
    ),
    limit=st.integers(40, 500),
    max_lines=st.none() | st.integers(4, 20),
)
def test_chunks_fit_and_fences_balance(
    parts: list[str], limit: int, max_lines: int | None
) -> None:
    text = "\n".join(parts)  # fences on their own lines, as in real replies
    chunks = chunk_text(text, limit, max_lines)
    assert all(len(c) <= limit for c in chunks)
    if max_lines is not None:
        assert all(c.count("\n") + 1 <= max_lines for c in chunks)
    assert squash("\n".join(chunks)) == squash(text), "nothing lost, nothing invented"


PURE_FENCE = re.compile(r"^\s*(```|~~~)[\w+#.-]{0,20}\s*$")


def squash(text: str) -> str:
    """Content without whitespace and bare fence lines: chunking closes a split fence and
    re-opens it (with its language tag) in the next chunk."""
    return "".join("".join(line.split()) for line in text.split("\n") if not PURE_FENCE.match(line))


def test_sentence_and_line_limits() -> None:
    text = "One sentence here. Another one follows. " * 20
    chunks = chunk_text(text, 100)
    assert all(c.endswith(".") for c in chunks[:-1]), chunks[:2]
    lines = "\n".join(f"line {i}" for i in range(40))
    assert all(c.count("\n") + 1 <= 17 for c in chunk_text(lines, 2_000, max_lines=17))
    code = "```\n" + "\n".join(f"x{i}" for i in range(40)) + "\n```"
    for chunk in chunk_text(code, 2_000, max_lines=17):
        assert chunk.count("\n") + 1 <= 17 and chunk.count("```") % 2 == 0


def test_preview_tail_keeps_short_text_and_shows_the_end_of_long_text() -> None:
    assert preview_tail("  short reply \n", 100) == "short reply"
    text = " ".join(f"word{i}" for i in range(100))
    tail = preview_tail(text, 60)
    assert len(tail) <= 60
    assert tail.startswith("…word")  # starts at a word
    assert text.endswith(tail[1:])
    unbroken = "x" * 500
    assert preview_tail(unbroken, 60) == "…" + "x" * 59


# Plain lines skip the Markdown parser: the shortcut must render exactly what the parser would.
_LINE_ALPHABET = st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from(
    list("abc XYZ 123 .,:;'\"?@/%$^&*_~`[]()<>#!|\\=+-\t\n\x00é中🙂\u00a0")
)


@settings(max_examples=400, deadline=None)
@given(st.text(_LINE_ALPHABET, max_size=40))
def test_a_plain_line_renders_as_the_parser_would(text: str) -> None:
    from channels.slack import _render_mrkdwn, markdown_to_mrkdwn
    from channels.telegram import _render_html, markdown_to_telegram_html

    assert markdown_to_telegram_html(text) == _render_html(text)
    assert markdown_to_mrkdwn(text) == _render_mrkdwn(text)


def test_plain_line_takes_ordinary_sentences_only() -> None:
    from channels.formatting import plain_line

    assert plain_line("Sure, it is 5 pm in Paris.  ") == "Sure, it is 5 pm in Paris."
    assert plain_line("Héllo 世界") == "Héllo 世界"
    for needs_parser in ("**bold**", "1. item", "- item", "# title", "a\nb", "x & y", "see [a](b)",
                         "> quote", "a_b", "", "    code", " lead"):
        assert plain_line(needs_parser) is None, needs_parser
