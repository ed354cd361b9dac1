"""Which gatehouse processes run on a data directory: pid files, and the SQLite run lock.

**Pid files.** `gatehouse run` writes `<data_dir>/pids/<pid>.pid` once it is ready for SIGHUP
and removes it when it stops cleanly: `gatehouse reload` signals each process it names, and
`gatehouse doctor` reads what each one saw of its database (`ProcessRecord`: the storage fault
failing now, or the last one and when it cleared). One file per process, because several
`gatehouse run` processes may share a data directory (on PostgreSQL, see docs/scaling.md). A
file left behind by a process that died (kill -9) is recognised and removed: its process is
gone, or is no `gatehouse`.

**The run lock.** On SQLite one process answers a data directory's messages: two would each
answer every message (two `gatehouse run`, or a `gatehouse chat` next to one). The process that
answers holds an exclusive `flock` on `<data_dir>/gatehouse.lock` for its whole life (and on
`<database>.lock` as well when the database file lives elsewhere); a second one is refused at
start with the holder's pid (`AlreadyRunning`). The kernel releases the lock when its holder
exits, however it exits, so a kill -9 leaves nothing stale behind, and the file is never
deleted (a process could otherwise lock a file nobody else sees). Commands that read or operate
(`sessions list`, `jobs list`, `outbox retry` …) take no lock and keep working next to it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from gateway.config import Config, sync_url

PIDS_DIR = "pids"
LOCK_NAME = "gatehouse.lock"
RECORD_BYTES = 4096
"""A pid file's fixed size: it is rewritten in place, so recording a fault on a full disk
needs no new block."""


def pids_dir(data_dir: Path) -> Path:
    return data_dir / PIDS_DIR


class ProcessRecord:
    """This process's pid file: its pid, start time, web address and database health, as one
    JSON object padded to `RECORD_BYTES` and rewritten in place (`update`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fields: dict[str, Any] = {"pid": os.getpid(), "started": _now()}
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self._write()

    def update(self, **fields: Any) -> None:
        self.fields.update(fields)
        if self._fd < 0:
            return  # closed: the process is stopping
        with contextlib.suppress(OSError):  # a record that cannot be written is no fault
            self._write()

    def _write(self) -> None:
        data = json.dumps(self.fields, ensure_ascii=False).encode()
        if len(data) >= RECORD_BYTES:  # only a very long fault text: cut it
            storage = dict(self.fields.get("storage") or {})
            for name in ("failing", "last_fault"):
                if isinstance(storage.get(name), str):
                    storage[name] = storage[name][:400]
            data = json.dumps({**self.fields, "storage": storage}).encode()[: RECORD_BYTES - 1]
        os.pwrite(self._fd, data.ljust(RECORD_BYTES - 1) + b"\n", 0)

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        os.close(fd)


@contextlib.contextmanager
def pid_file(data_dir: Path) -> Iterator[ProcessRecord]:
    """This process's pid file for the length of the block."""
    directory = pids_dir(data_dir)
    directory.mkdir(parents=True, exist_ok=True)
    record = ProcessRecord(directory / f"{os.getpid()}.pid")
    try:
        yield record
    finally:
        record.close()
        record.path.unlink(missing_ok=True)


def _is_gatehouse(pid: int) -> bool:
    """Whether `pid` is a live `gatehouse` process (not a stranger that got a dead one's pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's: signalling it will say so
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc (macOS): trust the file
    return b"gatehouse" in cmdline or b"gateway.cli" in cmdline


def _read_record(path: Path) -> dict[str, Any] | None:
    """A pid file's record (a bare pid, as older versions wrote, counts too); None when it
    cannot be read."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if text.isdigit():
        return {"pid": int(text)}
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
        return None
    return data


def gateway_records(data_dir: Path) -> list[dict[str, Any]]:
    """The records of the live `gatehouse run` processes on this data directory; the files of
    dead ones are removed."""
    directory = pids_dir(data_dir)
    found: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.pid")) if directory.is_dir() else []:
        record = _read_record(path)
        if record is None:
            continue
        if record["pid"] != os.getpid() and _is_gatehouse(record["pid"]):
            found.append(record)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return found


def running_gateways(data_dir: Path) -> list[int]:
    """The pids of the live `gatehouse run` processes on this data directory."""
    return [int(record["pid"]) for record in gateway_records(data_dir)]


# -- the run lock (SQLite) --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a run lock, as its file says."""

    pid: int | None
    command: str
    started: str | None


class AlreadyRunning(Exception):
    """Another process answers this SQLite data directory's messages."""

    def __init__(self, holder: Holder, guarded: Path, command: str) -> None:
        who = f"gatehouse {holder.command}" + (
            f" (pid {holder.pid})" if holder.pid is not None else " (pid unknown)"
        )
        then = (
            "chat through its web page or stop it first"
            if command == "chat"
            else "stop it first"
        )
        super().__init__(
            f"{who} already runs on {guarded} (SQLite: one gatehouse run or chat per data "
            f"directory, or every message would be answered twice); {then}, or use PostgreSQL "
            "to run several (docs/scaling.md)"
        )
        self.holder = holder


def lock_paths(config: Config) -> list[tuple[Path, Path]]:
    """The run lock's files, each with what it guards: none on PostgreSQL, else the data
    directory's, and one beside the database file when that lives elsewhere."""
    url = sync_url(config.database_url)
    if not url.startswith("sqlite"):
        return []
    paths = [(config.data_dir / LOCK_NAME, config.data_dir)]
    database = make_url(url).database
    if database and database != ":memory:":
        db = Path(database)
        if db.parent.resolve() != config.data_dir.resolve():
            paths.append((db.with_name(f"{db.name}.lock"), db))
    return paths


@contextlib.contextmanager
def run_lock(config: Config, command: str) -> Iterator[None]:
    """Hold the run lock (see the module docstring) for the length of the block: at once, or
    `AlreadyRunning`. Nothing to hold on PostgreSQL."""
    held: list[int] = []
    try:
        for path, guarded in lock_paths(config):
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise AlreadyRunning(_holder(path), guarded, command) from None
            held.append(fd)
            os.ftruncate(fd, 0)
            record = {"pid": os.getpid(), "command": command, "started": _now()}
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        yield
    finally:
        for fd in held:
            os.close(fd)  # releases the lock (the file stays: see the module docstring)


def _holder(path: Path, wait: float = 1.0) -> Holder:
    """What the lock file says of its holder, which may be writing it right now: read again
    for up to `wait` seconds until it names a pid."""
    deadline = time.monotonic() + wait
    while True:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict) and isinstance(data.get("pid"), int):
            started = data.get("started")
            return Holder(data["pid"], str(data.get("command") or "run"),
                          started if isinstance(started, str) else None)
        if time.monotonic() > deadline:
            return Holder(None, "run", None)
        time.sleep(0.05)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
