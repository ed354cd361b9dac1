"""What a turn tells the chat besides its reply: compaction progress (`[context]
notify_compaction`) and a reply cut at the output limit. Real Gateway, console and webchat
channels, the real openai SDK against the fake server."""

from __future__ import annotations

from typing import Any

from gateway.app import Gateway
from gateway.turn.notices import COMPACTING, CUT_NOTICE, compacted_line
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import FakeOpenAI, reply
from tests.helpers.llm_scripts import FILLER, is_summary_request, summarizer_and_echo


async def start(make_config: MakeConfig, fake: FakeOpenAI, **context: Any) -> RunningGateway:
    config = make_config(
        fake,
        models={"fake-model": {"context_window": 16_000}},
        context={"recent_turns": 2, **context},
    )
    gateway = Gateway(config)
    rg = RunningGateway(gateway)
    await gateway.start()
    return rg


async def chat_until_compacted(rg: RunningGateway, fake: FakeOpenAI) -> list[list[str]]:
    """Console turns until one compacts; every turn's replies (notices first)."""
    answers = []
    for i in range(8):
        _key, replies = await rg.console.ask(f"message {i} ORD-{i} " + FILLER)
        answers.append(replies)
        if any(is_summary_request(b) for b in fake.requests):
            return answers
    raise AssertionError("no compaction")


async def test_a_compaction_is_announced_before_and_summed_up_after(
    make_config: MakeConfig,
) -> None:
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        rg = await start(make_config, fake)
        try:
            answers = await chat_until_compacted(rg, fake)
            *quiet, last = answers
            assert all(len(replies) == 1 for replies in quiet), "no notice without compaction"
            started, done, answer = last
            assert started == COMPACTING
            assert done.startswith("Compacted ") and " messages into a summary (" in done
            assert "1 decision, 1 TODO, " in done and "identifiers kept; quality ok)" in done
            assert answer.startswith("echo: message"), "the reply comes after the notices"

            _key, replies = await rg.console.ask("/compact")
            assert replies[0] == COMPACTING
            assert replies[-1].startswith(("Compacted the conversation", "Nothing to compact",
                                           "Not compacted"))
            assert len(replies) == 2, "/compact's own answer is the line after"
        finally:
            await rg.gateway.stop()


async def test_no_notices_when_notify_compaction_is_off(make_config: MakeConfig) -> None:
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        rg = await start(make_config, fake, notify_compaction=False)
        try:
            answers = await chat_until_compacted(rg, fake)
            assert all(len(replies) == 1 for replies in answers)
            assert answers[-1][0].startswith("echo: message")
        finally:
            await rg.gateway.stop()


async def test_a_reply_cut_at_the_output_limit_says_so(make_config: MakeConfig) -> None:
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        rg = await start(make_config, fake)
        try:
            fake.script(reply("The three steps are: first, open the", finish_reason="length"))
            [answer] = await rg.ask("explain the steps")
            assert answer == "The three steps are: first, open the" + CUT_NOTICE
            assert "say “continue” for the rest" in answer
            [whole] = await rg.ask("thanks")
            assert CUT_NOTICE not in whole, "a reply that ended by itself carries no notice"
        finally:
            await rg.gateway.stop()


def test_the_line_for_a_compaction_that_did_not_run() -> None:
    assert compacted_line(None, 0).startswith("Nothing was compacted")
