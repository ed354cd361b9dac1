"""The chat commands as one Slack slash command, for `channels/slack.py`.

Slack reserves ``/status`` (and sends any message that starts with ``/`` to its command parser),
so the chat commands get one slash command of the app's own, ``[channels.slack] slash_command``
(default ``/gatehouse``): ``/gatehouse status``, ``/gatehouse context``, ``/gatehouse new``,
``/gatehouse compact keep the ticket ids``; ``/gatehouse`` alone (or an unknown word) is
``/help``. Create it in the Slack app's configuration (*Slash Commands*, Request URL
``https://<gateway>/slack/events`` in HTTP mode; in Socket Mode no URL is needed).

An invocation becomes an `InboundMessage` whose text is the command as it would be typed
(``/status``), with the invocation's ``trigger_id`` as its message id: it is stored and
answered like any message. It is acknowledged once stored (bolt's ``ack``, within Slack's 3
seconds), and its reply, which names that id, is posted through the invocation's
``response_url`` (visible in the channel, like a typed command's answer; Slack keeps the URL for
30 minutes), falling back to ``chat.postMessage`` when that fails.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from aiohttp import ClientSession
from slack_sdk.webhook.async_client import AsyncWebhookClient

from channels.base import (
    ChatType,
    InboundMessage,
    OutboundMessage,
    PartlySent,
    is_blank,
    send_parts,
)
from channels.commands import find_command

log = logging.getLogger(__name__)

PENDING_LIMIT = 512
"""Invocations waiting for their reply, at most (the oldest are answered in the channel)."""


class SlashCommandFailed(Exception):
    """Slack refused a ``response_url`` post (expired, or used up)."""


class SlackSlashCommand:
    """One slash command standing for every chat command (see the module docstring)."""

    def __init__(self, name: str, platform: str) -> None:
        self.name = name
        self.platform = platform
        self._pending: OrderedDict[str, str] = OrderedDict()
        """trigger_id -> response_url."""

    def normalize(self, body: Any) -> InboundMessage | None:
        """The invocation as the command it stands for, as typed; None when malformed."""
        if not isinstance(body, dict):
            return None
        ids = {k: body.get(k) for k in ("user_id", "channel_id", "trigger_id")}
        if not all(isinstance(v, str) and not is_blank(v) for v in ids.values()):
            log.warning("slack: ignoring a malformed %s invocation", self.name)
            return None
        raw = body.get("text")
        word, _, rest = (raw if isinstance(raw, str) else "").strip().partition(" ")
        command = find_command(word) if word else None
        rest = rest.strip() if command is not None and command.argument else ""
        text = f"/{command.name} {rest}".strip() if command is not None else "/help"
        channel_id, channel_name = str(ids["channel_id"]), str(body.get("channel_name") or "")
        chat_type: ChatType = "channel"
        if channel_name == "directmessage" or channel_id.startswith("D"):
            chat_type = "direct"
        elif channel_name.startswith("mpdm-"):
            chat_type = "group"
        user_name = body.get("user_name")
        return InboundMessage(
            platform=self.platform,
            chat_type=chat_type,
            chat_id=channel_id,
            sender_id=str(ids["user_id"]),
            sender_name=user_name if isinstance(user_name, str) and user_name else None,
            text=text,
            was_mentioned=True,
            platform_message_id=str(ids["trigger_id"]),
        )

    def expect(self, trigger_id: str, response_url: Any) -> None:
        if isinstance(response_url, str) and response_url.startswith(("https://", "http://")):
            self._pending[trigger_id] = response_url
            while len(self._pending) > PENDING_LIMIT:
                self._pending.popitem(last=False)

    def forget(self, trigger_id: str) -> bool:
        """Stop waiting for the invocation's reply; False when it was answered already."""
        return self._pending.pop(trigger_id, None) is not None

    async def answer(
        self, message: OutboundMessage, chunks: Sequence[str], session: ClientSession | None
    ) -> bool:
        """Post `message` through the ``response_url`` of the invocation it answers; False
        when it answers none still waiting (the channel posts it as usual then)."""
        ids = message.answers or ((message.reply_to,) if message.reply_to else ())
        urls = [self._pending.pop(i) for i in ids if i in self._pending]
        if not urls:
            return False
        webhook = AsyncWebhookClient(urls[-1], session=session)

        async def send_one(_index: int, chunk: str) -> None:
            response = await webhook.send(text=chunk, response_type="in_channel")
            if response.status_code != 200:
                raise SlashCommandFailed(f"response_url answered {response.status_code}")

        try:
            await send_parts(list(chunks), message, send_one)
        except PartlySent:
            raise  # retried from the chunk that failed, posted in the channel
        except Exception as exc:
            log.warning("slack: %s answer not posted through its response_url (%s); "
                        "posting it in the channel", self.name, exc)
            return False
        return True
