"""Scripted fake-model behaviours for `FakeOpenAI(default=...)`: a model that summarizes when
asked to compact, writes a memory note when asked to flush, and echoes everything else. Shared
so the compaction, memory, admin and metrics tests drive the same turns."""

from __future__ import annotations

import re
from typing import Any

from tests.fakes import echo, reply, tool_call

KEY = "agent:main:webchat:direct:tester"
"""The session `RunningGateway.ask` talks in (webchat, user ``tester``)."""
FILLER = " ".join(f"word{i}" for i in range(900))  # ~1,800 tokens per message


def is_summary_request(body: dict[str, Any]) -> bool:
    """A compaction call (partial summary or merge), told apart by the summarizer's prompt."""
    system = body["messages"][0]["content"] or ""
    return system.startswith(("You compress part of", "You merge partial summaries"))


def kind(body: dict[str, Any]) -> str:
    """What the gateway asked: ``summary``, ``flush``, ``flush-after-write`` or ``chat``."""
    last = body["messages"][-1]
    if is_summary_request(body):
        return "summary"
    if last["role"] == "user" and (last["content"] or "").startswith("[Memory flush"):
        return "flush"
    if last["role"] == "tool" and last.get("name") == "memory_write":
        return "flush-after-write"
    return "chat"


def scripted(body: dict[str, Any]) -> Any:
    """Summaries keep the first identifiers; a flush writes one memory note, then stays silent."""
    k = kind(body)
    if k == "summary":
        ids = re.findall(r"`([^`]+)`", body["messages"][-1]["content"])
        return reply(
            "## Decisions\n- none\n## Open TODOs\n- none\n## Constraints/Rules\n- none\n"
            "## Pending user asks\n- the latest question\n## Exact identifiers\n"
            + "\n".join(f"- `{i}`" for i in ids[:3])
        )
    if k == "flush":
        return tool_call("memory_write", {"text": "User prefers deploys on Monday. Ticket ORD-77."})
    if k == "flush-after-write":
        return reply("NO_REPLY")
    return echo(body)


def summarizer_and_echo(body: dict[str, Any]) -> Any:
    """Summaries with fixed decisions and the first identifier; every other call is echoed."""
    if not is_summary_request(body):
        return echo(body)
    text = body["messages"][-1]["content"]
    ids = re.findall(r"`([^`]+)`", text)
    return reply(
        "## Decisions\n- Ship on Monday.\n## Open TODOs\n- Write the changelog.\n"
        "## Constraints/Rules\n- none\n## Pending user asks\n- ticket ORD-1042 status question\n"
        "## Exact identifiers\n" + "\n".join(f"- `{i}`" for i in ids[:1])
    )
