"""The gateway's web server (aiohttp): the webchat page and API, and health.

aiohttp runs inside the gateway's own event loop, next to the channels and lanes, so one process
serves everything: the webchat, `/healthz`, `/metrics`, platform webhooks and `/admin/`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from importlib import resources
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from channels.webchat import WebchatChannel
from gateway.admin import add_admin_routes
from gateway.app import Gateway
from gateway.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from gateway.text import is_storable_id

log = logging.getLogger(__name__)

GATEWAY_KEY = web.AppKey("gateway", Gateway)
WEBCHAT_KEY = web.AppKey("webchat", WebchatChannel)


class WebchatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_id: str = Field(min_length=1, max_length=256)
    text: str
    message_id: str | None = Field(default=None, min_length=1, max_length=128)

    @field_validator("message_id")
    @classmethod
    def _plain_id(cls, value: str | None) -> str | None:
        # The reply is matched to the request by this id; one the store must rewrite (NUL, an
        # unpaired surrogate) would never match, and the caller would wait in vain.
        if value is not None and not is_storable_id(value):
            raise ValueError("message_id must be plain text (no NUL, no unpaired surrogates)")
        return value


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


async def chat_page(_request: web.Request) -> web.Response:
    html = (resources.files("channels") / "static" / "webchat.html").read_text(encoding="utf-8")
    return web.Response(text=html, content_type="text/html")


async def healthz(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    return web.json_response(
        {
            "status": "ok",
            "llm_configured": gateway.llm.configured,
            "active_lanes": gateway.lanes.active,
        }
    )


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text format (see gateway/metrics.py for what is counted)."""
    body = request.app[GATEWAY_KEY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})


async def post_message(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    webchat = request.app[WEBCHAT_KEY]
    raw = await request.read()
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return _error(400, "the request body is not valid UTF-8")
    except json.JSONDecodeError as exc:
        return _error(400, f"the request body is not valid JSON: {exc.msg} at position {exc.pos}")
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
    if not req.text.strip():
        return _error(422, "text is empty")
    try:
        reply = await webchat.submit(req.user_id, req.text, req.message_id)
    except TimeoutError:
        return _error(
            504,
            "no reply yet; the message is stored and will be answered",
        )
    except ConnectionAbortedError:
        return _error(503, "the gateway is shutting down; the message is stored")
    if not reply.accepted:
        status = 409 if reply.reason == "duplicate message" else 422
        if reply.reason and "shutting down" in reply.reason:
            status = 503
        return _error(status, reply.reason or "not accepted", session_key=reply.session_key)
    return web.json_response({"session_key": reply.session_key, "replies": reply.replies})


def build_app(gateway: Gateway, webchat: WebchatChannel) -> web.Application:
    app = web.Application(client_max_size=8 * 1024 * 1024)
    app[GATEWAY_KEY] = gateway
    app[WEBCHAT_KEY] = webchat
    app.router.add_get("/", chat_page)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/api/messages", post_message)
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
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        await asyncio.shield(self._runner.cleanup())
