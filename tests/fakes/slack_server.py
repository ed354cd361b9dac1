"""A fake Slack (Web API + Socket Mode WebSocket) for driving the real slack-bolt offline.

The fake runs a real aiohttp server on ``127.0.0.1`` with a random port::

    async with FakeSlack() as fake:
        client = AsyncWebClient(token="xoxb-test", base_url=fake.api_url)  # trailing slash!
        ...
        envelope_id = fake.push_event(im_message("hi"))     # delivered over /link
        await fake.wait_for_ack(envelope_id)
        [call] = await fake.wait_for_call("chat.postMessage")

Web API: ``POST /api/<method>`` with a form, JSON or empty body. Every call is recorded in
``calls`` (method, params, token, ``at`` = ``time.perf_counter()`` on arrival) and can be waited
on with ``wait_for_call``. Built-in answers: ``auth.test``, ``chat.postMessage``, ``chat.update``
(of a message posted earlier: ``message_not_found`` otherwise, or after ``delete_message``;
``messages`` holds every posted message as it is now), ``apps.connections.open`` (returns
``ws://127.0.0.1:P/link``); anything else answers ``{"ok": true}``. ``fail(method, error)``
makes the next call(s) of a method answer ``{"ok": false, "error": ...}``;
``rate_limit(method, retry_after=0)`` makes the next call(s) answer HTTP 429 with a
``Retry-After`` header and ``{"ok": false, "error": "ratelimited"}``, as Slack does. Rate-limited
calls are recorded too (``ApiCall.status == 429``).

``on_call`` (optional callable) sees every recorded ``ApiCall``; the benchmark uses it to time
replies without polling.

Socket Mode: ``GET /link`` upgrades to a WebSocket, sends ``hello`` and then every queued
``events_api`` envelope (``push_event`` / ``push_envelope``), and records the client's acks
(``{"envelope_id": ...}``) in ``acks``.

Files: ``add_file(name, data, mimetype)`` returns a ``files[]`` entry (put it in a
``file_share`` message) whose ``url_private`` is served at ``GET /files-pri/<id>/<name>`` to a
request with ``Authorization: Bearer xoxb-…`` (``file_token`` when set: exactly that token); any
other request gets Slack's sign-in page (HTML, status 200), as Slack answers a token without the
``files:read`` scope. ``file_downloads`` records each request (path, token).
``add_file(served=…)`` answers an authorized request with a `tests.fakes.file_bodies.Served`
instead of the bytes (a 300 MB stream, a redirect, an error status, a stall).

Slash commands: ``slash_command(text)`` builds an invocation's form body (HTTP mode: sign it
and post it as ``application/x-www-form-urlencoded``) whose ``response_url`` is served here at
``POST /respond/<trigger_id>``; each post to it is recorded as a call of method ``response_url``
(its JSON body as params).

HTTP mode helpers: ``signed_headers(secret, body)`` signs a request body with slack-sdk's
``SignatureVerifier``, and ``url_verification(challenge)`` builds the handshake body.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

from aiohttp import WSMsgType, web
from slack_sdk.signature import SignatureVerifier

from tests.fakes.file_bodies import Served
from tests.fakes.loopback import LoopbackServer

JSON = dict[str, Any]

BOT_USER_ID = "UBOT0001"
BOT_ID = "BBOT0001"
TEAM_ID = "T0000001"
APP_ID = "A0000001"

_ts_counter = itertools.count(1)


def new_ts() -> str:
    """A unique, realistic Slack ``ts`` ("seconds.micros")."""
    return f"{int(time.time())}.{next(_ts_counter):06d}"


# --------------------------------------------------------------------------------------------
# Event payload builders (the ``event`` object inside an ``event_callback``)
# --------------------------------------------------------------------------------------------


def _rich_text(text: str) -> list[JSON]:
    return [
        {
            "type": "rich_text",
            "block_id": uuid.uuid4().hex[:5],
            "elements": [
                {"type": "rich_text_section", "elements": [{"type": "text", "text": text}]}
            ],
        }
    ]


def user_profile(name: str, display_name: str | None = None) -> JSON:
    return {
        "avatar_hash": "g0000000000a",
        "image_72": "https://a.slack-edge.com/default.png",
        "first_name": name.split()[0],
        "real_name": name,
        "display_name": display_name if display_name is not None else name.split()[0].lower(),
        "team": TEAM_ID,
        "name": name.split()[0].lower(),
        "is_restricted": False,
        "is_ultra_restricted": False,
    }


def _message(
    text: str,
    *,
    user: str,
    channel: str,
    channel_type: str,
    ts: str | None,
    thread_ts: str | None,
    profile: JSON | None,
    extra: JSON,
) -> JSON:
    ts = ts or new_ts()
    event: JSON = {
        "type": "message",
        "client_msg_id": str(uuid.uuid4()),
        "text": text,
        "user": user,
        "ts": ts,
        "blocks": _rich_text(text),
        "team": TEAM_ID,
        "channel": channel,
        "event_ts": ts,
        "channel_type": channel_type,
    }
    if profile is not None:
        event["user_profile"] = profile
    if thread_ts is not None:
        event["thread_ts"] = thread_ts
        event["parent_user_id"] = extra.pop("parent_user_id", user)
    event.update(extra)
    return event


def im_message(
    text: str,
    *,
    user: str = "U0000USER",
    channel: str = "D0000DM01",
    ts: str | None = None,
    thread_ts: str | None = None,
    profile: JSON | None = None,
    **extra: Any,
) -> JSON:
    """A ``message`` event in a direct message (``channel_type: "im"``)."""
    return _message(
        text,
        user=user,
        channel=channel,
        channel_type="im",
        ts=ts,
        thread_ts=thread_ts,
        profile=profile,
        extra=extra,
    )


def channel_message(
    text: str,
    *,
    user: str = "U0000USER",
    channel: str = "C0000CHAN1",
    ts: str | None = None,
    thread_ts: str | None = None,
    profile: JSON | None = None,
    channel_type: str = "channel",
    **extra: Any,
) -> JSON:
    """A ``message`` event in a channel (``channel_type`` "channel", "group" or "mpim")."""
    return _message(
        text,
        user=user,
        channel=channel,
        channel_type=channel_type,
        ts=ts,
        thread_ts=thread_ts,
        profile=profile,
        extra=extra,
    )


def app_mention(
    text: str,
    *,
    user: str = "U0000USER",
    channel: str = "C0000CHAN1",
    ts: str | None = None,
    thread_ts: str | None = None,
    **extra: Any,
) -> JSON:
    """An ``app_mention`` event (put ``<@BOTID>`` in ``text`` yourself)."""
    ts = ts or new_ts()
    event: JSON = {
        "type": "app_mention",
        "client_msg_id": str(uuid.uuid4()),
        "text": text,
        "user": user,
        "ts": ts,
        "blocks": _rich_text(text),
        "team": TEAM_ID,
        "channel": channel,
        "event_ts": ts,
    }
    if thread_ts is not None:
        event["thread_ts"] = thread_ts
    event.update(extra)
    return event


def bot_message(
    text: str, *, channel: str = "C0000CHAN1", bot_id: str = BOT_ID, user: str | None = BOT_USER_ID
) -> JSON:
    """A message posted by a bot (by default ours): carries ``bot_id`` and ``bot_profile``."""
    ts = new_ts()
    event: JSON = {
        "type": "message",
        "text": text,
        "ts": ts,
        "bot_id": bot_id,
        "app_id": APP_ID,
        "bot_profile": {"id": bot_id, "app_id": APP_ID, "name": "gatehouse", "team_id": TEAM_ID},
        "team": TEAM_ID,
        "channel": channel,
        "event_ts": ts,
        "channel_type": "channel",
    }
    if user is not None:
        event["user"] = user
    return event


def message_changed(
    text: str, *, channel: str = "C0000CHAN1", user: str = "U0000USER", ts: str | None = None
) -> JSON:
    """A ``message_changed`` event (an edit of the message at ``ts``)."""
    ts = ts or new_ts()
    event_ts = new_ts()
    return {
        "type": "message",
        "subtype": "message_changed",
        "hidden": True,
        "message": {
            "type": "message",
            "user": user,
            "text": text,
            "ts": ts,
            "edited": {"user": user, "ts": event_ts},
        },
        "previous_message": {"type": "message", "user": user, "text": "before", "ts": ts},
        "channel": channel,
        "ts": event_ts,
        "event_ts": event_ts,
        "channel_type": "channel",
    }


def message_deleted(*, channel: str = "C0000CHAN1", ts: str | None = None) -> JSON:
    """A ``message_deleted`` event for the message at ``ts``."""
    ts = ts or new_ts()
    event_ts = new_ts()
    return {
        "type": "message",
        "subtype": "message_deleted",
        "hidden": True,
        "deleted_ts": ts,
        "previous_message": {"type": "message", "user": "U0000USER", "text": "gone", "ts": ts},
        "channel": channel,
        "ts": event_ts,
        "event_ts": event_ts,
        "channel_type": "channel",
    }


def event_callback(event: JSON, *, team_id: str = TEAM_ID, api_app_id: str = APP_ID) -> JSON:
    """The Events API body (``type: event_callback``) wrapping one event."""
    return {
        "token": "legacy-verification-token",
        "team_id": team_id,
        "context_team_id": team_id,
        "api_app_id": api_app_id,
        "event": event,
        "type": "event_callback",
        "event_id": f"Ev{uuid.uuid4().hex[:10].upper()}",
        "event_time": int(time.time()),
        "authorizations": [
            {
                "enterprise_id": None,
                "team_id": team_id,
                "user_id": BOT_USER_ID,
                "is_bot": True,
                "is_enterprise_install": False,
            }
        ],
        "is_ext_shared_channel": False,
        "event_context": f"4-{uuid.uuid4().hex}",
    }


def events_api_envelope(body: JSON, envelope_id: str | None = None) -> JSON:
    """A Socket Mode ``events_api`` envelope around an ``event_callback`` body."""
    return {
        "envelope_id": envelope_id or str(uuid.uuid4()),
        "payload": body,
        "type": "events_api",
        "accepts_response_payload": False,
        "retry_attempt": 0,
        "retry_reason": "",
    }


def url_verification(
    challenge: str = "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
) -> JSON:
    return {
        "token": "legacy-verification-token",
        "challenge": challenge,
        "type": "url_verification",
    }


def signed_headers(secret: str, body: str, timestamp: int | None = None) -> dict[str, str]:
    """Headers Slack would send with ``body`` (signed with slack-sdk's SignatureVerifier)."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    signature = SignatureVerifier(secret).generate_signature(timestamp=ts, body=body)
    return {
        "Content-Type": "application/json",
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": signature or "",
    }


# --------------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------------


@dataclass
class ApiCall:
    method: str
    params: JSON
    token: str | None
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 200
    at: float = field(default_factory=time.perf_counter)
    peer: str = ""
    """The client's address and port: one per TCP connection."""


class FakeSlack(LoopbackServer):
    """Fake Slack Web API and Socket Mode server (see the module docstring)."""

    def __init__(
        self,
        *,
        bot_user_id: str = BOT_USER_ID,
        bot_id: str = BOT_ID,
        team_id: str = TEAM_ID,
        host: str = "127.0.0.1",
    ) -> None:
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.team_id = team_id
        self.host = host
        self.calls: list[ApiCall] = []
        self.acks: list[JSON] = []
        """Every JSON message the Socket Mode client sent back (acks carry ``envelope_id``)."""
        self.sent: list[JSON] = []
        """Every envelope the fake sent over the WebSocket (``hello`` included)."""
        self.connections = 0
        self.messages: dict[tuple[str, str], JSON] = {}
        """(channel, ts) -> every message posted through the Web API, as it is now."""
        self._failures: dict[str, list[str]] = {}
        self._rate_limits: dict[str, list[int]] = {}
        self.on_call: Callable[[ApiCall], None] | None = None
        self._outbox: asyncio.Queue[JSON] = asyncio.Queue()
        self._sockets: set[web.WebSocketResponse] = set()
        self._cond = asyncio.Condition()
        self._ts = itertools.count(1)
        self.files: dict[str, tuple[bytes, str]] = {}
        """url path -> (bytes, mimetype) of each file `add_file` made."""
        self.file_downloads: list[tuple[str, str | None]] = []
        """(path, bearer token) of every file request."""
        self.file_token: str | None = None
        self.file_answers: dict[str, Served] = {}
        """url path -> what an authorized request gets instead of the bytes."""

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/api/{method}", self._handle_api)
        app.router.add_get("/link", self._handle_link)
        app.router.add_get("/link/", self._handle_link)
        app.router.add_post("/respond/{trigger}", self._handle_response_url)
        app.router.add_get("/files-pri/{tail:.*}", self._handle_file)
        await self._listen(app)

    async def stop(self) -> None:
        for ws in list(self._sockets):
            with contextlib.suppress(Exception):
                await ws.close()
        await self._close()

    @property
    def api_url(self) -> str:
        """``http://127.0.0.1:P/api/`` — the Web API base URL, trailing slash included."""
        return f"http://{self.host}:{self.port}/api/"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}/link"

    # -- scripting ----------------------------------------------------------------------------

    def fail(self, method: str, error: str = "internal_error", times: int = 1) -> None:
        """Make the next ``times`` calls of ``method`` answer ``{"ok": false, "error": error}``."""
        self._failures.setdefault(method, []).extend([error] * times)

    def rate_limit(self, method: str, retry_after: int = 0, times: int = 1) -> None:
        """Make the next ``times`` calls of ``method`` answer 429 with ``Retry-After``."""
        self._rate_limits.setdefault(method, []).extend([retry_after] * times)

    def delete_message(self, channel: str, ts: str) -> None:
        """Someone deleted a posted message: ``chat.update`` of it answers ``message_not_found``."""
        self.messages.pop((channel, ts), None)

    def add_file(
        self,
        name: str,
        data: bytes,
        mimetype: str,
        *,
        size: int | None = None,
        served: Served | None = None,
    ) -> JSON:
        """A ``files[]`` entry for a ``file_share`` event, its ``url_private`` served here
        (``size``: what the entry reports; ``served``: the answer instead of `data`)."""
        file_id = f"F{len(self.files) + 1:07d}"
        path = f"/files-pri/{self.team_id}-{file_id}/{name}"
        self.files[path] = (data, mimetype)
        if served is not None:
            self.file_answers[path] = served
        return {
            "id": file_id,
            "name": name,
            "title": name,
            "mimetype": mimetype,
            "filetype": name.rpartition(".")[2] or "binary",
            "size": len(data) if size is None else size,
            "url_private": f"http://{self.host}:{self.port}{path}",
            "url_private_download": f"http://{self.host}:{self.port}{path}?download=1",
        }

    def slash_command(
        self,
        text: str,
        *,
        command: str = "/gatehouse",
        user: str = "U0SLASH01",
        channel: str = "D0SLASH01",
        channel_name: str = "directmessage",
    ) -> tuple[str, str]:
        """An invocation of ``command text``: (its form-encoded body, its trigger_id)."""
        trigger = f"{next(self._ts)}.{int(time.time())}.fake{len(self.calls)}"
        form = {
            "token": "verification-token", "team_id": self.team_id, "team_domain": "gatehouse",
            "channel_id": channel, "channel_name": channel_name, "user_id": user,
            "user_name": "slasher", "command": command, "text": text, "api_app_id": APP_ID,
            "is_enterprise_install": "false", "trigger_id": trigger,
            "response_url": f"http://{self.host}:{self.port}/respond/{trigger}",
        }
        return urlencode(form), trigger

    async def _handle_response_url(self, request: web.Request) -> web.Response:
        params: JSON = {"trigger_id": request.match_info["trigger"], **(await request.json())}
        await self._record(ApiCall("response_url", params, None, dict(request.headers)))
        return web.Response(text="ok")

    def push_envelope(self, envelope: JSON) -> str:
        """Queue an envelope for the (current or next) Socket Mode connection."""
        self._outbox.put_nowait(envelope)
        return str(envelope.get("envelope_id", ""))

    def push_event(self, event: JSON) -> str:
        """Queue ``event`` as an ``events_api`` envelope; returns its ``envelope_id``."""
        return self.push_envelope(events_api_envelope(event_callback(event, team_id=self.team_id)))

    def calls_to(self, method: str) -> list[JSON]:
        """Params of the successful (non-429) calls of ``method``."""
        return [c.params for c in self.calls if c.method == method and c.status != 429]

    # -- waiting ------------------------------------------------------------------------------

    async def _wait(self, predicate: Any, timeout: float, what: str) -> None:  # noqa: ASYNC109
        try:
            async with asyncio.timeout(timeout), self._cond:
                await self._cond.wait_for(predicate)
        except TimeoutError:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}") from None

    async def wait_for_call(
        self,
        method: str,
        n: int = 1,
        timeout: float = 5.0,  # noqa: ASYNC109
        where: Callable[[JSON], bool] | None = None,
    ) -> list[JSON]:
        """Wait until ``method`` was called at least ``n`` times (with params matching ``where``);
        return the first ``n`` such params."""

        def matching() -> list[JSON]:
            return [p for p in self.calls_to(method) if where is None or where(p)]

        await self._wait(
            lambda: len(matching()) >= n,
            timeout,
            f"{n} {method} call(s) (got {len(matching())})",
        )
        return matching()[:n]

    async def wait_for_ack(self, envelope_id: str, timeout: float = 5.0) -> JSON:  # noqa: ASYNC109
        """Wait for the client's ack of ``envelope_id``; return the ack message."""

        def acked() -> bool:
            return any(a.get("envelope_id") == envelope_id for a in self.acks)

        await self._wait(acked, timeout, f"the ack of envelope {envelope_id}")
        return next(a for a in self.acks if a.get("envelope_id") == envelope_id)

    async def wait_for_connection(self, n: int = 1, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        await self._wait(lambda: self.connections >= n, timeout, f"{n} Socket Mode connection(s)")

    # -- handlers -----------------------------------------------------------------------------

    async def _record(self, call: ApiCall) -> None:
        if self.on_call is not None:
            self.on_call(call)
        async with self._cond:
            self.calls.append(call)
            self._cond.notify_all()

    async def _handle_api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        raw = await request.text()
        params: JSON = dict(parse_qsl(request.query_string))
        if raw:
            if request.content_type == "application/json":
                params.update(json.loads(raw))
            else:
                params.update(parse_qsl(raw, keep_blank_values=True))
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else params.get("token")
        peer = str(request.transport.get_extra_info("peername") if request.transport else "")
        limits = self._rate_limits.get(method)
        if limits:
            retry_after = limits.pop(0)
            await self._record(
                ApiCall(method, params, token, dict(request.headers), status=429, peer=peer)
            )
            return web.json_response(
                {"ok": False, "error": "ratelimited"},
                status=429,
                headers={"Retry-After": str(retry_after)},
            )
        await self._record(ApiCall(method, params, token, dict(request.headers), peer=peer))

        failures = self._failures.get(method)
        if failures:
            return web.json_response({"ok": False, "error": failures.pop(0)})
        return web.json_response(self._answer(method, params, token))

    def _answer(self, method: str, params: JSON, token: str | None) -> JSON:
        if method == "auth.test":
            return {
                "ok": True,
                "url": "https://gatehouse-test.slack.com/",
                "team": "Gatehouse Test",
                "user": "gatehouse",
                "team_id": self.team_id,
                "user_id": self.bot_user_id,
                "bot_id": self.bot_id,
                "is_enterprise_install": False,
            }
        if method == "apps.connections.open":
            if not (token or "").startswith("xapp-"):
                return {"ok": False, "error": "not_allowed_token_type"}
            return {"ok": True, "url": self.ws_url}
        if method in ("chat.postMessage", "chat.update"):
            channel = str(params.get("channel"))
            if method == "chat.update":
                ts = str(params.get("ts"))
                posted = self.messages.get((channel, ts))
                if posted is None:
                    return {"ok": False, "error": "message_not_found"}
                thread_ts = posted.get("thread_ts")
            else:
                ts = f"{int(time.time())}.{next(self._ts):06d}"
                thread_ts = params.get("thread_ts")
            message: JSON = {
                "type": "message",
                "text": params.get("text"),
                "user": self.bot_user_id,
                "bot_id": self.bot_id,
                "ts": ts,
                **({"thread_ts": thread_ts} if thread_ts else {}),
            }
            self.messages[(channel, ts)] = message
            return {"ok": True, "channel": channel, "ts": ts, "message": message}
        return {"ok": True}

    async def _handle_file(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        async with self._cond:
            self.file_downloads.append((request.path, token))
            self._cond.notify_all()
        allowed = token == self.file_token if self.file_token else (token or "").startswith("xoxb-")
        found = self.files.get(request.path)
        if not allowed:  # what Slack answers without files:read: its sign-in page
            return web.Response(
                text="<!DOCTYPE html><html><head><title>Slack</title></head><body>Sign in"
                "</body></html>",
                content_type="text/html",
            )
        if found is None:
            return web.Response(status=404, text="file_not_found")
        served = self.file_answers.get(request.path)
        if served is not None:
            return await served.respond(request)
        data, mimetype = found
        return web.Response(body=data, content_type=mimetype)

    async def _handle_link(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self._sockets.add(ws)
        async with self._cond:
            self.connections += 1
            self._cond.notify_all()
        sender = asyncio.create_task(self._send_loop(ws))
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                try:
                    data = json.loads(msg.data)
                except ValueError:
                    continue
                async with self._cond:
                    self.acks.append(data)
                    self._cond.notify_all()
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
            self._sockets.discard(ws)
        return ws

    async def _send_loop(self, ws: web.WebSocketResponse) -> None:
        hello: JSON = {
            "type": "hello",
            "num_connections": 1,
            "debug_info": {"host": "applink-fake", "approximate_connection_time": 18060},
            "connection_info": {"app_id": APP_ID},
        }
        await ws.send_json(hello)
        self.sent.append(hello)
        while not ws.closed:
            envelope = await self._outbox.get()
            if ws.closed:  # put it back for the next connection
                self._outbox.put_nowait(envelope)
                return
            await ws.send_json(envelope)
            self.sent.append(envelope)
