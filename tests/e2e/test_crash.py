"""Crash safety: `gatehouse run` killed with SIGKILL loses nothing and answers each message once.

Both tests run the real command as a subprocess with Telegram in polling mode (python-telegram-bot
against the fake Bot API) and a zero-latency fake model; `bench/crash.py` runs the first one at
1,000 messages across 100 sessions and prints the table.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from tests.fakes import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram
from tests.helpers.kill_restart import (
    FIRST_USER,
    ack_turn,
    run_trial,
    start_gateway,
    stored_messages,
    undelivered_replies,
    write_config,
)


async def test_sigkill_mid_burst_then_restart_answers_every_message_once(tmp_path: Path) -> None:
    trial = await run_trial(tmp_path, sessions=16, per_session=8)
    assert trial.unanswered_at_kill + trial.redelivered_updates > 0, "the kill must land mid-burst"
    assert trial.stored_wrong == []
    assert trial.lost == []
    # The only duplicates allowed: replies Telegram had received when the process died, before
    # the gateway could record the delivery (no Bot API lets a sender check that afterwards).
    assert trial.duplicated == sorted(set(trial.replies_in_doubt))
    assert trial.order_violations == []


async def test_reply_stored_but_not_yet_sent_at_the_kill_is_sent_after_restart(
    tmp_path: Path,
) -> None:
    async with FakeOpenAI(default=ack_turn) as llm, FakeTelegram() as tg:
        config = write_config(tmp_path, llm, tg)
        log = tmp_path / "gatehouse.log"
        proc = await start_gateway(config, log)
        try:
            tg.hold("sendMessage")  # the reply leaves the gateway but never reaches Telegram
            tg.private_message(FIRST_USER, "u0m0 hello")
            await tg.wait_for_held(1, timeout=30)
            # The turn is over (message answered in the store); its reply is still in transit.
            assert stored_messages(tmp_path) == [("u0m0 hello", 1, 1)]
            assert undelivered_replies(tmp_path) == ["ack u0m0"]
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        tg.release("sendMessage")
        assert tg.calls_to("sendMessage") == []

        proc = await start_gateway(config, log)
        try:
            [sent] = await tg.wait_for_call("sendMessage", timeout=30)
            assert sent["text"] == "ack u0m0"
            assert sent["chat_id"] == FIRST_USER
        finally:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), timeout=60)
        assert len(tg.calls_to("sendMessage")) == 1
        assert len(llm.requests) == 1, "the stored reply is sent; the model is not asked again"
        assert undelivered_replies(tmp_path) == []
