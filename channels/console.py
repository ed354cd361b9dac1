"""The console channel: chat with the agent from a terminal (`gatehouse chat`)."""

from __future__ import annotations

import asyncio
import getpass
import uuid

from channels.base import (
    ChannelCapabilities,
    InboundHandler,
    InboundMessage,
    OutboundMessage,
    ReplyWaiters,
)


class ConsoleChannel:
    name = "console"
    capabilities = ChannelCapabilities(max_message_chars=1_000_000)

    def __init__(self, user_id: str | None = None, reply_timeout: float = 600.0) -> None:
        self.user_id = user_id or getpass.getuser()
        self.reply_timeout = reply_timeout
        self._waiters = ReplyWaiters()
        self._handler: InboundHandler | None = None

    async def start(self, on_message: InboundHandler) -> None:
        self._handler = on_message

    async def stop(self) -> None:
        self._waiters.fail_all("console channel stopped")

    async def send(self, message: OutboundMessage) -> None:
        self._waiters.resolve(message)

    async def ask(self, text: str) -> tuple[str | None, list[str]]:
        """Send one line as the console user; return (session key, replies)."""
        if self._handler is None:
            raise RuntimeError("console channel is not started")
        message_id = uuid.uuid4().hex
        future = self._waiters.expect(message_id)
        try:
            result = await self._handler(
                InboundMessage(
                    platform=self.name,
                    chat_type="direct",
                    chat_id=self.user_id,
                    sender_id=self.user_id,
                    sender_name=self.user_id,
                    text=text,
                    platform_message_id=message_id,
                )
            )
            if result.duplicate:
                return result.session_key, []
            if not result.accepted and not future.done():
                return result.session_key, [result.reason or "Message not accepted."]
            replies = await asyncio.wait_for(future, timeout=self.reply_timeout)
            return result.session_key, replies
        finally:
            self._waiters.forget(message_id)
