"""Streaming a reply by editing one preview message, throttled.

With ``[channels.<name>] stream_preview = true`` on a channel that can edit (Telegram, Slack,
Discord), a turn shows its reply while the model writes it:

1. Once the text is ``stream_min_chars`` long, one preview message is sent (plain text, as the
   reply to the user's message, in its thread).
2. While the model streams, the preview is edited with the latest text, at most once per
   ``stream_edit_interval_ms`` (platforms rate-limit edits) and one edit at a time; text that
   arrives meanwhile only replaces what the next edit shows. The model's stream never waits for
   the platform.
3. At the end the runner delivers the reply through the normal ``deliver`` with
   ``OutboundMessage.preview_id``: the channel edits the preview into the first formatted chunk
   and sends the rest as new messages (an error notice replaces the preview the same way).

Previews are plain text, so half-written Markdown never makes an edit fail. A failed preview
edit is logged and never fails the turn; after `max_failures` failures in a row the preview
stops changing, and the final reply still arrives (the channel sends it as a new message if the
preview cannot be edited any more). In a tool round the preview keeps the latest text until the
next model call has written ``stream_min_chars`` again; the final answer replaces it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import ClassVar

from channels.base import Channel, OutboundMessage, PreviewChannel
from channels.formatting import preview_tail
from gateway.config import ChannelsSection

log = logging.getLogger(__name__)


@dataclass(eq=False)
class PreviewStream:
    """One reply's preview message: `update` from the token stream, `finish` before delivery."""

    max_failures: ClassVar[int] = 3
    """Preview edits that may fail in a row before the preview stops changing."""

    channel: PreviewChannel
    target: OutboundMessage
    _: KW_ONLY
    interval: float
    min_chars: int
    max_chars: int
    edits: int = field(init=False, default=0)
    _message_id: str | None = field(init=False, default=None)
    _latest: str = field(init=False, default="")
    _shown: str = field(init=False, default="")
    _failures: int = field(init=False, default=0)
    _closed: bool = field(init=False, default=False)
    _gave_up: bool = field(init=False, default=False)
    _busy: bool = field(init=False, default=False)
    _wake: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    _worker: asyncio.Task[None] | None = field(init=False, default=None)

    @property
    def message_id(self) -> str | None:
        """The preview's platform message id, once it was sent."""
        return self._message_id

    def update(self, text: str) -> None:
        """The reply so far (the whole text, not a delta). Never blocks, never raises; called
        for every streamed token, so it only keeps the text (the worker formats what it shows)."""
        if self._closed or self._gave_up or len(text) < self.min_chars:
            return
        self._latest = text
        if self._worker is None:
            self._worker = asyncio.create_task(
                self._run(), name=f"preview:{self.target.session_key}"
            )
        self._wake.set()

    def close(self) -> None:
        """No more updates. An edit in flight completes (`finish` waits for it); the rest stop."""
        self._closed = True
        if self._worker is not None and not self._busy:
            self._worker.cancel()

    async def finish(self) -> str | None:
        """Stop updating, let an edit in flight land, return the preview's message id (if any).

        Waiting matters: the preview's id must be known (or it would stay behind next to the
        reply), and a late plain edit must never land after the final formatted one.
        """
        self.close()
        if self._worker is not None:
            await asyncio.wait({self._worker})
        if self._message_id is not None:
            log.debug(
                "preview %s in %s: %d edit(s)", self._message_id, self.target.session_key, self.edits
            )
        return self._message_id

    def abort(self) -> None:
        """The turn was cancelled: stop at once (the preview stays as it is)."""
        self._closed = True
        if self._worker is not None:
            self._worker.cancel()

    async def _run(self) -> None:
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            text = preview_tail(self._latest, self.max_chars)
            if not text or text == self._shown:
                continue
            self._busy = True
            try:
                await self._show(text)
            finally:
                self._busy = False
            if self._closed or self._gave_up:
                return
            # Measured from the end of the last call, so the platform never sees two of them
            # closer together than the interval, however long each one took.
            await asyncio.sleep(self.interval)

    async def _show(self, text: str) -> None:
        target = self.target
        try:
            if self._message_id is None:
                self._message_id = await self.channel.send_preview(replace(target, text=text))
            else:
                await self.channel.edit(target.chat_id, self._message_id, text, target.thread_id)
                self.edits += 1
        except Exception as exc:  # a preview is cosmetic: never fail the turn over it
            self._failures += 1
            first = self._message_id is None
            log.warning(
                "preview %s on %s for %s failed: %s",
                "send" if first else "edit",
                target.platform,
                target.session_key,
                exc,
            )
            if first or self._failures >= self.max_failures:
                self._gave_up = True
                log.warning(
                    "preview on %s for %s: no more updates; the reply is delivered as usual",
                    target.platform,
                    target.session_key,
                )
            return
        self._failures = 0
        self._shown = text


class Previews:
    """Opens a `PreviewStream` for a reply when its channel has ``stream_preview`` on and can
    edit messages; None otherwise (the reply is then sent once, as always)."""

    def __init__(
        self, settings: ChannelsSection, channels: Mapping[str, Channel], llm_stream: bool
    ) -> None:
        self.settings = settings
        self.channels = channels
        self._warned: set[str] = set()
        streaming = [
            name
            for name in type(settings).model_fields
            if settings.get(name).stream_preview
        ]
        if streaming and not llm_stream:
            log.info(
                "stream_preview is on for %s while [llm] stream = false: turns answered there "
                "stream anyway (a preview needs the reply as it is written); other turns do not",
                ", ".join(streaming),
            )

    def __call__(self, target: OutboundMessage) -> PreviewStream | None:
        try:
            section = self.settings.get(target.platform)
        except KeyError:
            return None
        if not section.stream_preview:
            return None
        channel = self.channels.get(target.platform)
        if channel is None:
            return None
        if not channel.capabilities.edits or not isinstance(channel, PreviewChannel):
            if target.platform not in self._warned:
                self._warned.add(target.platform)
                log.warning(
                    "channels.%s.stream_preview is on, but this channel cannot edit messages; "
                    "replies are sent whole",
                    target.platform,
                )
            return None
        return PreviewStream(
            channel,
            target,
            interval=section.stream_edit_interval_ms / 1000,
            min_chars=section.stream_min_chars,
            max_chars=channel.capabilities.max_message_chars,
        )
