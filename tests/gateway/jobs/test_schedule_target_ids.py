"""Issue 20 beyond the channels: a scheduled job's target chat comes from the model's tool call,
an outside id like any other. One that is blank or that the store cannot hold as it is (a NUL,
an unpaired surrogate) is refused with a clear tool error, and nothing is stored; before, it was
stored and failed (or landed in a look-alike chat) each time the job fired."""

from __future__ import annotations

import pytest

from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram
from tests.helpers.jobs import call, ctx, start_gateway, telegram_config


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ({"platform": "telegram", "chat_id": "-100\x00777"}, "chat_id contains a NUL"),
        ({"platform": "telegram", "chat_id": "-100\ud800"}, "chat_id contains an unpaired"),
        ({"platform": "telegram", "chat_id": " \u200b "}, "chat_id is blank"),
        ({"platform": "telegram", "chat_id": "-100777", "thread_id": "7\x00"}, "thread_id"),
    ],
    ids=["nul", "surrogate", "zero-width", "nul-thread"],
)
async def test_a_target_chat_the_store_cannot_hold_is_refused(
    make_config: MakeConfig,
    fake_llm: FakeOpenAI,
    tg: FakeTelegram,
    target: dict[str, str],
    expected: str,
) -> None:
    gateway = await start_gateway(telegram_config(make_config, fake_llm, tg))
    try:
        args = {"schedule": "*/5 * * * *", "prompt": "status", "target": target}
        text = await call(gateway, "cron_create", args, ctx())
        assert text.startswith("error: ") and expected in text, text
        assert await gateway.scheduler.jobs() == [], "nothing bad was stored"
    finally:
        await gateway.stop(grace=2)
