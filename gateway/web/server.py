"""The gateway's web server (aiohttp): the webchat page and API, and health.

The webchat page is static (channels/static/: HTML, CSS, JS, nothing inline) and served under a
Content-Security-Policy that allows only this origin's own scripts, styles and requests.

aiohttp runs inside the gateway's own event loop, next to the channels and lanes, so one process
serves everything: the webchat, `/healthz`, `/metrics`, platform webhooks and `/admin/`.
"""

from __future__ import annotations

import asyncio
import logging
from importlib import resources
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from channels.base import id_problem, is_blank
from channels.webchat import WebchatChannel
from gateway.app import Gateway
from gateway.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from gateway.store.faults import StorageError
from gateway.turn.storage import ReplyNotStoredError
from gateway.web.admin import add_admin_routes, admin_status
from gateway.web.guard import BadBody, HostPolicy, guard_middleware, loads_json, read_body
from gateway.web.webchat_history import HISTORY_LIMIT, MAX_HISTORY_LIMIT, chat_history

log = logging.getLogger(__name__)

GATEWAY_KEY = web.AppKey("gateway", Gateway)
WEBCHAT_KEY = web.AppKey("webchat", WebchatChannel)

PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
"""Headers of the webchat page and its static files: no inline script or style runs, no
other origin is contacted, no page may frame it."""
STATIC_FILES = {
    "webchat.css": "text/css",
    "webchat.js": "text/javascript",
    "markdown.js": "text/javascript",
}
"""The page's own files under /webchat/static/ (nothing else in the folder is served)."""


def _check_id(value: Any, field_name: str | None) -> Any:
    # Ids are stored and keyed as they are: one the store cannot hold (a NUL, an unpaired
    # surrogate) is refused, never rewritten into the id of somebody else; a blank one is
    # refused like an empty one. (Before pydantic's own checks, which reject a surrogate
    # with a less helpful message.)
    if isinstance(value, str):
        if is_blank(value):
            raise ValueError(f"{field_name} is blank (empty, spaces or zero-width characters only)")
        problem = id_problem(value)
        if problem is not None:
            raise ValueError(f"{field_name} {problem}; ids must be plain text")
    return value


class WebchatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_id: str = Field(min_length=1, max_length=256)
    text: str
    message_id: str | None = Field(default=None, min_length=1, max_length=128)

    @field_validator("user_id", "message_id", mode="before")
    @classmethod
    def _plain_id(cls, value: Any, info: ValidationInfo) -> Any:
        return _check_id(value, info.field_name)


class HistoryQuery(BaseModel):
    """`GET /api/history?user_id=…[&after=SEQ][&limit=N]`: the page's own user id, as it posts
    it; messages after seq `after` (what the page already shows); at most `limit`."""

    model_config = ConfigDict(extra="forbid")

    user_id: str = Field(min_length=1, max_length=256)
    after: int = Field(default=0, ge=0, le=2**62)
    limit: int = Field(default=HISTORY_LIMIT, ge=1, le=MAX_HISTORY_LIMIT)

    @field_validator("user_id", mode="before")
    @classmethod
    def _plain_id(cls, value: Any, info: ValidationInfo) -> Any:
        return _check_id(value, info.field_name)

    @field_validator("after", "limit", mode="before")
    @classmethod
    def _digits(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str) and not (value.isascii() and value.isdigit() and len(value) <= 19):
            raise ValueError(f"{info.field_name} must be a whole number of at most 19 digits")
        return value


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


async def chat_page(_request: web.Request) -> web.Response:
    html = (resources.files("channels") / "static" / "webchat.html").read_text(encoding="utf-8")
    return web.Response(text=html, content_type="text/html", headers=PAGE_HEADERS)


async def chat_static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    content_type = STATIC_FILES.get(name)
    if content_type is None:
        raise web.HTTPNotFound()
    body = (resources.files("channels") / "static" / name).read_text(encoding="utf-8")
    return web.Response(
        text=body, content_type=content_type,
        headers={**PAGE_HEADERS, "Cache-Control": "no-cache"},
    )


async def get_history(request: web.Request) -> web.Response:
    """The recent messages of the session this user's own messages go to (see
    gateway/web/webchat_history.py), whether a turn of it is running, and the notices sent to
    the user meanwhile."""
    gateway = request.app[GATEWAY_KEY]
    webchat = request.app[WEBCHAT_KEY]
    repeated = sorted({k for k in request.query if len(request.query.getall(k)) > 1})
    if repeated:
        return _error(422, f"invalid request: {', '.join(repeated)} given more than once")
    try:
        query = HistoryQuery.model_validate(dict(request.query))
    except ValidationError as exc:
        problems = [f"{'.'.join(map(str, e['loc'])) or 'query'}: {e['msg']}" for e in exc.errors()]
        return _error(422, "invalid request: " + "; ".join(problems), problems=problems)
    try:
        history = await chat_history(
            gateway, webchat.name, query.user_id, after=query.after, limit=query.limit
        )
    except StorageError as exc:
        log.error("webchat: the history could not be read: %s", exc)
        return _error(503, f"the database is failing, the history could not be read: {exc}")
    body = history.to_json()
    body["notices"] = webchat.take_notices(query.user_id)
    return web.json_response(body, headers={"Cache-Control": "no-store"})


async def healthz(request: web.Request) -> web.Response:
    """200 `"status": "ok"`; 503 `"failing"` while the database is: a store step failed and no
    write has succeeded since, or the SQLite file was deleted or replaced. What the store
    remembers: a probe never touches the database. `unstored_turns`: sessions whose turn the
    database refused, waiting for another try (gateway/turn/storage.py)."""
    gateway = request.app[GATEWAY_KEY]
    failure = gateway.store.failure
    return web.json_response(
        {
            "status": "ok" if failure is None else "failing",
            "database": "ok" if failure is None else f"failing: {failure}",
            "llm_configured": gateway.llm.configured,
            "active_lanes": gateway.lanes.active,
            "unstored_turns": len(gateway.runner.blocked),
            "memory_search": gateway.memory_search,
        },
        status=200 if failure is None else 503,
    )


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text format (see gateway/metrics.py for what is counted)."""
    body = request.app[GATEWAY_KEY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


async def post_message(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    webchat = request.app[WEBCHAT_KEY]
    if request.content_type != "application/json":
        # A cross-site HTML form can send only form and text types, never JSON, without a
        # preflight the gateway never grants: refusing them means no page can post as a user.
        return _error(415, "the request body must be JSON (Content-Type: application/json)")
    try:
        body = loads_json(await read_body(request))
    except BadBody as exc:
        return _error(exc.status, exc.reason)
    try:
        req = WebchatRequest.model_validate(body)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()
        ]
        return _error(422, "invalid request: " + "; ".join(problems), problems=problems)
    limit = gateway.config.gateway.max_message_chars
    if len(req.text) > limit:
        return _error(413, f"text is {len(req.text):,} characters; the limit is {limit:,}")
    if is_blank(req.text):
        return _error(422, "text is empty (nothing but spaces or zero-width characters)")
    try:
        reply = await webchat.submit(req.user_id, req.text, req.message_id)
    except TimeoutError:
        return _error(
            504,
            "no reply yet; the message is stored and will be answered",
        )
    except ConnectionAbortedError:
        return _error(503, "the gateway is shutting down; the message is stored")
    except ReplyNotStoredError as exc:
        # The turn ran but the database refused its reply (logged once by the turn): the
        # message stays and is answered once the database works again (the page's history
        # shows it then), so the request ends now rather than at its timeout.
        return _error(503, f"the database is failing: {exc}", pending=True)
    except StorageError as exc:
        # The message could not be stored: said once, as the one line the CLI would print.
        log.error("webchat: the message was not stored: %s", exc)
        return _error(503, f"the database is failing, the message was not stored: {exc}")
    if not reply.accepted:  # (a repeated message_id is no refusal: it gets its one reply)
        status = 503 if reply.reason and "shutting down" in reply.reason else 422
        return _error(status, reply.reason or "not accepted", session_key=reply.session_key)
    return web.json_response({"session_key": reply.session_key, "replies": reply.replies})


def build_app(gateway: Gateway, webchat: WebchatChannel) -> web.Application:
    # The guard comes first: Host and cross-site checks, and one log line for every 4xx.
    guard = guard_middleware(HostPolicy.for_config(gateway.config))
    app = web.Application(client_max_size=8 * 1024 * 1024, middlewares=[guard])
    app[GATEWAY_KEY] = gateway
    app[WEBCHAT_KEY] = webchat
    app.router.add_get("/", chat_page)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/api/messages", post_message)
    app.router.add_get("/api/history", get_history)
    app.router.add_get("/webchat/static/{name}", chat_static)
    add_admin_routes(app, gateway)
    return app


class WebServer:
    def __init__(self, app: web.Application, host: str, port: int) -> None:
        self.app = app
        self.host = host
        self.port = port
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)

    async def start(self) -> str:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        for address in self._runner.addresses:
            self.port = int(address[1])
            break
        url = f"http://{self.host}:{self.port}"
        gateway = self.app.get(GATEWAY_KEY)
        if gateway is not None:
            log.info("%s", admin_status(gateway.config.web, url))
        return url

    async def stop(self) -> None:
        await asyncio.shield(self._runner.cleanup())
