"""What every HTTP endpoint of the gateway's web server shares against hostile input.

- **Refusals are logged once**: each 4xx answer leaves exactly one log line (`log_refusal`; a
  404 at DEBUG), never a traceback. A handler that explains a refusal itself calls
  `log_refusal`; the middleware logs the others, so a request never leaves two lines.
- **Bounded parsing**: `read_body` reads at most the app's ``client_max_size`` (413 beyond it);
  `loads_json` refuses bodies that are not UTF-8, not JSON, nested deeper than `MAX_JSON_DEPTH`
  or holding a number over Python's 4,300-digit limit -- each a `BadBody`, which the endpoints
  answer with a 4xx (`channels.webhooks`, shared with the platform webhooks).
- **DNS rebinding** (`HostPolicy`): a page on ``evil.example`` whose name resolves to
  127.0.0.1 is same-origin with the gateway for the browser, but its requests still carry
  ``Host: evil.example``. Only the configured host, loopback names, ``[web] allowed_hosts``
  (and the host of the Telegram ``webhook_url``) are answered; any IP literal as well when the
  server listens on every address (an IP cannot be rebound). Others get 421.
- **Cross-site requests** (`cross_site`): a state-changing request (POST, PUT, PATCH, DELETE)
  whose ``Origin`` -- or ``Referer`` when a browser sent no ``Origin`` -- is another origin is
  refused (403). A request with neither is left to the endpoint: the admin UI refuses it for
  cookie and anonymous access (a browser always sends one of them), bearer-token clients and
  webhooks pass.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Handler

# The body helpers live with the platform webhooks that use them; re-exported for the endpoints.
from channels.webhooks import MAX_JSON_DEPTH as MAX_JSON_DEPTH
from channels.webhooks import BadBody as BadBody
from channels.webhooks import loads_json as loads_json
from channels.webhooks import log_refusal as _log_refusal
from channels.webhooks import read_body as read_body

if TYPE_CHECKING:
    from gateway.config import Config

log = logging.getLogger(__name__)

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


def log_refusal(
    request: web.Request, status: int, reason: str, logger: logging.Logger | None = None
) -> None:
    """The one log line of a refused request (a second call for the same request is a no-op);
    on this module's logger unless the endpoint names its own."""
    _log_refusal(request, status, reason, logger or log)


def _hostname(authority: str) -> str | None:
    """The host of a ``Host`` header or URL authority, lowercased; None when malformed."""
    value = authority.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        rest = value[end + 1 :]
        if end < 0 or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return value[1:end]
    if value.count(":") == 1:
        value, _, port = value.partition(":")
        if not port.isdigit():
            return None
    return value or None


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


class HostPolicy:
    """Which ``Host`` headers (and origins) are this gateway's own."""

    def __init__(self, host: str, allowed: Iterable[str] = ()) -> None:
        self.any_ip = host.strip().lower() in WILDCARD_HOSTS
        names = {n for n in (_hostname(a) for a in allowed) if n}
        self.extra = frozenset(names)
        configured = _hostname(host)
        self.names = LOOPBACK_NAMES | self.extra | ({configured} if configured else set())

    @classmethod
    def for_config(cls, config: Config) -> HostPolicy:
        """`[web] host`, loopback, `[web] allowed_hosts` and the host of the Telegram webhook
        URL (the reverse proxy in front of it may pass that name on)."""
        allowed = list(config.web.allowed_hosts)
        telegram = config.channels.telegram
        if telegram.enabled and telegram.mode == "webhook" and telegram.webhook_url:
            try:
                allowed.append(urlsplit(telegram.webhook_url).hostname or "")
            except ValueError:
                pass
        return cls(config.web.host, allowed)

    def host_ok(self, header: str | None) -> bool:
        if header is None:
            return True  # no browser omits it (HTTP/1.0 tools do): nothing to rebind
        name = _hostname(header)
        if name is None:
            return False
        if name in self.names:
            return True
        ip = _ip(name)
        return ip is not None and (ip.is_loopback or self.any_ip)

    def cross_site(self, request: web.Request) -> bool | None:
        """True: Origin/Referer names another origin; False: ours; None: neither was sent."""
        source = request.headers.get("Origin")
        if source is None:
            source = request.headers.get("Referer")
        if source is None or source == "":
            return None
        parts = urlsplit(source)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return True  # "null" (sandboxed frames, file:, some redirects) or garbage
        netloc = parts.netloc.lower()
        if netloc == request.headers.get("Host", "").lower():
            return False
        # Behind a reverse proxy that rewrites Host, the public names are ours too.
        return _hostname(netloc) not in self.extra


def _reason(response: web.StreamResponse) -> str:
    body = getattr(response, "body", None)
    if not isinstance(body, bytes) or len(body) > 4096:
        return response.reason or ""
    text = body.decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return text.strip() or response.reason or ""
    error = data.get("error") if isinstance(data, dict) else None
    return error if isinstance(error, str) else response.reason or ""


def refuse(request: web.Request, status: int, reason: str) -> web.Response:
    log_refusal(request, status, reason)
    return web.json_response({"error": reason}, status=status)


def guard_middleware(policy: HostPolicy) -> Any:
    """The gateway app's outermost middleware: Host, cross-site and size checks, one log line
    for every 4xx answer (whoever produced it)."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not policy.host_ok(request.headers.get("Host")):
            return refuse(
                request, 421,
                "unknown Host header; add the name this gateway is reached by to "
                "[web] allowed_hosts",
            )
        if request.method in UNSAFE_METHODS:
            if policy.cross_site(request):
                return refuse(request, 403, "cross-site request refused")
            limit = request.client_max_size
            if request.content_length is not None and request.content_length > limit:
                return refuse(
                    request, 413,
                    f"the body is {request.content_length:,} bytes; the limit is {limit:,}",
                )
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if 400 <= exc.status < 500:
                log_refusal(request, exc.status, exc.text or exc.reason)
            raise
        if 400 <= response.status < 500:
            log_refusal(request, response.status, _reason(response))
        return response

    return guard
