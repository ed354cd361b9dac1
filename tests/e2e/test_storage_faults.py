"""Issue 20, item 6: storage faults are one line naming the file and what to do (exit code 2),
never a traceback: a config path that is a directory, a data directory that cannot be written,
a database file that is not a database, a database with damaged pages (which `run` refuses at
start and `doctor` says how to recover), a PostgreSQL server that does not answer. A running
gateway whose database fails says so on `/healthz`.

Under a running `gatehouse run`: a disk that fills up (a real tmpfs, `tests/helpers/storage.py`)
is a 503 for the waiting request, the message waits and is answered once space returns, and
`doctor` says what happened; a database file deleted while it runs turns `/healthz` 503, stops
the turns and leaves the open copy beside the path, from which a restart gets every session
back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.app import Gateway
from gateway.config import load_config
from gateway.web.server import WebServer, build_app
from tests.conftest import RunningGateway
from tests.fakes import FakeOpenAI, Reply, last_user_text, reply
from tests.helpers.cli import GATEHOUSE, env, in_process, run_cli, start_run, stop_run, write_config
from tests.helpers.storage import cannot_mount_tmpfs, fill, in_small_filesystem, inside, seen_by


def config_file(tmp_path: Path, data_dir: str = "data", fake: FakeOpenAI | None = None) -> Path:
    llm = f'base_url = "{fake.base_url}"\napi_key = "sk-test"\nmodel = "m"\n' if fake else ""
    path = tmp_path / "gatehouse.toml"
    path.write_text(
        f'[gateway]\ndata_dir = "{data_dir}"\n[web]\nport = 0\n[llm]\nlocal_model = false\n{llm}',
        encoding="utf-8",
    )
    return path


def one_line(err: str) -> str:
    """The whole of stderr: one line, no traceback."""
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


async def populated(tmp_path: Path, fake_llm: FakeOpenAI) -> Path:
    """A real database: a few conversations through a gateway, then closed (WAL checkpointed)."""
    config = load_config(config_file(tmp_path, fake=fake_llm))
    gateway = Gateway(config)
    chat = RunningGateway(gateway)
    await gateway.start()
    try:
        for i in range(6):
            fake_llm.script(reply(f"answer {i}"))
            assert await chat.ask(f"question {i}", user=f"user{i % 3}") == [f"answer {i}"]
    finally:
        await gateway.stop()
    db = config.data_dir / "gatehouse.db"
    assert checkpointed(db)
    return db


def checkpointed(db: Path) -> bool:
    """Every page is in the file itself (none waits in the write-ahead log)."""
    wal = Path(f"{db}-wal")
    return not wal.exists() or wal.stat().st_size == 0


def damage_pages(db: Path, table: str = "messages") -> list[int]:
    """Overwrite, in place, the pages of the table's indexes (pages in the middle of the file):
    a torn write or a bad disk. Opening the file and reading the table still work."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
        pages = [int(p) for (p,) in conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE type = 'index' AND tbl_name = ?", (table,)
        )]
        total = int(conn.execute("PRAGMA page_count").fetchone()[0])
    assert pages and all(1 < p < total for p in pages)
    with db.open("r+b") as f:
        for page in pages:
            f.seek((page - 1) * page_size)
            f.write(b"\xff" * page_size)
    return pages


@contextlib.contextmanager
def unwritable(directory: Path) -> Iterator[None]:
    """The directory can be read but nothing in it created (root ignores modes: chattr +i)."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(0o755)
        return
    done = subprocess.run(["chattr", "+i", str(directory)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot make a directory read-only as root here: {done.stderr.decode()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)


async def test_a_config_path_that_is_a_directory(tmp_path: Path) -> None:
    folder = tmp_path / "conf.d"
    folder.mkdir()
    code, _out, err = await run_cli("--config", str(folder), "sessions", "list", cwd=tmp_path)
    assert code == 2
    line = one_line(err)
    assert str(folder) in line and "is a directory" in line


async def test_a_data_dir_below_a_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a directory")
    config = config_file(tmp_path, data_dir="afile/data")
    code, _out, err = await in_process(config, "sessions", "list")
    assert code == 2
    line = one_line(err)
    assert str(tmp_path / "afile") in line and "[gateway] data_dir" in line


async def test_a_data_dir_that_cannot_be_written(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    config = config_file(tmp_path)
    with unwritable(data):
        code, _out, err = await run_cli("--config", str(config), "sessions", "list", cwd=tmp_path)
    assert code == 2
    line = one_line(err)
    assert str(data) in line and "write access" in line


async def test_an_existing_database_in_a_data_dir_that_cannot_be_written(
    tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    db = await populated(tmp_path, fake_llm)
    config = tmp_path / "gatehouse.toml"
    with unwritable(db.parent):
        code, _out, err = await in_process(config, "pairing", "list")
    assert code == 2
    line = one_line(err)
    assert str(db.parent) in line and "write access" in line


@pytest.mark.parametrize("command", [("run",), ("sessions", "list")])
async def test_a_database_file_that_is_not_a_database(tmp_path: Path, command: tuple[str]) -> None:
    config = config_file(tmp_path)
    db = tmp_path / "data" / "gatehouse.db"
    db.parent.mkdir()
    db.write_bytes(b"these are my notes, not a database\n" * 200)
    code, _out, err = await run_cli("--config", str(config), *command, cwd=tmp_path)
    assert code == 2
    line = one_line(err)
    assert str(db) in line and "not a SQLite database" in line


async def test_run_refuses_a_damaged_database_and_doctor_says_how_to_recover(
    tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    db = await populated(tmp_path, fake_llm)
    damage_pages(db)
    config = tmp_path / "gatehouse.toml"
    code, out, err = await run_cli("--config", str(config), "run", cwd=tmp_path)
    assert code == 2
    assert "listening" not in out
    line = one_line(err)
    assert str(db) in line and "damaged" in line and ".recover" in line

    code, out, _err = await in_process(config, "doctor", "--json")
    assert code == 1
    [check] = [c for c in json.loads(out)["checks"] if c["name"] == "database"]
    assert check["status"] == "problem"
    assert str(db) in check["detail"] and "damaged" in check["detail"]
    assert "backup" in check["fix"]
    assert f'sqlite3 {db} ".recover" | sqlite3 ' in check["fix"]


async def test_healthz_says_the_database_fails_once_a_write_failed(
    tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    db = await populated(tmp_path, fake_llm)
    damage_pages(db)
    # A gateway already running when its pages went bad (`run` itself refuses to start).
    gateway = Gateway(load_config(tmp_path / "gatehouse.toml"))
    chat = RunningGateway(gateway)
    await gateway.start()
    server = WebServer(build_app(gateway, chat.webchat), "127.0.0.1", 0)
    url = await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/healthz") as resp:
                assert resp.status == 200
                assert (await resp.json())["database"] == "ok"
            async with http.post(
                f"{url}/api/messages", json={"user_id": "newcomer", "text": "hello?"}
            ) as resp:
                assert resp.status == 503  # not stored, said so: no 500, no traceback
                assert "the database is failing" in (await resp.json())["error"]
            async with http.get(f"{url}/healthz") as resp:
                assert resp.status == 503
                body = await resp.json()
    finally:
        await server.stop()
        await gateway.stop()
    assert body["status"] == "failing"
    assert body["database"].startswith("failing: ")
    assert str(db) in body["database"] and "damaged" in body["database"]


async def test_a_postgresql_server_that_does_not_answer(tmp_path: Path) -> None:
    config = config_file(tmp_path)
    config.write_text(config.read_text().replace(
        "[gateway]\n",
        '[gateway]\ndatabase_url = "postgresql://gh:PgSecretPw1@127.0.0.1:9/gatehouse"\n',
    ))
    code, _out, err = await in_process(config, "sessions", "list")
    assert code == 2
    line = one_line(err)
    assert "postgresql://gh:***@127.0.0.1:9/gatehouse" in line and "PgSecretPw1" not in line


BIG = "y" * 1_500_000
"""A reply larger than what the full disk has left."""


async def post(url: str, user: str, text: str, message_id: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.post(
        f"{url}/api/messages", json={"user_id": user, "text": text, "message_id": message_id}
    ) as resp:
        return resp.status, await resp.json()


async def health(url: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/healthz") as resp:
        return resp.status, await resp.json()


async def doctor_row(prefix: list[str], config: Path) -> dict[str, Any]:
    """`gatehouse doctor --json`'s row for the running gateway (run with `prefix`)."""
    proc = await asyncio.create_subprocess_exec(
        *prefix, GATEHOUSE, "--config", str(config), "doctor", "--json", env=env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    rows = [c for c in json.loads(out)["checks"] if c["name"] == "gateway"]
    assert len(rows) == 1, (out, err)
    return rows[0]


async def test_a_full_disk_is_a_503_then_the_message_is_answered_once_space_returns(
    tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    why = cannot_mount_tmpfs(data)
    if why is not None:
        pytest.skip(why)  # tests/gateway/turn/test_storage.py: SQLite's own "disk is full"
    asked, release = asyncio.Event(), asyncio.Event()

    async def answer(body: dict[str, Any]) -> Reply:
        text = last_user_text(body)
        if text == "the long one":
            asked.set()
            async with asyncio.timeout(30):
                await release.wait()
            return Reply(BIG)
        return Reply(f"re: {text}")

    fake_llm.default = answer
    config = write_config(tmp_path, fake_llm)
    proc, url = await start_run(config, argv=in_small_filesystem(data, 8))
    filler = seen_by(proc.pid, data / "filler")
    try:
        assert await post(url, "alice", "hello", "m1") == (200, {
            "session_key": "agent:main:webchat:direct:alice", "replies": ["re: hello"],
        })
        waiting = asyncio.create_task(post(url, "alice", "the long one", "m2"))
        async with asyncio.timeout(10):
            await asked.wait()  # stored and claimed: the model is on it
        assert await fill(filler) > 0
        release.set()
        began = time.monotonic()
        status, body = await asyncio.wait_for(waiting, 30)
        assert status == 503 and time.monotonic() - began < 5, body
        assert body["error"].startswith("the database is failing: the reply could not be stored")
        assert "disk is full" in body["error"] and body["pending"] is True
        status, body = await health(url)
        assert status == 503 and "disk is full" in body["database"], body
        row = await doctor_row(inside(proc.pid, tmp_path), config)
        assert row["status"] == "problem" and "disk is full" in row["detail"], row
        assert "answers the waiting messages once a write succeeds" in row["fix"]

        filler.unlink()  # space returns; nobody writes again
        async with asyncio.timeout(30):
            while (status := (await health(url))[0]) != 200:  # noqa: ASYNC110
                await asyncio.sleep(0.2)
        status, body = await post(url, "alice", "the long one", "m2")  # the stored reply
        assert (status, body["replies"]) == (200, [BIG])
        assert len([b for b in fake_llm.requests if last_user_text(b) == "the long one"]) == 1
        row = await doctor_row(inside(proc.pid, tmp_path), config)
        assert row["status"] == "warning" and "works again since" in row["detail"], row
    finally:
        code = await stop_run(proc)
    logged = (tmp_path / "gatehouse.log").read_text()
    assert code == 0 and "Traceback" not in logged, logged[-3000:]
    assert logged.count("could not store the turn of agent:main:webchat:direct:alice") == 1


async def test_a_database_deleted_while_running_stops_the_turns_and_keeps_a_copy(
    tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    fake_llm.default = lambda body: Reply(f"re: {last_user_text(body)}")
    config = write_config(tmp_path, fake_llm)
    data = tmp_path / "data"
    proc, url = await start_run(config)
    try:
        for user in ("alice", "bob"):
            assert (await post(url, user, "hello", f"{user}-1"))[0] == 200
        for path in data.glob("gatehouse.db*"):  # `rm data/gatehouse.db*`
            path.unlink()
        async with asyncio.timeout(5):  # noticed within a second, even with nothing written
            while "was deleted while" not in (tmp_path / "gatehouse.log").read_text():  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        status, body = await health(url)
        assert status == 503, body
        assert body["database"].startswith(f"failing: {data / 'gatehouse.db'} was deleted while")
        status, body = await post(url, "carol", "anyone there?", "carol-1")
        assert status == 503 and "the database is failing" in body["error"], body
        assert len(fake_llm.requests) == 2, "no turn after the file was gone"
        row = await doctor_row([], config)
        assert row["status"] == "problem" and "was deleted" in row["detail"], row
        [rescued] = data.glob("gatehouse.db.rescued-*")
    finally:
        code = await stop_run(proc)
    logged = (tmp_path / "gatehouse.log").read_text()
    assert code == 0 and "Traceback" not in logged, logged[-3000:]
    [line] = [line for line in logged.splitlines() if "gateway.store.engine: " in line]
    assert f"move {rescued.name} (what it had open) to {data / 'gatehouse.db'}" in line

    rescued.replace(data / "gatehouse.db")  # what the line says to do
    code, out, err = await run_cli("--config", str(config), "sessions", "list", cwd=tmp_path)
    assert code == 0 and "alice" in out and "bob" in out, err
