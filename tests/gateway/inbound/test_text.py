"""`gateway.inbound.text` on its own: what text and ids the gateway accepts, how it cleans what
it keeps, and the answer it gives when it refuses (the whole path is in test_inbound_ids)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channels.base import ZERO_WIDTH, InboundMessage
from gateway.inbound.text import clean_inbound, clean_text, inbound_problem, is_storable_id

EMPTY = "Your message was empty, so there was nothing for me to answer."
NOT_TEXT = "I can only read text messages."
DM = InboundMessage(
    platform="telegram", chat_type="direct", chat_id="42", sender_id="7", text="hi",
    thread_id="3", reply_to="m0", platform_message_id="m1", sender_name="Alice",
)
ID_FIELDS = ("sender_id", "chat_id", "account", "thread_id", "reply_to", "platform_message_id")


def too_long(length: int, limit: int) -> str:
    """The refusal `clean_text` gives for text over the limit."""
    return (
        f"Your message is {length:,} characters long; the limit is {limit:,}. "
        "Please send a shorter message or attach the text as a file."
    )


# -- clean_text ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["hello", "  padded  ", "line\r\nbreaks\ttabs", "ünïcödé 日本語 😀", "bell\x07 esc\x1b[31m"],
)
def test_ordinary_text_passes_unchanged(text: str) -> None:
    """Only NULs and lone surrogates are touched: other control characters are the model's
    to read, and surrounding whitespace is kept."""
    assert clean_text(text, 1_000) == (text, None)


def test_nul_characters_are_dropped() -> None:
    assert clean_text("a\x00b\x00\x00c", 100) == ("abc", None)


def test_lone_surrogates_become_the_replacement_character() -> None:
    # JSON can carry an unpaired surrogate; json.loads hands it over as is.
    lone = json.loads('"deploy \\ud800 now \\udfff"')
    assert lone == "deploy \ud800 now \udfff"
    assert clean_text(lone, 100) == ("deploy \ufffd now \ufffd", None)


def test_a_surrogate_pair_as_two_code_points_is_two_replacements_and_a_real_emoji_is_kept() -> None:
    assert clean_text("\ud83d\ude00", 100) == ("\ufffd\ufffd", None)
    assert clean_text("\U0001f600", 100) == ("\U0001f600", None)


def test_cleaned_text_is_always_encodable_as_utf8() -> None:
    cleaned, problem = clean_text("x\ud800\x00y", 100)
    assert problem is None
    assert cleaned.encode("utf-8") == b"x\xef\xbf\xbdy"


@pytest.mark.parametrize(
    "text",
    ["", " ", "\n\t\r ", "\u00a0\u3000", ZERO_WIDTH, f" {ZERO_WIDTH} \n", "\x00\x00"],
    ids=["empty", "space", "whitespace", "unicode-spaces", "zero-width", "mixed", "nuls-only"],
)
def test_text_nobody_can_see_is_refused_as_empty(text: str) -> None:
    cleaned, problem = clean_text(text, 100)
    assert problem == EMPTY
    assert cleaned == text.replace("\x00", "")


@pytest.mark.parametrize("value", [None, b"hello", 42, ["hi"], {"text": "hi"}])
def test_anything_but_a_string_is_refused(value: Any) -> None:
    assert clean_text(value, 100) == ("", NOT_TEXT)


def test_the_limit_is_inclusive_and_counts_characters_not_bytes() -> None:
    assert clean_text("a" * 10, 10) == ("a" * 10, None)
    assert clean_text("é" * 10, 10) == ("é" * 10, None)  # 20 bytes in UTF-8
    assert clean_text("\U0001f600" * 10, 10) == ("\U0001f600" * 10, None)
    assert clean_text("a" * 11, 10) == ("a" * 11, too_long(11, 10))


def test_the_limit_applies_after_cleaning() -> None:
    """Dropped NULs do not count; a replaced surrogate counts as the one character it becomes."""
    assert clean_text("a" * 10 + "\x00" * 50, 10) == ("a" * 10, None)
    assert clean_text("a" * 9 + "\ud800", 10) == ("a" * 9 + "\ufffd", None)
    assert clean_text("a" * 10 + "\ud800", 10)[1] == too_long(11, 10)


def test_huge_text_is_refused_with_its_length_and_the_limit_in_thousands() -> None:
    text = "x" * 5_000_000
    cleaned, problem = clean_text(text, 100_000)
    assert problem == too_long(5_000_000, 100_000)
    assert "5,000,000" in problem and "100,000" in problem
    assert cleaned == text


def test_blank_is_reported_before_length() -> None:
    assert clean_text(" " * 500, 10) == (" " * 500, EMPTY)


HOSTILE = st.sampled_from(["\x00", "\ud800", "\udfff", "\u200b", " "])
"""What `st.characters()` leaves out or rarely draws: NUL, lone surrogates, invisible text."""


@settings(max_examples=300, deadline=None)
@given(text=st.text(st.one_of(st.characters(), HOSTILE)), limit=st.integers(1, 40))
def test_what_clean_text_accepts_is_storable_visible_and_within_the_limit(
    text: str, limit: int
) -> None:
    cleaned, problem = clean_text(text, limit)
    assert "\x00" not in cleaned
    assert not any("\ud800" <= c <= "\udfff" for c in cleaned)
    cleaned.encode("utf-8")  # raises on a surrogate
    if problem is None:
        assert len(cleaned) <= limit
        assert cleaned.translate(dict.fromkeys(map(ord, ZERO_WIDTH))).strip()


# -- is_storable_id -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "storable"),
    [
        ("42", True),
        ("", True),  # blank is inbound_problem's business, for the ids that must be named
        ("U\\x00", True),  # the escaped spelling is plain text
        ("C\\ud800", True),
        ("😀", True),
        ("U\x00", False),
        ("C\ud800", False),
        ("\udfff", False),
    ],
)
def test_is_storable_id(value: str, storable: bool) -> None:
    assert is_storable_id(value) is storable


# -- inbound_problem ----------------------------------------------------------------------------


def test_a_well_formed_message_has_no_problem() -> None:
    assert inbound_problem(DM) is None


@pytest.mark.parametrize("name", ["thread_id", "reply_to", "platform_message_id"])
def test_optional_ids_may_be_missing_or_blank(name: str) -> None:
    assert inbound_problem(replace(DM, **{name: None})) is None
    assert inbound_problem(replace(DM, **{name: ""})) is None
    assert inbound_problem(replace(DM, **{name: ZERO_WIDTH})) is None


@pytest.mark.parametrize("name", ID_FIELDS)
def test_an_id_with_a_nul_is_refused_and_named(name: str) -> None:
    msg = replace(DM, **{name: "sk-SECRET\x00value"})
    problem = inbound_problem(msg)
    assert problem == f"the {name} contains a NUL character; ids must be plain text"
    assert "SECRET" not in problem  # the reason names the field, never the value


@pytest.mark.parametrize("name", ID_FIELDS)
def test_an_id_with_a_lone_surrogate_is_refused_not_rewritten(name: str) -> None:
    problem = inbound_problem(replace(DM, **{name: "U\udc80"}))
    assert problem == (
        f"the {name} contains an unpaired surrogate (\\ud800-\\udfff); ids must be plain text"
    )


@pytest.mark.parametrize("name", ["sender_id", "chat_id"])
@pytest.mark.parametrize("value", ["", "   ", "\t\n", ZERO_WIDTH, f" {ZERO_WIDTH[0]} "])
def test_the_sender_and_the_chat_must_be_named(name: str, value: str) -> None:
    assert inbound_problem(replace(DM, **{name: value})) == (
        f"the {name} is blank (empty, spaces or zero-width characters only)"
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [("sender_id", None), ("chat_id", None), ("sender_id", 7), ("chat_id", b"42"),
     ("thread_id", 3), ("reply_to", b"m0"), ("platform_message_id", ["m1"]), ("account", 1)],
)
def test_an_id_that_is_not_a_string_is_refused(name: str, value: Any) -> None:
    assert inbound_problem(replace(DM, **{name: value})) == f"the {name} is not text"


def test_the_first_bad_id_in_field_order_is_the_one_named() -> None:
    msg = replace(DM, sender_id="", chat_id="\x00", thread_id="\ud800")
    assert inbound_problem(msg) == (
        "the sender_id is blank (empty, spaces or zero-width characters only)"
    )
    assert inbound_problem(replace(msg, sender_id="7")) == (
        "the chat_id contains a NUL character; ids must be plain text"
    )


def test_the_text_is_not_inbound_problems_business() -> None:
    assert inbound_problem(replace(DM, text="")) is None
    assert inbound_problem(replace(DM, text="a\x00\ud800")) is None


# -- clean_inbound ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Alice", "", None, "Zoë 😀", "bell\x07"])
def test_a_clean_sender_name_leaves_the_message_as_it_is(name: str | None) -> None:
    msg = replace(DM, sender_name=name)
    assert clean_inbound(msg) is msg


def test_a_sender_name_with_nuls_and_lone_surrogates_is_cleaned_and_nothing_else() -> None:
    msg = replace(DM, sender_name="Al\x00ice\ud800", text="t\x00\ud800", chat_id="c\x00")
    cleaned = clean_inbound(msg)
    assert cleaned.sender_name == "Alice\ufffd"
    assert cleaned == replace(msg, sender_name="Alice\ufffd")  # text and ids untouched
    assert msg.sender_name == "Al\x00ice\ud800"  # a new message; the old one is as it was


def test_a_sender_name_of_only_nuls_becomes_empty() -> None:
    assert clean_inbound(replace(DM, sender_name="\x00\x00")).sender_name == ""
