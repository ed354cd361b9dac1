"""The one token authority (pure part).

Every component that needs a token count — history limits, budgets, the compaction trigger, the
memory-flush threshold, `explain` — asks one `TokenCounter`. Two counters that disagree are how
compaction ends up firing too early, never, or in a loop; so there is exactly one per model.

The counter wraps an encoder length function (tiktoken's, loaded by `gateway.model.tokenizer`, which
owns the file I/O) or, when none could be loaded, the CJK-aware estimate below with a ×1.2
safety margin. Each message is counted once: the count is cached on `Message.tokens`, persisted
by the runner, and reused. `UsageCalibration` then anchors local totals to what the provider
reports as `usage.prompt_tokens`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from context.types import Message, ToolCall

__all__ = [
    "ESTIMATE_COUNTER_NAME",
    "ESTIMATE_SAFETY_MARGIN",
    "IMAGE_TOKENS",
    "IMAGE_TOKENS_LOW_DETAIL",
    "MESSAGE_OVERHEAD_TOKENS",
    "TokenCounter",
    "UsageCalibration",
    "estimate_counter",
    "estimate_tokens",
]

#: Multiplier applied to estimated (not tokenizer-exact) text counts.
ESTIMATE_SAFETY_MARGIN = 1.2
#: Per-message framing in the chat format (`<|start|>role<|message|>…<|end|>`): 3 tokens of
#: framing plus 1 for the role, which is a single token in cl100k and o200k for all four roles.
MESSAGE_OVERHEAD_TOKENS = 4
#: An extra name field costs its text plus one token (OpenAI's `tokens_per_name`).
NAME_OVERHEAD_TOKENS = 1
#: Framing for each tool call beyond the JSON of its name and arguments.
TOOL_CALL_OVERHEAD_TOKENS = 3
#: An image part (high/auto detail). Low detail costs a flat 85.
IMAGE_TOKENS = 1_200
IMAGE_TOKENS_LOW_DETAIL = 85
#: Content parts that are neither text nor image (audio, files): counted flat, never by their
#: base64 payload.
ATTACHMENT_TOKENS = 1_200

ESTIMATE_COUNTER_NAME = "estimate:cjk-aware"

# CJK: Hangul Jamo, CJK radicals/Kangxi, CJK symbols & punctuation, Hiragana, Katakana, Bopomofo,
# Hangul compatibility Jamo, Kanbun, Katakana ext., enclosed CJK, CJK compatibility, CJK ext. A,
# CJK unified ideographs, Hangul Jamo ext. A, Hangul syllables + Jamo ext. B, CJK compatibility
# ideographs, CJK compatibility forms, halfwidth/fullwidth forms, CJK ext. B–H (planes 2–3).
_CJK_CLASS = (
    "\u1100-\u11ff\u2e80-\u2fdf\u3000-\u303f\u3040-\u30ff\u3100-\u31ff\u3200-\u4dbf"
    "\u4e00-\u9fff\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef"
    "\U00020000-\U0003134f"
)
# Pieces roughly as a BPE pre-tokenizer splits them: ASCII letter runs, digit runs, CJK chars,
# other non-ASCII chars, ASCII punctuation runs, whitespace runs.
_PIECE_RE = re.compile(
    rf"(?P<alpha>[A-Za-z]+)|(?P<digit>[0-9]+)|(?P<cjk>[{_CJK_CLASS}])|(?P<other>[^\x00-\x7f])"
    r"|(?P<space>\s+)|(?P<punct>[^\sA-Za-z0-9\x80-\U0010ffff]+)"
)


def estimate_tokens(text: str) -> int:
    """Estimate the token count of `text` without a tokenizer (no safety margin applied).

    CJK characters (Han, Hiragana, Katakana, Hangul and CJK punctuation) count one token each
    (a chars/4 scheme would count four of them as one). Everything else is counted the way a BPE
    pre-tokenizer splits it, which lands near chars/4 for English prose and code, but does not
    under-count identifiers and JSON by half the way plain chars/4 does: letter runs cost
    ⌈len/8⌉, digit runs ⌈len/3⌉ (BPE splits digits in threes), punctuation runs ⌈len/2⌉, a
    whitespace run other than a single space 1, and any other non-ASCII char (Cyrillic, Thai,
    Arabic, emoji, accents) 0.6. It is an estimate for when no tokenizer is loaded, so callers
    apply the ×1.2 margin on top.
    """
    if not text:
        return 0
    total = 0.0
    for match in _PIECE_RE.finditer(text):
        kind = match.lastgroup
        size = match.end() - match.start()
        if kind == "alpha":
            total += math.ceil(size / 8)
        elif kind == "digit":
            total += math.ceil(size / 3)
        elif kind == "cjk":
            total += 1
        elif kind == "other":
            total += 0.6
        elif kind == "space":
            total += 0 if size == 1 and match.group() == " " else 1
        else:  # punct
            total += math.ceil(size / 2)
    return math.ceil(total)


def _tool_call_json(call: ToolCall) -> str:
    return json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)


class TokenCounter:
    """Counts tokens of text and chat messages with one encoding (or the estimate).

    `name` says which counter this is (``"tiktoken:o200k_base"``, ``"estimate:cjk-aware"``,
    ``"tiktoken:cl100k_base (o200k_base unavailable)"``) so logs and `explain` can show it.
    `encode_len` returns the exact token count of a string; None means "estimate". `exact`
    says whether counts come from a real tokenizer; estimates get a ×1.2 safety margin.
    """

    __slots__ = ("_encode_len", "exact", "name")

    def __init__(
        self,
        name: str,
        encode_len: Callable[[str], int] | None = None,
        exact: bool = False,
    ) -> None:
        if exact and encode_len is None:
            raise ValueError(f"token counter {name!r}: exact=True needs an encode_len function")
        self.name = name
        self._encode_len = encode_len
        self.exact = exact

    def __repr__(self) -> str:
        return f"TokenCounter(name={self.name!r}, exact={self.exact})"

    @property
    def is_estimate(self) -> bool:
        """True when counts are estimates (×1.2 margin) rather than tokenizer counts."""
        return not self.exact

    # -- text -----------------------------------------------------------------------------

    def _raw(self, text: str) -> int:
        if not text:
            return 0
        if self._encode_len is not None:
            return self._encode_len(text)
        return estimate_tokens(text)

    def _margin(self, raw: int) -> int:
        if self.exact or raw == 0:
            return raw
        return math.ceil(raw * ESTIMATE_SAFETY_MARGIN)

    def count_text(self, text: str) -> int:
        """Tokens in `text` (estimates include the ×1.2 margin)."""
        return self._margin(self._raw(text))

    def count_json(self, value: Any) -> int:
        """Tokens in the compact JSON of `value` — e.g. the `tools` schema list of a request."""
        return self.count_text(json.dumps(value, ensure_ascii=False, separators=(",", ":")))

    # -- messages -------------------------------------------------------------------------

    def count_message(self, msg: Message) -> int:
        """Tokens one message costs in a prompt, ignoring any cached `msg.tokens`.

        Framing and role (4), the text parts, image parts (1,200 each, 85 at low detail), tool
        calls as the JSON of name + arguments (plus 3 each), `tool_call_id` and `name`.
        """
        text_raw = 0
        fixed = MESSAGE_OVERHEAD_TOKENS
        content = msg.content
        if isinstance(content, str):
            text_raw += self._raw(content)
        elif content is not None:
            for part in content:
                text_raw, fixed = self._count_part(part, text_raw, fixed)
        for call in msg.tool_calls:
            text_raw += self._raw(_tool_call_json(call))
            fixed += TOOL_CALL_OVERHEAD_TOKENS
        if msg.tool_call_id:
            text_raw += self._raw(msg.tool_call_id)
        if msg.name:
            text_raw += self._raw(msg.name)
            fixed += NAME_OVERHEAD_TOKENS
        return fixed + self._margin(text_raw)

    def _count_part(self, part: Mapping[str, Any], text_raw: int, fixed: int) -> tuple[int, int]:
        kind = part.get("type")
        if kind == "text":
            return text_raw + self._raw(str(part.get("text", ""))), fixed
        if kind in ("image_url", "image", "input_image"):
            return text_raw, fixed + _image_tokens(part)
        return text_raw, fixed + ATTACHMENT_TOKENS

    def count_messages(self, msgs: Iterable[Message]) -> int:
        """Total tokens of `msgs`, using each message's cached `tokens` when it has one."""
        return sum(m.tokens if m.tokens is not None else self.count_message(m) for m in msgs)

    def ensure_counted(self, msgs: Iterable[Message]) -> list[Message]:
        """`msgs` with `tokens` filled in where missing (cached ones are kept as they are).

        The runner persists the new counts so a message is counted once in its life.
        """
        return [m if m.tokens is not None else m.with_tokens(self.count_message(m)) for m in msgs]

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Tokens of the tool schemas sent with a request (they count against the window)."""
        return self.count_json(list(tools)) if tools else 0


def _image_tokens(part: Mapping[str, Any]) -> int:
    detail: Any = part.get("detail")
    inner = part.get("image_url")
    if isinstance(inner, Mapping):
        detail = inner.get("detail", detail)
    return IMAGE_TOKENS_LOW_DETAIL if detail == "low" else IMAGE_TOKENS


def estimate_counter() -> TokenCounter:
    """The fallback counter: CJK-aware estimate with the ×1.2 margin."""
    return TokenCounter(ESTIMATE_COUNTER_NAME, None, exact=False)


@dataclass(slots=True)
class UsageCalibration:
    """Anchors local token totals to the provider's reported `usage.prompt_tokens`.

    After each LLM call, `observe(local_total, reported)` with the local count of everything
    that was sent (messages, tool schemas) and the provider's `prompt_tokens`. The ratio
    reported/local is clamped to [`min_ratio`, `max_ratio`] — a wildly different figure means
    something other than tokenization differs (a proxy injecting a prompt, a cached-prefix
    discount) and must not swing the budget — and smoothed with weight `alpha` for new
    observations (the first one is taken as is). `calibrated(total)` applies it.
    """

    ratio: float = 1.0
    samples: int = 0
    min_ratio: float = 0.5
    max_ratio: float = 2.0
    alpha: float = 0.5
    last_raw_ratio: float | None = None
    last_clamped: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.min_ratio <= 1.0 <= self.max_ratio:
            raise ValueError("calibration range must satisfy 0 < min_ratio <= 1 <= max_ratio")
        if not 0 < self.alpha <= 1:
            raise ValueError("calibration alpha must be in (0, 1]")
        self.ratio = self._clamp(self.ratio)

    def _clamp(self, value: float) -> float:
        return min(self.max_ratio, max(self.min_ratio, value))

    def observe(self, local_total: int, reported: int) -> float:
        """Record one provider report; returns the new ratio. Non-positive inputs are ignored."""
        if local_total <= 0 or reported <= 0:
            return self.ratio
        raw = reported / local_total
        clamped = self._clamp(raw)
        self.last_raw_ratio = raw
        self.last_clamped = clamped != raw
        if self.samples == 0:
            self.ratio = clamped
        else:
            self.ratio = self._clamp(self.alpha * clamped + (1 - self.alpha) * self.ratio)
        self.samples += 1
        return self.ratio

    def calibrated(self, total: int) -> int:
        """`total` scaled by the current ratio (rounded up); unchanged before any report."""
        if total <= 0 or self.samples == 0:
            return max(total, 0)
        return math.ceil(total * self.ratio)

    def describe(self) -> str:
        """One line for `explain`, e.g. ``"×1.070 from 3 provider reports"``."""
        if self.samples == 0:
            return "none (no provider usage reported yet)"
        plural = "s" if self.samples > 1 else ""
        text = f"×{self.ratio:.3f} from {self.samples} provider report{plural}"
        if self.last_clamped and self.last_raw_ratio is not None:
            text += (
                f" (last raw ratio {self.last_raw_ratio:.3f} clamped to "
                f"{self.min_ratio}–{self.max_ratio})"
            )
        return text
