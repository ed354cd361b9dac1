"""Two `gatehouse run` processes on one PostgreSQL database, Telegram in webhook mode.

A load balancer may hand any update to either process, and Telegram redelivers what it thinks
failed: here every update is posted to *both* processes. Each message must be answered exactly
once, and each chat's messages in the order they were sent.
"""

from __future__ import annotations

import asyncio
import re
import signal
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp

from tests.e2e.test_cli import GATEHOUSE, env
from tests.fakes import FakeOpenAI, Reply
from tests.fakes.telegram_server import FakeTelegram
from tests.postgres import ThrowawayPostgres

SECRET = "webhook-secret-1"
CHATS = 8
PER_CHAT = 5
_MARK = re.compile(r"c\d+-m\d+")


def _answer_all_pending(body: dict[str, Any]) -> Reply:
    """Name every user message since the last assistant message (a turn may collect several)."""
    pending: list[str] = []
    for message in body["messages"]:
        if message["role"] == "assistant":
            pending = []
        elif message["role"] == "user":
            pending.extend(_MARK.findall(str(message.get("content") or "")))
    return Reply("answered " + " ".join(pending))


async def _start(config: Path, cwd: Path) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        GATEHOUSE, "--config", str(config), "run", cwd=cwd, env=env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), timeout=60)).decode()
    assert "listening on" in line, line
    return proc, line.rsplit(" ", 1)[-1].strip()


async def _stop(proc: asyncio.subprocess.Process) -> str:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    _out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    return err.decode()


async def test_two_processes_answer_each_message_once_in_order(
    tmp_path: Path, fake_llm: FakeOpenAI, postgres: ThrowawayPostgres
) -> None:
    fake_llm.default = _answer_all_pending
    database = postgres.new_database()
    async with FakeTelegram() as tg:
        config = tmp_path / "gatehouse.toml"
        config.write_text(
            f'[gateway]\ndata_dir = "data"\ndatabase_url = "{database}"\n[web]\nport = 0\n'
            f'[llm]\nbase_url = "{fake_llm.base_url}"\napi_key = "x"\nmodel = "fake-model"\n'
            f"stream = false\n"
            f'[channels.telegram]\nenabled = true\ntoken = "{tg.token}"\n'
            f'base_url = "{tg.base_url}"\nmode = "webhook"\n'
            f'webhook_url = "https://bot.example/telegram/webhook"\n'
            f'webhook_secret = "{SECRET}"\ndm_policy = "open"\n',
            encoding="utf-8",
        )
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        procs = await asyncio.gather(_start(config, tmp_path / "a"), _start(config, tmp_path / "b"))
        urls = [url for _proc, url in procs]
        try:
            async with aiohttp.ClientSession() as http:

                async def deliver(update: dict[str, Any], url: str) -> int:
                    async with http.post(
                        f"{url}/telegram/webhook",
                        json=update,
                        headers={"X-Telegram-Bot-Api-Secret-Token": SECRET},
                    ) as resp:
                        return resp.status

                async def chat(c: int) -> None:
                    for m in range(PER_CHAT):
                        update = tg.private_message(5000 + c, f"c{c}-m{m}", enqueue=False)
                        # Both processes get it, in either order: a redelivery through the LB.
                        first, second = (urls[0], urls[1]) if (c + m) % 2 else (urls[1], urls[0])
                        statuses = await asyncio.gather(
                            deliver(update, first), deliver(update, second)
                        )
                        assert statuses == [200, 200]

                await asyncio.gather(*(chat(c) for c in range(CHATS)))

                answered: dict[int, list[str]] = defaultdict(list)

                def count() -> int:
                    answered.clear()
                    for call in tg.calls_to("sendMessage"):
                        answered[int(call["chat_id"])].extend(_MARK.findall(call["text"]))
                    return sum(len(v) for v in answered.values())

                for _ in range(300):
                    if count() >= CHATS * PER_CHAT:
                        break
                    await asyncio.sleep(0.1)
                await asyncio.sleep(0.5)  # a double answer would arrive now
                count()
        finally:
            errors = [await _stop(proc) for proc, _url in procs]
        for c in range(CHATS):
            assert answered[5000 + c] == [f"c{c}-m{m}" for m in range(PER_CHAT)], errors
        assert all(proc.returncode == 0 for proc, _url in procs), errors


async def _read_until(stream: asyncio.StreamReader, needle: str, seconds: float) -> None:
    async def scan() -> None:
        while True:
            line = await stream.readline()
            if not line:
                raise AssertionError(f"process ended before logging {needle!r}")
            if needle in line.decode(errors="replace"):
                return

    await asyncio.wait_for(scan(), seconds)


async def test_a_killed_leader_is_replaced_and_a_due_reminder_fires_once(
    tmp_path: Path, fake_llm: FakeOpenAI, postgres: ThrowawayPostgres
) -> None:
    from gateway.app import Gateway
    from gateway.config import load_config
    from gateway.tools import ToolContext

    database = postgres.new_database()
    async with FakeTelegram() as tg:
        config = tmp_path / "gatehouse.toml"
        config.write_text(
            f'[gateway]\ndata_dir = "data"\ndatabase_url = "{database}"\n[web]\nport = 0\n'
            f'[llm]\nbase_url = "{fake_llm.base_url}"\napi_key = "x"\nmodel = "fake-model"\n'
            f"[scheduler]\nleader_poll_seconds = 0.3\npoll_seconds = 0.3\n"
            f'[channels.telegram]\nenabled = true\ntoken = "{tg.token}"\n'
            f'base_url = "{tg.base_url}"\nmode = "webhook"\n'
            f'webhook_url = "https://bot.example/telegram/webhook"\n'
            f'webhook_secret = "{SECRET}"\ndm_policy = "open"\n',
            encoding="utf-8",
        )
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        first, _ = await _start(config, tmp_path / "a")
        assert first.stderr is not None
        await _read_until(first.stderr, "fires scheduled jobs (leader)", 30)
        second, _ = await _start(config, tmp_path / "b")
        assert second.stderr is not None
        try:
            # A reminder is stored (as `gatehouse chat` would), due in a few seconds.
            creator = Gateway(load_config(config))
            creator.scheduler.fires_jobs = False
            await creator.open(fetch_metadata=False)
            await creator.scheduler.start(creator)
            context = ToolContext(session_key="telegram:direct:777", timezone="UTC",
                                  platform="telegram", chat_id="777", chat_type="direct")
            result = await creator.tools.call(
                "reminder_create", '{"text": "water the plants", "delay": 3}', context
            )
            assert result.content.startswith("Reminder "), result.content
            await creator.scheduler.stop()
            await creator.close()

            first.kill()  # the leader dies before the reminder is due
            await first.wait()
            await _read_until(second.stderr, "fires scheduled jobs (leader)", 30)
            [sent] = await tg.wait_for_call("sendMessage", timeout=30)
            assert sent["text"] == "⏰ Reminder: water the plants"
            await asyncio.sleep(1.5)  # a second firing would arrive now
            assert len(tg.calls_to("sendMessage")) == 1
        finally:
            err = await _stop(second)
        assert second.returncode == 0, err
