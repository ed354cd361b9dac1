"""The Discord channel: a thin adapter on the real discord.py client (gateway + REST).

discord.py does the protocol work — login, the gateway websocket (HELLO/IDENTIFY/heartbeats/
RESUME/reconnects), sharding, rate limits, caching, mention parsing. This module only turns a
``discord.Message`` into an `InboundMessage` and an `OutboundMessage` into ``channel.send`` calls.

Normalization
- DM (``DMChannel``): chat_type ``direct``, chat_id = the DM channel id, always ``was_mentioned``.
- Guild text channel: chat_type ``channel``, chat_id = the channel id.
- Thread: chat_type ``channel`` with chat_id = the *parent* channel id and thread_id = the thread
  id, so a thread's session key is the channel's key plus ``:thread:<id>`` and the channel's
  allowlist and history settings apply to its threads.
- ``was_mentioned``: the bot is in ``message.mentions``, or the bot's managed role is mentioned,
  or the message replies to a bot message, or it is in a thread the bot started, or it is a DM.
  ``<@id>``/``<@!id>`` (and ``<@&role>`` of the bot's role) are stripped from the text.
- Ignored: the bot's own messages, every other bot's messages (two bots must never answer each
  other in a loop), system messages (joins, pins, boosts ...), and messages with neither text
  nor attachments (stickers, embeds only).
- Attachments are listed (id, filename, url, content_type, size); the gateway downloads them
  after the message is stored, through `fetch_attachment`: a GET of the url on discord.py's own
  aiohttp session, as its ``get_from_cdn`` does (proxy included), but streamed and refused as
  soon as it passes the size cap (``get_from_cdn`` reads the whole body first).

Endpoints: ``api_base_url`` (the REST root *including the version*, e.g.
``https://discord.com/api/v10``) and ``gateway_url`` (``wss://gateway.discord.gg/``) are for
proxies and tests. discord.py keeps them in **process-wide class attributes**
(``discord.http.Route.BASE`` and ``discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY``), so every
client in the process uses them; `start` sets them and `stop` restores the previous values.

Outbound: Discord renders Markdown itself, so replies keep it. A reply is split into messages of
at most 2,000 characters *and* 17 lines (longer messages collapse behind "read more" in the
client), with code fences closed and re-opened across chunks. ``@everyone``/``@here`` in the text
are defused with a zero-width space, on top of ``AllowedMentions.none()`` on every send. A 429
is retried by discord.py itself (it sleeps ``retry_after``); should it give up (a 429 without
``Via``, taken for a Cloudflare ban, or five in a row) `send` retries the chunk a bounded number
of times. DM channels seen inbound are remembered (discord.py does not cache them), so a reply to
a DM needs no extra ``GET /channels/{id}``.

Streamed previews (``stream_preview``): `send_preview` sends the text as the reply (Discord
renders Markdown itself and shows an unclosed marker as typed, so no escaping is needed) and
`edit` is ``PartialMessage.edit`` (``PATCH /channels/{id}/messages/{mid}``); both go through
discord.py's rate limiter and the same bounded retry as `send`. A reply with ``preview_id``
edits the preview into its first chunk; a preview that cannot be edited (deleted) is logged and
that chunk is sent as a new message.

Malformed dispatches: discord.py's parsers raise on some (a MESSAGE_CREATE without ``author``
kills ``Client.start`` outright), so every parser but READY's is wrapped to log and skip the
event; ``content: null`` and unknown channels are normalized as usual; a message that still
cannot be normalized is logged and skipped. The next good event is processed either way.

The ``message_content`` intent is privileged: enable it for the bot in the Developer Portal, or
guild messages arrive without text.

Chat commands are also application (slash) commands, registered at start and answered as the
interaction's follow-up (`channels/discord_commands.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import aiohttp
import discord
import discord.gateway
import discord.http
import yarl

from channels.attachments import AttachmentTooLarge, AttachmentUnavailable, read_bounded
from channels.base import (
    ChannelCapabilities,
    ChatType,
    InboundHandler,
    InboundMessage,
    OutboundMessage,
    is_blank,
    send_parts,
)
from channels.discord_commands import SlashCommands
from channels.formatting import DISCORD_LIMIT, DISCORD_MAX_LINES, chunk_text, preview_tail
from channels.settings import DiscordSettings

log = logging.getLogger(__name__)

__all__ = ["DiscordChannel", "defuse_mass_mentions", "discord_intents"]

SEND_ATTEMPTS = 3
"""How often `send` tries one chunk when discord.py gives up on a 429."""
MAX_RETRY_WAIT = 30.0
DM_CACHE_SIZE = 1024
_T = TypeVar("_T")

_MASS_MENTION = re.compile(r"@(everyone|here)\b")


def defuse_mass_mentions(text: str) -> str:
    """``@everyone``/``@here`` with a zero-width space after the ``@``: shown, never a ping."""
    return _MASS_MENTION.sub("@\u200b\\1", text)


def discord_intents() -> discord.Intents:
    """Guilds, guild + DM messages, and message content (privileged)."""
    intents = discord.Intents.none()
    intents.guilds = True
    intents.messages = True  # guild_messages and dm_messages
    intents.dm_messages = True
    intents.message_content = True
    return intents


class DiscordChannel:
    name = "discord"
    capabilities = ChannelCapabilities(
        max_message_chars=DISCORD_LIMIT, threads=True, edits=True, typing=True
    )
    send_errors: tuple[type[BaseException], ...] = (discord.HTTPException, aiohttp.ClientError)
    """Refusals and outages (`channels.base.platform_failure`): an error answer from Discord's
    REST API (403, 404, 5xx, a 429 given up on) and its aiohttp transport's failures."""

    def __init__(
        self,
        settings: DiscordSettings,
        *,
        account: str = "default",
        ready_timeout: float = 60.0,
        guild_ready_timeout: float = 2.0,
        stop_timeout: float = 10.0,
    ) -> None:
        """``guild_ready_timeout`` is discord.py's wait for further GUILD_CREATEs before READY
        fires (its default, 2 s); tests against a fake gateway pass a small value."""
        token = (settings.token or "").strip()
        if not token:
            raise ValueError(
                "channels.discord.token is not set: add the bot token "
                '(e.g. token = "${DISCORD_BOT_TOKEN}") to [channels.discord]'
            )
        if settings.shard_ids is not None and settings.shard_count is None:
            raise ValueError("channels.discord.shard_ids needs channels.discord.shard_count")
        if settings.shard_ids is not None and settings.shard_count is not None:
            bad = [i for i in settings.shard_ids if not 0 <= i < settings.shard_count]
            if bad:
                raise ValueError(
                    f"channels.discord.shard_ids {bad} out of range for shard_count "
                    f"{settings.shard_count}"
                )
        self.settings = settings
        self.account = account
        self.ready_timeout = ready_timeout
        self.guild_ready_timeout = guild_ready_timeout
        self.stop_timeout = stop_timeout
        self._token = token
        self._handler: InboundHandler | None = None
        self._client: discord.Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._saved_endpoints: tuple[str, yarl.URL] | None = None
        self._dm_channels: OrderedDict[int, discord.abc.Messageable] = OrderedDict()
        self.slash = SlashCommands(self.name, account)
        """The chat commands in Discord's command menu (channels/discord_commands.py)."""

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def client(self) -> discord.Client:
        if self._client is None:
            raise RuntimeError("discord channel is not started")
        return self._client

    def _make_client(self) -> discord.Client:
        options: dict[str, Any] = {
            "intents": discord_intents(),
            "guild_ready_timeout": self.guild_ready_timeout,
            # Never ping anyone by accident; send() passes this explicitly as well.
            "allowed_mentions": discord.AllowedMentions.none(),
        }
        s = self.settings
        client: discord.Client
        if s.shard_count is not None or s.shard_ids is not None:
            if s.shard_ids is not None:
                options["shard_ids"] = s.shard_ids
            client = discord.AutoShardedClient(shard_count=s.shard_count, **options)
        else:
            client = discord.Client(**options)
        # discord.py dispatches "ready"/"message" to attributes named on_<event>.
        client.on_ready = self._on_ready  # type: ignore[attr-defined]
        client.on_message = self._on_message  # type: ignore[attr-defined]
        _guard_parsers(client)
        self.slash.install(client)
        return client

    def _apply_endpoints(self) -> None:
        s = self.settings
        if not (s.api_base_url or s.gateway_url):
            return
        ws_cls = discord.gateway.DiscordWebSocket
        self._saved_endpoints = (discord.http.Route.BASE, ws_cls.DEFAULT_GATEWAY)
        if s.api_base_url:
            discord.http.Route.BASE = s.api_base_url.rstrip("/")
        if s.gateway_url:
            ws_cls.DEFAULT_GATEWAY = yarl.URL(s.gateway_url)

    def _restore_endpoints(self) -> None:
        saved, self._saved_endpoints = self._saved_endpoints, None
        if saved is not None:
            discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = saved

    async def start(self, on_message: InboundHandler) -> None:
        """Log in, connect the gateway in a background task and wait until READY."""
        if self._task is not None:
            raise RuntimeError("discord channel is already started")
        self._handler = self.slash.handler = on_message
        self._ready.clear()
        self._apply_endpoints()
        self._client = client = self._make_client()
        self._task = task = asyncio.create_task(client.start(self._token), name="discord-client")
        ready = asyncio.create_task(self._ready.wait())
        try:
            done, _ = await asyncio.wait(
                {task, ready}, timeout=self.ready_timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            ready.cancel()
        if ready in done and not task.done():
            log.info("discord: connected as %s (%s)", client.user, client.user and client.user.id)
            await self.slash.sync()
            return
        error: BaseException | None = None
        if task.done() and not task.cancelled():
            error = task.exception()
        await self.stop()
        if isinstance(error, discord.LoginFailure):
            raise RuntimeError(
                f"discord: login failed, check channels.discord.token ({error})"
            ) from error
        if isinstance(error, discord.PrivilegedIntentsRequired):
            raise RuntimeError(
                "discord: the message_content intent is not enabled for this bot "
                "(Developer Portal → Bot → Privileged Gateway Intents)"
            ) from error
        if error is not None:
            raise RuntimeError(f"discord: could not connect: {error!r}") from error
        if task.done():
            raise RuntimeError("discord: the client stopped before it was ready")
        raise TimeoutError(f"discord: not ready after {self.ready_timeout}s (gateway unreachable?)")

    async def stop(self) -> None:
        """Close the client (gateway + HTTP session) and end the background task. Idempotent."""
        client, self._client = self._client, None
        task, self._task = self._task, None
        try:
            if client is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.close(), timeout=self.stop_timeout)
            if task is not None:
                if not task.done():
                    try:
                        await asyncio.wait_for(asyncio.shield(task), timeout=self.stop_timeout)
                    except TimeoutError:
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await task
                    except Exception:
                        pass
                elif not task.cancelled():
                    task.exception()  # retrieved, so asyncio does not warn about it
        finally:
            self._ready.clear()
            self._dm_channels.clear()
            self._restore_endpoints()

    # -- inbound ------------------------------------------------------------------------------

    async def _on_ready(self) -> None:
        self._ready.set()

    async def _on_message(self, message: discord.Message) -> None:
        handler = self._handler
        if handler is None:
            return
        try:
            inbound = self.normalize(message)
        except Exception:
            log.exception("discord: could not normalize message %s; skipped", message.id)
            return
        if inbound is None:
            log.debug("discord: message %s ignored (bot, system or empty message)", message.id)
            return
        if inbound.chat_type == "direct" and isinstance(message.channel, discord.DMChannel):
            self._remember_dm(message.channel)
        try:
            await handler(inbound)
        except Exception:
            log.exception("discord: inbound handler failed for message %s", message.id)

    def normalize(self, message: discord.Message) -> InboundMessage | None:
        """A ``discord.Message`` as an `InboundMessage`, or ``None`` when it is ignored."""
        me = self._client.user if self._client is not None else None
        if me is None or message.author.bot or message.author.id == me.id:
            return None
        if message.is_system():
            return None

        channel = message.channel
        chat_type: ChatType
        thread_id: str | None = None
        mentioned = False
        if isinstance(channel, discord.DMChannel):
            chat_type, chat_id, mentioned = "direct", str(channel.id), True
        elif isinstance(channel, discord.GroupChannel):
            chat_type, chat_id = "group", str(channel.id)
        elif isinstance(channel, discord.Thread):
            chat_type, chat_id, thread_id = "channel", str(channel.parent_id), str(channel.id)
            mentioned = channel.owner_id == me.id  # a thread the bot started
        else:
            chat_type, chat_id = "channel", str(channel.id)

        if any(user.id == me.id for user in message.mentions):
            mentioned = True
        bot_role = message.guild.self_role if message.guild is not None else None
        if bot_role is not None and bot_role in message.role_mentions:
            mentioned = True
        reply_to: str | None = None
        ref = message.reference
        if ref is not None and ref.message_id is not None:
            reply_to = str(ref.message_id)
            replied = ref.resolved if isinstance(ref.resolved, discord.Message) else None
            replied = replied or ref.cached_message
            if replied is not None and replied.author.id == me.id:
                mentioned = True

        text = _strip_mentions(message.content or "", me.id, bot_role.id if bot_role else None)
        attachments = tuple(
            {
                "id": str(a.id),
                "filename": a.filename,
                "url": a.url,
                "content_type": a.content_type,
                "size": a.size,
            }
            for a in message.attachments
        )
        if is_blank(text) and not attachments:  # zero-width characters only count as empty
            return None
        return InboundMessage(
            platform=self.name,
            account=self.account,
            chat_type=chat_type,
            chat_id=chat_id,
            thread_id=thread_id,
            sender_id=str(message.author.id),
            # discord.py keeps whatever the payload had (a malformed one: not a string).
            sender_name=_name(message.author.display_name),
            text=text,
            was_mentioned=mentioned,
            reply_to=reply_to,
            attachments=attachments,
            platform_message_id=str(message.id),
            timestamp=message.created_at.timestamp(),
        )

    # -- outbound -----------------------------------------------------------------------------

    def _remember_dm(self, channel: discord.DMChannel) -> None:
        self._dm_channels[channel.id] = channel
        self._dm_channels.move_to_end(channel.id)
        while len(self._dm_channels) > DM_CACHE_SIZE:
            self._dm_channels.popitem(last=False)

    async def _messageable(self, chat_id: str, thread_id: str | None) -> discord.abc.Messageable:
        client = self.client
        channel_id = int(thread_id or chat_id)
        channel = client.get_channel(channel_id) or self._dm_channels.get(channel_id)
        if channel is None:
            channel = await client.fetch_channel(channel_id)
        if not isinstance(channel, discord.abc.Messageable):
            raise ValueError(f"discord: channel {channel_id} cannot receive messages")
        return channel

    async def send(self, message: OutboundMessage) -> None:
        """Send the reply in chunks (2,000 characters, 17 lines); the first one as a reply.

        With `preview_id` the streamed preview is edited into the first chunk instead; if it
        cannot be edited any more, that chunk is sent as a new message."""
        chunks = chunk_text(
            defuse_mass_mentions(message.text), DISCORD_LIMIT, max_lines=DISCORD_MAX_LINES
        )
        if not chunks:
            return
        if message.preview_id is None and await self.slash.answer(message, chunks):
            return  # the follow-up of the slash command it answers
        channel = await self._messageable(message.chat_id, message.thread_id)
        reference = self._reference(message, channel)

        async def send_one(index: int, chunk: str) -> None:
            if index == 0 and message.preview_id is not None:
                if await self._edit_preview(channel, message.preview_id, chunk):
                    return
            await self._send_chunk(channel, chunk, reference if index == 0 else None)

        await send_parts(chunks, message, send_one)

    async def send_preview(self, message: OutboundMessage) -> str:
        """The streamed preview, sent as a reply like the first chunk. Its text is not escaped:
        Discord renders Markdown itself and shows an unclosed marker as typed."""
        channel = await self._messageable(message.chat_id, message.thread_id)
        sent = await self._send_chunk(
            channel, _fit(message.text), self._reference(message, channel)
        )
        return str(sent.id)

    async def edit(
        self, chat_id: str, message_id: str, text: str, thread_id: str | None = None
    ) -> None:
        """Replace a message's text (``PATCH /channels/{id}/messages/{mid}``)."""
        channel = await self._messageable(chat_id, thread_id)
        await self._edit(channel, message_id, _fit(text))

    def _reference(
        self, message: OutboundMessage, channel: discord.abc.Messageable
    ) -> discord.MessageReference | None:
        reply_to = message.reply_to or (message.answers[-1] if message.answers else None)
        if reply_to is None or not reply_to.isdigit():
            return None
        channel_id = getattr(channel, "id", None) or int(message.thread_id or message.chat_id)
        return discord.MessageReference(
            message_id=int(reply_to), channel_id=channel_id, fail_if_not_exists=False
        )

    async def _edit_preview(
        self, channel: discord.abc.Messageable, message_id: str, chunk: str
    ) -> bool:
        """Edit the preview into the first chunk; False (logged) when it cannot be edited."""
        try:
            await self._edit(channel, message_id, chunk)
        except (discord.DiscordException, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning(
                "discord: could not edit preview %s in %s (%s); sending the reply instead",
                message_id,
                getattr(channel, "id", "?"),
                exc,
            )
            return False
        return True

    async def _edit(self, channel: discord.abc.Messageable, message_id: str, text: str) -> None:
        partial = getattr(channel, "get_partial_message", None)
        if partial is None:
            raise ValueError(f"discord: cannot edit messages in {type(channel).__name__}")
        target: discord.PartialMessage = partial(int(message_id))
        await self._rate_limited(
            channel,
            lambda: target.edit(content=text, allowed_mentions=discord.AllowedMentions.none()),
        )

    async def _send_chunk(
        self,
        channel: discord.abc.Messageable,
        chunk: str,
        reference: discord.MessageReference | None,
    ) -> discord.Message:
        return await self._rate_limited(
            channel,
            lambda: channel.send(
                chunk,
                reference=reference,  # type: ignore[arg-type]
                allowed_mentions=discord.AllowedMentions.none(),
            ),
        )

    async def _rate_limited(
        self, channel: discord.abc.Messageable, call: Callable[[], Awaitable[_T]]
    ) -> _T:
        """One REST call; discord.py waits out 429s itself, and one it gave up on is retried
        here (bounded)."""
        for attempt in range(1, SEND_ATTEMPTS + 1):
            try:
                return await call()
            except discord.RateLimited as exc:
                if attempt == SEND_ATTEMPTS or exc.retry_after > MAX_RETRY_WAIT:
                    raise
                wait = exc.retry_after
            except discord.HTTPException as exc:
                if exc.status != 429 or attempt == SEND_ATTEMPTS:
                    raise
                wait = _retry_after(exc)
            log.warning(
                "discord: rate limited in %s; retry %d in %.2fs",
                getattr(channel, "id", "?"),
                attempt,
                wait,
            )
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    async def typing(self, chat_id: str, thread_id: str | None = None) -> None:
        """Show "typing…" once (Discord shows it for about ten seconds)."""
        channel = await self._messageable(chat_id, thread_id)
        await channel.typing()

    # -- attachments --------------------------------------------------------------------------

    download_timeout = 60.0
    """Seconds a file download may go without a byte arriving (a stall); the whole download
    is bounded by the gateway (``[attachments] download_timeout``)."""

    async def fetch_attachment(self, attachment: Mapping[str, Any], max_bytes: int) -> bytes:
        """Download a listed attachment from its URL, as discord.py's ``get_from_cdn`` (what
        ``Attachment.read`` uses) does: its session, its proxy, redirects followed (no token
        travels to the CDN). Unlike ``get_from_cdn`` the body is streamed (`read_bounded`), so
        a file is refused once past `max_bytes` whatever size Discord reported; a reported
        size over it is refused before anything is read."""
        url = attachment.get("url")
        if not isinstance(url, str) or not url:
            raise AttachmentUnavailable("Discord listed the file without a URL")
        size = attachment.get("size")
        if isinstance(size, int) and size > max_bytes:
            raise AttachmentTooLarge(size, max_bytes)
        http = self.client.http
        # discord.py keeps its session private (name-mangled ``__session``) and only offers
        # the read-it-all ``get_from_cdn``; this is the same session, so the same pool.
        session = getattr(http, "_HTTPClient__session", None)
        if not isinstance(session, aiohttp.ClientSession) or session.closed:
            raise AttachmentUnavailable("the Discord channel is not running")
        timeout = aiohttp.ClientTimeout(total=None, sock_read=self.download_timeout)
        try:
            async with session.get(
                url, proxy=http.proxy, proxy_auth=http.proxy_auth, timeout=timeout
            ) as response:
                if response.status == 404:
                    raise AttachmentUnavailable("Discord no longer has it (404)")
                if response.status != 200:
                    raise AttachmentUnavailable(f"Discord answered HTTP {response.status}")
                return await read_bounded(response, max_bytes)
        except TimeoutError as exc:
            raise AttachmentUnavailable(
                f"Discord sent nothing for {self.download_timeout:g} s"
            ) from exc
        except aiohttp.TooManyRedirects as exc:
            raise AttachmentUnavailable("Discord redirected the download too often") from exc
        except (aiohttp.ClientError, ValueError) as exc:
            raise AttachmentUnavailable(
                f"the download from Discord failed ({type(exc).__name__}: {exc})"
            ) from exc


def _guard_parsers(client: discord.Client) -> None:
    """Make discord.py skip (and log) a gateway event its parser chokes on, instead of letting
    the exception end the whole client (``received_message`` does not catch it)."""
    state = client._connection
    parsers: dict[str, Any] = state.parsers

    def guarded(event: str, parse: Any) -> Any:
        def run(data: Any) -> None:
            try:
                parse(data)
            except Exception:
                log.exception("discord: skipped a malformed %s dispatch", event)

        return run

    for event, parse in list(parsers.items()):
        if event != "READY":
            parsers[event] = guarded(event, parse)


def _retry_after(exc: discord.HTTPException) -> float:
    """Seconds to wait after a 429 discord.py did not retry (from its headers; 1 s if none)."""
    headers = getattr(exc.response, "headers", None) or {}
    for name in ("X-RateLimit-Reset-After", "Retry-After"):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return min(max(float(value), 0.0), MAX_RETRY_WAIT)
        except ValueError:
            continue
    return 1.0


def _name(value: object) -> str | None:
    return None if value is None else str(value)


def _fit(text: str) -> str:
    """Preview text as one message: mass mentions defused, at most 2,000 characters."""
    return preview_tail(defuse_mass_mentions(text), DISCORD_LIMIT)


def _strip_mentions(text: str, bot_id: int, role_id: int | None) -> str:
    """Remove ``<@id>``/``<@!id>`` (and the bot role's ``<@&id>``) with one following blank."""
    pattern = rf"<@!?{bot_id}>"
    if role_id is not None:
        pattern += rf"|<@&{role_id}>"
    return re.sub(rf"(?:{pattern})[ \t]?", "", text).strip()
