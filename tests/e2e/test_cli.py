"""The real `gatehouse` command as a subprocess, talking to a fake OpenAI server over a socket."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import aiohttp
import pytest

from tests.fakes import FakeOpenAI, reply
from tests.helpers.cli import GATEHOUSE, env, in_process, run_cli, write_config


async def test_run_serves_webchat_and_stops_cleanly(tmp_path: Path, fake_llm: FakeOpenAI) -> None:
    config = write_config(tmp_path, fake_llm, embeddings=True)  # stops cleanly while warming
    fake_llm.script(reply("hello from the agent"))
    proc = await asyncio.create_subprocess_exec(
        GATEHOUSE, "--config", str(config), "run", cwd=tmp_path, env=env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=30)).decode()
        assert line.startswith("gatehouse listening on http://127.0.0.1:"), line
        url = line.split(" on ", 1)[1].strip()
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{url}/api/messages", json={"user_id": "alice", "text": "hi"}
            ) as resp:
                assert resp.status == 200
                body = await resp.json()
            async with http.get(f"{url}/") as resp:
                assert "Gatehouse" in await resp.text()
        assert body == {
            "session_key": "agent:main:webchat:direct:alice",
            "replies": ["hello from the agent"],
        }
        assert fake_llm.request_headers[-1]["authorization"] == "Bearer sk-test"
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 0, err.decode()
    assert "stopped" in err.decode()


async def test_chat_message_prints_the_reply(tmp_path: Path, fake_llm: FakeOpenAI) -> None:
    write_config(tmp_path, fake_llm)
    fake_llm.script(reply("pong"))
    code, out, err = await run_cli("chat", "-m", "ping", "--user", "bob", cwd=tmp_path)
    assert code == 0, err
    assert out.strip() == "pong"
    code, out, _ = await run_cli(
        "sessions", "show", "agent:main:console:direct:bob", "--json", cwd=tmp_path
    )
    assert code == 0
    shown = json.loads(out)
    assert [(m["role"], m["content"]) for m in shown["messages"]] == [
        ("user", "ping"), ("assistant", "pong"),
    ]


async def test_chat_without_endpoint_says_how_to_configure(tmp_path: Path) -> None:
    # local_model = false: the same answer a gateway without the `local` extra gives.
    write_config(tmp_path, None, extra="[llm]\nlocal_model = false\n")
    code, out, _ = await run_cli("chat", "-m", "hello", cwd=tmp_path)
    assert code == 0
    assert "No LLM endpoint is configured" in out
    assert "[llm] base_url" in out


async def test_config_typo_is_a_precise_error(tmp_path: Path) -> None:
    write_config(tmp_path, None, extra="[sessions]\ndm_scop = 'main'\n")
    code, _out, err = await run_cli("chat", "-m", "hi", cwd=tmp_path)
    assert code == 2
    assert "sessions.dm_scop: unknown key" in err
    assert "gatehouse.toml" in err


async def test_init_writes_config_and_workspace(tmp_path: Path) -> None:
    code, out, err = await run_cli("init", "--dir", "site", cwd=tmp_path)
    assert code == 0, err
    site = tmp_path / "site"
    assert (site / "gatehouse.toml").exists()
    agents = (site / "data" / "workspace" / "AGENTS.md").read_text()
    assert "## Session Startup" in agents and "## Red Lines" in agents
    assert (site / "data" / "workspace" / "memory").is_dir()
    code, out, _ = await run_cli("init", "--dir", "site", cwd=tmp_path)
    assert "already exists" in out


async def test_db_current_and_upgrade(tmp_path: Path) -> None:
    config = str(write_config(tmp_path, None))
    code, out, _err = await run_cli("--config", config, "db", "current", cwd=tmp_path)
    assert code == 1 and "no database yet" in out
    code, out, err = await run_cli("--config", config, "db", "upgrade", cwd=tmp_path)
    assert code == 0, err
    assert "created the tables at revision" in out
    code, out, err = await run_cli("--config", config, "db", "current", cwd=tmp_path)
    assert code == 0, err
    assert "(up to date)" in " ".join(out.split())


async def test_with_the_bundled_model_explain_shows_its_window_not_the_default_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make run` answers with the bundled offline model when no [llm] is configured; the CLI
    explains limits (and counts tokens) for that model too, not for `[llm] model`'s default."""
    import gateway.model.local_model as local_model
    from gateway.config import load_config
    from gateway.store import SessionInfo, Store

    path = write_config(tmp_path, None)
    key = "agent:main:webchat:direct:ann"
    store = Store(load_config(path).database_url)
    await store.init()
    await store.ensure_session(SessionInfo(key=key, platform="webchat", chat_id="ann"))
    await store.close()

    # No bundled model installed (as after `make test` alone; `make run` installs one).
    monkeypatch.setattr(local_model, "server_installed", lambda: False)
    code, out, err = await in_process(path, "context", "explain", key, "--json", "--offline")
    assert code == 0, err
    assert json.loads(out)["model"] == "gpt-4o-mini"  # no bundled model installed: the default

    monkeypatch.setattr(local_model, "server_installed", lambda: True)
    monkeypatch.setattr(local_model, "find_bundled_model", lambda: tmp_path / "model.gguf")
    code, out, err = await in_process(path, "context", "explain", key, "--json", "--offline")
    assert code == 0, err
    facts = json.loads(out)
    assert facts["model"] == local_model.MODEL_ALIAS
    assert facts["window"] == local_model.CONTEXT_TOKENS
    assert facts["window_source"].startswith("the bundled offline model")
    code, out, err = await in_process(path, "sessions", "list", "--json")
    assert code == 0, err
    assert json.loads(out)[0]["window"] == local_model.CONTEXT_TOKENS
