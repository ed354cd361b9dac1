"""Attachments: what an adapter lists on an `InboundMessage` and how it downloads one.

Adapters list each file a person sent as a small dict (``InboundMessage.attachments``), in their
platform's words: Telegram ``{"type", "file_id", "name"}``, Slack ``{"id", "name", "mimetype",
"size", "url"}`` (``url`` is ``url_private``), Discord ``{"id", "filename", "url",
"content_type", "size"}``. `describe` reads any of them; nothing is downloaded when the message
arrives. The gateway downloads later (after the message is stored) through the adapter's
`FetchesAttachments.fetch_attachment`, which uses the platform's own API and the SDK's own HTTP
client: Telegram ``getFile`` and the file URL (python-telegram-bot's httpx client), Slack
``url_private`` with the bot token (slack-sdk's aiohttp session), Discord the attachment URL
(discord.py's aiohttp session). Every body is streamed through `collect_bounded`, so a server
that says a file is small and then sends gigabytes costs at most ``max_bytes`` plus one read
buffer of memory. The gateway saves what comes back to the workspace
(gateway/inbound/attachments.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # a type only: the gateway loads this module long before any download
    from aiohttp import ClientResponse

__all__ = [
    "READ_CHUNK",
    "WORKSPACE_IMAGE_PREFIX",
    "AttachmentInfo",
    "AttachmentTooLarge",
    "AttachmentUnavailable",
    "FetchesAttachments",
    "collect_bounded",
    "declared_length",
    "describe",
    "read_bounded",
]

READ_CHUNK = 64 * 1024
"""The read buffer of a download: what may be held beyond ``max_bytes`` before a refusal."""

WORKSPACE_IMAGE_PREFIX = "workspace:"
"""How a stored message names an image saved in the workspace, in an OpenAI image part
(``{"type": "image_url", "image_url": {"url": "workspace:inbox/…/photo.jpg"}}``): the model
provider sends the file's bytes as a data URL to a vision model and leaves the part out for
any other (gateway/model/images.py). The stored message never holds the bytes."""


class AttachmentTooLarge(Exception):
    """The file is larger than the gateway accepts (`size` in bytes when known)."""

    def __init__(self, size: int | None, limit: int) -> None:
        shown = f"{size:,} bytes" if size is not None else "too large"
        super().__init__(f"{shown}; the limit is {limit:,} bytes")
        self.size = size
        self.limit = limit


class AttachmentUnavailable(Exception):
    """The platform would not hand the file over; the message says why, for people."""


@runtime_checkable
class FetchesAttachments(Protocol):
    """Optional: a channel that can download the attachments it lists.

    ``fetch_attachment`` returns the file's bytes, at most ``max_bytes`` of them: a larger file
    raises `AttachmentTooLarge` (before downloading when the platform or the Content-Length
    says the size, else while streaming, never holding more than the limit: `collect_bounded`),
    one the platform will not give `AttachmentUnavailable` with a reason for people (an error
    status, a redirect refused, a stall, a broken connection); anything else propagates and the
    gateway logs it in one line.
    """

    async def fetch_attachment(self, attachment: Mapping[str, Any], max_bytes: int) -> bytes: ...


@dataclass(frozen=True, slots=True)
class AttachmentInfo:
    """An attachment dict read the same way whichever platform wrote it."""

    name: str | None
    """The file name as sent (None: the platform gave none, e.g. a Telegram photo)."""
    kind: str | None
    """The platform's own kind (Telegram: photo, document, audio, video, voice), if any."""
    mime: str | None
    """The type the platform (or the sender's client) claims; never trusted as it is."""
    size: int | None
    """The size the platform reports, in bytes."""
    file_id: str | None
    """The platform's id of the file (Slack, Discord), if it has one."""


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def describe(attachment: Mapping[str, Any]) -> AttachmentInfo:
    """What an adapter's attachment dict says (any platform's shape; wrong types are None)."""
    size = attachment.get("size")
    return AttachmentInfo(
        name=_text(attachment.get("name")) or _text(attachment.get("filename")),
        kind=_text(attachment.get("type")),
        mime=_text(attachment.get("mimetype")) or _text(attachment.get("content_type")),
        size=size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None,
        file_id=_text(attachment.get("id")),
    )


def declared_length(value: str | None) -> int | None:
    """A Content-Length header as a number (None: absent or not one; then only reading tells)."""
    digits = (value or "").strip()
    return int(digits) if digits.isascii() and digits.isdigit() else None


async def collect_bounded(
    chunks: AsyncIterable[bytes], declared: int | None, max_bytes: int
) -> bytes:
    """The bytes of `chunks`, refused (`AttachmentTooLarge`) as soon as they pass `max_bytes`:
    by the `declared` length before reading, else while reading. Nothing past the limit is kept
    (at most one chunk over it), whatever the server declared; the caller closes the stream."""
    if declared is not None and declared > max_bytes:
        raise AttachmentTooLarge(declared, max_bytes)
    body = bytearray()
    async for chunk in chunks:
        if len(body) + len(chunk) > max_bytes:
            raise AttachmentTooLarge(None, max_bytes)
        body += chunk
    return bytes(body)


async def read_bounded(response: ClientResponse, max_bytes: int) -> bytes:
    """The body of an aiohttp `response`, read `READ_CHUNK` at a time by `collect_bounded`."""
    return await collect_bounded(
        response.content.iter_chunked(READ_CHUNK), response.content_length, max_bytes
    )
