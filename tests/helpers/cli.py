"""Driving the `gatehouse` command in tests: as a real subprocess (`run_cli`; `start_run` for a
`gatehouse run` that keeps running), or in this process through Typer's runner (`in_process`,
for tests that monkeypatch), on a config file `write_config` puts in a tmp dir."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

from typer.testing import CliRunner

from gateway.cli import app
from tests.fakes import FakeOpenAI

GATEHOUSE = str(Path(sys.executable).parent / "gatehouse")
"""The console script the venv installed next to its python."""


def write_config(
    tmp_path: Path, fake: FakeOpenAI | None, extra: str = "", *, embeddings: bool = False
) -> Path:
    """A `gatehouse.toml` with data under the tmp dir, any web port, and `fake` as the model
    (its key read from ``TEST_LLM_KEY``, which `env` sets); `extra` is appended TOML. The
    embedding model stays off unless asked for (or `extra` has a [memory] section): each
    gateway process would warm it up, which is not what these tests look at."""
    if not embeddings and "[memory]" not in extra:
        extra = f"[memory]\nembeddings = false\n{extra}"
    llm = (
        f'[llm]\nbase_url = "{fake.base_url}"\n'
        'api_key = "${TEST_LLM_KEY}"\nmodel = "fake-model"\n'
        if fake
        else ""
    )
    path = tmp_path / "gatehouse.toml"
    path.write_text(
        f'[gateway]\ndata_dir = "data"\n[web]\nport = 0\n{llm}{extra}', encoding="utf-8"
    )
    return path


def env() -> dict[str, str]:
    """The subprocess environment: the test key, and no config path inherited from the caller."""
    return {**os.environ, "TEST_LLM_KEY": "sk-test", "GATEHOUSE_CONFIG": ""}


async def run_cli(*args: str, cwd: Path) -> tuple[int, str, str]:
    """Run `gatehouse *args` in `cwd` as a subprocess: (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        GATEHOUSE, *args, cwd=cwd, env=env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def in_process(config: Path, *args: str) -> tuple[int, str, str]:
    """The CLI in this process (a thread: the command runs its own event loop), with
    `--config config` before `args`."""
    return await invoke("--config", str(config), *args)


async def invoke(*args: str) -> tuple[int, str, str]:
    """`gatehouse *args` in this process, as given. The command sets up logging for a process
    of its own; the test process's logging is put back after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    runner = CliRunner()
    try:
        result = await asyncio.to_thread(
            runner.invoke, app, list(args),
            env={"COLUMNS": "200", "TEST_LLM_KEY": "sk-test", "GATEHOUSE_CONFIG": ""},
        )
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return result.exit_code, result.stdout, result.stderr


async def start_run(
    config: Path, *, argv: list[str] | None = None, log: Path | None = None
) -> tuple[asyncio.subprocess.Process, str]:
    """`gatehouse --config CONFIG run` as a subprocess (`argv`: what to run it with, the
    command line appended), its stderr to `log` (default: beside the config); returns it and
    its web address once it listens, or raises with the log's tail."""
    log = log or config.parent / "gatehouse.log"
    command = [GATEHOUSE, "--config", str(config), "run"]
    with log.open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            *(argv or []), *command, cwd=config.parent, env=env(),
            stdout=asyncio.subprocess.PIPE, stderr=err,
        )
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), timeout=60)).decode()
    if not line.startswith("gatehouse listening on"):
        await stop_run(proc)
        raise AssertionError(f"gatehouse run did not start: {line!r}\n{log.read_text()[-3000:]}")
    return proc, line.rsplit(" ", 1)[-1].strip()


async def stop_run(proc: asyncio.subprocess.Process) -> int:
    """SIGTERM (if still running) and wait: its exit code."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode is not None
    return proc.returncode
