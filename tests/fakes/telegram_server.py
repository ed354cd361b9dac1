"""A small fake Telegram Bot API server, driven by the real python-telegram-bot over real sockets.

    async with FakeTelegram() as fake:
        app = ApplicationBuilder().token(fake.token).base_url(fake.base_url + "/bot")...
        fake.private_message(user_id=7, text="hi")          # queued for getUpdates
        sent = await fake.wait_for_call("sendMessage")       # params decoded from PTB's form body

Routes: ``POST|GET /bot<TOKEN>/<method>`` for getMe, getUpdates (a real long poll: it holds until
an update is queued, ``timeout`` elapses or the server stops), sendMessage, editMessageText,
sendChatAction, setMyCommands, setWebhook, deleteWebhook, getWebhookInfo, close and logOut. A wrong token answers 401 and an
unknown method 404, both in the Bot API's ``{"ok": false, ...}`` shape.

Files: ``add_file(data)`` stores bytes under a new ``file_id`` (put it in a message's ``photo``,
``document`` or ``voice``); ``getFile`` answers its ``file_path`` and ``file_size`` (an unknown
id: ``400 Bad Request: invalid file_id``; a file over 20 MB: ``400 Bad Request: file is too
big``, as the cloud Bot API says), and ``GET /file/bot<TOKEN>/<file_path>`` serves the bytes.
``add_file(served=…)`` answers the file URL with a `tests.fakes.file_bodies.Served` instead (a
300 MB stream, a redirect, an error status, a stall, a hang-up), and ``size_unknown=True``
leaves ``file_size`` out of ``getFile`` (the Bot API may omit it).

PTB sends ``application/x-www-form-urlencoded`` bodies whose values are JSON (strings are sent
raw); each field is decoded back. ``sendMessage`` with a ``reply_parameters.message_id`` the
fake does not know (never queued/sent, or removed with ``forget_message``) answers
``400 Bad Request: message to be replied not found`` like Telegram does. With
``parse_mode="HTML"`` the text is checked against Telegram's HTML subset (known tags, balanced,
entities escaped); a violation answers ``400 Bad Request: can't parse entities: ...``.
``rate_limit(method, retry_after)`` makes the next call(s) answer ``429`` with
``parameters.retry_after`` like Telegram's flood control. ``hold(method)`` stalls every call of
``method`` *before* it counts as received (crash tests kill the client while it waits);
``release(method)`` lets them through, and a held call whose client went away is never recorded.

``editMessageText`` edits a message the bot sent (its current state is in ``bot_messages``):
an unknown (or forgotten) message answers ``400 Bad Request: message to edit not found``, text
that would look the same (same visible text, same HTML tags) ``400 Bad Request: message is not
modified``, and HTML is checked as for sendMessage. Every call carries ``at`` (``time.perf_counter()`` on arrival), so
a test can check how far apart edits came.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import itertools
import json
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any, TypeAlias

from aiohttp import web

from tests.fakes.file_bodies import Served
from tests.fakes.loopback import LoopbackServer

__all__ = ["Call", "FakeTelegram", "entity", "html_problem"]

JSON: TypeAlias = dict[str, Any]

# Fields whose value is a string even when it looks like JSON (e.g. a text of "123").
_STRING_FIELDS = frozenset(
    {"text", "caption", "url", "secret_token", "action", "parse_mode", "ip_address"}
)


@dataclass(frozen=True, slots=True)
class Call:
    """One request the fake received: the Bot API method and its decoded parameters."""

    method: str
    params: JSON
    at: float = field(default_factory=time.perf_counter)


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def entity(text: str, fragment: str, type: str = "mention", **extra: Any) -> JSON:
    """A ``MessageEntity`` dict covering the first ``fragment`` in ``text`` (UTF-16 offsets)."""
    at = text.index(fragment)
    return {
        "type": type,
        "offset": _utf16_len(text[:at]),
        "length": _utf16_len(fragment),
        **extra,
    }


def _decode_field(name: str, raw: str) -> Any:
    if name in _STRING_FIELDS:
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


class FakeTelegram(LoopbackServer):
    """A Bot API server for one bot, on ``127.0.0.1`` and a random port."""

    def __init__(
        self,
        token: str = "123456:TEST-TOKEN",
        bot_id: int = 4242,
        bot_username: str = "gatehouse_bot",
        bot_name: str = "Gatehouse",
        host: str = "127.0.0.1",
    ) -> None:
        self.token = token
        self.bot_id = bot_id
        self.bot_username = bot_username
        self.bot_name = bot_name
        self.host = host
        self.calls: list[Call] = []
        self.updates: list[JSON] = []
        """Queued updates not yet confirmed by a getUpdates ``offset``."""
        self.confirmed_offset = 0
        self.served: Counter[int] = Counter()
        """How often each ``update_id`` was handed out by getUpdates (> 1: redelivered)."""
        self.webhook: JSON = {}
        self.fail_next: dict[str, tuple[int, str]] = {}
        """method -> (HTTP status, description) answered once instead of the normal result."""
        self.on_call: Callable[[Call], None] | None = None
        """Called synchronously with every request as it arrives (benchmarks time replies)."""
        self.rate_limited: dict[str, list[int]] = {}
        """method -> retry_after values, one 429 answered per value (see `rate_limit`)."""
        self.held_calls = 0
        """Calls currently stalled by `hold`."""
        self._holds: dict[str, asyncio.Event] = {}
        self._cond = asyncio.Condition()
        self._new_update = asyncio.Event()
        self._stopping = asyncio.Event()
        self._update_ids = itertools.count(1)
        self._message_ids: dict[int, itertools.count[int]] = {}
        self._known: set[tuple[int, int]] = set()
        self.bot_messages: dict[tuple[int, int], JSON] = {}
        """(chat id, message id) -> the bot's message as it is now (edits applied)."""
        self.files: dict[str, tuple[str, bytes, int | None]] = {}
        """file_id -> (file_path, bytes, the size getFile reports if not their length)."""
        self.file_downloads: list[str] = []
        """file_path of every file served."""
        self.file_answers: dict[str, Served] = {}
        """file_path -> what its URL answers instead of the bytes (``add_file(served=…)``)."""
        self._sizes_unknown: set[str] = set()

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        self._stopping = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        app.router.add_get("/file/bot{token}/{path:.+}", self._handle_file)
        await self._listen(app)

    async def stop(self) -> None:
        """Stop the server; pending long polls are answered (empty) at once. Idempotent."""
        self._stopping.set()
        await self._close()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` — the Bot API root; PTB wants ``base_url + "/bot"``."""
        if self._port is None:
            raise RuntimeError("FakeTelegram is not started")
        return f"http://{self.host}:{self._port}"

    # -- inspection ---------------------------------------------------------------------------

    def calls_to(self, method: str) -> list[JSON]:
        return [call.params for call in self.calls if call.method == method]

    async def wait_for_call(
        self,
        method: str,
        n: int = 1,
        timeout: float = 5.0,  # noqa: ASYNC109
        where: Callable[[JSON], bool] | None = None,
    ) -> list[JSON]:
        """Wait until ``n`` calls of ``method`` (matching ``where``) arrived; return them all."""

        def matching() -> list[JSON]:
            return [p for p in self.calls_to(method) if where is None or where(p)]

        try:
            async with asyncio.timeout(timeout), self._cond:
                await self._cond.wait_for(lambda: len(matching()) >= n)
        except TimeoutError:
            raise TimeoutError(
                f"expected {n} {method} call(s) within {timeout}s, got {len(matching())}"
            ) from None
        return matching()

    # -- scripting ----------------------------------------------------------------------------

    def queue_update(self, update: JSON) -> JSON:
        """Queue a raw update (``update_id`` is assigned when missing) for getUpdates."""
        update.setdefault("update_id", next(self._update_ids))
        self.updates.append(update)
        self._new_update.set()
        self._new_update = asyncio.Event()
        return update

    def rate_limit(self, method: str, retry_after: int = 1, times: int = 1) -> None:
        """Answer the next ``times`` calls of ``method`` with 429 and ``retry_after`` seconds.

        PTB treats ``retry_after=0`` as absent (a plain NetworkError), as Telegram never sends 0.
        """
        self.rate_limited.setdefault(method, []).extend([retry_after] * times)

    def hold(self, method: str) -> None:
        """Stall calls of ``method`` before they are received, until `release`."""
        self._holds.setdefault(method, asyncio.Event())

    def release(self, method: str) -> None:
        gate = self._holds.pop(method, None)
        if gate is not None:
            gate.set()

    async def wait_for_held(self, n: int = 1, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        async with asyncio.timeout(timeout), self._cond:
            await self._cond.wait_for(lambda: self.held_calls >= n)

    async def _held(self, method: str, request: web.Request) -> bool:
        """Wait while ``method`` is held; False when the caller went away (never received)."""
        gate = self._holds.get(method)
        if gate is None:
            return True
        async with self._cond:
            self.held_calls += 1
            self._cond.notify_all()
        stopping = asyncio.ensure_future(self._stopping.wait())
        released = asyncio.ensure_future(gate.wait())
        try:
            await asyncio.wait({stopping, released}, return_when="FIRST_COMPLETED")
        finally:
            for task in (stopping, released):
                task.cancel()
            self.held_calls -= 1
        transport = request.transport
        return not self._stopping.is_set() and transport is not None and not transport.is_closing()

    def add_file(
        self,
        data: bytes = b"",
        *,
        suffix: str = ".bin",
        reported_size: int | None = None,
        served: Served | None = None,
        size_unknown: bool = False,
    ) -> JSON:
        """Store `data` as a Telegram file; returns its ``file_id``/``file_unique_id``/
        ``file_size`` (the shape of a ``document``/``voice``/``PhotoSize`` minus their extras).
        ``reported_size``: what ``getFile`` says instead of ``len(data)``; ``size_unknown``:
        ``getFile`` says no size; ``served``: what the file URL answers instead of `data`."""
        n = len(self.files) + 1
        file_id = f"FILE{n:04d}-{'x' * 40}"  # long, like Telegram's
        path = f"files/file_{n}{suffix}"
        self.files[file_id] = (path, data, reported_size)
        if served is not None:
            self.file_answers[path] = served
        if size_unknown:
            self._sizes_unknown.add(file_id)
        return {"file_id": file_id, "file_unique_id": f"U{n:04d}", "file_size": len(data)}

    def forget_message(self, chat_id: int, message_id: int) -> None:
        """Make the message unknown (deleted): replies to it fail with "not found"."""
        self._known.discard((chat_id, message_id))

    def next_message_id(self, chat_id: int) -> int:
        counter = self._message_ids.setdefault(chat_id, itertools.count(1))
        message_id = next(counter)
        self._known.add((chat_id, message_id))
        return message_id

    def bot_user(self) -> JSON:
        return {
            "id": self.bot_id,
            "is_bot": True,
            "first_name": self.bot_name,
            "username": self.bot_username,
        }

    def user(self, user_id: int, first_name: str | None = None, **extra: Any) -> JSON:
        if user_id == self.bot_id:
            return self.bot_user()
        return {
            "id": user_id,
            "is_bot": False,
            "first_name": first_name or f"User{user_id}",
            "username": f"user{user_id}",
            **extra,
        }

    def message(
        self,
        chat: JSON,
        user_id: int,
        text: str | None,
        *,
        entities: Sequence[Mapping[str, Any]] | None = None,
        caption: str | None = None,
        photo: Sequence[Mapping[str, Any]] | None = None,
        document: Mapping[str, Any] | None = None,
        reply_to: JSON | int | None = None,
        thread_id: int | None = None,
        first_name: str | None = None,
        edited: bool = False,
        enqueue: bool = True,
        **extra: Any,
    ) -> JSON:
        """Build (and by default queue) an update carrying one message; returns the update."""
        chat_id = int(chat["id"])
        message: JSON = {
            "message_id": self.next_message_id(chat_id),
            "date": int(time.time()),
            "chat": chat,
            "from": self.user(user_id, first_name),
            **extra,
        }
        if text is not None:
            message["text"] = text
        if entities:
            key = "entities" if text is not None else "caption_entities"
            message[key] = [dict(e) for e in entities]
        if caption is not None:
            message["caption"] = caption
        if photo is not None:
            message["photo"] = [dict(p) for p in photo]
        if document is not None:
            message["document"] = dict(document)
        if thread_id is not None:
            message["message_thread_id"] = thread_id
            message["is_topic_message"] = True
        if isinstance(reply_to, int):
            reply_to = {
                "message_id": reply_to,
                "date": int(time.time()),
                "chat": chat,
                "from": self.user(1),
                "text": "(earlier message)",
            }
        if reply_to is not None:
            message["reply_to_message"] = reply_to
        update: JSON = {"update_id": next(self._update_ids)}
        update["edited_message" if edited else "message"] = message
        if edited:
            message["edit_date"] = int(time.time())
        return self.queue_update(update) if enqueue else update

    def private_message(self, user_id: int, text: str | None, **kwargs: Any) -> JSON:
        """A direct message from ``user_id`` (its private chat has the same id)."""
        chat = {
            "id": user_id,
            "type": "private",
            "first_name": kwargs.get("first_name") or f"User{user_id}",
        }
        return self.message(chat, user_id, text, **kwargs)

    def group_message(
        self,
        chat_id: int,
        user_id: int,
        text: str | None,
        *,
        reply_to_bot: bool = False,
        chat_type: str = "supergroup",
        title: str = "Test group",
        **kwargs: Any,
    ) -> JSON:
        """A message in a group; ``thread_id`` makes it a forum-topic message."""
        chat: JSON = {"id": chat_id, "type": chat_type, "title": title}
        if kwargs.get("thread_id") is not None:
            chat["is_forum"] = True
        if reply_to_bot:
            kwargs["reply_to"] = {
                "message_id": self.next_message_id(chat_id),
                "date": int(time.time()),
                "chat": chat,
                "from": self.bot_user(),
                "text": "an earlier answer",
            }
        return self.message(chat, user_id, text, **kwargs)

    # -- HTTP ---------------------------------------------------------------------------------

    async def _params(self, request: web.Request) -> JSON:
        params: JSON = {k: _decode_field(k, v) for k, v in request.query.items()}
        if request.can_read_body:
            if request.content_type == "application/json":
                body = await request.json()
                if isinstance(body, dict):
                    params.update(body)
            else:
                form = await request.post()
                params.update(
                    {k: _decode_field(k, v) for k, v in form.items() if isinstance(v, str)}
                )
        return params

    async def _handle(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        if request.match_info["token"] != self.token:
            return _error(401, "Unauthorized")
        params = await self._params(request)
        if not await self._held(method, request):
            return _error(503, "Service Unavailable: the client went away while held")
        call = Call(method, params)
        if self.on_call is not None:
            self.on_call(call)
        async with self._cond:
            self.calls.append(call)
            self._cond.notify_all()
        if method in self.fail_next:
            status, description = self.fail_next.pop(method)
            return _error(status, description)
        if self.rate_limited.get(method):
            retry_after = self.rate_limited[method].pop(0)
            return _error(
                429,
                f"Too Many Requests: retry after {retry_after}",
                parameters={"retry_after": retry_after},
            )
        handler = self._methods().get(method)
        if handler is None:
            return _error(404, "Not Found: method not found")
        return await handler(params)

    def _methods(self) -> dict[str, Callable[[JSON], Awaitable[web.Response]]]:
        return {
            "getMe": self._get_me,
            "getFile": self._get_file,
            "getUpdates": self._get_updates,
            "sendMessage": self._send_message,
            "editMessageText": self._edit_message_text,
            "sendChatAction": self._true,
            "setMyCommands": self._true,
            "setWebhook": self._set_webhook,
            "deleteWebhook": self._delete_webhook,
            "getWebhookInfo": self._get_webhook_info,
            "close": self._true,
            "logOut": self._true,
        }

    async def _true(self, params: JSON) -> web.Response:
        return _ok(True)

    async def _get_me(self, params: JSON) -> web.Response:
        return _ok(
            {
                **self.bot_user(),
                "can_join_groups": True,
                "can_read_all_group_messages": False,
                "supports_inline_queries": False,
            }
        )

    async def _get_updates(self, params: JSON) -> web.Response:
        offset = int(params.get("offset") or 0)
        if offset > self.confirmed_offset:
            self.confirmed_offset = offset
            self.updates = [u for u in self.updates if u["update_id"] >= offset]
        limit = int(params.get("limit") or 100)
        timeout = float(params.get("timeout") or 0)
        if not self.updates and timeout > 0 and not self._stopping.is_set():
            new_update = self._new_update
            stopping = asyncio.ensure_future(self._stopping.wait())
            arrived = asyncio.ensure_future(new_update.wait())
            try:
                await asyncio.wait(
                    {stopping, arrived}, timeout=timeout, return_when="FIRST_COMPLETED"
                )
            finally:
                for task in (stopping, arrived):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        batch = self.updates[:limit]
        self.served.update(u["update_id"] for u in batch if isinstance(u.get("update_id"), int))
        return _ok(batch)

    async def _send_message(self, params: JSON) -> web.Response:
        chat_id = int(params["chat_id"])
        if str(params.get("parse_mode", "")).lower() == "html":
            problem = html_problem(str(params.get("text", "")))
            if problem is not None:
                return _error(400, f"Bad Request: can't parse entities: {problem}")
        reply = params.get("reply_parameters") or {}
        reply_id = reply.get("message_id") if isinstance(reply, dict) else None
        if reply_id is not None and (chat_id, int(reply_id)) not in self._known:
            if not reply.get("allow_sending_without_reply"):
                return _error(400, "Bad Request: message to be replied not found")
        message: JSON = {
            "message_id": self.next_message_id(chat_id),
            "date": int(time.time()),
            "chat": {"id": chat_id, "type": "private" if chat_id > 0 else "supergroup"},
            "from": self.bot_user(),
            "text": params.get("text", ""),
        }
        if params.get("message_thread_id") is not None:
            message["message_thread_id"] = int(params["message_thread_id"])
        # What the chat shows now; parse_mode is kept for tests (it is no Message field).
        self.bot_messages[(chat_id, message["message_id"])] = {
            **message,
            "parse_mode": params.get("parse_mode"),
        }
        return _ok(message)

    async def _edit_message_text(self, params: JSON) -> web.Response:
        chat_id, message_id = int(params["chat_id"]), int(params["message_id"])
        message = self.bot_messages.get((chat_id, message_id))
        if message is None or (chat_id, message_id) not in self._known:
            return _error(400, "Bad Request: message to edit not found")
        text, parse_mode = params.get("text", ""), params.get("parse_mode")
        if str(parse_mode or "").lower() == "html":
            problem = html_problem(str(text))
            if problem is not None:
                return _error(400, f"Bad Request: can't parse entities: {problem}")
        if _shown(text, parse_mode) == _shown(message["text"], message.get("parse_mode")):
            return _error(
                400,
                "Bad Request: message is not modified: specified new message content and reply "
                "markup are exactly the same as a current content and reply markup of the message",
            )
        message.update(text=text, parse_mode=parse_mode, edit_date=int(time.time()))
        return _ok({k: v for k, v in message.items() if k != "parse_mode"})

    async def _get_file(self, params: JSON) -> web.Response:
        found = self.files.get(str(params.get("file_id")))
        if found is None:
            return _error(400, "Bad Request: invalid file_id")
        path, data, reported = found
        size = reported if reported is not None else len(data)
        if size > 20 * 1024 * 1024:
            return _error(400, "Bad Request: file is too big")
        file_id = str(params["file_id"])
        result = {"file_id": file_id, "file_unique_id": file_id[:8], "file_size": size,
                  "file_path": path}
        if file_id in self._sizes_unknown:
            del result["file_size"]
        return _ok(result)

    async def _handle_file(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["token"] != self.token:
            return _error(401, "Unauthorized")
        path = request.match_info["path"]
        for file_path, data, _reported in self.files.values():
            if file_path == path:
                async with self._cond:
                    self.file_downloads.append(path)
                    self._cond.notify_all()
                served = self.file_answers.get(path)
                if served is not None:
                    return await served.respond(request)
                return web.Response(body=data, content_type="application/octet-stream")
        return _error(404, "Not Found")

    async def _set_webhook(self, params: JSON) -> web.Response:
        self.webhook = dict(params)
        return _ok(True)

    async def _delete_webhook(self, params: JSON) -> web.Response:
        self.webhook = {}
        if params.get("drop_pending_updates"):
            self.updates.clear()
        return _ok(True)

    async def _get_webhook_info(self, params: JSON) -> web.Response:
        return _ok(
            {
                "url": self.webhook.get("url", ""),
                "has_custom_certificate": False,
                "pending_update_count": len(self.updates),
            }
        )


def _shown(text: str, parse_mode: str | None) -> tuple[str, tuple[str, ...]]:
    """What a chat shows for a text: its visible characters and its markup (HTML tags), which is
    what Telegram compares to answer "message is not modified"."""
    if str(parse_mode or "").lower() != "html":
        return text, ()
    return html.unescape(re.sub(r"<[^>]*>", "", text)), tuple(re.findall(r"</?[\w-]+", text))


def _ok(result: Any) -> web.Response:
    return web.json_response({"ok": True, "result": result})


def _error(status: int, description: str, parameters: JSON | None = None) -> web.Response:
    body: JSON = {"ok": False, "error_code": status, "description": description}
    if parameters:
        body["parameters"] = parameters
    return web.json_response(body, status=status)


TELEGRAM_HTML_TAGS = frozenset(
    {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "code", "pre", "a"}
    | {"blockquote", "span", "tg-spoiler", "tg-emoji"}
)


class _TelegramHTML(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.stack: list[str] = []
        self.problem: str | None = None

    def _fail(self, problem: str) -> None:
        if self.problem is None:
            self.problem = problem

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in TELEGRAM_HTML_TAGS:
            self._fail(f'unsupported start tag "{tag}"')
        elif tag == "blockquote" and "blockquote" in self.stack:
            self._fail("nested blockquote")
        elif tag == "a" and not dict(attrs).get("href"):
            self._fail("link without href")
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self._fail(f'unmatched end tag "{tag}"')
        else:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        if "<" in data or ">" in data:
            self._fail("unescaped < or >")

    def handle_entityref(self, name: str) -> None:
        if name not in ("lt", "gt", "amp", "quot"):
            self._fail(f"unsupported entity &{name};")


def html_problem(text: str) -> str | None:
    """Why Telegram would refuse ``text`` as ``parse_mode=HTML`` (a close approximation), or None."""
    if "&" in text.replace("&lt;", "").replace("&gt;", "").replace("&amp;", "").replace(
        "&quot;", ""
    ).replace("&#", ""):
        return "unescaped &"
    parser = _TelegramHTML()
    parser.feed(text)
    parser.close()
    if parser.problem is None and parser.stack:
        return f'unclosed tag "{parser.stack[-1]}"'
    if parser.problem is None and parser.rawdata:
        return "unterminated tag"
    return parser.problem
