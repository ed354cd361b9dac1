"""The channel seam: normalized inbound/outbound messages and the Channel protocol.

Adapters stay thin: SDK event -> `InboundMessage`; `OutboundMessage` -> SDK call. Nothing
platform-specific travels past this module.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from aiohttp import web

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
    logged with its traceback. A channel names its SDK's errors in ``send_errors``
    (`NamesSendErrors`)."""
    errors = channel.send_errors if isinstance(channel, NamesSendErrors) else ()
    return isinstance(exc, NETWORK_ERRORS + errors)


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


StoredReply = Callable[[str, str], Awaitable["list[str] | None"]]
"""(chat id, platform message id) -> the reply the store holds for that inbound message: None
while it is unanswered (or unknown), [] when it was handled without a reply of its own."""


class ReplyWaiters:
    """Lets a request/response channel (console, webchat) wait for the reply to its message.

    The gateway answers asynchronously through `Channel.send`; each waiter named by
    `OutboundMessage.answers` is resolved with the reply text. A waiter is keyed by (chat id,
    platform message id), the pair the store deduplicates by: a message id belongs to the chat
    (the person) that sent it, so two users' ids never meet, and the chat id on the reply is the
    one the message came from (`Runner.run_turn`). Several requests may wait for one message
    (retries): the reply resolves them all.

    With `stored` (the gateway sets it, `Gateway.add_channel`), `wait` also looks in the store
    every `poll_interval` seconds, for a reply that was stored but went elsewhere: to another
    chat of a shared session (``dm_scope`` ``main`` / ``per-peer``), or from another process.
    """

    def __init__(self, stored: StoredReply | None = None, poll_interval: float = 1.0) -> None:
        self.stored = stored
        self.poll_interval = poll_interval
        self._waiting: dict[tuple[str, str], list[asyncio.Future[list[str]]]] = {}

    def expect(self, chat_id: str, message_id: str) -> asyncio.Future[list[str]]:
        future: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault((chat_id, message_id), []).append(future)
        return future

    def forget(self, chat_id: str, message_id: str, future: asyncio.Future[list[str]]) -> None:
        """Stop waiting with `future` (the others waiting for the same message go on)."""
        key = (chat_id, message_id)
        futures = self._waiting.get(key)
        if futures is None:
            return
        if future in futures:
            futures.remove(future)
        if not futures:
            del self._waiting[key]

    def resolve(self, message: OutboundMessage) -> None:
        ids = message.answers or ((message.reply_to,) if message.reply_to else ())
        for message_id in ids:
            for future in self._waiting.pop((message.chat_id, message_id), ()):
                if not future.done():
                    future.set_result([message.text])

    async def wait(
        self,
        chat_id: str,
        message_id: str,
        future: asyncio.Future[list[str]],
        within: float,
        *,
        look_first: bool = False,
    ) -> list[str]:
        """The reply to (chat id, message id), whichever way it comes first: `future` (from
        `expect`) resolved by `resolve`, or the store (first at once with `look_first`: a repeat
        of a message that may be answered already). `TimeoutError` after `within` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        look = look_first
        while True:
            if look and self.stored is not None and not future.done():
                found = await self.stored(chat_id, message_id)
                if found is not None:
                    return found
            left = deadline - loop.time()
            if left <= 0 and not future.done():
                raise TimeoutError(f"no reply within {within:g} s")
            step = left if self.stored is None else min(left, self.poll_interval)
            done, _pending = await asyncio.wait({future}, timeout=max(step, 0))
            if done:
                return future.result()
            look = True

    def fail_all(self, reason: str) -> None:
        for futures in self._waiting.values():
            for future in futures:
                if not future.done():
                    future.set_exception(ConnectionAbortedError(reason))
                    # Nobody may be awaiting it any more; don't warn about an unretrieved error.
                    future.add_done_callback(lambda f: f.exception())
        self._waiting.clear()


class AwaitsReplies:
    """The part of a channel whose callers wait for their replies (console, webchat): the
    waiters, the gateway's handler their messages go to, and `stored_reply`, which the gateway
    sets so a repeat or a reply sent elsewhere is found in the store."""

    name: str
    _waiters: ReplyWaiters
    _handler: InboundHandler | None = None

    async def start(self, on_message: InboundHandler) -> None:
        self._handler = on_message

    async def send(self, message: OutboundMessage) -> None:
        self._waiters.resolve(message)

    def _started(self) -> InboundHandler:
        """The handler `start` was given; a message before it is a programming error."""
        if self._handler is None:
            raise RuntimeError(f"{self.name} channel is not started")
        return self._handler

    def _from_user(self, user_id: str, text: str, message_id: str) -> InboundMessage:
        """A message the caller sent: a direct chat of its own, the user its chat id."""
        return InboundMessage(
            platform=self.name,
            chat_type="direct",
            chat_id=user_id,
            sender_id=user_id,
            sender_name=user_id,
            text=text,
            platform_message_id=message_id,
        )

    @property
    def stored_reply(self) -> StoredReply | None:
        """How to find a stored reply (set by `Gateway.add_channel`; see `ReplyWaiters`)."""
        return self._waiters.stored

    @stored_reply.setter
    def stored_reply(self, lookup: StoredReply | None) -> None:
        self._waiters.stored = lookup


@runtime_checkable
class AnswersRequests(Protocol):
    """A channel whose callers wait for the reply to what they sent (console, webchat): the
    gateway gives it `StoredReply` for its platform, so a repeat of a message gets the stored
    reply and a reply sent elsewhere is still found (`ReplyWaiters`)."""

    stored_reply: StoredReply | None


ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff"
"""Zero-width space, non-joiner, joiner, word joiner and BOM: invisible, and not whitespace to
`str.strip` (they are format characters)."""
_INVISIBLE = str.maketrans(dict.fromkeys(ZERO_WIDTH))
_SURROGATE = re.compile("[\ud800-\udfff]")


def is_blank(text: str) -> bool:
    """Nothing a person can see: empty, whitespace, or zero-width characters only.

    Every channel treats such text as it treats empty text, and such an id as a missing one.
    """
    return not text.translate(_INVISIBLE).strip()


def storable(text: str) -> str:
    """Text the store and every platform can hold: NULs dropped, unpaired surrogates made
    U+FFFD. For text (a model's reply, a tool's output), never for ids (`id_problem`)."""
    if "\x00" in text:
        text = text.replace("\x00", "")
    return _SURROGATE.sub("\ufffd", text)


def id_problem(value: str) -> str | None:
    """Why the store cannot keep this id as it is (None: it can).

    PostgreSQL text holds no NUL and UTF-8 no unpaired surrogate (JSON can carry ``"\\ud800"``).
    Such an id is refused, never rewritten: any storable spelling of it (``\\x00``, an escape)
    is also an id someone else can send, and the two would share a session.
    """
    if "\x00" in value:
        return "contains a NUL character"
    if _SURROGATE.search(value):
        return "contains an unpaired surrogate (\\ud800-\\udfff)"
    return None


@runtime_checkable
class Channel(Protocol):
    """What the gateway needs from a platform adapter."""

    name: str
    capabilities: ChannelCapabilities
    # Optional parts, each its own protocol below, found with isinstance: `PreviewChannel`,
    # `TypingChannel`, `WebhookChannel`, `NamesSendErrors`, and `AnswersRequests` above.

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


@runtime_checkable
class TypingChannel(Protocol):
    """Optional: a channel that can show "typing…" while a turn runs. Used only when
    ``capabilities.typing`` is also on, so an adapter can keep the method and switch it off."""

    async def typing(self, chat_id: str, thread_id: str | None = None) -> None:
        """Show the indicator once, in the chat (and thread) the reply will go to."""
        ...


@runtime_checkable
class WebhookChannel(Protocol):
    """Optional: a channel whose platform can post events to the gateway's web server
    (Telegram's webhook mode, Slack's HTTP mode): it mounts its endpoint on the app before the
    server starts."""

    def add_routes(self, app: web.Application) -> None: ...


@runtime_checkable
class NamesSendErrors(Protocol):
    """Optional: a channel naming its SDK's exception types for a platform's refusal or outage,
    so such a failed send is logged as one line rather than as a bug (`platform_failure`)."""

    send_errors: tuple[type[BaseException], ...]
