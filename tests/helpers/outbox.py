"""Outbound messages for the outbox tests (the store's tests and the CLI's)."""

from __future__ import annotations

from channels.base import OutboundMessage


def reply_to(text: str, answers: tuple[str, ...] = ("m1",)) -> OutboundMessage:
    """A Telegram reply in a thread, answering the last of `answers` (the inbound message ids)."""
    return OutboundMessage(
        platform="telegram", chat_id="42", text=text, session_key="k", thread_id="7",
        reply_to=answers[-1], answers=answers,
    )
