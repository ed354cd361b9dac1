"""Inbound text hygiene: what the gateway accepts, and the polite answer when it does not."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from channels.base import InboundMessage

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


_ID_FIELDS = ("chat_id", "sender_id", "thread_id", "reply_to", "platform_message_id", "account")


def _storable_id(value: str) -> str:
    """An id that UTF-8 (SQLite, PostgreSQL) and percent-encoding accept; distinct stays distinct."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def is_storable_id(value: str) -> bool:
    """An id the store keeps as it is (`clean_inbound` rewrites the others)."""
    return not (_SURROGATES.search(value) or "\x00" in value)


def clean_inbound(msg: InboundMessage) -> InboundMessage:
    """The message with ids and sender name the store can hold (the text is `clean_text`'s job).

    A lone surrogate (JSON can carry ``"\\ud800"``) cannot be encoded as UTF-8, so an id or a
    name holding one would fail the insert, and the session key too. Ids keep it visible as an
    escape; the display name gets U+FFFD.
    """
    changes: dict[str, Any] = {}
    for name in _ID_FIELDS:
        value = getattr(msg, name)
        if isinstance(value, str) and not is_storable_id(value):
            changes[name] = _storable_id(value)
    if msg.sender_name and (_SURROGATES.search(msg.sender_name) or "\x00" in msg.sender_name):
        changes["sender_name"] = _SURROGATES.sub("\ufffd", msg.sender_name).replace("\x00", "")
    return replace(msg, **changes) if changes else msg
