"""A platform stand-in at the Channel seam (`channels.base.Channel`): it records what the
gateway sends and hands the gateway direct and group messages as an adapter would."""

from __future__ import annotations

import itertools

from channels.base import (
    ChannelCapabilities,
    InboundHandler,
    InboundMessage,
    InboundResult,
    OutboundMessage,
)

_ids = itertools.count(1)


class RecordingChannel:
    """Records what the gateway sends; `dm` and `group` deliver a message as an adapter would."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.capabilities = ChannelCapabilities()
        self.sent: list[OutboundMessage] = []
        self.handler: InboundHandler | None = None

    async def start(self, on_message: InboundHandler) -> None:
        self.handler = on_message

    async def stop(self) -> None:
        return None

    async def send(self, message: OutboundMessage) -> None:
        self.sent.append(message)

    async def dm(self, sender: str, text: str) -> InboundResult:
        assert self.handler is not None
        return await self.handler(
            InboundMessage(platform=self.name, chat_type="direct", chat_id=sender,
                           sender_id=sender, sender_name=f"user{sender}", text=text,
                           platform_message_id=str(next(_ids)))
        )

    async def group(self, chat: str, sender: str, text: str, mentioned: bool) -> InboundResult:
        assert self.handler is not None
        return await self.handler(
            InboundMessage(platform=self.name, chat_type="group", chat_id=chat,
                           sender_id=sender, sender_name=f"user{sender}", text=text,
                           was_mentioned=mentioned, platform_message_id=str(next(_ids)))
        )
