"""Reading a webhook's request body safely, and logging its refusal once.

Platform webhooks (Telegram's, Slack's) and the gateway's own endpoints share these: each body
is read bounded -- at most the app's ``client_max_size`` (413 beyond it) -- and parsed bounded:
a body that is not UTF-8, not JSON, nested deeper than `MAX_JSON_DEPTH` (Python's parser would
raise `RecursionError` near 1,000 levels, and a structure of 990 levels is enough to exhaust the
stack of whatever walks it next) or holding a number over Python's 4,300-digit limit is a
`BadBody`, answered with a 4xx and never a 500. A refusal leaves exactly one log line
(`log_refusal`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web

MAX_JSON_DEPTH = 64
"""Deepest JSON nesting any endpoint accepts (Slack's and Telegram's payloads stay under 20)."""
REFUSAL_LOGGED = web.RequestKey("gatehouse_refusal_logged", bool)
_REASON_CHARS = 200


class BadBody(ValueError):
    """A request body an endpoint refuses; `status` is the 4xx to answer with."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _short(text: str) -> str:
    text = text if len(text) <= _REASON_CHARS else text[:_REASON_CHARS] + "…"
    return text.encode("unicode_escape").decode("ascii")  # one line, whatever the input


def log_refusal(request: web.Request, status: int, reason: str, logger: logging.Logger) -> None:
    """The one log line of a refused request, on `logger` (the endpoint's own, so the line says
    who refused); a second call for the same request is a no-op."""
    if request.get(REFUSAL_LOGGED):
        return
    request[REFUSAL_LOGGED] = True
    # A 404 is what every browser's /favicon.ico gets: worth a line only when debugging.
    logger.log(
        logging.DEBUG if status == 404 else logging.WARNING,
        "refused %s %s from %s: %d %s",
        request.method, _short(request.raw_path), request.remote, status, _short(reason),
    )


async def read_body(request: web.Request) -> bytes:
    """The raw body, at most the app's ``client_max_size``; `BadBody` (413) beyond it."""
    limit = request.client_max_size
    if request.content_length is not None and request.content_length > limit:
        raise BadBody(413, f"the body is {request.content_length:,} bytes; the limit is {limit:,}")
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BadBody(413, f"the body is over the limit of {limit:,} bytes") from None


def _too_deep(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def loads_json(raw: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads`, bounded: `BadBody` (400) for anything a 500 must never come from."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise BadBody(400, "the request body is not valid UTF-8") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadBody(
            400, f"the request body is not valid JSON: {exc.msg} at position {exc.pos}"
        ) from None
    except RecursionError:
        raise BadBody(400, f"the request body's JSON is nested deeper than {max_depth}") from None
    except ValueError as exc:  # e.g. an integer over Python's 4,300-digit limit
        raise BadBody(400, f"the request body is not usable JSON: {exc}") from None
    if isinstance(value, dict | list) and _too_deep(value, max_depth):
        raise BadBody(400, f"the request body's JSON is nested deeper than {max_depth}")
    return value
