"""The channel seam's shared sending rule: a chunked reply resumes where a failed try stopped."""

from __future__ import annotations

import pytest

from channels.base import OutboundMessage, PartlySent, send_parts


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
