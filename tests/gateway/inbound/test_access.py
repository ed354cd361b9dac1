"""DM policies, pairing, group allowlists and mention gating, through the gateway."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from channels.base import (
    ChannelCapabilities,
    InboundHandler,
    InboundMessage,
    InboundResult,
    OutboundMessage,
)
from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI

_ids = itertools.count(1)


class RecordingChannel:
    """A platform stand-in at the Channel seam: records what the gateway sends."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.capabilities = ChannelCapabilities()
        self.sent: list[OutboundMessage] = []
        self.handler: InboundHandler | None = None

    async def start(self, on_message: InboundHandler) -> None:
        self.handler = on_message

    async def stop(self) -> None:
        return None

    async def send(self, message: OutboundMessage) -> None:
        self.sent.append(message)

    async def dm(self, sender: str, text: str) -> InboundResult:
        assert self.handler is not None
        return await self.handler(
            InboundMessage(platform=self.name, chat_type="direct", chat_id=sender,
                           sender_id=sender, sender_name=f"user{sender}", text=text,
                           platform_message_id=str(next(_ids)))
        )

    async def group(self, chat: str, sender: str, text: str, mentioned: bool) -> InboundResult:
        assert self.handler is not None
        return await self.handler(
            InboundMessage(platform=self.name, chat_type="group", chat_id=chat,
                           sender_id=sender, sender_name=f"user{sender}", text=text,
                           was_mentioned=mentioned, platform_message_id=str(next(_ids)))
        )


async def gateway_with(make_config: MakeConfig, fake: FakeOpenAI, **telegram: Any) -> tuple[Gateway, RecordingChannel]:
    config = make_config(fake, channels={"telegram": telegram})
    gateway = Gateway(config)
    channel = RecordingChannel("telegram")
    gateway.add_channel(channel)
    await gateway.start()
    return gateway, channel


async def test_pairing_code_then_approval(make_config: MakeConfig, fake_llm: FakeOpenAI) -> None:
    gateway, tg = await gateway_with(make_config, fake_llm)
    try:
        result = await tg.dm("42", "hello?")
        assert not result.accepted
        code = tg.sent[-1].text.split("pairing code is ")[1][:8]
        assert f"gatehouse pairing approve {code}" in tg.sent[-1].text
        await tg.dm("42", "still there?")
        assert code in tg.sent[-1].text, "the same code while it is pending"
        assert fake_llm.requests == [] and await gateway.store.message_count() == 0
        assert (await gateway.store.decide_pairing(code.lower(), "approved")) is not None
        assert (await tg.dm("42", "now?")).accepted
        await gateway.lanes.join()
        assert tg.sent[-1].text == "echo: now?"
    finally:
        await gateway.stop()


async def test_at_most_three_pending_pairings_per_platform(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    gateway, tg = await gateway_with(make_config, fake_llm)
    try:
        for sender in ("1", "2", "3"):
            await tg.dm(sender, "hi")
        await tg.dm("4", "hi")
        assert "can't take new contacts" in tg.sent[-1].text
        assert len(await gateway.store.pending_pairings("telegram")) == 3
    finally:
        await gateway.stop()


@pytest.mark.parametrize(("policy", "answered", "reply"), [
    ("allowlist", False, "allow list"), ("disabled", False, None), ("open", True, "echo"),
])
async def test_dm_policies(
    make_config: MakeConfig, fake_llm: FakeOpenAI, policy: str, answered: bool, reply: str | None
) -> None:
    gateway, tg = await gateway_with(make_config, fake_llm, dm_policy=policy, allow_from=["7"])
    try:
        assert (await tg.dm("9", "hi")).accepted is answered
        await gateway.lanes.join()
        if reply is None:
            assert tg.sent == []
        else:
            assert reply in tg.sent[-1].text
        assert (await tg.dm("7", "friend")).accepted, "allow_from always passes"
    finally:
        await gateway.stop()


async def test_unmentioned_group_messages_become_context_for_the_next_mention(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    gateway, tg = await gateway_with(make_config, fake_llm, group_buffer=2)
    try:
        for text in ("first", "second", "third"):
            result = await tg.group("-100", "5", text, mentioned=False)
            assert result.accepted
        await gateway.lanes.join()
        assert tg.sent == [] and fake_llm.requests == []
        await tg.group("-100", "6", "@bot what do you think?", mentioned=True)
        await gateway.lanes.join()
        users = [m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "user"]
        assert users == ["user5: second", "user5: third", "user6: @bot what do you think?"]
        assert len(tg.sent) == 1
    finally:
        await gateway.stop()


async def test_group_allowlist(make_config: MakeConfig, fake_llm: FakeOpenAI) -> None:
    gateway, tg = await gateway_with(make_config, fake_llm, group_allowlist=["-1"])
    try:
        assert not (await tg.group("-2", "5", "hi", mentioned=True)).accepted
        assert (await tg.group("-1", "5", "hi", mentioned=True)).accepted
        await gateway.lanes.join()
        assert [m.chat_id for m in tg.sent] == ["-1"]
    finally:
        await gateway.stop()
