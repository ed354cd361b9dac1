"""One bundled-model server per data directory, shared by the gatehouse processes on it.

The process that starts the server (its *owner*: usually `gatehouse run`) records it in
`<data_dir>/local-model.json` — port, model, the owner's pid and start time, the server's pid —
and removes the record when it stops the server. Another process that needs the model (`gatehouse
chat`, `sessions compact`…) reads the record and, when the owner is alive and the server answers
with the same model and window, talks to it instead of starting a second one: a *reuser*, which
never stops it. When the owner goes away, a reuser starts a server of its own on the same port
(its `[llm] base_url` stays right) and becomes the owner. `<data_dir>/local-model.lock` (flock)
makes each decision one process at a time.

A record left by an owner that died (kill -9) is stale: its server, which runs in a session of
its own and so outlives its owner, is terminated (only if that pid still runs the model server
on the recorded port) and the record is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path

STATE_NAME = "local-model.json"
LOCK_NAME = "local-model.lock"


@dataclass(frozen=True)
class ServerRecord:
    """What `<data_dir>/local-model.json` says about the running server."""

    port: int
    owner_pid: int
    owner_started: str | None
    server_pid: int | None
    model: str
    alias: str
    context_tokens: int

    def serves(self, model: Path, alias: str, context_tokens: int) -> bool:
        """The same model file, name and window as the caller would start."""
        return (self.model, self.alias, self.context_tokens) == (
            str(model), alias, context_tokens
        )


def read_record(path: Path) -> ServerRecord | None:
    """The record, or None when there is none or it cannot be read (a half-written or foreign
    file counts as none: the next owner overwrites it)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return ServerRecord(
            port=int(data["port"]), owner_pid=int(data["owner_pid"]),
            owner_started=None if data.get("owner_started") is None
            else str(data["owner_started"]),
            server_pid=None if data.get("server_pid") is None else int(data["server_pid"]),
            model=str(data["model"]), alias=str(data["alias"]),
            context_tokens=int(data["context_tokens"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_record(path: Path, record: ServerRecord) -> None:
    """Replace the record atomically (a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(record), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def remove_record(path: Path, owner_pid: int, port: int) -> None:
    """Remove the record if it still names `owner_pid` and `port` (another owner's is left
    alone)."""
    record = read_record(path)
    if record is not None and (record.owner_pid, record.port) == (owner_pid, port):
        path.unlink(missing_ok=True)


def process_started(pid: int) -> str | None:
    """The process's start time (Linux: field 22 of /proc/PID/stat), which tells a live owner
    from a stranger that got a dead one's pid; None where there is no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the command name may hold spaces
    return fields[19] if len(fields) > 19 else None


def process_running(pid: int) -> bool:
    """Alive and not a zombie (a zombie no longer holds its port)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return True
    fields = stat.rsplit(")", 1)[-1].split()
    return not fields or fields[0] != "Z"


def owner_alive(record: ServerRecord) -> bool:
    """The recorded owner is still that process (same pid, same start time)."""
    if not process_running(record.owner_pid):
        return False
    if record.owner_started is None:
        return True
    return process_started(record.owner_pid) in (None, record.owner_started)


def _runs_server(pid: int, port: int, server_module: str) -> bool:
    """`pid` runs the model server on `port` (checked on /proc: never signal a stranger)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return server_module.encode() in argv and str(port).encode() in argv


async def end_orphan(record: ServerRecord, server_module: str, grace: float = 5.0) -> bool:
    """Terminate the server a dead owner left behind (SIGTERM, then SIGKILL after `grace` s);
    True when there was one."""
    pid = record.server_pid
    if pid is None or not process_running(pid) or not _runs_server(pid, record.port,
                                                                    server_module):
        return False
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not process_running(pid):
                return True
            await asyncio.sleep(0.05)
    return True


async def serves_model(port: int, alias: str, within: float = 2.0) -> bool:
    """The server on `port` answers `/v1/models` with `alias` among its models."""
    import aiohttp  # here: every CLI command loads this module

    url = f"http://127.0.0.1:{port}/v1/models"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=within)) as http,
            http.get(url) as response,
        ):
            if response.status != 200:
                return False
            body = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return False
    models = body.get("data") if isinstance(body, dict) else None
    return isinstance(models, list) and any(
        isinstance(m, dict) and m.get("id") == alias for m in models
    )


class LockTimeout(RuntimeError):
    """Another process held the lock for longer than the caller would wait."""


@contextlib.asynccontextmanager
async def locked(path: Path, wait: float) -> AsyncIterator[None]:
    """Hold an exclusive flock on `path` for the block (polled, so a cancelled waiter leaves no
    thread blocked behind it). Two opens in one process exclude each other too."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LockTimeout(f"{path} stayed locked for {wait:g} s") from None
                await asyncio.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock
