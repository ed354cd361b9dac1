"""The Slack channel: a thin adapter on slack-bolt's async API.

Transport (all of it is bolt / slack-sdk; nothing here re-implements it):

- **Socket Mode** (``mode = "socket"``, the default): bolt's ``AsyncSocketModeHandler`` opens the
  WebSocket URL from ``apps.connections.open`` (app-level ``xapp-`` token) and acks every
  envelope. The URL is issued once in ``start()`` through the SDK's own
  ``issue_new_wss_url()`` so a bad app token fails ``start()`` instead of retrying forever.
- **HTTP mode** (``mode = "http"``): ``add_routes()`` mounts ``POST /slack/events`` on the
  gateway's aiohttp app and hands every request to ``AsyncApp.async_dispatch``. The signature is
  checked first, on the raw bytes, with the SDK's own ``SignatureVerifier`` (401 for a missing or
  forged one or a timestamp older than five minutes) -- bolt's aiohttp adapter would parse the
  body (JSON, or a form's ``payload``) before bolt verified it, so an unsigned body nested 1,000
  deep was a ``RecursionError`` and a 500. Only then is the body parsed, bounded
  (`channels.webhooks.loads_json`: 400 for malformed or too deeply nested JSON), and handed to
  bolt, which verifies again and answers ``url_verification`` challenges. Each refusal is one
  log line, never a traceback.
- ``settings.base_url`` is the Web API base (default ``https://slack.com/api/``); a trailing slash
  is added when missing, because slack-sdk joins method names onto it.

Ack timing: acked only after the message is persisted. The app runs with bolt's
``process_before_response``, so bolt awaits our listener -- which awaits ``on_message``, the
gateway's persist -- before it answers: HTTP mode sends the 200 after it, Socket Mode sends the
envelope ack after it. A crash before the persist leaves the event unacknowledged and Slack
delivers it again (the gateway deduplicates by ``ts``); if ``on_message`` raises, HTTP answers
500 and Socket Mode sends no ack, so Slack retries too. Persisting takes milliseconds, well
inside Slack's 3-second ack deadline. ``stop()`` waits briefly for in-flight handlers.

Events:

- ``message`` with ``channel_type == "im"`` -> ``chat_type="direct"``; ``"mpim"`` -> ``"group"``;
  ``"channel"`` / ``"group"`` (public / private channel) -> ``"channel"``.
- ``app_mention`` -> ``chat_type="channel"``, ``was_mentioned=True``.
- A mention of the bot (``<@BOTID>`` or ``<@BOTID|name>``) is stripped from the text wherever it
  appears, and sets ``was_mentioned`` on plain ``message`` events too.
- **Dedupe choice**: Slack delivers a channel message that mentions the bot twice, as
  ``message`` and as ``app_mention``, in either order. Both are normalized the same way
  (mention detected from the text), and the adapter remembers the last ``(channel, ts)`` pairs
  it handed on: whichever copy arrives first wins, the second is dropped. This also works when
  only one of the two subscriptions is configured, and swallows Slack's event retries.
- ``thread_ts`` -> ``thread_id`` and ``reply_to`` (so the reply goes into that thread);
  ``ts`` -> ``platform_message_id`` and ``timestamp``; ``user_profile`` (when Slack includes
  it) -> ``sender_name``; no per-message API calls are made.
- Ignored: anything with a ``bot_id`` (our own messages and other bots', which avoids bot loops),
  anything from the bot's own user id, and every ``subtype`` except ``file_share``,
  ``thread_broadcast`` and ``me_message`` -- so ``message_changed``, ``message_deleted``,
  ``bot_message``, ``channel_join``/``channel_leave``, topic/purpose changes and the rest are
  dropped. Other event types are acked by a catch-all listener so Slack does not retry them.
- Slack escapes ``&``, ``<`` and ``>`` in message text; inbound text is unescaped, outbound text
  is escaped once, by the mrkdwn renderer (see Outbound).

Threads (``reply_in_thread``, on by default): a top-level mention in a channel gets
``thread_id = its own ts``, so the reply opens a thread under it and the thread is the
conversation -- its session key is the channel's plus ``:thread:<ts>``, the key every later
message in that thread gets from its ``thread_ts``. A message in such a thread (one this process
opened under a mention) is addressed to the bot without a new mention, as in a Discord thread the
bot started; after a restart a mention is needed again. A mention already inside a thread is
answered in that thread; DMs and group DMs (``mpim``) stay top-level. Off: a top-level mention is
answered at top level, in the channel's own conversation.

Files (``files`` of a ``file_share``) are listed as attachments; `fetch_attachment` downloads one
from its ``url_private`` with the bot token (the ``files:read`` scope) on slack-sdk's own aiohttp
session, streamed and refused once past the size cap. The token is only ever sent over https to
Slack's own hosts (``slack.com`` and ``*.slack.com``) on port 443, or to exactly the configured
``base_url``'s scheme, host and port; redirects are followed by hand and every hop is checked
again, so a redirect to another port, scheme or host is refused before anything is sent there.

Malformed events (no channel, no user, a non-string ``text`` / ``ts`` / ``thread_ts``, a
non-object ``user_profile``) are dropped with a warning instead of raising in the listener.

Chat commands: ``[channels.slack] slash_command`` (default ``/gatehouse``) is registered with
bolt (``app.command``); an invocation (``/gatehouse status``) is stored as the command typed,
acked once stored, and answered through its ``response_url`` (`channels/slack_commands.py`).

Outbound: models write Markdown; Slack renders its own ``mrkdwn``. The reply is chunked as
Markdown (``chunk_text(text, SLACK_LIMIT)``, fences kept balanced), each chunk is parsed with
markdown-it-py and rendered as mrkdwn by ``markdown_to_mrkdwn`` (``**b**`` -> ``*b*``, ``*i*`` ->
``_i_``, ``~~s~~`` -> ``~s~``, ``[t](u)`` -> ``<u|t>``, headings -> a bold line, list items ->
``"• "`` / ``"1. "``, fences -> ``` blocks without the language tag). The renderer is the only
place that escapes ``&``, ``<`` and ``>`` -- code included, because Slack treats ``<...>`` as a
control sequence (``<!channel>``) even inside backticks and unescapes entities in code too. A
converted chunk over the limit is re-chunked from its Markdown with a smaller budget. One
``chat.postMessage`` per chunk, with ``thread_ts = thread_id``.

Streamed previews (``stream_preview``): `send_preview` posts the raw text (escaped, not converted:
previews are plain text on every platform, so a half-written Markdown construct shows as typed)
and keeps its ``ts``; `edit` is ``chat.update``. A reply with ``preview_id`` updates the preview into its
first mrkdwn chunk and posts the rest; if Slack refuses the update (message deleted, edit window
closed) the first chunk is posted as a new message.

Rate limits: the Web client carries slack-sdk's ``AsyncRateLimitErrorRetryHandler``, so a 429 is
retried after its ``Retry-After`` (at most ``RATE_LIMIT_RETRIES`` times) before raising.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl

import yarl
from aiohttp import ClientError, ClientSession, ClientTimeout, web
from markdown_it import MarkdownIt
from markdown_it.tree import SyntaxTreeNode
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_bolt.context.async_context import AsyncBoltContext
from slack_bolt.request.async_internals import build_async_context
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
)
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

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
from channels.formatting import SLACK_LIMIT, chunk_text, plain_line
from channels.settings import SlackSettings
from channels.slack_commands import SlackSlashCommand
from channels.webhooks import BadBody, loads_json, log_refusal, read_body

log = logging.getLogger(__name__)

EVENTS_PATH = "/slack/events"
DEFAULT_API_URL = "https://slack.com/api/"
ACCEPTED_SUBTYPES = frozenset({None, "file_share", "thread_broadcast", "me_message"})
"""Message subtypes that are a person talking; every other subtype is ignored."""
RATE_LIMIT_RETRIES = 3
"""How many times a 429 answer is retried (after its ``Retry-After``) before giving up."""
_SEEN_LIMIT = 2048
_THREADS_LIMIT = 4096
_REDIRECTS = 3
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_STOP_GRACE = 10.0


def _origin(url: yarl.URL) -> tuple[str, str, int | None]:
    """(scheme, host, port) of `url` as aiohttp connects to it: the scheme's default port when
    none is given, the host lower-cased as sent (IDNA-encoded)."""
    return url.scheme.lower(), (url.raw_host or "").lower(), url.port


def _origin_shown(url: yarl.URL) -> str:
    """`url`'s origin for a message (no path or query, which are nobody's business)."""
    scheme, host, port = _origin(url)
    if not host:
        return "no host"
    return f"{scheme}://{host}:{port}" if port is not None else f"{scheme}://{host}"


def _unescape(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("strikethrough")
_MIN_BUDGET = 16


def _inline(node: SyntaxTreeNode, *, bold: bool = False) -> str:
    """Render inline children as mrkdwn; ``bold`` drops nested bold markers (headings)."""
    out: list[str] = []
    for child in node.children:
        kind = child.type
        if kind == "text":
            out.append(_escape(child.content))
        elif kind in ("softbreak", "hardbreak"):
            out.append("\n")
        elif kind == "code_inline":
            out.append(f"`{_escape(child.content)}`")
        elif kind == "strong":
            inner = _inline(child, bold=True)
            out.append(inner if bold else f"*{inner}*")
        elif kind == "em":
            out.append(f"_{_inline(child, bold=bold)}_")
        elif kind == "s":
            out.append(f"~{_inline(child, bold=bold)}~")
        elif kind in ("link", "image"):
            attr = child.attrs.get("href" if kind == "link" else "src")
            href = _escape(str(attr or "")).replace("|", "%7C")
            label = _inline(child, bold=bold) if kind == "link" else _escape(child.content)
            if not href:
                out.append(label)
            elif not label or label == href or child.markup == "autolink":
                out.append(f"<{href}>")
            else:
                out.append(f"<{href}|{label}>")
        elif kind == "html_inline":
            out.append(_escape(child.content))
        else:  # an unknown inline rule: keep its text
            out.append(_inline(child, bold=bold) if child.children else _escape(child.content))
    return "".join(out)


def _blocks(nodes: list[SyntaxTreeNode], sep: str) -> str:
    return sep.join(part for part in (_block(n) for n in nodes) if part)


def _list(node: SyntaxTreeNode) -> str:
    number = int(node.attrs.get("start", 1) or 1)
    items: list[str] = []
    for item in node.children:
        marker = f"{number}. " if node.type == "ordered_list" else "• "
        number += 1
        body = _blocks(item.children, "\n").split("\n")
        pad = " " * 4
        items.append("\n".join([marker + body[0], *(pad + line for line in body[1:])]))
    return "\n".join(items)


def _block(node: SyntaxTreeNode) -> str:
    kind = node.type
    if kind == "paragraph" or kind == "inline":
        return _inline(node.children[0] if kind == "paragraph" else node)
    if kind == "heading":
        return f"*{_inline(node.children[0], bold=True)}*"
    if kind in ("bullet_list", "ordered_list"):
        return _list(node)
    if kind in ("fence", "code_block"):
        code = node.content if node.content.endswith("\n") else node.content + "\n"
        return f"```\n{_escape(code)}```"
    if kind == "blockquote":
        inner = _blocks(node.children, "\n")
        return "\n".join(f"> {line}" if line else ">" for line in inner.split("\n"))
    if kind == "hr":
        return "———"
    if kind == "html_block":
        return _escape(node.content.rstrip("\n"))
    return _blocks(node.children, "\n\n") if node.children else _escape(node.content)


def markdown_to_mrkdwn(text: str) -> str:
    """Render Markdown as Slack ``mrkdwn``, with ``&``/``<``/``>`` escaped exactly once."""
    plain = plain_line(text)
    return _escape(plain) if plain is not None else _render_mrkdwn(text)


def _render_mrkdwn(text: str) -> str:
    root = SyntaxTreeNode(_MARKDOWN.parse(text))
    return _blocks(root.children, "\n\n")


def slack_chunks(text: str, limit: int = SLACK_LIMIT) -> list[str]:
    """mrkdwn chunks of at most ``limit`` characters: Markdown is chunked first, then each chunk
    converted (and escaped); a chunk that grew past ``limit`` is re-chunked from its Markdown."""
    return _render_chunks(text, limit, limit)


def _render_chunks(text: str, budget: int, limit: int) -> list[str]:
    out: list[str] = []
    for chunk in chunk_text(text, budget):
        converted = markdown_to_mrkdwn(chunk)
        if len(converted) <= limit:
            if converted:
                out.append(converted)
            continue
        # Escaping can grow a character to 5; shrink the Markdown budget by this chunk's growth.
        smaller = max(len(chunk) * limit // len(converted) - 1, _MIN_BUDGET)
        if smaller >= len(chunk):  # cannot shrink further: hard-split the rendered text
            out.extend(converted[i : i + limit] for i in range(0, len(converted), limit))
        else:
            out.extend(_render_chunks(chunk, smaller, limit))
    return out


_MALFORMED_EVENT = "gatehouse_malformed_event"
"""Stands in for an ``event`` that is not an object, so bolt acks it through the catch-all."""


def _sanitize_body(body: Any) -> dict[str, Any] | None:
    """The request body with a malformed ``event`` replaced; None when it is not an object.

    Bolt's listener matchers read ``event.type`` (and ``subtype``) as strings, and its context
    extraction reads the channel, user and team ids as strings or objects; anything else raises
    -- a 500 or a missing ack, so Slack would redeliver the poison forever.
    """
    if not isinstance(body, dict):
        log.warning("slack: ignoring a malformed request (body is a %s)", type(body).__name__)
        return None
    if body.get("type") != "event_callback":
        problem = _context_problem(body)
        if problem is not None:
            log.warning("slack: ignoring a malformed request (%s)", problem)
            return None
        return body
    event = body.get("event")
    problem = None
    if not isinstance(event, dict):
        problem = f"event is a {type(event).__name__}"
    elif not isinstance(event.get("type"), str):
        problem = f"event type is a {type(event.get('type')).__name__}"
    elif event.get("subtype") is not None and not isinstance(event["subtype"], str):
        problem = f"event subtype is a {type(event['subtype']).__name__}"
    else:
        problem = _context_problem(body)
    if problem is None:
        return body
    log.warning("slack: ignoring a malformed event_callback (%s)", problem)
    stripped = {**body, "event": {"type": _MALFORMED_EVENT}}
    if _context_problem(stripped) is None:
        return stripped
    return {"type": "event_callback", "event": {"type": _MALFORMED_EVENT}}


def _context_problem(body: dict[str, Any]) -> str | None:
    """What bolt's context extraction (team, user, channel ids) would trip over, if anything."""
    try:
        build_async_context(AsyncBoltContext(), body)
    except (TypeError, AttributeError, KeyError, ValueError, IndexError) as exc:
        return f"ids bolt cannot read ({type(exc).__name__})"
    return None


def parse_http_body(text: str, content_type: str) -> Any:
    """What bolt's ``parse_body`` reads from an HTTP request (JSON, or a form whose ``payload``
    is JSON, or a plain form), with every JSON parse bounded (`BadBody` when refused)."""
    if not text:
        return {}
    if content_type == "application/json" or text.startswith("{"):
        return loads_json(text)
    if "payload" in text:
        payload = dict(parse_qsl(text, keep_blank_values=True)).get("payload")
        return {} if payload is None else loads_json(payload)
    return dict(parse_qsl(text, keep_blank_values=True))


class _SocketModeHandler(AsyncSocketModeHandler):
    """bolt's handler, with malformed envelopes acked and dropped instead of crashing bolt."""

    async def handle(self, client: Any, req: SocketModeRequest) -> None:
        body = _sanitize_body(req.payload)
        if body is None:
            await client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))
            return
        req.payload = body
        await super().handle(client, req)


class SlackChannel:
    name = "slack"
    capabilities = ChannelCapabilities(
        max_message_chars=SLACK_LIMIT, threads=True, edits=True, typing=False
    )
    send_errors: tuple[type[BaseException], ...] = (SlackClientError, ClientError)
    """Refusals and outages (`channels.base.platform_failure`): slack-sdk's errors (an
    ``ok: false`` answer is a `SlackApiError`) and its aiohttp transport's."""

    def __init__(self, settings: SlackSettings) -> None:
        if not settings.bot_token:
            raise ValueError("channels.slack.bot_token is required (the xoxb- bot token)")
        if settings.mode == "socket" and not settings.app_token:
            raise ValueError(
                "channels.slack.app_token is required in socket mode (the xapp- app-level token "
                "with connections:write)"
            )
        if settings.mode == "http" and not settings.signing_secret:
            raise ValueError("channels.slack.signing_secret is required in http mode")
        self.settings = settings
        self.mode = settings.mode
        self._verifier = (
            SignatureVerifier(settings.signing_secret) if settings.signing_secret else None
        )
        api_url = settings.base_url or DEFAULT_API_URL
        if not api_url.endswith("/"):
            api_url += "/"
        self.client = AsyncWebClient(
            token=settings.bot_token,
            base_url=api_url,
            retry_handlers=[
                AsyncConnectionErrorRetryHandler(),
                AsyncRateLimitErrorRetryHandler(max_retry_count=RATE_LIMIT_RETRIES),
            ],
        )
        self.app = AsyncApp(
            client=self.client,
            name="gatehouse",
            logger=log,
            signing_secret=settings.signing_secret or "",
            request_verification_enabled=self.mode == "http",
            process_before_response=True,  # ack after the persist (see the module docstring)
        )
        self.app.event("message")(self._on_message_event)
        self.app.event("app_mention")(self._on_mention_event)
        self.app.event(re.compile(".*"))(self._on_other_event)
        self.slash: SlackSlashCommand | None = None
        """The chat commands as one slash command (channels/slack_commands.py)."""
        if settings.slash_command:
            self.slash = SlackSlashCommand(settings.slash_command, self.name)
            self.app.command(settings.slash_command)(self._on_slash_command)
        self.bot_user_id: str | None = None
        self.bot_id: str | None = None
        self._mention: re.Pattern[str] | None = None
        self._handler: InboundHandler | None = None
        self._accepting = False
        self._socket: _SocketModeHandler | None = None
        self._seen: OrderedDict[tuple[str, str | None], None] = OrderedDict()
        self._inflight: set[asyncio.Task[Any]] = set()
        self._threads: OrderedDict[tuple[str, str], None] = OrderedDict()
        """(channel, thread ts) of threads opened under a mention (`reply_in_thread`)."""

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self, on_message: InboundHandler) -> None:
        if self.client.session is None or self.client.session.closed:
            # One connection pool for every Web API call: without a session slack_sdk opens
            # (and closes) a new one, so a new TCP connection, per call.
            self.client.session = ClientSession(timeout=ClientTimeout(total=self.client.timeout))
        auth = await self.client.auth_test()
        self._identify(auth.get("user_id"), auth.get("bot_id"))
        self._handler = on_message
        self._accepting = True
        if self.mode == "socket":
            handler = _SocketModeHandler(self.app, self.settings.app_token, logger=log)
            try:
                # Issue the URL here so a bad app token raises instead of reconnecting forever.
                handler.client.wss_uri = await handler.client.issue_new_wss_url()
                await handler.connect_async()  # type: ignore[no-untyped-call]
            except BaseException:
                await handler.close_async()  # type: ignore[no-untyped-call]
                self._handler = None
                self._accepting = False
                raise
            self._socket = handler
        log.info("slack: connected as %s (%s mode)", self.bot_user_id, self.mode)

    async def stop(self) -> None:
        # Stop taking new events first (HTTP: 503, so Slack retries; Socket Mode: the
        # connection closes and unacked envelopes are redelivered). Events bolt already acked
        # keep the handler until they finish, so they still get persisted.
        self._accepting = False
        handler, self._socket = self._socket, None
        if handler is not None:
            await handler.close_async()  # type: ignore[no-untyped-call]
            client = handler.client
            tasks = [
                t
                for t in (
                    client.message_processor,
                    client.current_session_monitor,
                    client.message_receiver,
                )
                if t is not None
            ]
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._inflight:
            _done, pending = await asyncio.wait(set(self._inflight), timeout=_STOP_GRACE)
            if pending:
                log.warning("slack: %d inbound message(s) still in flight at stop", len(pending))
        self._handler = None
        session, self.client.session = self.client.session, None
        if session is not None:
            await session.close()

    def add_routes(self, app: web.Application) -> None:
        """Mount ``POST /slack/events`` (HTTP mode) on the gateway's aiohttp application."""
        app.router.add_post(EVENTS_PATH, self._handle_http)

    def _signed(self, raw: bytes, request: web.Request) -> bool:
        """Slack's request signature over the raw body (nothing of the body is parsed yet)."""
        if self._verifier is None:
            return False
        try:
            return self._verifier.is_valid(
                raw,
                request.headers.get("X-Slack-Request-Timestamp"),
                request.headers.get("X-Slack-Signature"),
            )
        except (ValueError, TypeError):  # a timestamp that is no number, a non-ASCII signature
            return False

    async def _handle_http(self, request: web.Request) -> web.Response:
        if not self._accepting:
            # Not started (or stopping): Slack retries later; nothing was acked.
            return web.Response(status=503, text="slack channel is not running")
        try:
            raw = await read_body(request)
        except BadBody as exc:
            log_refusal(request, exc.status, f"slack: {exc.reason}", log)
            return web.Response(status=exc.status, text=exc.reason)
        if not self._signed(raw, request):
            log_refusal(request, 401, "slack: missing or invalid request signature", log)
            return web.json_response({"error": "invalid request"}, status=401)  # as bolt says
        try:
            text = raw.decode("utf-8")
            parsed = parse_http_body(text, request.content_type)
        except UnicodeDecodeError:
            parsed = BadBody(400, "the request body is not valid UTF-8")
        except BadBody as exc:
            parsed = exc
        if isinstance(parsed, BadBody) or not isinstance(parsed, dict):
            reason = (
                parsed.reason if isinstance(parsed, BadBody)
                else f"the body is a {type(parsed).__name__}, not an object"
            )
            log_refusal(request, 400, f"slack: ignoring a malformed request ({reason})", log)
            return web.Response(status=400, text="malformed request body")
        body = _sanitize_body(parsed)
        if body is None:
            return web.Response(status=400, text="malformed request body")
        if body is not parsed:
            # A malformed event is acked and dropped here: bolt reads ids while it builds the
            # request, before any listener, and in HTTP mode it only takes the signed raw text.
            return web.Response(status=200)
        # Bolt parses the text again, safely now: the same JSON, already bounded and checked.
        bolt_request = AsyncBoltRequest(
            body=text,
            query=request.query_string,
            headers=request.headers,  # type: ignore[arg-type]  # as bolt's aiohttp adapter does
        )
        bolt_response = await self.app.async_dispatch(bolt_request)
        return await to_aiohttp_response(bolt_response)

    # -- outbound ---------------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> None:
        chunks = slack_chunks(message.text, SLACK_LIMIT)
        if self.slash is not None and message.preview_id is None:
            if await self.slash.answer(message, chunks, self.client.session):
                return  # through the response_url of the slash command it answers

        async def send_one(index: int, chunk: str) -> None:
            if index == 0 and message.preview_id is not None:
                if await self._edit_preview(message.chat_id, message.preview_id, chunk):
                    return
            await self.client.chat_postMessage(
                channel=message.chat_id, text=chunk, thread_ts=message.thread_id
            )

        await send_parts(chunks, message, send_one)

    async def send_preview(self, message: OutboundMessage) -> str:
        """The streamed preview: the raw text (escaped, not converted), in the reply's thread."""
        response = await self.client.chat_postMessage(
            channel=message.chat_id, text=_escape(message.text), thread_ts=message.thread_id
        )
        return str(response["ts"])

    async def edit(
        self, chat_id: str, message_id: str, text: str, thread_id: str | None = None
    ) -> None:
        """Replace a message's text with raw `text` (``chat.update``; escaped, not converted)."""
        await self.client.chat_update(channel=chat_id, ts=message_id, text=_escape(text))

    async def _edit_preview(self, chat_id: str, ts: str, chunk: str) -> bool:
        """Edit the preview into the first mrkdwn chunk; False (logged) when Slack refuses."""
        try:
            await self.client.chat_update(channel=chat_id, ts=ts, text=chunk)
        except (SlackClientError, ClientError, TimeoutError) as exc:
            # Posting is what never loses the reply; a duplicate beats a missing answer.
            log.warning(
                "slack: could not edit preview %s in %s (%s); sending the reply instead",
                ts,
                chat_id,
                exc.response.get("error") if isinstance(exc, SlackApiError) else exc,
            )
            return False
        return True

    # -- attachments ------------------------------------------------------------------------

    download_timeout = 60.0
    """Seconds a file download may go without a byte arriving (a stall); the whole download
    is bounded by the gateway (``[attachments] download_timeout``)."""

    async def fetch_attachment(self, attachment: Mapping[str, Any], max_bytes: int) -> bytes:
        """Download a shared file from its ``url_private`` with the bot token.

        The token goes only where `_token_may_go_to` says; redirects are followed by hand and
        each hop is checked again, so it never travels anywhere else. The body is streamed
        (`read_bounded`): refused once past `max_bytes`, whatever size Slack reported. Slack
        answers a token without the ``files:read`` scope with its sign-in page (HTML, status
        200): refused as such.
        """
        raw = attachment.get("url")
        if not isinstance(raw, str) or not raw:
            raise AttachmentUnavailable("Slack listed the file without a download URL")
        size = attachment.get("size")
        if isinstance(size, int) and size > max_bytes:
            raise AttachmentTooLarge(size, max_bytes)
        session = self.client.session
        if session is None or session.closed:
            raise AttachmentUnavailable("the Slack channel is not running")
        try:
            url = yarl.URL(raw)
        except ValueError as exc:
            raise AttachmentUnavailable("Slack listed the file with a malformed URL") from exc
        claimed = attachment.get("mimetype")
        timeout = ClientTimeout(
            total=None, sock_connect=self.client.timeout, sock_read=self.download_timeout
        )
        try:
            for hop in range(_REDIRECTS + 1):
                if not self._token_may_go_to(url):
                    where = "its URL is not on" if hop == 0 else "Slack redirected it away from"
                    raise AttachmentUnavailable(
                        f"{where} Slack ({_origin_shown(url)}); the bot token is not sent there"
                    )
                headers = {"Authorization": f"Bearer {self.client.token}"}
                async with session.get(
                    url, headers=headers, allow_redirects=False, timeout=timeout
                ) as response:
                    location = response.headers.get("Location")
                    if response.status in _REDIRECT_STATUSES and location:
                        url = url.join(yarl.URL(location))
                        continue
                    if response.status != 200:
                        raise AttachmentUnavailable(f"Slack answered HTTP {response.status}")
                    if response.content_type == "text/html" and claimed != "text/html":
                        raise AttachmentUnavailable(
                            "Slack sent a web page instead of the file (does the app have the "
                            "files:read scope?)"
                        )
                    return await read_bounded(response, max_bytes)
        except TimeoutError as exc:
            raise AttachmentUnavailable(
                f"Slack sent nothing for {self.download_timeout:g} s"
            ) from exc
        except (ClientError, ValueError) as exc:  # ValueError: a malformed redirect Location
            raise AttachmentUnavailable(
                f"the download from Slack failed ({type(exc).__name__}: {exc})"
            ) from exc
        raise AttachmentUnavailable("Slack redirected the download too often")

    def _token_may_go_to(self, url: yarl.URL) -> bool:
        """Whether the bot token may be sent to `url`: over https to Slack's own hosts on the
        default port, or to exactly the configured ``base_url``'s scheme, host and port (a
        fake or proxy, trusted as configured). Parsed by yarl, as aiohttp connects."""
        scheme, host, port = _origin(url)
        if not host:
            return False
        on_slack = host == "slack.com" or host.endswith(".slack.com")
        if scheme == "https" and port == 443 and on_slack:
            return True
        return (scheme, host, port) == _origin(yarl.URL(self.client.base_url))

    # -- inbound ----------------------------------------------------------------------------

    def normalize(self, event: Any) -> InboundMessage | None:
        """Normalize a ``message`` / ``app_mention`` event, or None when it is not a person's
        message (or is malformed)."""
        if not isinstance(event, dict):
            log.warning("slack: ignoring a malformed event (not an object)")
            return None
        if event.get("type") == "app_mention":
            return self.to_inbound(event, "channel", mentioned=True)
        channel_type = event.get("channel_type")
        chat_type: ChatType
        if channel_type == "im":
            chat_type = "direct"
        elif channel_type == "mpim":
            chat_type = "group"
        else:
            chat_type = "channel"
        return self.to_inbound(event, chat_type)

    async def _on_message_event(self, event: dict[str, Any]) -> None:
        await self._dispatch(event)

    async def _on_mention_event(self, event: dict[str, Any]) -> None:
        await self._dispatch(event)

    async def _on_slash_command(self, ack: Any, command: dict[str, Any]) -> None:
        """A chat command from the slash command: stored, then acknowledged (as events are)."""
        handler, slash = self._handler, self.slash
        msg = slash.normalize(command) if slash is not None else None
        if handler is None or slash is None or msg is None:
            await ack(text="The bot cannot take this command right now; try again shortly.")
            return
        trigger = msg.platform_message_id or ""
        slash.expect(trigger, command.get("response_url"))
        try:
            result = await handler(msg)
        except Exception:
            slash.forget(trigger)  # not stored: no ack, so Slack tells the user it failed
            raise
        if not result.accepted and slash.forget(trigger):
            # Refused without a reply of its own: say why, to the invoker only.
            await ack(text=result.reason or "Not accepted.")
            return
        await ack()

    async def _on_other_event(self) -> None:
        """Ack event types we don't use, so Slack doesn't retry them."""

    def _identify(self, bot_user_id: str | None, bot_id: str | None) -> None:
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self._mention = (
            re.compile(rf"<@{re.escape(bot_user_id)}(?:\|[^>]*)?>") if bot_user_id else None
        )

    @staticmethod
    def _malformed(event: dict[str, Any]) -> str | None:
        # A blank id (spaces, zero-width characters) is no id, like an empty one.
        if not isinstance(event.get("channel"), str) or is_blank(event["channel"]):
            return "no channel"
        if not isinstance(event.get("user"), str) or is_blank(event["user"]):
            return "no user"
        for key in ("text", "ts", "event_ts", "thread_ts"):
            if event.get(key) is not None and not isinstance(event[key], str):
                return f"{key} is a {type(event[key]).__name__}, not a string"
        if event.get("user_profile") is not None and not isinstance(event["user_profile"], dict):
            return "user_profile is not an object"
        if event.get("files") is not None and not isinstance(event["files"], list):
            return "files is not a list"
        return None

    def _ignored(self, event: dict[str, Any]) -> str | None:
        subtype = event.get("subtype")
        if subtype is not None and (
            not isinstance(subtype, str) or subtype not in ACCEPTED_SUBTYPES
        ):
            return f"subtype {subtype!r}"
        if event.get("bot_id") or event.get("bot_profile"):
            return "bot message"
        if event.get("user") == self.bot_user_id:
            return "own message"
        return None

    def to_inbound(
        self, event: dict[str, Any], chat_type: ChatType, *, mentioned: bool = False
    ) -> InboundMessage | None:
        """Normalize a Slack event, or None when it is not a person's message."""
        reason = self._ignored(event)
        if reason is not None:
            log.debug("slack: ignoring %s event (%s)", event.get("type"), reason)
            return None
        problem = self._malformed(event)
        if problem is not None:
            log.warning("slack: ignoring a malformed %s event (%s)", event.get("type"), problem)
            return None
        text = event.get("text") or ""
        if self._mention is not None:
            text, hits = self._mention.subn("", text)
            mentioned = mentioned or hits > 0
        channel = str(event.get("channel"))
        thread_ts = event.get("thread_ts")
        if thread_ts is not None and (channel, thread_ts) in self._threads:
            mentioned = True  # the bot's own thread: no mention needed (see the module doc)
        text = _unescape(re.sub(r"[ \t]{2,}", " ", text).strip())
        attachments = tuple(
            {
                "id": f.get("id"),
                "name": f.get("name"),
                "mimetype": f.get("mimetype"),
                "size": f.get("size"),
                "url": f.get("url_private"),
            }
            for f in event.get("files") or ()
            if isinstance(f, dict)
        )
        if is_blank(text) and not attachments:  # zero-width characters only count as empty
            log.debug("slack: ignoring %s event with neither text nor files", event.get("type"))
            return None
        ts = str(event.get("ts") or event.get("event_ts") or "")
        thread_id = thread_ts
        if (
            thread_ts is None and ts and mentioned and chat_type == "channel"
            and self.settings.reply_in_thread
        ):
            thread_id = ts  # answered in a thread under the mention: that thread's conversation
            self._threads[(channel, ts)] = None
            while len(self._threads) > _THREADS_LIMIT:
                self._threads.popitem(last=False)
        profile = event.get("user_profile") or {}
        names = (profile.get(k) for k in ("display_name", "real_name", "name"))
        sender_name = next((n for n in names if isinstance(n, str) and n), None)
        try:
            timestamp = float(ts)
        except ValueError:
            timestamp = time.time()
        return InboundMessage(
            platform=self.name,
            chat_type=chat_type,
            chat_id=channel,
            sender_id=str(event["user"]),
            sender_name=sender_name,
            text=text,
            thread_id=thread_id,
            reply_to=thread_ts,
            was_mentioned=mentioned,
            attachments=attachments,
            platform_message_id=ts or None,
            timestamp=timestamp,
        )

    async def _dispatch(self, event: Any) -> None:
        handler = self._handler
        if handler is None:
            log.warning("slack: dropping an event that arrived while the channel is stopped")
            return
        msg = self.normalize(event)
        if msg is None:
            return
        # A pair, not "chat:ts" text: ids holding ":" must not make two messages one.
        key = (msg.chat_id, msg.platform_message_id)
        if msg.platform_message_id is not None:
            if key in self._seen:
                log.debug("slack: %s in %s already handled (message + app_mention)", *key[::-1])
                return
            self._seen[key] = None
            while len(self._seen) > _SEEN_LIMIT:
                self._seen.popitem(last=False)
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        try:
            await handler(msg)
        except Exception:
            # Not persisted: no ack (bolt answers 500 and logs it), so Slack delivers it again.
            self._seen.pop(key, None)
            raise
        finally:
            if task is not None:
                self._inflight.discard(task)
