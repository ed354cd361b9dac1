"""Real storage faults for tests: SQLite's own "database or disk is full" (`PageLimit`), and a
real full filesystem (`in_small_filesystem`: a tmpfs of a few MB that `gatehouse run` is started
on, in a mount namespace of its own; `fill` fills it)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import shutil
import subprocess
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event


class PageLimit:
    """`PRAGMA max_page_count` on every connection an engine opens: past the limit SQLite
    fails a write with SQLITE_FULL, "database or disk is full", exactly as on a full disk.
    Install before the store opens its first connection; `set(None)` lifts the limit."""

    UNLIMITED = 1_073_741_823

    def __init__(self, engine: Engine) -> None:
        self.pages: int | None = None
        self._connections: list[Any] = []
        event.listen(engine, "connect", self._connected)

    def _connected(self, dbapi_conn: Any, _record: Any) -> None:
        self._connections.append(dbapi_conn)
        self._apply(dbapi_conn)

    def _apply(self, conn: Any) -> None:
        conn.execute(f"PRAGMA max_page_count = {self.pages or self.UNLIMITED}")

    def page_count(self) -> int:
        """The database's size in pages now, as the connections see it."""
        return int(self._connections[0].execute("PRAGMA page_count").fetchone()[0])

    def set(self, pages: int | None) -> None:
        """Limit the database to `pages` pages (the store must be idle: each connection is
        used from this thread for a moment)."""
        self.pages = pages
        for conn in self._connections:
            with contextlib.suppress(Exception):  # a connection closed meanwhile
                self._apply(conn)


def cannot_mount_tmpfs(directory: Path) -> str | None:
    """Why a tmpfs cannot be mounted on `directory` in a namespace of its own here (None: it
    can; nothing stays mounted)."""
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return "no unshare(1) or nsenter(1) here"
    probe = subprocess.run(
        ["unshare", "-rm", "mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(directory)],
        capture_output=True, text=True, check=False,
    )
    if probe.returncode != 0:
        return f"no tmpfs can be mounted here: {probe.stderr.strip() or probe.returncode}"
    return None


def in_small_filesystem(directory: Path, megabytes: int) -> list[str]:
    """The command prefix that runs a command with a `megabytes` MB tmpfs mounted on
    `directory`, seen by that process alone (`unshare -rm`: a user and mount namespace of its
    own; nothing is mounted for anyone else). From outside, the tmpfs is reached through
    `/proc/<pid>/root` (`seen_by`), and a command runs beside it with `inside`."""
    script = 'mount -t tmpfs -o size="$1"m tmpfs "$2" && shift 2 && exec "$@"'
    return ["unshare", "-rm", "sh", "-c", script, "sh", str(megabytes), str(directory)]


def inside(pid: int, cwd: Path) -> list[str]:
    """The command prefix that runs a command in process `pid`'s namespaces (its tmpfs)."""
    return ["nsenter", "-t", str(pid), "-U", "-m", f"--wd={cwd}", "--"]


def seen_by(pid: int, path: Path) -> Path:
    """`path` as process `pid` sees it (its mount namespace)."""
    return Path(f"/proc/{pid}/root") / path.resolve().relative_to("/")


async def fill(path: Path) -> int:
    """Write `path` until the filesystem it is on is full; the bytes written."""

    def write() -> int:
        written = 0
        chunk = b"\0" * 65536
        with path.open("wb", buffering=0) as f:
            while True:
                try:
                    written += f.write(chunk) or 0
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    if len(chunk) == 1:
                        return written
                    chunk = chunk[: len(chunk) // 2]

    return await asyncio.to_thread(write)
