"""Inbound text hygiene: what the gateway accepts, and the polite answer when it does not."""

from __future__ import annotations

import re

_SURROGATES = re.compile("[\ud800-\udfff]")


def clean_text(text: str, max_chars: int) -> tuple[str, str | None]:
    """Return (cleaned text, problem). Lone surrogates become U+FFFD; NULs are dropped."""
    if not isinstance(text, str):
        return "", "I can only read text messages."
    cleaned = _SURROGATES.sub("\ufffd", text).replace("\x00", "")
    if not cleaned.strip():
        return cleaned, "Your message was empty, so there was nothing for me to answer."
    if len(cleaned) > max_chars:
        return cleaned, (
            f"Your message is {len(cleaned):,} characters long; the limit is {max_chars:,}. "
            "Please send a shorter message or attach the text as a file."
        )
    return cleaned, None
