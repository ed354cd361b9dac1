"""Issue 23, item 9: a real `gatehouse run` reloads history limits and access lists on SIGHUP
(`gatehouse reload`) without dropping the turn in flight; an invalid config on reload keeps the
running one. The fake model's received messages show the history limit each turn had."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fakes import FakeOpenAI, Reply, last_user_text
from tests.helpers.cli import GATEHOUSE, env, invoke, run_cli, write_config

LIMIT = '[channels.webchat]\ndm_history_limit = {}\n'


class Gateway:
    """`gatehouse run --config FILE` (the option after the command) as a subprocess."""

    def __init__(self, proc: asyncio.subprocess.Process, url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    async def ask(self, user: str, text: str) -> list[str]:
        async with aiohttp.ClientSession() as http, http.post(
            f"{self.url}/api/messages", json={"user_id": user, "text": text}
        ) as resp:
            assert resp.status == 200, await resp.text()
            replies: list[str] = (await resp.json())["replies"]
            return replies

    def logged(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    async def wait_logged(self, needle: str, seconds: float = 15) -> None:
        deadline = time.monotonic() + seconds
        while needle not in self.logged():
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} not logged:\n{self.logged()[-3000:]}")
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def gateway(config: Path) -> AsyncIterator[Gateway]:
    log = config.parent / "gatehouse.log"
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            GATEHOUSE, "run", "--config", str(config), cwd=config.parent, env=env(),
            stdout=asyncio.subprocess.PIPE, stderr=err,
        )
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), timeout=60)).decode()
    assert line.startswith("gatehouse listening on"), log.read_text()
    running = Gateway(proc, line.split(" on ", 1)[1].strip(), log)
    try:
        yield running
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), timeout=30)
    assert proc.returncode == 0, log.read_text()


def user_messages(body: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in body["messages"] if m["role"] == "user"]


def request_for(fake: FakeOpenAI, text: str) -> dict[str, Any]:
    """The last chat request whose latest user message is `text`."""
    return [b for b in fake.requests if last_user_text(b) == text][-1]


@pytest.fixture
def held(fake_llm: FakeOpenAI) -> asyncio.Event:
    """The fake model answers "slow" only once the event is set (a turn held in flight); any
    other message at once."""
    release = asyncio.Event()

    async def answer(body: dict[str, Any]) -> Reply:
        text = last_user_text(body)
        if text == "slow":
            await release.wait()
        return Reply(f"re: {text}")

    fake_llm.default = answer
    return release


async def test_sighup_reload_changes_the_next_turns_history_limit_while_a_turn_is_in_flight(
    tmp_path: Path, fake_llm: FakeOpenAI, held: asyncio.Event
) -> None:
    config = write_config(tmp_path, fake_llm, LIMIT.format(4))
    async with gateway(config) as gw:
        pids = list((tmp_path / "data" / "pids").glob("*.pid"))
        assert [p.name for p in pids] == [f"{gw.proc.pid}.pid"]
        for n in range(1, 7):
            assert await gw.ask("alice", f"m{n}") == [f"re: m{n}"]
        assert user_messages(request_for(fake_llm, "m6")) == ["m2", "m3", "m4", "m5", "m6"]

        in_flight = asyncio.create_task(gw.ask("bob", "slow"))
        try:
            for _ in range(200):
                if any(last_user_text(b) == "slow" for b in fake_llm.requests):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("bob's turn never reached the model")

            config.write_text(
                config.read_text().replace("dm_history_limit = 4", "dm_history_limit = 2")
                + '[channels.telegram]\nallow_from = ["42"]\n', encoding="utf-8"
            )
            code, out, err = await run_cli("reload", "--config", str(config), cwd=tmp_path)
            assert code == 0, err
            assert f"pid {gw.proc.pid}" in out
            await gw.wait_logged("reload: history limits: webchat dm 4 → 2")
            assert "reload: access: telegram allow_from +42" in gw.logged()

            assert not in_flight.done(), "the turn in flight is still held by the model"
            assert await gw.ask("alice", "m7") == ["re: m7"]
            assert user_messages(request_for(fake_llm, "m7")) == ["m5", "m6", "m7"]

            held.set()
            assert await asyncio.wait_for(in_flight, 30) == ["re: slow"]
        finally:
            held.set()  # a failed step must not leave the turn held at shutdown
    assert not list((tmp_path / "data" / "pids").glob("*.pid")), "removed on a clean stop"


async def test_a_reload_with_an_invalid_config_keeps_the_running_one(
    tmp_path: Path, fake_llm: FakeOpenAI, held: asyncio.Event
) -> None:
    config = write_config(tmp_path, fake_llm, LIMIT.format(2))
    good = config.read_text()
    async with gateway(config) as gw:
        for n in range(1, 5):
            await gw.ask("alice", f"m{n}")
        assert user_messages(request_for(fake_llm, "m4")) == ["m2", "m3", "m4"]

        config.write_text(good.replace("dm_history_limit = 2", "dm_history_limit = -1"))
        code, _out, err = await run_cli("reload", "--config", str(config), cwd=tmp_path)
        assert code == 2, "refused before any signal"
        assert "channels.webchat.dm_history_limit" in err

        gw.proc.send_signal(signal.SIGHUP)  # the gateway reads the invalid file itself
        await gw.wait_logged("reload refused, the running config is kept")
        refused = [line for line in gw.logged().splitlines() if "gatehouse: reload" in line]
        assert len(refused) == 1, refused
        assert "channels.webchat.dm_history_limit" in refused[0]

        assert await gw.ask("alice", "m5") == ["re: m5"]
        assert user_messages(request_for(fake_llm, "m5")) == ["m3", "m4", "m5"]
        assert gw.proc.returncode is None

        config.write_text(good.replace("[web]\nport = 0", "[web]\nport = 0\nhost = \"::1\""))
        gw.proc.send_signal(signal.SIGHUP)
        await gw.wait_logged("reload: changed, needs a restart (the running values are kept): web.host")
        assert "reload: no change to history limits or access lists" in gw.logged()


async def test_reload_without_a_running_gateway_says_so(tmp_path: Path) -> None:
    config = write_config(tmp_path, None, "[llm]\nlocal_model = false\n")
    stale = tmp_path / "data" / "pids" / "999999999.pid"  # a process that died (kill -9)
    stale.parent.mkdir(parents=True)
    stale.write_text("999999999\n")
    code, _out, err = await invoke("reload", "--config", str(config))
    assert code == 1
    assert "no running gateway: no `gatehouse run` on" in err
    assert not stale.exists(), "a dead process's pid file is removed"
    assert os.getpid() != 999999999
