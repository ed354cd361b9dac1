"""How `gatehouse reload` finds the running gateways: `gatehouse run` writes its process id to
`<data_dir>/pids/<pid>.pid` once it is ready for SIGHUP, and removes it when it stops cleanly.

One file per process, because several `gatehouse run` processes may share a data directory (on
PostgreSQL, see docs/scaling.md): `reload` signals each of them. A file left behind by a process
that died (kill -9) is recognised and removed: its process is gone, or is no `gatehouse`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

PIDS_DIR = "pids"


def pids_dir(data_dir: Path) -> Path:
    return data_dir / PIDS_DIR


@contextlib.contextmanager
def pid_file(data_dir: Path) -> Iterator[Path]:
    """This process's pid file for the length of the block."""
    directory = pids_dir(data_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{os.getpid()}.pid"
    path.write_text(f"{os.getpid()}\n", encoding="utf-8")
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


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


def running_gateways(data_dir: Path) -> list[int]:
    """The pids of the live `gatehouse run` processes on this data directory; the files of dead
    ones are removed."""
    directory = pids_dir(data_dir)
    found: list[int] = []
    for path in sorted(directory.glob("*.pid")) if directory.is_dir() else []:
        try:
            pid = int(path.read_text(encoding="utf-8").strip())
        except (OSError, ValueError):
            continue
        if pid != os.getpid() and _is_gatehouse(pid):
            found.append(pid)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return found
