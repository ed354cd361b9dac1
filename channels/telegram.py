"""The Telegram channel: a thin adapter over python-telegram-bot (PTB).

PTB does the Bot API work (HTTP, long polling, update parsing, entity offsets); this module only
turns a PTB `Message` into an `InboundMessage` and an `OutboundMessage` into `send_message` calls.

Modes (`[channels.telegram] mode`):

- ``polling`` (default): PTB's own `Updater.start_polling` long-polls ``getUpdates``.
- ``webhook``: no updater; `start()` calls ``setWebhook(webhook_url, secret_token)`` and the
  gateway's web server routes ``POST /telegram/webhook`` (see `add_routes`) into PTB. The reply is
  200 only after the inbound handler returned, i.e. after the message was persisted; a handler
  failure answers 500 so Telegram delivers the update again.

``base_url`` points PTB at a self-hosted Bot API server (``<base_url>/bot<token>/<method>``).

Delivery guarantee (polling). Telegram forgets an update once a later ``getUpdates`` call sends
an ``offset`` past it. Stock PTB fetches the next batch as soon as the previous one is *queued*,
so a crash while the handler still runs would lose the message. The update queue given to PTB
(`_AckAfterProcessing`) makes the poller wait until the application processed each update — and
the handler awaits `on_message`, which persists the message — before the next ``getUpdates``
confirms it. A crash before persistence therefore means Telegram redelivers the update; the
gateway deduplicates by platform message id. If `on_message` raises, the batch is not confirmed
and PTB's retry loop fetches it again (with PTB's growing back-off), up to `max_redeliveries`
attempts per update, after which the update is dropped with an error in the log.

Outbound: models write Markdown; `send` chunks it (`chunk_text`, so no tag spans two messages),
renders each chunk to Telegram's HTML subset with markdown-it-py (`markdown_to_telegram_html`,
everything else escaped) and sends it with ``parse_mode="HTML"``. A chunk whose HTML outgrows
4,096 characters is split further; one Telegram refuses ("can't parse entities") is sent again
as plain text. A 429 (PTB's `RetryAfter`) is waited out — ``retry_after``, capped at
`max_retry_wait` — up to `send_attempts` tries per chunk, so nothing is silently dropped.

Streamed previews (``stream_preview``): `send_preview` sends plain text (no parse mode, so a
half-written reply never fails to parse) and `edit` is ``editMessageText``; both wait out 429s
the same way, and "message is not modified" counts as done. A reply with ``preview_id`` edits
the preview into its first HTML chunk; a preview that cannot be edited (deleted, too old) is
logged and that chunk is sent as a new message instead.

Malformed input: the webhook checks the secret token header before it reads the body, then
reads it bounded (`channels.webhooks`): too large, not UTF-8, not JSON or nested deeper than 64
is a 4xx with one log line. A body that is JSON but no readable update is logged and acknowledged
(200, so Telegram stops redelivering it); in polling, `_TolerantBot` replaces an unreadable
update in a ``getUpdates`` batch by a bare ``update_id`` so it is confirmed and skipped instead
of wedging the poller. Either way later updates are processed normally.

Ignored on purpose: the bot's own messages, edited messages (an edit never re-triggers a turn;
they are not even requested via ``allowed_updates``), channel posts, and service messages that
carry neither text nor an attachment (joins, pins, topic creation...). Attachments are listed by
``file_id``; the gateway downloads them later, after the message is stored, through
`fetch_attachment` (``getFile``, then the file URL PTB gives, under
``<base_url>/file/bot<token>/``). The file is streamed by PTB's own httpx client
(`_StreamingRequest`) and refused as soon as it passes the size cap, whatever ``getFile`` or
Content-Length said; a redirect, an error status or an encoded body is refused without
reading it (PTB's own download would log a traceback for those), and no error names the URL,
which holds the bot token.
"""

from __future__ import annotations

import asyncio
import datetime as dtm
import hmac
import html
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
from aiohttp import web
from markdown_it import MarkdownIt
from markdown_it.token import Token
from telegram import Bot, BotCommand, Message, MessageEntity, Update, User
from telegram.constants import ChatAction, ChatType, ParseMode
from telegram.error import BadRequest, RetryAfter, TelegramError
from telegram.ext import (
    Application,
    ApplicationBuilder,
    ContextTypes,
    ExtBot,
    MessageHandler,
    filters,
)
from telegram.request import HTTPXRequest

from channels.attachments import (
    AttachmentTooLarge,
    AttachmentUnavailable,
    collect_bounded,
    declared_length,
)
from channels.base import (
    ChannelCapabilities,
    InboundHandler,
    InboundMessage,
    OutboundMessage,
    is_blank,
    send_parts,
)
from channels.commands import CHAT_COMMANDS
from channels.formatting import TELEGRAM_LIMIT, chunk_text, plain_line
from channels.settings import TelegramSettings
from channels.webhooks import BadBody, loads_json, log_refusal, read_body

log = logging.getLogger(__name__)

WEBHOOK_PATH = "/telegram/webhook"
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
ALLOWED_UPDATES = [Update.MESSAGE]

TelegramApp = Application[Any, Any, Any, Any, Any, Any]
_T = TypeVar("_T")


class _Redeliver(TelegramError):
    """Raised inside PTB's polling loop so it does not confirm (and later refetches) a batch."""


class _AckAfterProcessing(asyncio.Queue[object]):
    """PTB's update queue, but `put` of an update returns only once the application processed it.

    The poller advances its ``offset`` (which confirms updates to Telegram on the next
    ``getUpdates``) only after all `put` calls of a batch returned, so an update is confirmed
    only after its handler — and so the gateway's persistence — finished.
    """

    def __init__(self, channel: TelegramChannel) -> None:
        super().__init__()
        self._channel = channel

    async def put(self, item: object) -> None:
        await super().put(item)
        if isinstance(item, Update):
            await self.join()
            self._channel._check_delivered(item.update_id)


class _TolerantBot(ExtBot[None]):
    """PTB's bot, except that an unreadable update cannot wedge polling.

    Stock PTB parses a ``getUpdates`` batch in one go: one malformed update raises, the batch
    is never confirmed and polling refetches the same poison forever. Here each raw update is
    checked first; an unreadable one is logged and replaced by a bare ``{"update_id": n}`` (no
    handler matches it, but it still advances the offset), or dropped without a usable id.
    """

    async def _post(self, endpoint: str, data: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        result = await super()._post(endpoint, data, **kwargs)
        if endpoint == "getUpdates" and isinstance(result, list):
            result = [u for u in (self._readable(raw) for raw in result) if u is not None]
        return result

    def _readable(self, raw: object) -> dict[str, Any] | None:
        update_id = raw.get("update_id") if isinstance(raw, dict) else None
        if not isinstance(update_id, int) or isinstance(update_id, bool):
            log.warning("telegram: ignoring an update without a usable update_id: %.200r", raw)
            return None
        assert isinstance(raw, dict)
        try:
            Update.de_json(raw, self)
        except Exception as exc:
            log.warning(
                "telegram: ignoring unreadable update %s (%s: %s)",
                update_id,
                type(exc).__name__,
                exc,
            )
            return {"update_id": update_id}
        return raw


class _StreamingRequest(HTTPXRequest):
    """PTB's HTTP client (httpx, one pool for every Bot API call) that can also stream a file.

    PTB's own download (``File.download_as_bytearray`` → ``BaseRequest.retrieve``) holds the
    whole body before anyone sees its size, and on an answer other than 2xx it logs a traceback
    (its invalid-JSON path) before raising. `stream_file` uses the same httpx client instead.
    """

    __slots__ = ()

    async def stream_file(self, url: str, max_bytes: int, read_timeout: float) -> bytes:
        """The body at `url`, at most `max_bytes` (`collect_bounded`), read as it arrives.

        Redirects are not followed (the Bot API serves files directly), and the body is asked
        for and accepted only unencoded: httpx decompresses without a bound, so a small gzip
        body could otherwise grow past any cap inside one read.
        """
        if self._client.is_closed:
            raise AttachmentUnavailable("the Telegram channel is not running")
        base = self._client.timeout
        timeout = httpx.Timeout(
            connect=base.connect, read=read_timeout, write=base.write, pool=base.pool
        )
        headers = {"User-Agent": self.USER_AGENT, "Accept-Encoding": "identity"}
        async with self._client.stream(
            "GET", url, headers=headers, timeout=timeout, follow_redirects=False
        ) as response:
            status = response.status_code
            if 300 <= status < 400:
                raise AttachmentUnavailable(
                    f"Telegram answered HTTP {status}, a redirect (not followed)"
                )
            if status != 200:
                raise AttachmentUnavailable(f"Telegram answered HTTP {status}")
            encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise AttachmentUnavailable(f"Telegram sent it {encoding}-encoded, unasked")
            declared = declared_length(response.headers.get("Content-Length"))
            return await collect_bounded(response.aiter_raw(), declared, max_bytes)


def _file_url(file_path: str) -> str:
    """The URL PTB itself downloads a file from (``File._get_encoded_url``): the Bot API's
    file URL with its path percent-encoded (file names may be any UTF-8)."""
    parts = urlsplit(file_path)
    return urlunsplit(parts._replace(path=quote(parts.path)))


def _utf16_spans_removed(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` without the given (offset, length) spans, counted in UTF-16 code units.

    ``surrogatepass``: a lone surrogate (JSON allows ``"\\ud800"``) is one code unit like any
    other, instead of an exception that would drop the whole message.
    """
    raw = text.encode("utf-16-le", "surrogatepass")
    for offset, length in sorted(spans, reverse=True):
        raw = raw[: offset * 2] + raw[(offset + length) * 2 :]
    return raw.decode("utf-16-le", "surrogatepass")


def _entity_fragments(
    text: str, entities: tuple[MessageEntity, ...]
) -> list[tuple[MessageEntity, str]]:
    """Each entity with the text it covers (PTB's ``parse_entities``, tolerant of lone
    surrogates and of offsets past the end of the text)."""
    raw = text.encode("utf-16-le", "surrogatepass")
    return [
        (ent, raw[ent.offset * 2 : (ent.offset + ent.length) * 2].decode("utf-16-le", "surrogatepass"))
        for ent in entities
    ]


def _attachments(message: Message) -> tuple[dict[str, Any], ...]:
    found: list[dict[str, Any]] = []
    if message.photo:
        largest = message.photo[-1]  # Telegram lists sizes smallest first
        found.append({"type": "photo", "file_id": largest.file_id, "name": None})
    for kind in ("document", "audio", "video", "voice"):
        media = getattr(message, kind, None)
        if media is not None:
            found.append(
                {"type": kind, "file_id": media.file_id, "name": getattr(media, "file_name", None)}
            )
    return tuple(found)


def to_inbound(message: Message, me: User) -> InboundMessage | None:
    """Normalize one PTB message; `None` for messages the gateway must not see (see module doc)."""
    ids = (message.message_id, message.chat.id, *(u.id for u in (message.from_user,) if u))
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        log.warning("telegram: ignoring a message whose ids are not integers: %r", ids)
        return None
    sender = message.from_user
    if sender is not None and sender.id == me.id:
        return None
    if message.chat.type == ChatType.CHANNEL:
        return None
    text = message.text if message.text is not None else message.caption
    if isinstance(text, str) and is_blank(text):
        text = None  # nothing to see (zero-width characters only) is no text, as in an empty one
    attachments = _attachments(message)
    if not text and not attachments:
        return None
    text = text or ""

    direct = message.chat.type == ChatType.PRIVATE
    mentioned = direct
    spans: list[tuple[int, int]] = []
    entities = message.entities if message.text is not None else message.caption_entities
    handle = f"@{me.username}".lower() if me.username else None
    for ent, fragment in _entity_fragments(text, entities):
        if ent.type == MessageEntity.MENTION and handle and fragment.lower() == handle:
            mentioned = True
            spans.append((ent.offset, ent.length))
        elif (
            ent.type == MessageEntity.TEXT_MENTION and ent.user is not None and ent.user.id == me.id
        ):
            mentioned = True
            spans.append((ent.offset, ent.length))
        elif ent.type == MessageEntity.BOT_COMMAND and handle and fragment.lower().endswith(handle):
            # "/help@gatehouse_bot" addresses this bot; keep the command, drop the suffix.
            mentioned = True
            spans.append((ent.offset + ent.length - len(handle), len(handle)))
    if spans:
        text = _utf16_spans_removed(text, spans)
        text = re.sub(r"[ \t]{2,}", " ", text)
        text = re.sub(r"^[\s,:;]+", "", text).strip()

    replied = message.reply_to_message
    reply_to: str | None = None
    thread_id: str | None = None
    if message.is_topic_message and message.message_thread_id is not None:
        thread_id = str(message.message_thread_id)
    if replied is not None:
        # In a forum topic every message "replies" to the topic's creation message; that is
        # not a reply to a person (but a topic the bot created counts as addressing the bot).
        implicit = thread_id is not None and replied.message_id == message.message_thread_id
        if not implicit:
            reply_to = str(replied.message_id)
        if replied.from_user is not None and replied.from_user.id == me.id:
            mentioned = True

    if sender is not None:
        sender_id = str(sender.id)
        # PTB keeps whatever the JSON held: a malformed name is no name.
        well_formed = all(isinstance(n, str | None) for n in (sender.first_name, sender.last_name))
        sender_name = _name(sender.full_name if well_formed else None, sender.username)
    elif message.sender_chat is not None:  # anonymous admin / linked channel
        sender_id = str(message.sender_chat.id)
        sender_name = _name(message.sender_chat.title, message.sender_chat.username)
    else:
        return None

    return InboundMessage(
        platform="telegram",
        chat_type="direct" if direct else "group",
        chat_id=str(message.chat.id),
        sender_id=sender_id,
        sender_name=sender_name,
        text=text,
        thread_id=thread_id,
        was_mentioned=mentioned,
        reply_to=reply_to,
        attachments=attachments,
        platform_message_id=str(message.message_id),
        timestamp=message.date.timestamp(),
    )


def _name(*candidates: object) -> str | None:
    """The first candidate that is a non-empty string: a sender's display name."""
    return next((c for c in candidates if isinstance(c, str) and c), None)


# -- Markdown -> Telegram HTML ----------------------------------------------------------------

_MD = MarkdownIt("commonmark", {"html": False}).enable("strikethrough")
_INLINE_TAGS = {
    "strong_open": "<b>",
    "strong_close": "</b>",
    "em_open": "<i>",
    "em_close": "</i>",
    "s_open": "<s>",
    "s_close": "</s>",
    "link_close": "</a>",
}
_LANGUAGE = re.compile(r"[\w+#.-]{1,32}")


def _esc(text: str) -> str:
    return html.escape(text, quote=False)


def _inline_html(children: list[Token]) -> str:
    out: list[str] = []
    links = 0  # Telegram forbids nested links; markdown-it never nests them, but be safe
    for tok in children:
        kind = tok.type
        if kind == "text":
            out.append(_esc(tok.content))
        elif kind == "code_inline":
            out.append(f"<code>{_esc(tok.content)}</code>")
        elif kind in ("softbreak", "hardbreak"):
            out.append("\n")
        elif kind == "link_open":
            href = str(tok.attrs.get("href", ""))
            links += 1
            out.append(f'<a href="{html.escape(href, quote=True)}">' if links == 1 else "")
        elif kind == "link_close":
            links -= 1
            out.append("</a>" if links == 0 else "")
        elif kind == "image":
            src = html.escape(str(tok.attrs.get("src", "")), quote=True)
            alt = _esc(tok.content) or "image"
            out.append(alt if links else f'<a href="{src}">{alt}</a>')
        elif kind in _INLINE_TAGS:
            out.append(_INLINE_TAGS[kind])
        else:  # html_inline and anything unknown: shown literally
            out.append(_esc(tok.content))
    return "".join(out)


def markdown_to_telegram_html(markdown: str) -> str:
    """Render Markdown (as models write it) into Telegram's HTML subset, escaping all else.

    Bold/italic/strike/code/links map to ``<b> <i> <s> <code> <a>``; fenced code to
    ``<pre><code class="language-x">``; headings become bold lines, list items "• " (or "1. ")
    lines indented by depth, quotes ``<blockquote>`` (never nested: Telegram refuses that).
    """
    plain = plain_line(markdown)
    return _esc(plain) if plain is not None else _render_html(markdown)


def _render_html(markdown: str) -> str:
    out: list[str] = []
    lists: list[str] = []  # "bullet" | "ordered", innermost last
    quotes = 0

    def newline() -> None:
        if out and not out[-1].endswith("\n"):
            out.append("\n")

    def end_block() -> None:
        text = "".join(out).rstrip(" \n")
        out[:] = [text, "\n\n"] if text else []

    for tok in _MD.parse(markdown):
        kind = tok.type
        if kind == "inline":
            out.append(_inline_html(tok.children or []))
        elif kind == "paragraph_close":
            if tok.hidden:
                newline()
            else:
                end_block()
        elif kind == "heading_open":
            out.append("<b>")
        elif kind == "heading_close":
            out.append("</b>")
            end_block()
        elif kind in ("bullet_list_open", "ordered_list_open"):
            newline()
            lists.append(kind.split("_", 1)[0])
        elif kind in ("bullet_list_close", "ordered_list_close"):
            lists.pop()
            if not lists:
                end_block()
        elif kind == "list_item_open":
            newline()
            bullet = f"{tok.info}. " if lists and lists[-1] == "ordered" else "• "
            out.append("  " * (len(lists) - 1) + bullet)
        elif kind == "list_item_close":
            newline()
        elif kind == "blockquote_open":
            quotes += 1
            if quotes == 1:
                end_block()
                out.append("<blockquote>")
        elif kind == "blockquote_close":
            quotes -= 1
            if quotes == 0:
                text = "".join(out).rstrip(" \n")
                out[:] = [text, "</blockquote>"]
                end_block()
        elif kind in ("fence", "code_block"):
            lang = _LANGUAGE.match(tok.info.strip()) if kind == "fence" else None
            attr = f' class="language-{lang.group(0)}"' if lang else ""
            body = _esc(tok.content.rstrip("\n"))
            out.append(f"<pre><code{attr}>{body}</code></pre>")
            end_block()
        elif kind == "hr":
            out.append("———")
            end_block()
        elif kind == "html_block":
            out.append(_esc(tok.content))
            end_block()
    return "".join(out).strip()


def _html_chunks(markdown: str) -> list[tuple[str, str]]:
    """(Markdown, HTML) pairs for one Markdown chunk, split further while the HTML is too long."""
    rendered = markdown_to_telegram_html(markdown)
    if len(rendered) <= TELEGRAM_LIMIT or len(markdown) < 32:
        return [(markdown, rendered)]
    pieces = chunk_text(markdown, max(16, len(markdown) // 2))
    if len(pieces) < 2:  # cannot split any further: send as is
        return [(markdown, rendered)]
    return [pair for piece in pieces for pair in _html_chunks(piece)]


async def _put_html(
    put: Callable[[str, str | None], Awaitable[None]], markdown: str, rendered: str
) -> None:
    """Send or edit one chunk as HTML; as plain text when it renders to nothing or Telegram
    cannot parse the HTML ("can't parse entities")."""
    if not rendered:
        await put(markdown, None)
        return
    try:
        await put(rendered, ParseMode.HTML)
    except BadRequest as exc:
        if "can't parse entities" not in exc.message.lower():
            raise
        log.warning("telegram: HTML refused (%s); sending the chunk as plain text", exc)
        await put(markdown, None)


def _retry_seconds(exc: RetryAfter) -> float:
    delay = getattr(exc, "_retry_after", None)  # a timedelta; the public property may warn
    if isinstance(delay, dtm.timedelta):
        return max(0.0, delay.total_seconds())
    value = exc.retry_after
    return max(0.0, value.total_seconds() if isinstance(value, dtm.timedelta) else float(value))


def _reply_target_gone(exc: BadRequest) -> bool:
    msg = exc.message.lower()
    return "not found" in msg and "repl" in msg


class TelegramChannel:
    name = "telegram"
    capabilities = ChannelCapabilities(
        max_message_chars=TELEGRAM_LIMIT, threads=True, edits=True, typing=True
    )
    send_errors: tuple[type[BaseException], ...] = (TelegramError,)
    """Refusals and outages (`channels.base.platform_failure`): PTB raises its own types for
    both, network failures included."""
    max_redeliveries = 10
    """Polling: fetch an update again at most this often when `on_message` keeps failing."""
    poll_timeout = 30
    """Seconds one ``getUpdates`` long poll may be held by Telegram."""
    send_attempts = 5
    """``sendMessage`` attempts per chunk while Telegram answers 429 (flood control)."""
    max_retry_wait = 60.0
    """Cap on one 429 wait (Telegram's ``retry_after``), in seconds."""

    def __init__(self, settings: TelegramSettings) -> None:
        if not settings.token:
            raise ValueError(
                'channels.telegram.token is missing: set it (e.g. token = "${TELEGRAM_BOT_TOKEN}")'
            )
        if settings.mode == "webhook":
            if not settings.webhook_url:
                raise ValueError('channels.telegram.webhook_url is required when mode = "webhook"')
            if not settings.webhook_secret:
                raise ValueError(
                    'channels.telegram.webhook_secret is required when mode = "webhook" '
                    "(Telegram sends it back in every request; without it anyone could post updates)"
                )
        self.settings = settings
        self._app: TelegramApp | None = None
        self._on_message: InboundHandler | None = None
        self._me: User | None = None
        self._failed: dict[int, int] = {}  # update_id -> failed attempts
        self._undelivered: set[int] = set()  # update_ids whose on_message raised

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def bot(self) -> Bot:
        if self._app is None:
            raise RuntimeError("telegram channel is not started")
        bot: Bot = self._app.bot
        return bot

    @property
    def me(self) -> User:
        if self._me is None:
            raise RuntimeError("telegram channel is not started")
        return self._me

    def _build(self) -> TelegramApp:
        s = self.settings
        assert s.token is not None
        root = (s.base_url or "https://api.telegram.org").rstrip("/")
        bot = _TolerantBot(
            s.token,
            base_url=f"{root}/bot",
            base_file_url=f"{root}/file/bot",
            request=_StreamingRequest(connection_pool_size=256),
            get_updates_request=HTTPXRequest(connection_pool_size=1),
        )
        builder = ApplicationBuilder().bot(bot).job_queue(None)
        if s.mode == "webhook":
            builder = builder.updater(None)
        else:
            builder = builder.update_queue(_AckAfterProcessing(self))
        app = builder.build()
        app.add_handler(MessageHandler(filters.UpdateType.MESSAGE, self._on_update))
        return app

    async def start(self, on_message: InboundHandler) -> None:
        if self._app is not None:
            raise RuntimeError("telegram channel already started")
        self._on_message = on_message
        app = self._build()
        await app.initialize()
        try:
            # initialize() called getMe; `bot.bot` is that User (id and username for mentions).
            self._me = app.bot.bot
            await self._set_commands(app.bot)
            if self.settings.mode == "webhook":
                await app.bot.set_webhook(
                    url=self.settings.webhook_url or "",
                    secret_token=self.settings.webhook_secret,
                    allowed_updates=ALLOWED_UPDATES,
                )
            else:
                assert app.updater is not None
                await app.updater.start_polling(
                    timeout=self.poll_timeout, allowed_updates=ALLOWED_UPDATES
                )
            await app.start()
        except BaseException:
            if app.updater is not None and app.updater.running:
                await app.updater.stop()
            await app.shutdown()
            raise
        self._app = app
        log.info("telegram: started as @%s (%s mode)", self._me.username, self.settings.mode)

    async def _set_commands(self, bot: Bot) -> None:
        """The bot's command menu (``setMyCommands``): the chat commands, which also work typed
        as plain text. A convenience: a refusal is logged and the channel starts anyway."""
        commands = [BotCommand(c.name, c.description) for c in CHAT_COMMANDS]
        try:
            await bot.set_my_commands(commands)
        except TelegramError as exc:
            log.warning("telegram: could not set the command menu: %s", exc)

    async def stop(self) -> None:
        """Stop polling (the pending long poll is cancelled), finish the handler, close HTTP."""
        app, self._app = self._app, None
        if app is None:
            return
        if app.updater is not None and app.updater.running:
            await app.updater.stop()
        if app.running:
            await app.stop()
        await app.shutdown()

    # -- inbound ------------------------------------------------------------------------------

    async def _on_update(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.message
        if message is None or self._on_message is None:
            log.debug("telegram: update %s carries no message; ignored", update.update_id)
            return
        try:
            inbound = to_inbound(message, self.me)
        except Exception:  # a message we cannot read is skipped, never retried forever
            log.exception("telegram: could not normalize update %s", update.update_id)
            return
        if inbound is None:
            log.debug(
                "telegram: update %s ignored (own, channel post, service or empty message)",
                update.update_id,
            )
            return
        try:
            await self._on_message(inbound)
        except Exception:
            log.exception("telegram: inbound handler failed for update %s", update.update_id)
            self._undelivered.add(update.update_id)
        else:
            self._failed.pop(update.update_id, None)

    def _check_delivered(self, update_id: int) -> None:
        """Polling: refuse to confirm an update whose `on_message` raised (see module doc)."""
        if update_id not in self._undelivered:
            return
        self._undelivered.discard(update_id)
        attempts = self._failed.get(update_id, 0) + 1
        if attempts >= self.max_redeliveries:
            self._failed.pop(update_id, None)
            log.error("telegram: dropping update %s after %s failed attempts", update_id, attempts)
            return
        self._failed[update_id] = attempts
        raise _Redeliver(f"update {update_id} was not persisted; fetching it again")

    def add_routes(self, app: web.Application) -> None:
        """Register ``POST /telegram/webhook`` (used in webhook mode) on the gateway's web app."""
        app.router.add_post(WEBHOOK_PATH, self._handle_webhook)

    async def _handle_webhook(self, request: web.Request) -> web.Response:
        secret = self.settings.webhook_secret
        given = request.headers.get(SECRET_HEADER, "")
        if not secret or not hmac.compare_digest(given.encode(), secret.encode()):
            log_refusal(request, 403, "telegram: missing or wrong webhook secret token", log)
            return web.Response(status=403, text="forbidden")
        app = self._app
        if app is None or self.settings.mode != "webhook":
            return web.Response(status=503, text="telegram webhook is not active")
        try:
            # Read only now, past the secret, and bounded: size, UTF-8, JSON and its nesting.
            data = loads_json(await read_body(request))
        except BadBody as exc:
            log_refusal(request, exc.status, f"telegram: {exc.reason}", log)
            return web.Response(status=exc.status, text=exc.reason)
        # Valid JSON that is no readable update is acknowledged (200) and dropped: Telegram
        # would otherwise redeliver it forever and hold back every later update.
        update_id = data.get("update_id") if isinstance(data, dict) else None
        if not isinstance(update_id, int) or isinstance(update_id, bool):
            log.warning("telegram: ignoring a webhook body that is not an update: %.200r", data)
            return web.Response(text="ignored")
        try:
            update = Update.de_json(data, app.bot)
        except Exception as exc:
            log.warning(
                "telegram: ignoring unreadable webhook update %s (%s: %s)",
                update_id,
                type(exc).__name__,
                exc,
            )
            return web.Response(text="ignored")
        await app.process_update(update)
        if update.update_id in self._undelivered:
            self._undelivered.discard(update.update_id)
            return web.Response(status=500, text="not persisted; deliver again")
        return web.Response(text="ok")

    # -- outbound -----------------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> None:
        """Send the reply as Telegram HTML (converted from Markdown), chunk by chunk.

        The Markdown is chunked first (so no tag spans two messages), then each chunk is
        converted; a chunk whose HTML outgrows 4,096 characters is split further. A chunk
        Telegram cannot parse is sent again as plain text; 429s are waited out (`send_attempts`).
        With `preview_id` the streamed preview becomes the first chunk (edited in place); if it
        cannot be edited any more, that chunk is sent as a new message.
        """
        thread = int(message.thread_id) if message.thread_id else None
        reply_to = int(message.reply_to) if message.reply_to else None
        preview = int(message.preview_id) if message.preview_id else None
        parts = [pair for chunk in chunk_text(message.text, TELEGRAM_LIMIT)
                 for pair in _html_chunks(chunk)]

        async def send_one(index: int, part: tuple[str, str]) -> None:
            markdown, rendered = part
            if index == 0 and preview is not None:
                if await self._edit_chunk(message.chat_id, preview, markdown, rendered):
                    return
            # Only the first chunk is a reply.
            first = reply_to if index == 0 else None
            await self._send_chunk(message.chat_id, markdown, rendered, thread, first)

        await send_parts(parts, message, send_one)

    async def send_preview(self, message: OutboundMessage) -> str:
        """The streamed preview: plain text (no parse mode), a reply like the first chunk."""
        sent = await self._send_retrying(
            message.chat_id,
            message.text,
            None,
            int(message.thread_id) if message.thread_id else None,
            int(message.reply_to) if message.reply_to else None,
        )
        return str(sent.message_id)

    async def edit(
        self, chat_id: str, message_id: str, text: str, thread_id: str | None = None
    ) -> None:
        """Replace a message's text with plain `text` (``editMessageText``, no parse mode)."""
        await self._edit_retrying(chat_id, int(message_id), text, None)

    async def _send_chunk(
        self, chat_id: str, markdown: str, rendered: str, thread: int | None, reply_to: int | None
    ) -> None:
        async def put(text: str, parse_mode: str | None) -> None:
            await self._send_retrying(chat_id, text, parse_mode, thread, reply_to)

        await _put_html(put, markdown, rendered)

    async def _edit_chunk(self, chat_id: str, message_id: int, markdown: str, rendered: str) -> bool:
        """Edit the preview into a formatted chunk; False (logged) when it cannot be edited."""

        async def put(text: str, parse_mode: str | None) -> None:
            await self._edit_retrying(chat_id, message_id, text, parse_mode)

        try:
            await _put_html(put, markdown, rendered)
        except TelegramError as exc:
            log.warning(
                "telegram: could not edit preview %s in chat %s (%s); sending the reply instead",
                message_id,
                chat_id,
                exc,
            )
            return False
        return True

    async def _send_retrying(
        self,
        chat_id: str,
        text: str,
        parse_mode: str | None,
        thread: int | None,
        reply_to: int | None,
    ) -> Message:
        """One ``sendMessage``: flood control (429) is waited out, a vanished reply target dropped."""

        async def send(reply_to: int | None) -> Message:
            return await self.bot.send_message(
                chat_id,
                text,
                parse_mode=parse_mode,
                message_thread_id=thread,
                reply_to_message_id=reply_to,
            )

        try:
            return await self._flood_controlled(chat_id, lambda: send(reply_to))
        except BadRequest as exc:
            if reply_to is None or not _reply_target_gone(exc):
                raise
            log.info("telegram: reply target %s is gone; sending without it", reply_to)
            return await self._flood_controlled(chat_id, lambda: send(None))

    async def _edit_retrying(
        self, chat_id: str, message_id: int, text: str, parse_mode: str | None
    ) -> None:
        """One ``editMessageText``: flood control waited out; "message is not modified" (the
        same text again) is success."""
        try:
            await self._flood_controlled(
                chat_id,
                lambda: self.bot.edit_message_text(
                    text, chat_id=chat_id, message_id=message_id, parse_mode=parse_mode
                ),
            )
        except BadRequest as exc:
            if "message is not modified" not in exc.message.lower():
                raise

    async def _flood_controlled(self, chat_id: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """Run one Bot API call; a 429 (`RetryAfter`) is waited out — ``retry_after``, capped at
        `max_retry_wait` — up to `send_attempts` tries."""
        rate_limited = 0
        while True:
            try:
                return await call()
            except RetryAfter as exc:
                rate_limited += 1
                if rate_limited >= self.send_attempts:
                    raise
                delay = min(_retry_seconds(exc), self.max_retry_wait)
                log.warning("telegram: rate limited in chat %s; retrying in %.1fs", chat_id, delay)
                await asyncio.sleep(delay)

    async def typing(self, chat_id: str, thread_id: str | None = None) -> None:
        await self.bot.send_chat_action(
            chat_id, ChatAction.TYPING, message_thread_id=int(thread_id) if thread_id else None
        )

    # -- attachments --------------------------------------------------------------------------

    download_timeout = 60.0
    """Seconds a file download may go without a byte arriving (a stall); the whole download
    is bounded by the gateway (``[attachments] download_timeout``)."""

    async def fetch_attachment(self, attachment: Mapping[str, Any], max_bytes: int) -> bytes:
        """Download a listed file: ``getFile`` for its path and size, then the file itself.

        The cloud Bot API hands bots files of at most 20 MB ("file is too big" beyond). A
        ``file_path`` that is no URL (a Bot API server in ``--local`` mode names a file on its
        own disk) is refused: PTB would read that path from this machine's disk. The file is
        streamed and refused past `max_bytes` while reading (`_StreamingRequest.stream_file`).
        """
        file_id = attachment.get("file_id")
        if not isinstance(file_id, str) or not file_id:
            raise AttachmentUnavailable("Telegram listed the file without an id")
        try:
            file = await self.bot.get_file(file_id)
        except BadRequest as exc:
            if "too big" in exc.message.lower():
                raise AttachmentTooLarge(None, max_bytes) from exc
            raise AttachmentUnavailable(f"Telegram refused it: {exc.message}") from exc
        if file.file_size is not None and file.file_size > max_bytes:
            raise AttachmentTooLarge(file.file_size, max_bytes)
        path = str(file.file_path or "")
        if not path.startswith(("https://", "http://")):
            raise AttachmentUnavailable("Telegram gave no download URL for it")
        request = self.bot.request
        if not isinstance(request, _StreamingRequest):  # a bot this channel did not build
            raise AttachmentUnavailable("the Telegram channel cannot stream downloads")
        try:
            return await request.stream_file(_file_url(path), max_bytes, self.download_timeout)
        except httpx.TimeoutException as exc:
            raise AttachmentUnavailable(
                f"Telegram sent nothing for {self.download_timeout:g} s ({type(exc).__name__})"
            ) from exc
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            # The URL holds the bot token: the reason is told by the error's type alone.
            raise AttachmentUnavailable(
                f"the download from Telegram failed ({type(exc).__name__})"
            ) from exc
