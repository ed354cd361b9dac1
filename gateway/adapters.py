"""Which platform channels `gatehouse run` starts, from `[channels.<name>] enabled`.

Adapters are imported only when enabled, so a gateway that never talks to Discord never loads
discord.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from channels.base import Channel, WebhookChannel
from gateway.config import Config

if TYPE_CHECKING:
    from aiohttp import web


def platform_channels(config: Config) -> list[Channel]:
    channels: list[Channel] = []
    c = config.channels
    if c.telegram.enabled:
        from channels.telegram import TelegramChannel

        channels.append(TelegramChannel(c.telegram))
    if c.slack.enabled:
        from channels.slack import SlackChannel

        channels.append(SlackChannel(c.slack))
    if c.discord.enabled:
        from channels.discord import DiscordChannel

        channels.append(DiscordChannel(c.discord))
    return channels


def add_channel_routes(app: web.Application, channels: list[Channel]) -> None:
    """Webhook endpoints (Telegram webhook mode, Slack HTTP mode) on the gateway's web server."""
    for channel in channels:
        if isinstance(channel, WebhookChannel):
            channel.add_routes(app)
