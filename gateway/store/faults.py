"""Storage faults, each said in one line: the file, what is wrong with it, what to do.

The store, the job store and the memory index keep their files under [gateway] data_dir (or in
PostgreSQL). When one cannot be used (a directory where the database should be, a directory the
gateway cannot write, a file that is not a database, a database with damaged pages, a full
disk, a PostgreSQL server that does not answer), the driver's exception becomes a
`StorageError` that names the file and the fix: the CLI prints that one line and exits 2
(`gateway.cli`), `gatehouse doctor` shows it, and `/healthz` reports it once a store step
failed. Anything else (a bug) keeps its traceback.

`StorageHealth` is what a running process remembers of its database's faults: the one failing
now, and the last one after it cleared (`gatehouse doctor` reads it from the process's pid file).
"""

from __future__ import annotations

import contextlib
import errno
import shlex
import socket
import sqlite3
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from gateway.config import redacted_url

Where = Path | str | None
"""What a fault names: a file, a database URL (without its password), or nothing known."""

WRITE_FIX = (
    "give the gateway's user write access to it, or set [gateway] data_dir to a writable "
    "directory"
)


class StorageError(Exception):
    """A database or data file the gateway cannot use: what is wrong, then what to do."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}; {fix}")
        self.problem = problem
        self.fix = fix


@dataclass(slots=True)
class StorageHealth:
    """A process's database health as it saw it: what fails now, and the last fault after it
    cleared, so an operator learns of a fault that came and went (`gatehouse doctor`)."""

    failing: str | None = None
    """Why the database fails now (a step failed and no write has succeeded since), or None."""
    since: str | None = None
    """When the current failure began (ISO 8601, UTC)."""
    last_fault: str | None = None
    """The latest failure, kept once it cleared."""
    last_fault_at: str | None = None
    recovered_at: str | None = None
    """When a write last succeeded after a failure (None while failing, or never failed)."""
    permanent: bool = False
    """The database file was deleted or replaced: only a restart (after restoring it) helps."""

    def failed(self, reason: str, *, permanent: bool = False) -> None:
        now = _now()
        if self.failing is None:
            self.since = now
        self.failing = self.last_fault = reason
        self.last_fault_at = now
        self.recovered_at = None
        self.permanent = self.permanent or permanent

    def recovered(self) -> None:
        self.failing = self.since = None
        self.recovered_at = _now()

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> StorageHealth:
        """Read back from `as_dict` (a process's pid file); what is not a string is left out."""
        if not isinstance(data, dict):
            return cls()
        text = {k: v for k, v in data.items() if isinstance(v, str)}
        return cls(
            failing=text.get("failing"), since=text.get("since"),
            last_fault=text.get("last_fault"), last_fault_at=text.get("last_fault_at"),
            recovered_at=text.get("recovered_at"), permanent=data.get("permanent") is True,
        )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def database_where(url: str) -> Path | str:
    """How a fault names a database: its SQLite file, else its URL without the password."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return redacted_url(url)
    if parsed.drivername.startswith("sqlite") and parsed.database not in (None, "", ":memory:"):
        return Path(str(parsed.database))
    return redacted_url(url)


def recover_command(path: Path) -> str:
    """SQLite's own recovery: what can still be read, copied into a new file."""
    recovered = path.with_name(f"{path.stem}-recovered{path.suffix}")
    return f'sqlite3 {shlex.quote(str(path))} ".recover" | sqlite3 {shlex.quote(str(recovered))}'


def damaged(where: Where, detail: str) -> StorageError:
    """A database whose pages are damaged (failed `PRAGMA quick_check`, or "malformed")."""
    if isinstance(where, Path):
        fix = (
            "stop the gateway, then restore it from a backup, or recover what is readable: "
            f'{recover_command(where)} (".dump" where ".recover" fails) and move the recovered '
            "file into its place"
        )
    else:
        fix = "stop the gateway, then restore it from a backup"
    return StorageError(f"{where or 'the database'} is damaged ({detail})", fix)


def storage_error(exc: BaseException, where: Where = None) -> StorageError | None:
    """The one-line fault for `exc`, or None when it is not a storage fault (a bug, a lock
    held by another process, a duplicate row)."""
    if isinstance(exc, StorageError):
        return exc
    driver = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    if isinstance(driver, sqlite3.Error):
        return _sqlite_fault(driver, where)
    if isinstance(driver, OSError) and (fault := _os_fault(driver, where)) is not None:
        return fault
    return _postgres_fault(driver, where)


@contextlib.contextmanager
def storage_faults(where: Where) -> Iterator[None]:
    """Inside the block, a storage fault is raised as the StorageError that names `where`."""
    try:
        yield
    except Exception as exc:
        fault = storage_error(exc, where)
        if fault is None or fault is exc:
            raise
        raise fault from exc


def _sqlite_fault(exc: sqlite3.Error, where: Where) -> StorageError | None:
    if isinstance(exc, sqlite3.IntegrityError):
        return None
    text = str(exc).lower()
    name = str(where) if where else "the database"
    path = where if isinstance(where, Path) else None
    folder = str(path.parent) if path is not None else "its directory"
    if "not a database" in text:
        return StorageError(
            f"{name} is not a SQLite database",
            "check [gateway] data_dir and database_url, restore the file from a backup, or move "
            "it aside to start a new one",
        )
    if "malformed" in text or "corrupt" in text:
        return damaged(where, str(exc))
    if "unable to open database file" in text:
        if path is not None and path.is_dir():
            return StorageError(
                f"{path} is a directory, not a database file",
                "move it away, or point [gateway] data_dir / database_url elsewhere",
            )
        return StorageError(f"cannot open {name}: {folder} cannot be written (or is missing)",
                            WRITE_FIX)
    if "readonly" in text or "read-only" in text:
        return StorageError(f"cannot write {name}: it (or {folder}) is read-only", WRITE_FIX)
    if "disk i/o error" in text:
        return StorageError(
            f"cannot use {name}: disk I/O error",
            f"check the disk and that the gateway's user can write {folder}; if the file is "
            "damaged, restore it from a backup",
        )
    if "database or disk is full" in text:
        return StorageError(f"cannot write {name}: the disk is full", "free some space on it")
    return None


def _os_fault(exc: OSError, where: Where) -> StorageError | None:
    name = exc.filename if exc.filename is not None else where
    if name is None:
        return None
    if exc.errno == errno.EISDIR:
        return StorageError(f"{name} is a directory where a file should be",
                            "move it away, or point [gateway] data_dir elsewhere")
    if exc.errno == errno.ENOTDIR:
        return StorageError(
            f"cannot create {name}: part of that path is a file, not a directory",
            "set [gateway] data_dir (and workspace) to a directory",
        )
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return StorageError(f"cannot write {name} ({exc.strerror})", WRITE_FIX)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageError(f"cannot write {name}: the disk is full", "free some space on it")
    return None


def _postgres_fault(exc: BaseException, where: Where) -> StorageError | None:
    """A PostgreSQL server that cannot be reached or refuses the login (not a query error),
    through psycopg (the ORM's steps) or asyncpg (the hot path's)."""
    try:
        import asyncpg
        import psycopg
    except ImportError:  # the [postgres] extra is not installed
        return None
    if isinstance(exc, psycopg.OperationalError):
        state = getattr(exc, "sqlstate", None)
    elif isinstance(exc, asyncpg.PostgresError):
        state = exc.sqlstate
        if state is None:
            return None
    elif isinstance(exc, (asyncpg.InterfaceError, ConnectionError, socket.gaierror, TimeoutError)):
        state = None  # asyncpg: the connection is gone, or could not be made
    else:
        return None
    # No state: the client could not connect. 08: connection, 28: login, 3D: no such
    # database, 57P: the server is shutting down or starting.
    if state is not None and not state.startswith(("08", "28", "3D", "57P")):
        return None
    detail = (str(exc).strip() or type(exc).__name__).splitlines()[0]
    return StorageError(
        f"cannot reach the database {where or ''}: {detail}".replace("  ", " "),
        "is the PostgreSQL server running, and are the host, port, user, password and "
        "database in [gateway] database_url right?",
    )
