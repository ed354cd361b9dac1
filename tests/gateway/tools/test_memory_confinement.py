"""Path traversal through the agent's memory tools is refused at the tool seam (the JSON the
model sends), never returning a byte from outside the workspace. `tests/memory/test_workspace.py`
proves the path rules themselves, with a property test; this checks the tools use them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gateway.tools.memory import MemoryTools
from gateway.tools.registry import ToolContext, ToolRegistry
from memory.index import MemoryIndex
from memory.workspace import ensure_workspace

SECRET_LINE = "root-only: do not read me"


@pytest.fixture
def registry(tmp_path: Path) -> ToolRegistry:
    workspace = tmp_path / "data" / "workspace"
    ensure_workspace(workspace)
    (tmp_path / "data" / "outside.txt").write_text(SECRET_LINE, encoding="utf-8")
    os.symlink(tmp_path / "data" / "outside.txt", workspace / "memory" / "link.md")
    os.symlink(tmp_path / "data", workspace / "memory" / "up")
    tools = ToolRegistry()
    for tool in MemoryTools(workspace, MemoryIndex(tmp_path / "index.db", workspace), "UTC").tools():
        tools.register(tool)
    return tools


@pytest.mark.parametrize(
    "path",
    [
        "../outside.txt",
        "memory/../../outside.txt",
        "memory/./../../outside.txt",
        "..\\outside.txt",
        "memory\\..\\..\\outside.txt",
        "/etc/passwd",
        "{tmp}/data/outside.txt",
        "~/../../etc/passwd",
        "memory/link.md",  # a symlink to a file outside
        "memory/up/outside.txt",  # through a symlinked folder
        "memory/%2e%2e/%2e%2e/outside.txt",
        "memory/\x00../outside.txt",
        "C:\\Windows\\win.ini",
    ],
)
async def test_memory_get_refuses_every_escape(
    registry: ToolRegistry, tmp_path: Path, path: str
) -> None:
    arguments = json.dumps({"path": path.replace("{tmp}", str(tmp_path))})
    result = await registry.call("memory_get", arguments, ToolContext(session_key="k"))
    assert result.content.startswith("error"), result.content
    assert SECRET_LINE not in result.content


async def test_memory_get_reads_inside(registry: ToolRegistry) -> None:
    result = await registry.call(
        "memory_get", json.dumps({"path": "AGENTS.md"}), ToolContext(session_key="k")
    )
    assert "Red Lines" in result.content
