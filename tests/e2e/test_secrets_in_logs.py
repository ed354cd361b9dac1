"""`gatehouse run --log-level DEBUG` with Telegram: the log holds no bot token, no API key, and
none of the secrets people paste into messages, even in the SDKs' own debug lines."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from tests.fakes import FakeOpenAI, error
from tests.fakes.telegram_server import FakeTelegram
from tests.helpers.kill_restart import start_gateway, write_config

API_KEY = "sk-live-proxy-Qw3rTy7uI9oP1aS2dF4gH6jK"
BOT_TOKEN = "7212345678:AAHk3v9QxYp2Lm8Rt4Zs1Wn6Bc0Df5Gh7Jk"
PASTED_KEY = "sk-proj-Zq8xW2vN5mK1pR7tY4uI9oL3aS6dF0gH2jK4"
PASSWORD = "hunter2-Correct-Horse"


async def test_debug_log_of_a_real_run_holds_no_secret(tmp_path: Path) -> None:
    log = tmp_path / "gatehouse.log"
    async with FakeOpenAI() as llm, FakeTelegram(token=BOT_TOKEN) as tg:
        config = write_config(tmp_path, llm, tg, api_key=API_KEY)
        proc = await start_gateway(config, log, "DEBUG")
        try:
            tg.private_message(77, f"my OpenAI key is {PASTED_KEY} and password={PASSWORD}")
            await tg.wait_for_call("sendMessage", timeout=30)
            # A provider error that quotes the request back: logged with its detail.
            llm.script(error(400, {"error": {"message": f"key {PASTED_KEY} is not valid here"}}))
            tg.private_message(77, "and again")
            await tg.wait_for_call("sendMessage", n=2, timeout=30)
        finally:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), timeout=60)
    text = await asyncio.to_thread(log.read_text)
    assert "sendMessage" in text and "turn failed" in text  # the debug lines are there...
    for secret in (API_KEY, BOT_TOKEN, PASTED_KEY, PASSWORD):
        assert secret not in text  # ... without the secrets
    assert "[REDACTED:config]" in text  # PTB's Bot API URL, with the token masked
    assert "[REDACTED:openai_key]" in text
