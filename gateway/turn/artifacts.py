"""Tool outputs over the engine's cap: saved whole under the workspace's artifacts/, sent cut.

The agent sees where the full output is, so it can read the part it needs instead of the whole
output filling the prompt (and the store) on every later turn.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from pathlib import Path

from context.engine import ContextEngine, ContextSettings
from memory.workspace import ARTIFACTS_DIR, conversation_folder

log = logging.getLogger(__name__)


async def cap_tool_output(
    engine: ContextEngine,
    settings: ContextSettings,
    workspace: Path,
    text: str,
    tool: str,
    call_id: str,
    session_key: str,
) -> str:
    """Cap a tool result before it is stored or sent; the full output goes to the
    conversation's folder under artifacts/ (readable from that conversation only)."""
    limit = engine.tool_result_limit(settings)
    if len(text) <= limit:
        return text
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in f"{tool}-{call_id}")[:80]
    relative = f"{ARTIFACTS_DIR}/{conversation_folder(session_key)}/{stamp}-{safe}.txt"
    target = workspace / relative
    try:
        await asyncio.to_thread(_write_text, target, text)
    except OSError as exc:
        log.warning("could not save tool output to %s: %s", target, exc)
        return engine.cap_tool_result(text, limit, None)
    return engine.cap_tool_result(text, limit, relative)


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", errors="replace")
