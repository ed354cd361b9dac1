"""Helpers for the scheduler tests: a gateway on the fake Telegram Bot API, tool calls made
directly (no model turn), and moving a stored job's run time instead of waiting for it."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from channels.telegram import TelegramChannel
from gateway.app import Gateway
from gateway.config import Config
from gateway.jobs.scheduler import USER_STORE
from gateway.tools.registry import ToolContext
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram

USER = 7
"""The Telegram user (and private chat) the scheduling tests talk as."""
KEY = f"agent:main:telegram:direct:{USER}"


def to_chat(chat_id: int) -> Callable[[dict[str, Any]], bool]:
    """A `FakeTelegram.wait_for_call` filter: calls to one chat."""
    return lambda params: params.get("chat_id") == chat_id


def telegram_config(make_config: MakeConfig, fake: FakeOpenAI, tg: FakeTelegram,
                    **extra: Any) -> Config:
    return make_config(
        fake,
        channels={"telegram": {"enabled": True, "token": tg.token, "base_url": tg.base_url,
                               "dm_policy": "open"}},
        **extra,
    )


async def start_gateway(config: Config) -> Gateway:
    gateway = Gateway(config)
    gateway.add_channel(TelegramChannel(config.channels.telegram))
    await gateway.start()
    return gateway


async def make_due(gateway: Gateway, job_id: str, when: datetime | None = None) -> None:
    """Move a stored job's next run to `when` (default: now) and let the scheduler look."""
    aps = gateway.scheduler._require()
    aps.modify_job(job_id, jobstore=USER_STORE, next_run_time=when or datetime.now(UTC))
    aps.wakeup()


def tool_results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def ctx(session_key: str = KEY, chat_id: str = str(USER), tz: str = "Europe/Paris") -> ToolContext:
    """The tool context of a turn in the Telegram user's private chat."""
    return ToolContext(session_key=session_key, timezone=tz, platform="telegram",
                       chat_id=chat_id, chat_type="direct")


async def call(gateway: Gateway, name: str, args: dict[str, Any], context: ToolContext) -> str:
    """Call one of the gateway's tools as the model would; its text result."""
    result = await gateway.tools.call(name, json.dumps(args), context)
    return result.content
