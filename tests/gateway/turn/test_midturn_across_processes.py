"""Queue modes with two gateways on one PostgreSQL database (two processes, as far as the store
and its session locks can tell): the message arrives at the gateway that is *not* running the
session's turn."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from channels.webchat import WebchatChannel
from gateway.app import Gateway
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI, reply, stall_stream, tool_call
from tests.helpers.llm_scripts import KEY
from tests.helpers.midturn import INTERRUPT_CUT, Gate, arrived, conversation, until
from tests.postgres import ThrowawayPostgres


class Process:
    """One gateway with its web chat, as a separate process would run it."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        # A reply the other process sent is found in the store: look often.
        self.webchat = WebchatChannel(reply_timeout=10, poll_interval=0.1)
        gateway.add_channel(self.webchat)

    async def ask(self, text: str) -> list[str]:
        return (await self.webchat.submit("tester", text)).replies


Pair = Callable[[str], Awaitable[tuple[Process, Process]]]


@pytest.fixture
async def pair(
    postgres: ThrowawayPostgres, fake_llm: FakeOpenAI, make_config: MakeConfig
) -> AsyncIterator[Pair]:
    started: list[Gateway] = []

    async def start(mode: str) -> tuple[Process, Process]:
        url = postgres.new_database()
        config = make_config(fake_llm, gateway={"database_url": url, "queue_mode": mode})
        one, two = Process(Gateway(config)), Process(Gateway(config))
        for process in (one, two):
            await process.gateway.start()
            started.append(process.gateway)
        return one, two

    try:
        yield start
    finally:
        for gateway in started:
            await gateway.stop(grace=2)


async def test_interrupt_by_a_message_the_other_process_accepted(
    pair: Pair, fake_llm: FakeOpenAI
) -> None:
    a, b = await pair("interrupt")
    fake_llm.script(stall_stream(after_chunks=4, text="Let me think about this very carefully"))
    first = asyncio.create_task(a.ask("one"))
    await fake_llm.wait_for_requests(1)

    async def writing() -> bool:
        turn = a.gateway.runner.arrivals.turn(KEY)
        return turn is not None and bool(turn.partial)

    await until(writing)
    second = asyncio.create_task(b.ask("two"))  # B's lane waits for the session lock
    assert await asyncio.wait_for(first, 15) == [INTERRUPT_CUT]  # A looked in the store
    assert await asyncio.wait_for(second, 15) == ["echo: two"]
    assert len(fake_llm.requests) == 2
    assert conversation(fake_llm.requests[1])[-3:] == [
        ("user", "one"), ("assistant", INTERRUPT_CUT), ("user", "two"),
    ]


async def test_steer_takes_in_a_message_the_other_process_accepted(
    pair: Pair, fake_llm: FakeOpenAI
) -> None:
    a, b = await pair("steer")
    gate = Gate()
    fake_llm.script(gate.hold(tool_call("current_time", {})), reply("both answered"))
    first = asyncio.create_task(a.ask("one"))
    await fake_llm.wait_for_requests(1)
    second = asyncio.create_task(b.ask("two"))
    await arrived(a.gateway, 1)
    gate.open()
    assert await asyncio.wait_for(first, 15) == ["both answered"]
    assert await asyncio.wait_for(second, 15) == ["both answered"]  # found in the store
    await b.gateway.lanes.join()
    assert len(fake_llm.requests) == 2
    assert conversation(fake_llm.requests[1])[-2:] == [("tool", "current_time"), ("user", "two")]


async def test_followup_answers_each_whichever_process_took_it(
    pair: Pair, fake_llm: FakeOpenAI
) -> None:
    a, b = await pair("followup")
    gate = Gate()
    fake_llm.script(gate.hold(reply("first answer")))
    first = asyncio.create_task(a.ask("one"))
    await fake_llm.wait_for_requests(1)
    second = asyncio.create_task(b.ask("two"))
    await arrived(a.gateway, 1)
    third = asyncio.create_task(b.ask("three"))
    await arrived(a.gateway, 2)
    gate.open()
    assert await asyncio.wait_for(first, 15) == ["first answer"]
    assert await asyncio.wait_for(second, 15) == ["echo: two"]
    assert await asyncio.wait_for(third, 15) == ["echo: three"]
    assert len(fake_llm.requests) == 3
