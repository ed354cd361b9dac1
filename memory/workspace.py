"""The runtime workspace folder the agent and its people share.

Layout: `AGENTS.md` (from the template), `MEMORY.md`, `memory/` (daily notes), `artifacts/`
(full tool outputs too large for a prompt). Created by `gatehouse init` and on first run.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

MEMORY_TEMPLATE = """# MEMORY.md — long-term facts

Curated by people. The agent reads this file but does not edit it. Daily notes the agent writes
live in `memory/YYYY-MM-DD.md`.
"""


def agents_template() -> str:
    """The default AGENTS.md shipped with Gatehouse (the repo's top-level AGENTS.md)."""
    return (resources.files("memory") / "templates" / "AGENTS.md").read_text(encoding="utf-8")


def ensure_workspace(path: Path) -> list[Path]:
    """Create whatever part of the workspace is missing; never overwrite. Return what was made."""
    created: list[Path] = []
    for folder in (path, path / "memory", path / "artifacts"):
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            created.append(folder)
    for name, text in (("AGENTS.md", agents_template()), ("MEMORY.md", MEMORY_TEMPLATE)):
        target = path / name
        if not target.exists():
            target.write_text(text, encoding="utf-8")
            created.append(target)
    return created
