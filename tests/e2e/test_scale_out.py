"""Two `gatehouse run` processes on one PostgreSQL database: Telegram in webhook mode, Slack
in HTTP (Events API) mode, Discord with one shard each.

A load balancer may hand any update to either process, and both platforms redeliver what they
think failed: here every update is posted to *both* processes. Each message must be answered
exactly once, and each chat's messages in the order they were sent.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from tests.fakes import FakeOpenAI, Reply
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.slack_server import FakeSlack, event_callback, im_message, signed_headers
from tests.fakes.telegram_server import FakeTelegram
from tests.helpers.cli import GATEHOUSE, env
from tests.postgres import ThrowawayPostgres

SECRET = "webhook-secret-1"
SLACK_SIGNING_SECRET = "slack-signing-secret-1"
CHATS = 8
PER_CHAT = 5
_MARK = re.compile(r"c\d+-m\d+")
GUILD = 100
"""Discord: sender c's guild messages are marked c{GUILD + c} (their DMs c{c})."""


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
    if "listening on" not in line:  # it stopped: say why
        assert proc.stderr is not None
        err = (await asyncio.wait_for(proc.stderr.read(), timeout=10)).decode()
        await _stop(proc)  # reaped here, not by a later test's garbage collection
        raise AssertionError(f"gatehouse run did not start: {line!r}\n{err[-3000:]}")
    return proc, line.rsplit(" ", 1)[-1].strip()


async def _stop(proc: asyncio.subprocess.Process) -> str:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    _out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    return err.decode()


Send = Callable[[aiohttp.ClientSession, list[str], int, int], Awaitable[None]]
"""Posts chat c's message m to every process (the URLs in a chat-dependent order)."""


async def _each_answered_once_in_order(
    tmp_path: Path, config_text: str, send: Send, answered_by_chat: Callable[[], dict[str, list[str]]]
) -> None:
    """Start two processes, send every chat's messages to both, wait for the answers and check
    each chat got each of its messages answered exactly once, in order."""
    config = tmp_path / "gatehouse.toml"
    config.write_text(config_text, encoding="utf-8")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    started = await asyncio.gather(
        _start(config, tmp_path / "a"), _start(config, tmp_path / "b"), return_exceptions=True
    )
    procs = [one for one in started if not isinstance(one, BaseException)]
    if len(procs) < len(started):  # one did not start: stop the other, say why
        for proc, _url in procs:
            await _stop(proc)
        raise next(one for one in started if isinstance(one, BaseException))
    urls = [url for _proc, url in procs]
    answered: dict[str, list[str]] = {}
    try:
        async with aiohttp.ClientSession() as http:

            async def chat(c: int) -> None:
                for m in range(PER_CHAT):
                    await send(http, urls if (c + m) % 2 else urls[::-1], c, m)

            await asyncio.gather(*(chat(c) for c in range(CHATS)))
            for _ in range(300):
                answered = answered_by_chat()
                if sum(len(v) for v in answered.values()) >= CHATS * PER_CHAT:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)  # a double answer would arrive now
            answered = answered_by_chat()
    finally:
        errors = [await _stop(proc) for proc, _url in procs]
    assert len(answered) == CHATS, errors
    for messages in answered.values():
        name = messages[0].split("-")[0]
        assert messages == [f"{name}-m{m}" for m in range(PER_CHAT)], errors
    assert all(proc.returncode == 0 for proc, _url in procs), errors


def _marks_by_chat(calls: list[dict[str, Any]], chat_field: str) -> dict[str, list[str]]:
    """The message marks each chat's replies answered, in the order they were sent."""
    chats: dict[str, list[str]] = defaultdict(list)
    for call in calls:
        chats[str(call[chat_field])].extend(_MARK.findall(str(call.get("text", ""))))
    return chats


def _config(database: str, llm: FakeOpenAI, channel: str) -> str:
    return (
        f'[gateway]\ndata_dir = "data"\ndatabase_url = "{database}"\n[web]\nport = 0\n'
        "[memory]\nembeddings = false\n"
        f'[llm]\nbase_url = "{llm.base_url}"\napi_key = "x"\nmodel = "fake-model"\n'
        f"stream = false\n{channel}"
    )


async def test_two_processes_answer_each_message_once_in_order(
    tmp_path: Path, fake_llm: FakeOpenAI, postgres: ThrowawayPostgres
) -> None:
    fake_llm.default = _answer_all_pending
    async with FakeTelegram() as tg:
        channel = (
            f'[channels.telegram]\nenabled = true\ntoken = "{tg.token}"\n'
            f'base_url = "{tg.base_url}"\nmode = "webhook"\n'
            f'webhook_url = "https://bot.example/telegram/webhook"\n'
            f'webhook_secret = "{SECRET}"\ndm_policy = "open"\n'
        )

        async def send(http: aiohttp.ClientSession, urls: list[str], c: int, m: int) -> None:
            update = tg.private_message(5000 + c, f"c{c}-m{m}", enqueue=False)

            async def post(url: str) -> int:
                async with http.post(
                    f"{url}/telegram/webhook", json=update,
                    headers={"X-Telegram-Bot-Api-Secret-Token": SECRET},
                ) as resp:
                    return resp.status

            # Both processes get it, in either order: a redelivery through the LB.
            assert await asyncio.gather(*(post(url) for url in urls)) == [200, 200]

        await _each_answered_once_in_order(
            tmp_path, _config(postgres.new_database(), fake_llm, channel), send,
            lambda: _marks_by_chat(tg.calls_to("sendMessage"), "chat_id"),
        )


async def test_two_processes_on_slack_http_answer_each_message_once_in_order(
    tmp_path: Path, fake_llm: FakeOpenAI, postgres: ThrowawayPostgres
) -> None:
    fake_llm.default = _answer_all_pending
    async with FakeSlack() as slack:
        channel = (
            f'[channels.slack]\nenabled = true\nmode = "http"\nbot_token = "xoxb-scale"\n'
            f'signing_secret = "{SLACK_SIGNING_SECRET}"\nbase_url = "{slack.api_url}"\n'
            f'dm_policy = "open"\n'
        )

        async def send(http: aiohttp.ClientSession, urls: list[str], c: int, m: int) -> None:
            event = im_message(f"c{c}-m{m}", user=f"U{c:08d}", channel=f"D{c:08d}")
            body = json.dumps(event_callback(event))

            async def post(url: str, retry: bool) -> int:
                headers = signed_headers(SLACK_SIGNING_SECRET, body)
                if retry:  # what Slack adds when it sends an event again
                    headers |= {"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "timeout"}
                async with http.post(f"{url}/slack/events", data=body, headers=headers) as resp:
                    return resp.status

            statuses = await asyncio.gather(post(urls[0], False), post(urls[1], True))
            assert list(statuses) == [200, 200]

        await _each_answered_once_in_order(
            tmp_path, _config(postgres.new_database(), fake_llm, channel), send,
            lambda: _marks_by_chat(slack.calls_to("chat.postMessage"), "channel"),
        )


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
    from gateway.tools.registry import ToolContext

    database = postgres.new_database()
    async with FakeTelegram() as tg:
        config = tmp_path / "gatehouse.toml"
        config.write_text(
            f'[gateway]\ndata_dir = "data"\ndatabase_url = "{database}"\n[web]\nport = 0\n'
            "[memory]\nembeddings = false\n"
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


async def test_two_processes_split_discord_shards_and_answer_each_message_once(
    tmp_path: Path, fake_llm: FakeOpenAI, postgres: ThrowawayPostgres
) -> None:
    """Process a runs shard 0 (which gets DMs), process b shard 1 (which has the guild)."""
    fake_llm.default = _answer_all_pending
    database = postgres.new_database()
    async with FakeDiscord(shard_count=2, guild_shard=1) as fake:
        procs = []
        for shard, name in enumerate("ab"):
            channel = (
                f'[channels.discord]\nenabled = true\ntoken = "{fake.token}"\n'
                f'api_base_url = "{fake.api_base_url}"\ngateway_url = "{fake.gateway_url}"\n'
                f'dm_policy = "open"\nshard_count = 2\nshard_ids = [{shard}]\n'
            )
            config = tmp_path / f"{name}.toml"
            config.write_text(_config(database, fake_llm, channel), encoding="utf-8")
            (tmp_path / name).mkdir()
            procs.append(await _start(config, tmp_path / name))
        users = [fake.user(str(10**18 + c), f"user{c}") for c in range(CHATS)]

        def answered() -> dict[str, list[str]]:
            chats: dict[str, list[str]] = defaultdict(list)
            for call in fake.calls_to("POST", "/channels/"):
                if call.path.endswith("/messages") and call.status == 200:
                    content = str((call.json or {}).get("content", ""))
                    chats[call.path.split("/")[2]].extend(_MARK.findall(content))
            return chats

        try:
            await _wait_for_identifies(fake, 2)
            for m in range(PER_CHAT):
                for c, user in enumerate(users):
                    fake.dm_message(f"c{c}-m{m}", author=user)
                    fake.guild_message(f"c{GUILD + c}-m{m}", author=user, mention=True)
            for _ in range(300):
                if sum(len(v) for v in answered().values()) >= 2 * CHATS * PER_CHAT:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.5)  # a double answer would arrive now
        finally:
            errors = [await _stop(proc) for proc, _url in procs]
        chats = answered()
        guild = chats.pop(fake.text_channel_id, [])
        assert len(guild) == CHATS * PER_CHAT, errors  # all of them, once each
        for c in range(GUILD, GUILD + CHATS):  # each sender's guild messages in the order sent
            mine = [mark for mark in guild if mark.startswith(f"c{c}-")]
            assert mine == [f"c{c}-m{m}" for m in range(PER_CHAT)], errors
        assert len(chats) == CHATS, errors
        for messages in chats.values():
            name = messages[0].split("-")[0]
            assert messages == [f"{name}-m{m}" for m in range(PER_CHAT)], errors
        assert sorted(i["shard"] for i in fake.identifies) == [[0, 2], [1, 2]]
        assert all(proc.returncode == 0 for proc, _url in procs), errors


async def _wait_for_identifies(fake: FakeDiscord, n: int) -> None:
    for _ in range(300):
        if len(fake.identifies) >= n:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{len(fake.identifies)} of {n} shards identified")
