"""The attachment seam of the channels: one reading of every adapter's attachment dicts, one
download signature, and a bounded read."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from channels.attachments import (
    AttachmentInfo,
    AttachmentTooLarge,
    FetchesAttachments,
    collect_bounded,
    declared_length,
    describe,
    read_bounded,
)
from channels.console import ConsoleChannel
from channels.discord import DiscordChannel
from channels.slack import SlackChannel
from channels.telegram import TelegramChannel
from channels.webchat import WebchatChannel


@pytest.mark.parametrize(
    ("attachment", "expected"),
    [
        ({"type": "photo", "file_id": "AgAC", "name": None},
         AttachmentInfo(None, "photo", None, None, None)),
        ({"type": "document", "file_id": "BQAC", "name": "report.pdf"},
         AttachmentInfo("report.pdf", "document", None, None, None)),
        ({"id": "F1", "name": "plan.pdf", "mimetype": "application/pdf", "size": 1234,
          "url": "https://files.slack.com/files-pri/T1-F1/plan.pdf"},
         AttachmentInfo("plan.pdf", None, "application/pdf", 1234, "F1")),
        ({"id": "11", "filename": "a.png", "url": "https://cdn/a.png",
          "content_type": "image/png", "size": 9},
         AttachmentInfo("a.png", None, "image/png", 9, "11")),
        ({"id": 5, "name": ["x"], "size": True, "mimetype": None},  # malformed: nothing trusted
         AttachmentInfo(None, None, None, None, None)),
    ],
)
def test_describe_reads_every_platforms_shape(
    attachment: dict[str, Any], expected: AttachmentInfo
) -> None:
    assert describe(attachment) == expected


@pytest.mark.parametrize("adapter", [TelegramChannel, SlackChannel, DiscordChannel])
def test_the_platform_adapters_fetch_with_the_protocols_signature(adapter: type[Any]) -> None:
    assert issubclass(adapter, FetchesAttachments)
    declared = inspect.signature(FetchesAttachments.fetch_attachment)
    assert inspect.signature(adapter.fetch_attachment) == declared
    assert inspect.iscoroutinefunction(adapter.fetch_attachment)


@pytest.mark.parametrize("adapter", [ConsoleChannel, WebchatChannel])
def test_text_only_channels_fetch_nothing(adapter: type[Any]) -> None:
    assert not issubclass(adapter, FetchesAttachments)


async def test_read_bounded_stops_past_the_limit() -> None:
    async def declared(request: web.Request) -> web.Response:
        return web.Response(body=b"x" * 5000)

    async def streamed(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()  # no Content-Length: chunked
        await response.prepare(request)
        for _ in range(100):
            await response.write(b"y" * 1000)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/declared", declared)
    app.router.add_get("/streamed", streamed)
    async with TestServer(app) as server, ClientSession() as session:
        async with session.get(server.make_url("/declared")) as response:
            assert await read_bounded(response, 5000) == b"x" * 5000
        async with session.get(server.make_url("/declared")) as response:
            with pytest.raises(AttachmentTooLarge) as refused:
                await read_bounded(response, 4999)
            assert refused.value.size == 5000
        async with session.get(server.make_url("/streamed")) as response:
            with pytest.raises(AttachmentTooLarge):
                await read_bounded(response, 10_000)


class Chunks:
    """An async stream of `count` chunks of `size` bytes that counts how many were taken."""

    def __init__(self, size: int, count: int) -> None:
        self.size, self.count, self.taken = size, count, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self.count):
            self.taken += 1
            yield b"z" * self.size


async def test_collect_bounded_keeps_nothing_past_the_limit() -> None:
    assert await collect_bounded(Chunks(1000, 5), None, 5000) == b"z" * 5000  # exactly: kept
    endless = Chunks(1000, 1_000_000)
    with pytest.raises(AttachmentTooLarge) as refused:
        await collect_bounded(endless, 10, 4500)  # a lying declared size changes nothing
    assert refused.value.size is None
    assert endless.taken == 5  # the chunk that would pass the limit is the last one read
    unread = Chunks(1000, 10)
    with pytest.raises(AttachmentTooLarge) as declared:
        await collect_bounded(unread, 10_000, 9_999)
    assert declared.value.size == 10_000 and unread.taken == 0  # refused before reading


@pytest.mark.parametrize(("header", "length"), [
    ("1234", 1234), (" 7 ", 7), (None, None), ("", None), ("-1", None), ("12abc", None),
    ("\u00b2", None),  # a digit to str.isdigit, not to int()
])
def test_declared_length_reads_only_plain_numbers(header: str | None, length: int | None) -> None:
    assert declared_length(header) == length
