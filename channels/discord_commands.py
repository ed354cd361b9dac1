"""The chat commands as Discord application (slash) commands, for `channels/discord.py`.

Typed as plain text (``/status`` in a DM, ``@bot /status`` in a channel) a command is an
ordinary message. As an application command it shows in Discord's command menu:

- `install` adds one global command per chat command (`channels/commands.py`; `/compact` with
  an optional ``instructions`` text option) to a discord.py ``CommandTree`` on the client, and
  `sync` registers them with Discord at start (``PUT /applications/{id}/commands``; a refusal is
  logged, typed commands still work).
- An invocation is deferred at once ("thinking…", within Discord's 3 seconds), then handed to
  the gateway as an `InboundMessage` whose text is the command as typed and whose
  ``platform_message_id`` is the interaction id, so it is stored and answered like any message.
- The reply names that id (`OutboundMessage.answers`): `answer` sends it as the interaction's
  follow-up (which replaces "thinking…"), within the 15 minutes Discord keeps an interaction
  token; after that, or after a restart, the reply goes to the channel as usual.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import discord
from discord import app_commands

from channels.base import ChatType, InboundHandler, InboundMessage, OutboundMessage, send_parts
from channels.commands import CHAT_COMMANDS, ChatCommand

log = logging.getLogger(__name__)

PENDING_LIMIT = 512
"""Interactions waiting for their reply, at most (the oldest are answered in the channel)."""
_THREADS = (
    discord.ChannelType.public_thread,
    discord.ChannelType.private_thread,
    discord.ChannelType.news_thread,
)


class SlashCommands:
    """The application commands of one Discord client (see the module docstring)."""

    def __init__(self, platform: str, account: str) -> None:
        self.platform = platform
        self.account = account
        self.handler: InboundHandler | None = None
        """The gateway's handler, set by the channel's `start`."""
        self.tree: app_commands.CommandTree[Any] | None = None
        self._pending: OrderedDict[str, discord.Interaction[Any]] = OrderedDict()

    def install(self, client: discord.Client) -> None:
        tree: app_commands.CommandTree[Any] = app_commands.CommandTree(client)
        for command in CHAT_COMMANDS:
            tree.add_command(self._command(command))
        self.tree = tree

    async def sync(self) -> None:
        """Register the commands with Discord (global commands); logged, never raised."""
        if self.tree is None:
            return
        try:
            synced = await self.tree.sync()
        except (discord.DiscordException, aiohttp.ClientError, TimeoutError) as exc:
            log.warning("discord: could not register the slash commands: %s", exc)
            return
        log.info("discord: slash commands registered: %s", ", ".join(c.name for c in synced))

    def _command(self, command: ChatCommand) -> app_commands.Command[Any, Any, None]:
        async def plain(interaction: discord.Interaction[Any]) -> None:
            await self._invoked(interaction, command, "")

        async def with_text(interaction: discord.Interaction[Any], text: str | None = None) -> None:
            await self._invoked(interaction, command, text or "")

        callback: Callable[..., Any] = plain
        if command.argument is not None:
            callback = app_commands.rename(text=command.argument)(with_text)
            callback = app_commands.describe(text=f"optional {command.argument}")(callback)
        return app_commands.Command(
            name=command.name, description=command.description[:100], callback=callback
        )

    async def _invoked(
        self, interaction: discord.Interaction[Any], command: ChatCommand, text: str
    ) -> None:
        try:
            await interaction.response.defer(thinking=True)
        except (discord.DiscordException, aiohttp.ClientError) as exc:
            log.warning("discord: could not acknowledge /%s: %s", command.name, exc)
            return
        handler = self.handler
        if handler is None:
            await self._say(interaction, "The bot is not running; try again in a moment.")
            return
        inbound = self.normalize(interaction, command, text)
        key = inbound.platform_message_id or ""
        self._pending[key] = interaction
        while len(self._pending) > PENDING_LIMIT:
            self._pending.popitem(last=False)
        try:
            result = await handler(inbound)
        except Exception:
            log.exception("discord: inbound handler failed for /%s", command.name)
            if self._pending.pop(key, None) is not None:
                await self._say(interaction, "That was not stored; please try again.")
            return
        if not result.accepted and self._pending.pop(key, None) is not None:
            # Refused without a reply of its own (one with a reply was answered already).
            await self._say(interaction, result.reason or "Not accepted.")

    def normalize(
        self, interaction: discord.Interaction[Any], command: ChatCommand, text: str
    ) -> InboundMessage:
        """The invocation as the message it stands for: the command, as typed."""
        channel = interaction.channel
        kind = getattr(channel, "type", None)
        chat_type: ChatType = "channel"
        chat_id = str(interaction.channel_id)
        thread_id: str | None = None
        if interaction.guild_id is None:
            chat_type = "group" if kind == discord.ChannelType.group else "direct"
        elif kind in _THREADS:
            parent = getattr(channel, "parent_id", None)
            chat_id, thread_id = str(parent or interaction.channel_id), str(interaction.channel_id)
        user = interaction.user
        name = getattr(user, "display_name", None)
        return InboundMessage(
            platform=self.platform,
            account=self.account,
            chat_type=chat_type,
            chat_id=chat_id,
            thread_id=thread_id,
            sender_id=str(user.id),
            sender_name=name if isinstance(name, str) else None,
            text=f"/{command.name} {text}".strip(),
            was_mentioned=True,
            platform_message_id=str(interaction.id),
            timestamp=interaction.created_at.timestamp(),
        )

    async def answer(self, message: OutboundMessage, chunks: Sequence[str]) -> bool:
        """Send `message` as the follow-up of the interaction it answers; False when it answers
        none still waiting (the channel sends it as usual then)."""
        ids = message.answers or ((message.reply_to,) if message.reply_to else ())
        waiting = [self._pending.pop(i) for i in ids if i in self._pending]
        if not waiting:
            return False
        *others, interaction = waiting
        for other in others:  # several invocations answered by one turn
            await self._say(other, "Answered below, with the later command.")

        async def send_one(_index: int, chunk: str) -> None:
            await interaction.followup.send(chunk, allowed_mentions=discord.AllowedMentions.none())

        await send_parts(list(chunks), message, send_one)
        return True

    async def _say(self, interaction: discord.Interaction[Any], text: str) -> None:
        try:
            await interaction.followup.send(text, allowed_mentions=discord.AllowedMentions.none())
        except (discord.DiscordException, aiohttp.ClientError) as exc:
            log.warning("discord: could not answer an interaction: %s", exc)
