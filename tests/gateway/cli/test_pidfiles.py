"""Pid files and the SQLite run lock (gateway/cli/pidfiles.py), on real files and processes:
the lock refuses a second holder and names the first, only on SQLite; a pid file keeps its size
while it is rewritten (a fault is recorded on a full disk), is read back by `doctor` as the
database health of a live gateway, and one of a dead process is removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli.pidfiles import (
    RECORD_BYTES,
    AlreadyRunning,
    gateway_records,
    pid_file,
    pids_dir,
    run_lock,
    running_gateways,
)
from gateway.config import Config, parse_config
from gateway.doctor import check_running
from gateway.store.faults import StorageHealth


def config(tmp_path: Path, **gateway: str) -> Config:
    return parse_config({"gateway": {"data_dir": str(tmp_path / "data"), **gateway}}, "test")


@pytest.fixture
def a_gateway() -> Iterator[int]:
    """The pid of a live process that looks like a gatehouse (its command line says so)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; print(flush=True); time.sleep(60)",
         "gatehouse-run-stand-in"],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # it runs (its command line is there once it has exec'd)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_the_run_lock_refuses_a_second_holder_and_names_the_first(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    with run_lock(cfg, "run"):
        with pytest.raises(AlreadyRunning) as refused, run_lock(cfg, "chat"):
            pass
        text = str(refused.value)
        assert f"gatehouse run (pid {os.getpid()}) already runs on {cfg.data_dir}" in text
        assert "chat through its web page or stop it first" in text
    with run_lock(cfg, "chat"):  # released with its holder
        pass
    assert (cfg.data_dir / "gatehouse.lock").exists(), "the lock file stays"


def test_postgresql_takes_no_run_lock(tmp_path: Path) -> None:
    cfg = config(tmp_path, database_url="postgresql://gh:pw@127.0.0.1:9/gatehouse")
    with run_lock(cfg, "run"), run_lock(cfg, "run"):
        pass
    assert not (cfg.data_dir / "gatehouse.lock").exists()


def test_a_pid_file_is_rewritten_in_place_and_read_as_a_gateways_health(
    tmp_path: Path, a_gateway: int
) -> None:
    data = tmp_path / "data"
    with pid_file(data) as record:
        before = os.stat(record.path)
        health = StorageHealth()
        health.failed("cannot write data/gatehouse.db: the disk is full; free some space on it")
        record.update(storage=health.as_dict(), url="http://127.0.0.1:8787")
        record.update(storage={**health.as_dict(), "failing": "x" * 10_000})  # cut to fit
        after = os.stat(record.path)
        assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size) == (
            before.st_ino, RECORD_BYTES,
        )
        mine = record.path.read_text()
    # Another gateway's file (a live process), and a dead one's, which goes.
    own = pids_dir(data) / f"{a_gateway}.pid"
    own.write_text(mine.replace(f'"pid": {os.getpid()}', f'"pid": {a_gateway}'))
    (pids_dir(data) / "999999999.pid").write_text("999999999\n")  # a bare pid, long dead
    [found] = gateway_records(data)
    assert found["pid"] == a_gateway and found["url"] == "http://127.0.0.1:8787"
    assert StorageHealth.from_dict(found["storage"]).failing == "x" * 400
    assert running_gateways(data) == [a_gateway]
    assert not (pids_dir(data) / "999999999.pid").exists()


def test_doctor_shows_each_gateways_database_health(tmp_path: Path, a_gateway: int) -> None:
    cfg = config(tmp_path)
    path = pids_dir(cfg.data_dir) / f"{a_gateway}.pid"
    path.parent.mkdir(parents=True)
    health = StorageHealth()

    def written() -> None:
        path.write_text(f'{{"pid": {a_gateway}, "started": "2025-03-01T12:00:00+00:00", '
                        f'"storage": {json.dumps(health.as_dict())}}}')

    written()
    [row] = check_running(cfg)
    assert (row.name, row.status) == ("gateway", "ready")
    assert f"gatehouse run (pid {a_gateway}) since 2025-03-01T12:00:00+00:00" in row.detail
    health.failed("cannot write data/gatehouse.db: the disk is full; free some space on it")
    written()
    [row] = check_running(cfg)
    assert row.status == "problem" and "the disk is full" in row.detail
    assert "answers the waiting messages once a write succeeds" in row.fix
    health.recovered()
    written()
    [row] = check_running(cfg)
    assert row.status == "warning" and "works again since" in row.detail
