"""DM policies, pairing, group allowlists and mention gating, through the gateway; what a
stranger's flood costs."""

from __future__ import annotations

import asyncio
import itertools
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gateway.app import Gateway
from gateway.inbound.access import RefusalLimiter
from gateway.store import PairingRow
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.helpers.recording_channel import RecordingChannel

_ids = itertools.count(1)


class Clock:
    """A monotonic clock the test moves by hand, for refusal windows."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def code_in(text: str) -> str:
    return text.split("pairing code is ")[1][:8]


async def gateway_with(make_config: MakeConfig, fake: FakeOpenAI, **telegram: Any) -> tuple[Gateway, RecordingChannel]:
    config = make_config(fake, channels={"telegram": telegram})
    gateway = Gateway(config)
    channel = RecordingChannel("telegram")
    gateway.add_channel(channel)
    await gateway.start()
    return gateway, channel


async def test_pairing_code_then_approval(make_config: MakeConfig, fake_llm: FakeOpenAI) -> None:
    gateway, tg = await gateway_with(make_config, fake_llm)
    clock = gateway.access.refusals.clock = Clock()
    try:
        result = await tg.dm("42", "hello?")
        assert not result.accepted
        code = code_in(tg.sent[-1].text)
        assert f"gatehouse pairing approve {code}" in tg.sent[-1].text
        assert "valid for one hour" in tg.sent[-1].text
        await tg.dm("42", "still there?")
        assert len(tg.sent) == 1, "answered once per refusal window"
        clock.now += 600
        await tg.dm("42", "hello again?")
        assert len(tg.sent) == 2 and code_in(tg.sent[-1].text) == code, "the same code again"
        assert fake_llm.requests == [] and await gateway.store.message_count() == 0
        assert (await gateway.store.decide_pairing(code.lower(), "approved")) is not None
        assert (await tg.dm("42", "now?")).accepted
        await gateway.lanes.join()
        assert tg.sent[-1].text == "echo: now?"
    finally:
        await gateway.stop()


@pytest.mark.parametrize(("policy", "refusal"), [
    ("pairing", "pairing code is"), ("allowlist", "allow list"),
])
async def test_a_stranger_sending_50_messages_gets_one_refusal_in_the_window(
    make_config: MakeConfig, fake_llm: FakeOpenAI, caplog: pytest.LogCaptureFixture,
    policy: str, refusal: str,
) -> None:
    gateway, tg = await gateway_with(make_config, fake_llm, dm_policy=policy)
    clock = gateway.access.refusals.clock = Clock()
    try:
        with caplog.at_level(logging.DEBUG, logger="gateway.app"):
            for n in range(50):
                clock.now += 10  # 500 s in all: inside the 600 s window
                assert not (await tg.dm("66", f"spam {n}")).accepted
        assert len(tg.sent) == 1 and refusal in tg.sent[0].text
        assert fake_llm.requests == [] and await gateway.store.message_count() == 0
        lines = [r for r in caplog.records if "not answering telegram:66" in r.getMessage()]
        loud = [r.getMessage() for r in lines if r.levelno >= logging.INFO]
        assert len(lines) == 50 and len(loud) == 2, "the refusal, then once: not answering"
        assert "not answering this sender again until" in loud[1]
        assert "refusal_interval_seconds = 600" in loud[1]

        clock.now += 110  # 600 s since the first: the window is over: one more refusal, which says what was held
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="gateway.app"):
            await tg.dm("66", "anyone?")
        assert len(tg.sent) == 2 and refusal in tg.sent[1].text
        assert "49 message(s) since the last reply were not answered" in caplog.text
        if policy == "pairing":
            assert code_in(tg.sent[1].text) == code_in(tg.sent[0].text)
            assert len(await gateway.store.pending_pairings("telegram")) == 1
    finally:
        await gateway.stop()


async def test_a_strangers_empty_and_oversized_messages_get_no_answer_of_their_own(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    """Who may talk is decided before what was said: a stranger's empty or too long messages
    get the one refusal of the window, not an "empty message" reply each."""
    gateway, tg = await gateway_with(make_config, fake_llm, dm_policy="allowlist")
    gateway.access.refusals.clock = Clock()
    try:
        for text in ("   ", "x" * 200_000, "", "hello"):
            assert not (await tg.dm("66", text)).accepted
        assert len(tg.sent) == 1, [m.text for m in tg.sent]
        assert "empty" not in tg.sent[0].text and "too long" not in tg.sent[0].text
    finally:
        await gateway.stop()


async def test_refusal_interval_zero_answers_every_message(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    gateway, tg = await gateway_with(make_config, fake_llm, dm_policy="allowlist",
                                     refusal_interval_seconds=0)
    try:
        for _ in range(3):
            await tg.dm("9", "hi")
        assert [m.text for m in tg.sent] == ["Sorry, I only talk to people on my allow list."] * 3
    finally:
        await gateway.stop()


async def test_three_throwaway_accounts_cannot_block_a_fourth_person(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    gateway, tg = await gateway_with(make_config, fake_llm)
    clock = gateway.access.refusals.clock = Clock()
    try:
        for _ in range(5):
            for sender in ("1", "2", "3"):
                await tg.dm(sender, "gimme a code")
            clock.now += 601  # each round past the refusal window: they are asked again
        pending = await gateway.store.pending_pairings("telegram")
        assert sorted(r.sender_id for r in pending) == ["1", "2", "3"], "one code per sender"
        await tg.dm("4", "hi, I'm a real person")
        assert tg.sent[-1].chat_id == "4" and "pairing code is" in tg.sent[-1].text
        code = code_in(tg.sent[-1].text)
        assert await gateway.store.decide_pairing(code, "approved") is not None
        assert (await tg.dm("4", "hello")).accepted
    finally:
        await gateway.stop()


async def test_a_full_platform_refuses_newcomers_once_and_a_decision_frees_a_slot(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    gateway, tg = await gateway_with(make_config, fake_llm, max_pending_pairings=2)
    try:
        await tg.dm("1", "hi")
        await tg.dm("2", "hi")
        for _ in range(5):
            await tg.dm("3", "let me in")
        to_3 = [m.text for m in tg.sent if m.chat_id == "3"]
        assert to_3 == ["I can't take new contacts right now; please try again later."]
        first = code_in(next(m.text for m in tg.sent if m.chat_id == "1"))
        assert await gateway.store.decide_pairing(first, "denied") is not None
        await tg.dm("3", "now?")  # inside 3's refusal window, but a new code is news: sent
        assert tg.sent[-1].chat_id == "3" and "pairing code is" in tg.sent[-1].text
        assert len(await gateway.store.pending_pairings("telegram")) == 2
    finally:
        await gateway.stop()


async def test_messages_at_once_from_a_stranger_get_one_code(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    gateway, tg = await gateway_with(make_config, fake_llm)
    try:
        await asyncio.gather(*(tg.dm("8", f"hi {n}") for n in range(10)))
        assert len(tg.sent) == 1
        [row] = await gateway.store.pending_pairings("telegram")
        assert row.code == code_in(tg.sent[0].text)
    finally:
        await gateway.stop()


async def test_an_expired_code_is_replaced_not_resent(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    gateway, tg = await gateway_with(make_config, fake_llm)
    try:
        # Past its hour, and the maintenance job has not marked it yet.
        await gateway.store.add_pairing(PairingRow(
            platform="telegram", sender_id="5", code="STALE234",
            expires_at=datetime.now(UTC) - timedelta(minutes=1),
        ))
        await tg.dm("5", "hi again")
        code = code_in(tg.sent[-1].text)
        assert code != "STALE234"
        statuses = {r.code: r.status for r in await gateway.store.list_pairings()}
        assert statuses == {"STALE234": "expired", code: "pending"}
        assert await gateway.store.decide_pairing("STALE234", "approved") is None
    finally:
        await gateway.stop()


def test_the_limiter_remembers_a_bounded_number_of_strangers() -> None:
    clock = Clock()
    limiter = RefusalLimiter(clock, capacity=2)
    a, b, c = ("telegram", "a"), ("telegram", "b"), ("telegram", "c")
    assert limiter.admit(a, 600) == 0 and limiter.admit(b, 600) == 0
    assert limiter.admit(a, 600) == 1 and limiter.admit(a, 600) == 2
    assert limiter.admit(c, 600) == 0, "a third stranger: the oldest window (a) is forgotten"
    assert limiter.admit(b, 600) == 1 and limiter.admit(c, 600) == 1
    assert limiter.admit(a, 600) == 0, "forgotten, so refused once more, early"
    clock.now += 600
    assert limiter.admit(c, 600) == 0 and limiter.admit(c, 600) == 1
    assert limiter.admit(a, 0) == 0 and limiter.admit(a, 0) == 0, "0: no limit"


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
