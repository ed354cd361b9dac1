"""The webchat channel: a chat page and `POST /api/messages`, served by the gateway's web server."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from channels.base import (
    ChannelCapabilities,
    InboundHandler,
    InboundMessage,
    OutboundMessage,
    ReplyWaiters,
)


@dataclass(frozen=True, slots=True)
class WebchatReply:
    session_key: str | None
    replies: list[str]
    accepted: bool
    reason: str | None = None


class WebchatChannel:
    name = "webchat"
    capabilities = ChannelCapabilities(max_message_chars=100_000)

    def __init__(self, reply_timeout: float = 300.0) -> None:
        self.reply_timeout = reply_timeout
        self._waiters = ReplyWaiters()
        self._handler: InboundHandler | None = None

    async def start(self, on_message: InboundHandler) -> None:
        self._handler = on_message

    async def stop(self) -> None:
        self._waiters.fail_all("the gateway is shutting down")

    async def send(self, message: OutboundMessage) -> None:
        self._waiters.resolve(message)

    async def submit(
        self, user_id: str, text: str, message_id: str | None = None
    ) -> WebchatReply:
        if self._handler is None:
            raise RuntimeError("webchat channel is not started")
        message_id = message_id or uuid.uuid4().hex
        future = self._waiters.expect(message_id)
        try:
            result = await self._handler(
                InboundMessage(
                    platform=self.name,
                    chat_type="direct",
                    chat_id=user_id,
                    sender_id=user_id,
                    sender_name=user_id,
                    text=text,
                    platform_message_id=message_id,
                )
            )
            if not result.accepted or result.duplicate:
                return WebchatReply(result.session_key, [], False, result.reason)
            replies = await asyncio.wait_for(future, timeout=self.reply_timeout)
            return WebchatReply(result.session_key, replies, True)
        finally:
            self._waiters.forget(message_id)
