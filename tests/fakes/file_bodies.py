"""What a fake platform's file URL can answer instead of the file: the bodies an attacker's (or a
broken) server sends. Each is a `Served`, handed to ``add_file`` / ``attachment`` of the fake
Telegram, Slack and Discord servers, plus `RecordingServer`, a server on a port of its own that
records every request's headers (so a test can show a token never arrived there).

- `BigBody(total)`: ``total`` bytes written 64 KiB at a time from one block, so a 300 MB body
  costs the fake nothing; no Content-Length (chunked) unless ``content_length`` is given.
  ``written`` says how much went out before the client hung up.
- `Redirect(location)`: a 3xx with ``Location``.
- `Status(code)`: an error status with a short text body.
- `Compressed(total)`: ``total`` zero bytes gzip-compressed (a "zip bomb": 64 MiB is 64 KiB
  on the wire), sent with ``Content-Encoding: gzip`` whatever the client asked for.
- `Stall()`: the headers, then nothing until the client gives up.
- `Hangup()`: the connection closed without an answer.
"""

from __future__ import annotations

import asyncio
import gzip
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import web

from tests.fakes.loopback import LoopbackServer

__all__ = [
    "BigBody",
    "Compressed",
    "Hangup",
    "RecordedRequest",
    "RecordingServer",
    "Redirect",
    "Served",
    "Stall",
    "Status",
]

_BLOCK = 64 * 1024


class Served(Protocol):
    """An answer a fake file route gives instead of the file's bytes."""

    async def respond(self, request: web.Request) -> web.StreamResponse: ...


class BigBody:
    """``total`` bytes of zeros, streamed; never more than one 64 KiB block in memory."""

    def __init__(
        self,
        total: int,
        *,
        content_length: int | None = None,
        content_type: str = "application/octet-stream",
    ) -> None:
        self.total = total
        self.content_length = content_length
        self.content_type = content_type
        self.written = 0
        """Bytes written so far (the client hanging up early keeps this far below `total`)."""

    async def respond(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": self.content_type})
        if self.content_length is not None:
            response.content_length = self.content_length
        else:
            response.enable_chunked_encoding()
        await response.prepare(request)
        block = bytes(_BLOCK)
        try:
            while self.written < self.total:
                part = block[: self.total - self.written]  # the whole block but at the end
                await response.write(part)
                self.written += len(part)
            await response.write_eof()
        except (ConnectionError, RuntimeError):  # the client hung up: what a bounded reader does
            pass
        return response


class Compressed:
    """``total`` zeros, gzip-compressed once, sent as ``Content-Encoding: gzip``."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._body: bytes | None = None

    @property
    def body(self) -> bytes:
        """The compressed bytes (made on first use: a test collected is not a test run)."""
        if self._body is None:
            self._body = gzip.compress(bytes(self.total), compresslevel=9)
        return self._body

    async def respond(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=self.body, headers={
            "Content-Type": "application/octet-stream", "Content-Encoding": "gzip",
        })


@dataclass(frozen=True)
class Redirect:
    """A redirect to ``location`` (absolute or relative)."""

    location: str
    status: int = 302

    async def respond(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=self.status, headers={"Location": self.location},
                            text="moved")


@dataclass(frozen=True)
class Status:
    """An error status (403, 404, 500 …) with a short text body."""

    status: int

    async def respond(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=self.status, text=f"error {self.status}")


@dataclass
class Stall:
    """A 200 and its headers, then no byte until the client gives up (or ``seconds`` pass)."""

    seconds: float = 30.0
    started: asyncio.Event = field(default_factory=asyncio.Event)

    async def respond(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        self.started.set()
        loop = asyncio.get_running_loop()
        until = loop.time() + self.seconds
        while loop.time() < until and request.transport is not None:
            if request.transport.is_closing():  # the client gave up
                break
            await asyncio.sleep(0.02)
        return response


@dataclass(frozen=True)
class Hangup:
    """The connection closed before any answer (a server that refuses mid-way)."""

    async def respond(self, request: web.Request) -> web.StreamResponse:
        if request.transport is not None:
            request.transport.close()
        return web.Response(status=500)  # never reaches the client


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    url: str
    headers: dict[str, str]


class RecordingServer(LoopbackServer):
    """Any request to any path is recorded (method, URL, headers) and answered ``200 ok``:
    where a redirect would take a client that should never go there."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.requests: list[RecordedRequest] = []

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._record)
        await self._listen(app)

    async def stop(self) -> None:
        await self._close()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def _record(self, request: web.Request) -> web.Response:
        recorded = RecordedRequest(request.method, str(request.url), dict(request.headers))
        self.requests.append(recorded)
        return web.Response(body=b"recorded", content_type="application/octet-stream")
