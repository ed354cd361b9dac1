"""Issue 20 at the gateway, for every channel: ids are stored as they are or refused.

The store cannot hold a NUL (PostgreSQL) or an unpaired surrogate (UTF-8). Rewriting such an id
into something storable (``\\x00``, ``\\ud800``) made it the same id as the look-alike another
person can type, so the two shared a session and one read the other's history. Such a message is
refused now (a clear reason, one log line, no traceback), on every platform, and so is a message
from a blank sender or chat id. Invisible text (zero-width characters only) is empty text.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from channels.base import InboundMessage
from channels.console import ConsoleChannel
from gateway.app import Gateway
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import FakeOpenAI
from tests.fakes.sink import Sink

ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff"


@pytest.fixture
async def with_slack(fake_llm: FakeOpenAI, make_config: MakeConfig) -> AsyncIterator[RunningGateway]:
    """`running`, plus a Slack channel (a sink) whose DMs are open."""
    gateway = Gateway(make_config(fake_llm, channels={"slack": {"dm_policy": "open"}}))
    rg = RunningGateway(gateway)
    gateway.add_channel(Sink("slack"))
    await gateway.start()
    try:
        yield rg
    finally:
        await gateway.stop()


async def stored(running: RunningGateway, count: int) -> None:
    """Wait until `count` messages are stored (a turn's reply included)."""
    for _ in range(250):
        if await running.gateway.store.message_count() >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{count} messages were not stored within 5 s")


def dm(platform: str, user: str, text: str, message_id: str) -> InboundMessage:
    return InboundMessage(
        platform=platform, chat_type="direct", chat_id=user, sender_id=user, text=text,
        platform_message_id=message_id,
    )


@pytest.mark.parametrize(
    ("evil", "plain"),
    [("ev\x00il", "ev\\x00il"), ("ev\ud800il", "ev\\ud800il"), ("\udc00", "\\udc00")],
    ids=["nul", "high-surrogate", "low-surrogate"],
)
@pytest.mark.parametrize("platform", ["console", "webchat", "slack"])
async def test_an_unstorable_id_is_refused_not_merged_with_its_look_alike(
    with_slack: RunningGateway,
    fake_llm: FakeOpenAI,
    caplog: pytest.LogCaptureFixture,
    platform: str,
    evil: str,
    plain: str,
) -> None:
    gateway = with_slack.gateway
    first = await gateway.handle_inbound(dm(platform, plain, "my secret is 4471", "1"))
    assert first.accepted
    await stored(with_slack, 2)  # its turn is over: nothing else logs below
    caplog.clear()
    caplog.set_level(logging.INFO)
    second = await gateway.handle_inbound(dm(platform, evil, "what is my secret?", "2"))
    assert not second.accepted and not second.duplicate
    assert second.session_key is None  # never filed under the look-alike's session
    assert second.reason is not None and "sender_id" in second.reason
    [line] = [r for r in caplog.records if r.name.startswith(("gateway", "channels"))]
    assert line.exc_info is None and evil not in line.getMessage()
    session = await gateway.store.get_session(first.session_key or "")
    assert session is not None and session.id is not None
    assert await gateway.store.message_count() == 2  # plain's message and its reply, no more


@pytest.mark.parametrize(
    "field", ["chat_id", "thread_id", "reply_to", "platform_message_id", "account"]
)
@pytest.mark.parametrize("bad", ["a\x00b", "a\ud800b"], ids=["nul", "surrogate"])
async def test_every_id_field_is_checked(
    running: RunningGateway, field: str, bad: str
) -> None:
    group = InboundMessage(
        platform="console", chat_type="group", chat_id="g", sender_id="u", text="hi",
        was_mentioned=True,
    )
    result = await running.gateway.handle_inbound(replace(group, **{field: bad}))
    assert not result.accepted and result.reason is not None and field in result.reason
    assert await running.gateway.store.message_count() == 0


@pytest.mark.parametrize("user", ["   ", "\u200b", "\t\ufeff\n"])
async def test_a_blank_sender_is_refused_like_an_empty_one(
    running: RunningGateway, fake_llm: FakeOpenAI, user: str
) -> None:
    result = await running.gateway.handle_inbound(dm("console", user, "hi", "1"))
    assert not result.accepted and result.reason is not None and "blank" in result.reason
    assert await running.gateway.store.message_count() == 0
    assert fake_llm.requests == []


@pytest.mark.parametrize("user", ["", "   ", "\u200b", "ev\x00il", "ev\udfffil"])
async def test_console_user_ids_get_a_clear_answer_when_refused(
    running: RunningGateway, fake_llm: FakeOpenAI, user: str
) -> None:
    console = ConsoleChannel(user_id=user, reply_timeout=5)
    await console.start(running.gateway.handle_inbound)
    key, [answer] = await console.ask("hello")
    assert key is None
    assert "user id" in answer
    assert await running.gateway.store.message_count() == 0
    assert fake_llm.requests == []


@pytest.mark.parametrize("text", [ZERO_WIDTH, f"  {ZERO_WIDTH}\n", "\ufeff"])
async def test_zero_width_text_is_empty_on_the_console(
    running: RunningGateway, fake_llm: FakeOpenAI, text: str
) -> None:
    _key, [answer] = await running.console.ask(text)
    assert "empty" in answer
    assert await running.gateway.store.message_count() == 0
    assert fake_llm.requests == []
