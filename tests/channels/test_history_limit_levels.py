"""Which history limit applies to a conversation, through each real adapter: a person's own DM
limit, the platform's DM default, and the system default (a group with no limit of its own).
What the runner applies, `sessions list` (and the admin page, which shows the same overview)
and `context explain` must agree — a Slack or Discord DM's chat id is a channel id, never the
person whose `dms.<user>` limit it is."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from channels.discord import DiscordChannel
from channels.slack import SlackChannel
from channels.telegram import TelegramChannel
from context.history import SYSTEM_SOURCE
from gateway import operations
from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.slack_server import BOT_USER_ID, FakeSlack, app_mention, im_message
from tests.fakes.telegram_server import FakeTelegram

SYSTEM, DM_DEFAULT, OWN = 60, 20, 7


def limits(**platform: Any) -> dict[str, Any]:
    return {"dm_policy": "open", "dm_history_limit": DM_DEFAULT, "enabled": True, **platform}


# Each rig: (the gateway, a coroutine sending DMs from A and B and a group mention, A's id).
Rig = tuple[Gateway, Callable[[], Awaitable[None]], str]


@asynccontextmanager
async def slack(make_config: MakeConfig, llm: FakeOpenAI) -> AsyncIterator[Rig]:
    async with FakeSlack() as fake:
        config = make_config(llm, context={"history_limit": SYSTEM}, channels={"slack": limits(
            bot_token="xoxb-test", app_token="xapp-test", base_url=fake.api_url,
            dms={"U42": {"history_limit": OWN}},
        )})
        gw = Gateway(config)
        gw.add_channel(SlackChannel(config.channels.slack))
        await gw.start()

        async def send() -> None:
            fake.push_event(im_message("hi from A", user="U42", channel="D0000DM42"))
            fake.push_event(im_message("hi from B", user="U77", channel="D0000DM77"))
            fake.push_event(app_mention(f"<@{BOT_USER_ID}> hi all", user="U42"))

        try:
            yield gw, send, "U42"
        finally:
            await gw.stop()


@asynccontextmanager
async def discord(make_config: MakeConfig, llm: FakeOpenAI) -> AsyncIterator[Rig]:
    async with FakeDiscord() as fake:
        alice = str(fake.alice["id"])
        config = make_config(llm, context={"history_limit": SYSTEM}, channels={"discord": limits(
            token=fake.token, api_base_url=fake.api_base_url, gateway_url=fake.gateway_url,
            dms={alice: {"history_limit": OWN}},
        )})
        gw = Gateway(config)
        gw.add_channel(DiscordChannel(config.channels.discord, guild_ready_timeout=0.01,
                                      ready_timeout=10))
        await gw.start()

        async def send() -> None:
            fake.dm_message("hi from A", author=fake.alice)
            fake.dm_message("hi from B", author=fake.bob)
            fake.guild_message("hi all", mention=True)

        try:
            yield gw, send, alice
        finally:
            await gw.stop(grace=2)


@asynccontextmanager
async def telegram(make_config: MakeConfig, llm: FakeOpenAI) -> AsyncIterator[Rig]:
    async with FakeTelegram() as fake:
        config = make_config(llm, context={"history_limit": SYSTEM}, channels={
            "telegram": limits(token=fake.token, base_url=fake.base_url,
                               dms={"5151": {"history_limit": OWN}}),
        })
        gw = Gateway(config)
        gw.add_channel(TelegramChannel(config.channels.telegram))
        await gw.start()

        async def send() -> None:
            fake.private_message(5151, "hi from A")
            fake.private_message(7777, "hi from B")
            fake.group_message(-100123, 5151, "hi all", reply_to_bot=True)

        try:
            yield gw, send, "5151"
        finally:
            await gw.stop(grace=2)


RIGS = {"slack": slack, "discord": discord, "telegram": telegram}


async def until(check: Callable[[], bool], what: str) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("platform", list(RIGS))
async def test_own_dm_default_and_system_limits_agree_everywhere(
    platform: str, make_config: MakeConfig, fake_llm: FakeOpenAI,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, logger="gateway.turn.runner"):
        async with RIGS[platform](make_config, fake_llm) as (gw, send, person):
            await send()
            await until(lambda: len(fake_llm.requests) == 3, "three answered turns")
            await gw.lanes.join()
            applied = {
                m.group(1): (int(m.group(2)), m.group(3))
                for r in caplog.records
                if (m := re.match(r"context (\S+): .*history_limit=(\d+) \((.+?)\) prompt",
                                  r.getMessage()))
            }
            overview = {row.key: row for row in await operations.session_overview(gw)}
            explained = {
                key: await operations.session_explanation(gw, key, fetch_metadata=False) for key in overview
            }
    assert len(overview) == 3, list(overview)
    section = f"[channels.{platform}"
    expected = {
        "own": (OWN, f'{section}.dms."{person}"] history_limit'),
        "dm default": (DM_DEFAULT, f"{section}] dm_history_limit"),
        "system": (SYSTEM, SYSTEM_SOURCE),
    }
    seen: dict[str, str] = {}
    for key, row in overview.items():
        shown = (row.history_limit, row.history_limit_source)
        level = next(name for name, want in expected.items() if want == shown)
        seen[level] = key
        assert applied[key] == shown, (key, applied[key], shown)
        explanation = explained[key]
        assert explanation is not None and explanation.plan is not None
        assert explanation.plan.history_limit_source == row.history_limit_source
        assert explanation.plan.history_limit == row.history_limit
    assert set(seen) == set(expected), seen
