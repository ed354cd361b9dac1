"""The channel seam: normalized inbound/outbound messages and the Channel protocol.

Adapters stay thin: SDK event -> `InboundMessage`; `OutboundMessage` -> SDK call. Nothing
platform-specific travels past this module.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

ChatType = Literal["direct", "group", "channel", "thread"]


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """One message from a person, normalized across platforms."""

    platform: str
    chat_type: ChatType
    chat_id: str
    sender_id: str
    text: str
    account: str = "default"
    thread_id: str | None = None
    sender_name: str | None = None
    was_mentioned: bool = False
    reply_to: str | None = None
    attachments: tuple[dict[str, Any], ...] = ()
    platform_message_id: str | None = None
    timestamp: float = field(default_factory=time.time)

    @property
    def is_direct(self) -> bool:
        return self.chat_type == "direct"


@dataclass(frozen=True, slots=True)
class OutboundMessage:
    """A reply addressed to the chat (and thread) an inbound message came from."""

    platform: str
    chat_id: str
    text: str
    session_key: str
    thread_id: str | None = None
    reply_to: str | None = None
    account: str = "default"
    answers: tuple[str, ...] = ()
    """Platform message ids this reply answers (several when messages were collected)."""
    preview_id: str | None = None
    """A streamed preview of this reply (`PreviewChannel.send_preview`): `send` edits it into the
    first chunk and sends the rest as new messages."""
    sent_parts: int = 0
    """Chunks of this reply an earlier try already delivered (`PartlySent`): `send` starts after
    them, so a reply that failed halfway is completed, not repeated."""


@dataclass(frozen=True, slots=True)
class ChannelCapabilities:
    max_message_chars: int = 4000
    threads: bool = False
    edits: bool = False
    typing: bool = False


@dataclass(frozen=True, slots=True)
class InboundResult:
    """What the gateway did with an inbound message."""

    session_key: str | None
    accepted: bool
    duplicate: bool = False
    reason: str | None = None


InboundHandler = Callable[[InboundMessage], Awaitable[InboundResult]]


class PartlySent(Exception):
    """A reply sent in several chunks failed after its first `parts` chunks reached the platform.

    Raised from the failure (``__cause__``), so the gateway can try again from chunk `parts`
    (`OutboundMessage.sent_parts`) instead of repeating what the chat already shows.
    """

    def __init__(self, parts: int, cause: BaseException) -> None:
        super().__init__(f"sent {parts} chunk(s), then: {cause!r}")
        self.parts = parts


NETWORK_ERRORS: tuple[type[BaseException], ...] = (OSError, TimeoutError)
"""Send failures of the network itself on any platform: a refused connection, a timeout."""


def platform_failure(channel: object, exc: BaseException) -> bool:
    """Whether a failed send is the platform's or the network's doing (a refusal such as 403
    "bot was blocked", an outage), which the gateway logs as one line, as opposed to a bug,
    logged with its traceback. A channel names its SDK's errors in ``send_errors``."""
    return isinstance(exc, NETWORK_ERRORS + getattr(channel, "send_errors", ()))


_Part = TypeVar("_Part")


async def send_parts(
    parts: Sequence[_Part],
    message: OutboundMessage,
    send_one: Callable[[int, _Part], Awaitable[None]],
) -> None:
    """Send ``parts[message.sent_parts:]`` in order with ``send_one(index, part)``.

    A failure after at least one chunk (this try's or an earlier one's) went out is raised as
    `PartlySent`; a failure of the very first chunk is raised as it is.
    """
    for index in range(message.sent_parts, len(parts)):
        try:
            await send_one(index, parts[index])
        except Exception as exc:
            if index == 0:
                raise
            raise PartlySent(index, exc) from exc


class ReplyWaiters:
    """Lets a request/response channel (console, webchat) wait for the reply to its message.

    The gateway answers asynchronously through `Channel.send`; the waiter for each platform
    message id named in `OutboundMessage.answers` is resolved with the reply text.
    """

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[list[str]]] = {}

    def expect(self, message_id: str) -> asyncio.Future[list[str]]:
        future: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        self._waiting[message_id] = future
        return future

    def forget(self, message_id: str) -> None:
        self._waiting.pop(message_id, None)

    def resolve(self, message: OutboundMessage) -> None:
        ids = message.answers or ((message.reply_to,) if message.reply_to else ())
        for message_id in ids:
            future = self._waiting.pop(message_id, None)
            if future is not None and not future.done():
                future.set_result([message.text])

    def fail_all(self, reason: str) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionAbortedError(reason))
                # Nobody may be awaiting it any more; don't warn about an unretrieved error.
                future.add_done_callback(lambda f: f.exception())
        self._waiting.clear()


@runtime_checkable
class Channel(Protocol):
    """What the gateway needs from a platform adapter."""

    name: str
    capabilities: ChannelCapabilities
    # Optional: ``send_errors``, the SDK's exception types for a platform's refusal or outage
    # (`platform_failure`).

    async def start(self, on_message: InboundHandler) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, message: OutboundMessage) -> None: ...


@runtime_checkable
class PreviewChannel(Protocol):
    """Optional: a channel that can show a reply while it is written, by editing one message.

    Both take plain text (no Markdown rendering: a half-written reply must never make an edit
    fail); the finished reply goes through `Channel.send` with `OutboundMessage.preview_id`.
    """

    async def send_preview(self, message: OutboundMessage) -> str:
        """Send `message.text` as plain text (a reply to `message.reply_to`, in its thread);
        return the platform message id."""
        ...

    async def edit(
        self, chat_id: str, message_id: str, text: str, thread_id: str | None = None
    ) -> None:
        """Replace the text of an earlier message with plain `text`."""
        ...
