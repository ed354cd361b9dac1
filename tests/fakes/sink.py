"""A platform channel that only records what the gateway sends it, for tests that drive a
normalizer or the gateway's inbound path directly (no SDK, no server)."""

from __future__ import annotations

from dataclasses import dataclass, field

from channels.base import ChannelCapabilities, InboundHandler, OutboundMessage


@dataclass
class Sink:
    """A platform channel that only records replies (the normalizer is driven directly)."""

    name: str
    capabilities: ChannelCapabilities = field(default_factory=ChannelCapabilities)
    sent: list[OutboundMessage] = field(default_factory=list)

    async def start(self, on_message: InboundHandler) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, message: OutboundMessage) -> None:
        self.sent.append(message)
