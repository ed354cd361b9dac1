"""Inbound text hygiene: what the gateway accepts, and the polite answer when it does not."""

from __future__ import annotations

from dataclasses import replace

from channels.base import InboundMessage, id_problem, is_blank, storable


def clean_text(text: str, max_chars: int) -> tuple[str, str | None]:
    """Return (cleaned text, problem). Lone surrogates become U+FFFD; NULs are dropped.

    Text nobody can see (whitespace or zero-width characters only, `is_blank`) is empty.
    """
    if not isinstance(text, str):
        return "", "I can only read text messages."
    cleaned = storable(text)
    if is_blank(cleaned):
        return cleaned, "Your message was empty, so there was nothing for me to answer."
    if len(cleaned) > max_chars:
        return cleaned, (
            f"Your message is {len(cleaned):,} characters long; the limit is {max_chars:,}. "
            "Please send a shorter message or attach the text as a file."
        )
    return cleaned, None


_ID_FIELDS = ("sender_id", "chat_id", "account", "thread_id", "reply_to", "platform_message_id")
_REQUIRED_IDS = ("sender_id", "chat_id")


def is_storable_id(value: str) -> bool:
    """An id the store keeps as it is (`inbound_problem` refuses messages with others)."""
    return id_problem(value) is None


def inbound_problem(msg: InboundMessage) -> str | None:
    """Why the gateway refuses this message before anything else (None: it does not).

    Every id must be storable as it is (`id_problem`), and the chat and the sender must be
    named: a blank id (whitespace or zero-width characters only) is refused like an empty one.
    The reason names the field, never the value.
    """
    for name in _ID_FIELDS:
        value = getattr(msg, name)
        if not isinstance(value, str):
            if value is None and name not in _REQUIRED_IDS:
                continue
            return f"the {name} is not text"
        problem = id_problem(value)
        if problem is not None:
            return f"the {name} {problem}; ids must be plain text"
        if name in _REQUIRED_IDS and is_blank(value):
            return f"the {name} is blank (empty, spaces or zero-width characters only)"
    return None


def clean_inbound(msg: InboundMessage) -> InboundMessage:
    """The message with a sender name the store can hold (ids are `inbound_problem`'s job and
    the text is `clean_text`'s): a lone surrogate becomes U+FFFD and a NUL goes, as in text.
    A display name is no key, so the two spellings may look alike there."""
    name = msg.sender_name
    cleaned = storable(name) if name else name
    return msg if cleaned == name else replace(msg, sender_name=cleaned)
