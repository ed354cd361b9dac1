"""One bundled-model server per data directory: a second process reuses the running one, a
reuser never stops it, a reuser takes over (same port) when the owner stops, and a record left
by an owner that died is ignored and its orphaned server ended. The owner is a real other
process (`tests.helpers.local_model_owner`) serving the fake llama server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.app import Gateway
from gateway.model.local_model import CONTEXT_TOKENS, LocalModelServer, bundled_model
from gateway.model.local_share import (
    STATE_NAME,
    ServerRecord,
    process_running,
    read_record,
    write_record,
)
from tests.conftest import MakeConfig, RunningGateway

FAKE_SERVER = "tests.fakes.fake_llama_server"
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _run_from_the_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m tests...` resolves from the working directory."""
    monkeypatch.chdir(ROOT)


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF not really")
    return path


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "data" / STATE_NAME


async def answers(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{url}/models") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


class Owner:
    """`gatehouse run` stand-in: another process that started (or reused) the shared server."""

    def __init__(self, proc: asyncio.subprocess.Process, url: str, reused: bool) -> None:
        self.proc, self.url, self.reused = proc, url, reused

    async def stop(self) -> None:
        """SIGTERM: it stops its server and removes its record, as `gatehouse run` does."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(self.proc.wait(), timeout=10)

    async def crash(self) -> None:
        self.proc.kill()
        await self.proc.wait()


@contextlib.asynccontextmanager
async def owner(gguf: Path, state: Path) -> AsyncIterator[Owner]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.helpers.local_model_owner",
        "--model", str(gguf), "--state", str(state),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=30)).decode()
        if not line.startswith("ready "):
            raise AssertionError(f"owner did not start: {line!r} "
                                 f"{(await proc.stderr.read()).decode()}")
        _ready, url, reused = line.split()
        yield Owner(proc, url, reused == "True")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def eventually(check: object, what: str, seconds: float = 15.0) -> None:
    """Poll `check` (an async callable returning bool) until it is true."""
    assert callable(check)
    for _ in range(int(seconds / 0.05)):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


def server(gguf: Path, state: Path, context_tokens: int = CONTEXT_TOKENS) -> LocalModelServer:
    return LocalModelServer(gguf, state.parent / "local-model.log", server_module=FAKE_SERVER,
                            state_path=state, watch_interval=0.1, context_tokens=context_tokens)


async def test_a_second_process_reuses_the_running_server_and_leaves_it_running(
    gguf: Path, state: Path
) -> None:
    async with owner(gguf, state) as first:
        assert not first.reused
        record = read_record(state)
        assert record is not None and record.owner_pid == first.proc.pid
        assert first.url == f"http://127.0.0.1:{record.port}/v1"

        second = server(gguf, state)
        assert await second.start() == first.url
        assert second.reused and second.process is None, "no second server was spawned"
        await second.stop()
        assert await answers(first.url), "a reuser does not stop the owner's server"
        assert read_record(state) == record, "nor touch its record"
        await first.stop()
    assert read_record(state) is None, "the owner removes its record when it stops"
    assert not await answers(first.url)


async def test_gatehouse_chat_talks_to_the_model_gatehouse_run_started(
    make_config: MakeConfig, gguf: Path
) -> None:
    """`bundled_model` (what `run` and `chat` go through) on one data directory."""
    run_config, chat_config = make_config(), make_config()
    assert run_config.data_dir == chat_config.data_dir
    async with bundled_model(run_config, lambda _t: None, model_path=gguf,
                             server_module=FAKE_SERVER) as running:
        assert running is not None and not running.reused
        async with bundled_model(chat_config, lambda _t: None, model_path=gguf,
                                 server_module=FAKE_SERVER) as chatting:
            assert chatting is not None and chatting.reused
            assert chat_config.llm.base_url == run_config.llm.base_url
            rg = RunningGateway(Gateway(chat_config))
            await rg.gateway.start()
            try:
                [reply] = await rg.ask("hello from chat")
            finally:
                await rg.gateway.stop()
            assert reply.endswith("you said: hello from chat")
        assert running.process is not None and running.process.returncode is None
        assert await answers(running.base_url), "chat leaving does not stop run's model"


async def test_when_the_owner_stops_a_reuser_starts_the_model_on_the_same_port(
    gguf: Path, state: Path
) -> None:
    reuser = server(gguf, state)
    try:
        async with owner(gguf, state) as first:
            assert await reuser.start() == first.url and reuser.reused
            await first.stop()

            async def took_over() -> bool:
                return not reuser.reused and await answers(first.url)

            await eventually(took_over, "the reuser serves the model again")
        assert reuser.base_url == first.url, "its [llm] base_url is still right"
        assert reuser.process is not None
        record = read_record(state)
        assert record is not None
        assert (record.owner_pid, record.server_pid) == (os.getpid(), reuser.process.pid)

        # Now the owner: a new process reuses it, and it restarts it if it dies.
        async with owner(gguf, state) as later:
            assert later.reused and later.url == first.url
            await later.stop()
        assert await answers(first.url)
    finally:
        await reuser.stop(grace=2)
    assert read_record(state) is None
    assert not await answers(first.url)


async def test_a_record_left_by_a_dead_owner_is_ignored_and_its_server_ended(
    gguf: Path, state: Path
) -> None:
    async with owner(gguf, state) as first:
        await first.crash()  # kill -9: no clean-up
    stale = read_record(state)
    assert stale is not None and stale.server_pid is not None
    assert await answers(first.url), "its server outlived it (a session of its own)"

    fresh = server(gguf, state)
    url = await fresh.start()
    try:
        assert not fresh.reused
        assert not process_running(stale.server_pid), "the orphaned server was ended"
        record = read_record(state)
        assert record is not None and record.owner_pid == os.getpid()
        assert await answers(url)
    finally:
        await fresh.stop(grace=2)


async def test_a_record_naming_a_dead_pid_or_garbage_is_ignored(
    gguf: Path, state: Path
) -> None:
    done = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await done.wait()  # its pid names no process now
    write_record(state, ServerRecord(
        port=1, owner_pid=done.pid, owner_started=None, server_pid=done.pid,
        model=str(gguf), alias="smollm2-135m-instruct", context_tokens=16_384,
    ))
    for garbage in (None, "{not json"):
        if garbage is not None:
            await asyncio.to_thread(state.write_text, garbage, encoding="utf-8")
        fresh = server(gguf, state)
        try:
            await fresh.start()
            assert not fresh.reused and fresh.port != 1
            record = read_record(state)
            assert record is not None and record.port == fresh.port
        finally:
            await fresh.stop(grace=2)
        assert read_record(state) is None


async def test_a_server_of_another_model_is_not_reused_nor_its_record_taken(
    gguf: Path, state: Path
) -> None:
    async with owner(gguf, state) as first:
        record = read_record(state)
        other = server(gguf, state, context_tokens=32_768)
        try:
            url = await other.start()
            assert not other.reused and url != first.url
            assert read_record(state) == record
        finally:
            await other.stop(grace=2)
        assert read_record(state) == record and await answers(first.url)
        await first.stop()


async def test_two_processes_starting_at_once_run_one_server(
    gguf: Path, state: Path
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        a, b = await asyncio.gather(  # the lock file makes one wait for the other's decision
            stack.enter_async_context(owner(gguf, state)),
            stack.enter_async_context(owner(gguf, state)),
        )
        assert a.url == b.url
        assert sorted([a.reused, b.reused]) == [False, True]
        await a.stop()
        await b.stop()
