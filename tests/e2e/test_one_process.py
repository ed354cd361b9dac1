"""One process per SQLite data directory (gateway/cli/pidfiles.py, the run lock): a second
`gatehouse run`, or a `gatehouse chat`, on the data directory a `gatehouse run` serves is
refused with one line naming its pid (before, both ran and every message was answered twice),
while the commands that read or operate keep working next to it; the lock dies with its holder,
kill -9 included. PostgreSQL keeps allowing several processes (tests/e2e/test_scale_out.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from tests.fakes import FakeOpenAI, Reply, last_user_text
from tests.helpers.cli import run_cli, start_run, stop_run, write_config


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def answer(body: dict[str, Any]) -> Reply:
    return Reply(f"re: {last_user_text(body)}")


async def test_a_second_run_or_a_chat_on_the_same_sqlite_data_dir_is_refused(
    tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    fake_llm.default = answer
    config = write_config(tmp_path, fake_llm)
    first, url = await start_run(config)
    try:
        code, out, err = await run_cli("--config", str(config), "run", cwd=tmp_path)
        assert code == 1 and "listening" not in out
        line = one_line(err)
        assert f"gatehouse run (pid {first.pid}) already runs on {tmp_path / 'data'}" in line
        assert "stop it first" in line and "PostgreSQL" in line

        code, out, err = await run_cli(
            "--config", str(config), "chat", "-m", "hello?", cwd=tmp_path
        )
        assert code == 1 and out == ""
        assert f"(pid {first.pid})" in one_line(err) and "web page" in err
        assert fake_llm.requests == [], "neither answered anything"

        async with aiohttp.ClientSession() as http:

            async def ask(n: int) -> list[str]:
                async with http.post(
                    f"{url}/api/messages", json={"user_id": f"user{n}", "text": f"q{n}"}
                ) as resp:
                    assert resp.status == 200, await resp.text()
                    replies: list[str] = (await resp.json())["replies"]
                    return replies

            replies = await asyncio.gather(*(ask(n) for n in range(12)))
        assert sorted(r for rs in replies for r in rs) == sorted(f"re: q{n}" for n in range(12))
        assert len(fake_llm.requests) == 12

        code, out, err = await run_cli("--config", str(config), "sessions", "list", cwd=tmp_path)
        assert code == 0 and "user11" in out, err  # reads and operations work next to it
        code, out, err = await run_cli("--config", str(config), "outbox", "list", cwd=tmp_path)
        assert code == 0, err
    finally:
        assert await stop_run(first) == 0


async def test_the_lock_dies_with_its_holder_even_on_kill_9(
    tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    config = write_config(tmp_path, fake_llm)
    killed, _url = await start_run(config)
    killed.kill()
    await killed.wait()
    again, _url = await start_run(config)  # nothing stale left to refuse it
    assert await stop_run(again) == 0
    code, _out, err = await run_cli("--config", str(config), "chat", "-m", "hi", cwd=tmp_path)
    assert code == 0, err


async def test_one_database_file_shared_by_two_data_dirs_is_one_process_too(
    tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    """The lock beside a database file kept outside the data directory."""
    shared = tmp_path / "shared" / "gatehouse.db"
    configs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        configs.append(write_config(tmp_path / name, fake_llm))
        text = configs[-1].read_text().replace(
            '[gateway]\n', f'[gateway]\ndatabase_url = "sqlite:///{shared}"\n'
        )
        configs[-1].write_text(text)
    first, _url = await start_run(configs[0])
    try:
        code, _out, err = await run_cli("--config", str(configs[1]), "run", cwd=tmp_path / "b")
        assert code == 1
        assert f"gatehouse run (pid {first.pid}) already runs on {shared} " in one_line(err)
    finally:
        assert await stop_run(first) == 0
