"""A throwaway PostgreSQL cluster for the tests: initdb in a temp dir, started on a free port.

`initdb` refuses to run as root, so as root the cluster belongs to the `postgres` user (Debian's
package creates it). Durability is switched off (fsync, synchronous_commit): the cluster lives
for one test run.
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_major, reverse=True)
    if found:
        return Path(found[0]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise RuntimeError(
        "PostgreSQL server binaries not found (initdb): `make test` installs Debian's "
        "postgresql package; or set GATEHOUSE_TEST_PG_URL to an existing server"
    )


def _major(path: str) -> int:
    try:
        return int(Path(path).parent.parent.name)
    except ValueError:
        return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThrowawayPostgres:
    """`start()` → `url`; `new_database()` gives each test an empty database; `stop()` removes it."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gatehouse-pg-"))
        self.port = _free_port()
        self._names = itertools.count(1)
        self._as_postgres = os.geteuid() == 0
        self.external = os.environ.get("GATEHOUSE_TEST_PG_URL")

    @property
    def url(self) -> str:
        if self.external:
            return self.external
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = list(args)
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def start(self) -> ThrowawayPostgres:
        if self.external:
            return self
        bin_dir = _bin_dir()
        data = self.dir / "data"
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(
            str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
            "--no-sync", "-E", "UTF8",
        )
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
        )
        self._run(
            str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options,
            "-l", str(self.dir / "server.log"), "-w", "start",
        )
        return self

    def new_database(self) -> str:
        """An empty database of its own; returns its URL."""
        name = f"gatehouse_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def stop(self) -> None:
        if not self.external and (self.dir / "data" / "postmaster.pid").exists():
            self._run(str(_bin_dir() / "pg_ctl"), "-D", str(self.dir / "data"), "-m",
                      "immediate", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)
