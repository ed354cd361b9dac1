"""Fixtures of the scheduler tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.fakes.telegram_server import FakeTelegram


@pytest.fixture
async def tg() -> AsyncIterator[FakeTelegram]:
    """The fake Telegram Bot API the scheduled messages are posted to."""
    async with FakeTelegram() as server:
        yield server
