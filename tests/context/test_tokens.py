"""The token authority's pure part: text and message counts, the estimate, calibration."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from context.tokens import (
    ESTIMATE_COUNTER_NAME,
    IMAGE_TOKENS,
    IMAGE_TOKENS_LOW_DETAIL,
    MESSAGE_OVERHEAD_TOKENS,
    TokenCounter,
    UsageCalibration,
    estimate_counter,
    estimate_tokens,
)
from context.types import Message, ToolCall


def words(text: str) -> int:
    """A transparent stand-in tokenizer: one token per whitespace-separated word."""
    return len(text.split())


class Recorder:
    """An encode_len that records what it was asked to count."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, text: str) -> int:
        self.calls.append(text)
        return words(text)


@pytest.fixture
def exact() -> TokenCounter:
    return TokenCounter("test:words", words, exact=True)


# -- construction ------------------------------------------------------------------------------


def test_counter_flags() -> None:
    est = estimate_counter()
    assert est.name == ESTIMATE_COUNTER_NAME == "estimate:cjk-aware"
    assert est.is_estimate and not est.exact
    ex = TokenCounter("tiktoken:o200k_base", words, exact=True)
    assert not ex.is_estimate
    assert "o200k_base" in repr(ex)
    with pytest.raises(ValueError, match="encode_len"):
        TokenCounter("broken", None, exact=True)


# -- the estimate ------------------------------------------------------------------------------


def test_estimate_empty() -> None:
    assert estimate_tokens("") == 0
    assert estimate_counter().count_text("") == 0


def test_estimate_latin_is_about_chars_over_4() -> None:
    text = "The quick brown fox jumps over the lazy dog and keeps running far away. " * 20
    assert 0.7 <= estimate_tokens(text) / (len(text) / 4) <= 1.2


@pytest.mark.parametrize(
    "text",
    [
        "今天天气很好我们去公园散步吧",  # Han
        "こんにちはカタカナ",  # Hiragana + Katakana
        "안녕하세요반갑습니다",  # Hangul
    ],
)
def test_estimate_cjk_is_one_token_per_char(text: str) -> None:
    assert estimate_tokens(text) == len(text)
    # chars/4 would say a quarter of that
    assert estimate_tokens(text) >= 3 * math.ceil(len(text) / 4)


def test_estimate_mixed_cjk_and_latin() -> None:
    assert estimate_tokens("部署 build 到 staging") == 3 + 2  # 3 CJK chars, 2 short words


def test_estimate_counts_identifiers_like_bpe_splits_them() -> None:
    # plain chars/4 says 10; BPE splits hex into many short pieces
    sha = "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"
    assert estimate_tokens(sha) >= 18


def test_estimate_counter_applies_margin() -> None:
    est = estimate_counter()
    text = "今天天气很好" * 10  # 60 CJK chars → 60 raw
    assert estimate_tokens(text) == 60
    assert est.count_text(text) == 72  # ×1.2


def test_exact_counter_has_no_margin(exact: TokenCounter) -> None:
    assert exact.count_text("one two three") == 3


# -- messages ----------------------------------------------------------------------------------


def test_plain_message(exact: TokenCounter) -> None:
    msg = Message(role="user", content="hello there world")
    assert exact.count_message(msg) == MESSAGE_OVERHEAD_TOKENS + 3
    assert exact.count_message(Message(role="assistant", content=None)) == MESSAGE_OVERHEAD_TOKENS


def test_tool_calls_count_their_json(exact: TokenCounter) -> None:
    call = ToolCall(id="call_1", name="search", arguments='{"q": "weather in Paris"}')
    msg = Message(role="assistant", content=None, tool_calls=(call, call))
    payload = json.dumps({"name": "search", "arguments": call.arguments}, ensure_ascii=False)
    expected = MESSAGE_OVERHEAD_TOKENS + 2 * (words(payload) + 3)
    assert exact.count_message(msg) == expected
    # bigger arguments cost more
    big = ToolCall(id="call_2", name="search", arguments=json.dumps({"q": "word " * 100}))
    assert exact.count_message(Message(role="assistant", tool_calls=(big,))) > expected


def test_tool_result_counts_id_and_name(exact: TokenCounter) -> None:
    msg = Message(role="tool", content="result text", tool_call_id="call_1", name="search")
    # overhead + 2 content words + 1 id word + 1 name word + 1 name overhead
    assert exact.count_message(msg) == MESSAGE_OVERHEAD_TOKENS + 2 + 1 + 1 + 1


def test_images(exact: TokenCounter) -> None:
    parts: list[dict[str, Any]] = [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100_000}},
        {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}},
    ]
    msg = Message(role="user", content=parts)
    assert exact.count_message(msg) == (
        MESSAGE_OVERHEAD_TOKENS + 3 + IMAGE_TOKENS + IMAGE_TOKENS_LOW_DETAIL
    )
    assert IMAGE_TOKENS == 1_200 and IMAGE_TOKENS_LOW_DETAIL == 85


def test_base64_attachments_are_not_counted_as_text() -> None:
    est = estimate_counter()
    part = {"type": "input_audio", "input_audio": {"data": "QUJD" * 50_000, "format": "wav"}}
    assert est.count_message(Message(role="user", content=[part])) < 2_000


def test_estimate_margin_covers_text_not_fixed_costs() -> None:
    est = estimate_counter()
    msg = Message(
        role="user",
        content=[
            {"type": "text", "text": "今天天气很好" * 10},
            {"type": "image_url", "image_url": {"url": "u"}},
        ],
    )
    assert est.count_message(msg) == MESSAGE_OVERHEAD_TOKENS + 72 + IMAGE_TOKENS


def test_estimate_vs_exact_on_cjk() -> None:
    text = "请把报告发给我谢谢"
    est = estimate_counter().count_text(text)
    naive = math.ceil(len(text) / 4)
    assert est >= 4 * naive - 4  # CJK weighted, not chars/4


# -- caching -----------------------------------------------------------------------------------


def test_count_messages_reuses_cached_tokens() -> None:
    rec = Recorder()
    counter = TokenCounter("test:rec", rec, exact=True)
    cached = Message(role="user", content="this text is never counted again", tokens=999)
    fresh = Message(role="assistant", content="two words")
    assert counter.count_messages([cached, fresh]) == 999 + MESSAGE_OVERHEAD_TOKENS + 2
    assert rec.calls == ["two words"]


def test_ensure_counted_fills_only_missing() -> None:
    rec = Recorder()
    counter = TokenCounter("test:rec", rec, exact=True)
    msgs = [
        Message(role="system", content="be nice"),
        Message(role="user", content="cached already", tokens=7, seq=1),
        Message(role="assistant", content="one two three", seq=2),
    ]
    out = counter.ensure_counted(msgs)
    assert [m.tokens for m in out] == [MESSAGE_OVERHEAD_TOKENS + 2, 7, MESSAGE_OVERHEAD_TOKENS + 3]
    assert out[1] is msgs[1]
    assert [m.seq for m in out] == [None, 1, 2]
    assert rec.calls == ["be nice", "one two three"]
    # a second pass counts nothing
    rec.calls.clear()
    assert counter.count_messages(out) == sum(m.tokens or 0 for m in out)
    assert counter.ensure_counted(out) == out
    assert rec.calls == []


def test_count_tools_schema(exact: TokenCounter) -> None:
    assert exact.count_tools([]) == 0
    tools = [{"type": "function", "function": {"name": "memory_write", "parameters": {}}}]
    assert exact.count_tools(tools) == exact.count_json(tools) > 0


# -- calibration -------------------------------------------------------------------------------


def test_calibration_identity_before_reports() -> None:
    cal = UsageCalibration()
    assert cal.calibrated(1_000) == 1_000
    assert cal.samples == 0
    assert "no provider usage" in cal.describe()


def test_calibration_first_report_sets_ratio() -> None:
    cal = UsageCalibration()
    cal.observe(local_total=1_000, reported=1_100)
    assert cal.ratio == pytest.approx(1.1)
    assert cal.calibrated(2_000) == 2_200
    assert "×1.100 from 1 provider report" in cal.describe()


def test_calibration_smooths_later_reports() -> None:
    cal = UsageCalibration(alpha=0.5)
    cal.observe(1_000, 1_000)
    cal.observe(1_000, 1_200)
    assert cal.ratio == pytest.approx(1.1)
    assert cal.samples == 2


@pytest.mark.parametrize(
    ("local", "reported", "ratio", "clamped"),
    [
        (1_000, 10_000, 2.0, True),
        (1_000, 100, 0.5, True),
        (1_000, 1_900, 1.9, False),
    ],
)
def test_calibration_clamp(local: int, reported: int, ratio: float, clamped: bool) -> None:
    cal = UsageCalibration()
    assert cal.observe(local, reported) == pytest.approx(ratio)
    assert cal.last_clamped is clamped
    assert cal.min_ratio <= cal.ratio <= cal.max_ratio
    if clamped:
        assert "clamped" in cal.describe()


def test_calibration_ignores_nonsense() -> None:
    cal = UsageCalibration()
    cal.observe(0, 500)
    cal.observe(500, 0)
    assert cal.samples == 0 and cal.ratio == 1.0
    assert cal.calibrated(0) == 0


def test_calibration_rejects_bad_range() -> None:
    with pytest.raises(ValueError):
        UsageCalibration(min_ratio=1.5, max_ratio=2.0)
    with pytest.raises(ValueError):
        UsageCalibration(alpha=0)
    assert UsageCalibration(ratio=9.0).ratio == 2.0
