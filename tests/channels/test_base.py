"""The channel seam's shared sending rule: a chunked reply resumes where a failed try stopped."""

from __future__ import annotations

import pytest

from channels.base import OutboundMessage, PartlySent, platform_failure, send_parts


def message(sent_parts: int = 0) -> OutboundMessage:
    return OutboundMessage("telegram", "7", "text", "k", sent_parts=sent_parts)


async def test_parts_go_out_in_order_from_the_first_one_not_yet_sent() -> None:
    sent: list[tuple[int, str]] = []

    async def send_one(index: int, part: str) -> None:
        sent.append((index, part))

    await send_parts(["a", "b", "c"], message(), send_one)
    await send_parts(["a", "b", "c"], message(sent_parts=2), send_one)
    assert sent == [(0, "a"), (1, "b"), (2, "c"), (2, "c")]


async def test_a_failure_after_some_parts_says_how_many_reached_the_platform() -> None:
    async def send_one(index: int, part: str) -> None:
        if part == "c":
            raise ConnectionResetError("peer went away")

    with pytest.raises(PartlySent) as caught:
        await send_parts(["a", "b", "c"], message(), send_one)
    assert caught.value.parts == 2
    assert isinstance(caught.value.__cause__, ConnectionResetError)
    with pytest.raises(PartlySent) as caught:
        await send_parts(["a", "b", "c"], message(sent_parts=2), send_one)
    assert caught.value.parts == 2  # an earlier try's chunks count too


async def test_a_failure_of_the_first_part_is_the_plain_error() -> None:
    async def send_one(index: int, part: str) -> None:
        raise PermissionError("blocked")

    with pytest.raises(PermissionError):
        await send_parts(["a", "b"], message(), send_one)


def test_each_adapter_names_its_sdks_errors_as_the_platforms() -> None:
    import aiohttp
    import discord
    from slack_sdk.errors import SlackApiError
    from telegram.error import Forbidden

    from channels.discord import DiscordChannel
    from channels.slack import SlackChannel
    from channels.telegram import TelegramChannel

    assert platform_failure(TelegramChannel, Forbidden("bot was blocked by the user"))
    assert platform_failure(SlackChannel, SlackApiError("not_in_channel", {"ok": False}))
    assert platform_failure(SlackChannel, aiohttp.ServerDisconnectedError())
    assert platform_failure(DiscordChannel, discord.DiscordServerError(_Response(503), "down"))
    for channel in (TelegramChannel, SlackChannel, DiscordChannel, object()):
        assert platform_failure(channel, TimeoutError())  # the network's, on any platform
        assert not platform_failure(channel, KeyError("chat_id"))  # a bug is a bug everywhere
    assert not platform_failure(object(), Forbidden("blocked"))  # only an adapter knows its SDK


class _Response:
    """What discord.HTTPException reads off an aiohttp response."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.reason = "Service Unavailable"
