"""`history_search` on the live path: a real gateway compacts a session, the agent's tool and
`gatehouse sessions search` find every compacted message again, and only in that session."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from gateway.app import Gateway
from gateway.cli import app
from gateway.config import load_config
from gateway.tools.history import NO_MATCHES
from gateway.tools.registry import ToolContext
from tests.conftest import RunningGateway
from tests.fakes import FakeOpenAI, echo, reply

ALICE = "agent:main:webchat:direct:alice"
BOB = "agent:main:webchat:direct:bob"
SECRET = "sk-proj-abcdEFGH1234ijklMNOP5678qrstUVWX"
FIRST = (
    f"order ORD-88123 failed to ship; the manifest is /srv/releases/v2/manifest.json and my "
    f"key is {SECRET}. "
)
FILLER = " ".join(f"word{i}" for i in range(600))  # makes compacting worth it


def summarizer_and_echo(body: dict[str, Any]) -> Any:
    system = body["messages"][0]["content"] or ""
    if not system.startswith(("You compress part of", "You merge partial summaries")):
        return echo(body)
    ids = re.findall(r"`([^`]+)`", body["messages"][-1]["content"])
    return reply(
        "## Decisions\n- none\n## Open TODOs\n- none\n## Constraints/Rules\n- none\n"
        "## Pending user asks\n- the latest question\n## Exact identifiers\n"
        + "\n".join(f"- `{i}`" for i in ids[:1])
    )


def write_config(tmp_path: Path, fake: FakeOpenAI, database_url: str) -> Path:
    path = tmp_path / "gatehouse.toml"
    path.write_text(
        f'[gateway]\ndata_dir = "{tmp_path / "data"}"\ndatabase_url = "{database_url}"\n'
        f'[web]\nport = 0\n'
        f'[llm]\nbase_url = "{fake.base_url}"\napi_key = "test"\nmodel = "fake-model"\n'
        "max_retries = 1\ntimeout = 5\nstream = false\n"
        '[models.fake-model]\ncontext_window = 200000\n'
        "[context]\nrecent_turns = 2\n"
        "[memory]\narchive_transcripts = false\n",
        encoding="utf-8",
    )
    return path


async def search(gateway: Gateway, key: str, query: str, limit: int = 5) -> str:
    result = await gateway.runner.tools.call(
        "history_search", json.dumps({"query": query, "limit": limit}), ToolContext(key)
    )
    assert not result.is_error, result.content
    return result.content


def cli(config: Path, *args: str) -> tuple[int, str, str]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        result = CliRunner().invoke(
            app, ["--config", str(config), *args], env={"COLUMNS": "200"}
        )
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return result.exit_code, result.stdout, result.stderr


async def test_compacted_messages_are_one_lookup_away(tmp_path: Path, database_url: str) -> None:
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        config_path = write_config(tmp_path, fake, database_url)
        gateway = Gateway(load_config(config_path))
        rg = RunningGateway(gateway)
        await gateway.start()
        try:
            assert "history_search" in gateway.runner.tools.tools
            await rg.ask(FIRST + FILLER, "alice")
            await rg.ask("我们需要在周五之前完成数据库迁移 " + FILLER, "alice")
            for i in range(3):
                await rg.ask(f"filler {i} " + FILLER, "alice")
            await rg.ask("bob here, nothing to see", "bob")
            assert await search(gateway, ALICE, "ORD-88123") == NO_MATCHES, "nothing compacted"
            [answer] = await rg.ask("/compact", "alice")
            assert answer.startswith("Compacted"), answer

            found = await search(gateway, ALICE, "ORD-88123")
            blocks = found.split("\n\n")
            # The user's message (seq 1) and the echo of it (seq 2), newest first.
            heading = r"seq 2 · \d{4}-\d\d-\d\d \d\d:\d\d · assistant \(identifier\)\n"
            assert re.match(heading, blocks[0]), found
            assert blocks[1].startswith("seq 1 · ") and "· user (identifier)\n" in blocks[1]
            assert "ORD-88123" in blocks[1]
            assert SECRET not in found and "[REDACTED:openai_key]" in found, "redacted"
            assert "seq 1 · " in await search(gateway, ALICE, "ord-88123")
            assert "(identifier)" in await search(gateway, ALICE, "`/srv/releases/v2/manifest.json`")
            assert "seq 1 · " in await search(gateway, ALICE, "which manifest failed to ship?")
            words = await search(gateway, ALICE, "数据库 迁移")
            assert words.startswith("seq 4 · ") or words.startswith("seq 3 · "), words
            assert "(words)" in words and "数据库" in words
            # The kept turns were not compacted: not in the archive yet.
            assert "filler 2" not in await search(gateway, ALICE, "filler", limit=20)
            # Another session never sees Alice's messages, whatever it asks.
            for query in ("ORD-88123", "manifest", "数据库", "sk-proj"):
                assert await search(gateway, BOB, query) == NO_MATCHES
            # archive_transcripts = false: memory_search does not reach the archive.
            assert gateway.memory_index.search("ORD-88123", corpus="transcripts") == []
        finally:
            await gateway.stop()

        code, out, err = await asyncio.to_thread(
            cli, config_path, "sessions", "search", ALICE, "ORD-88123", "--json"
        )
        assert code == 0, err
        hits = json.loads(out)
        assert [(h["seq"], h["via"]) for h in hits[:2]] == [(2, "identifier"), (1, "identifier")]
        assert all(SECRET not in h["excerpt"] for h in hits)
        code, out, err = await asyncio.to_thread(
            cli, config_path, "sessions", "search", ALICE, "manifest", "--limit", "1"
        )
        assert code == 0, err
        assert "manifest" in out and "words" in out and "seq" in out
        code, out, err = await asyncio.to_thread(
            cli, config_path, "sessions", "search", BOB, "ORD-88123", "--json"
        )
        assert code == 0 and json.loads(out) == []
        code, out, err = await asyncio.to_thread(
            cli, config_path, "sessions", "search", "agent:main:nobody", "ORD-88123"
        )
        assert code == 1 and "no session 'agent:main:nobody'" in err


async def test_a_reset_archives_its_messages_and_their_identifiers(
    tmp_path: Path, database_url: str
) -> None:
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        gateway = Gateway(load_config(write_config(tmp_path, fake, database_url)))
        rg = RunningGateway(gateway)
        await gateway.start()
        try:
            await rg.ask(f"incident INC0012345 hit db-7.internal:5432, key {SECRET}", "alice")
            await rg.ask("and the runbook is docs/runbooks/failover.md", "alice")
            async with gateway.lanes.hold(ALICE):
                assert await gateway.runner.reset_session(ALICE, "test", flush=False) is not None
            # No compaction result ranked them: they were extracted from the archived texts.
            for query in ("INC0012345", "db-7.internal:5432", "docs/runbooks/failover.md"):
                found = await search(gateway, ALICE, query)
                assert "user (identifier)" in found and query in found, (query, found)
            assert SECRET not in await search(gateway, ALICE, "incident", limit=20)
            assert await search(gateway, BOB, "INC0012345") == NO_MATCHES
        finally:
            await gateway.stop()


def test_hits_render_with_local_time_role_and_tool() -> None:
    from gateway.tools.history import render_hits, when
    from memory.index import HistoryHit

    assert when("2026-03-01T10:05:00+00:00", "Asia/Shanghai") == "2026-03-01 18:05"
    assert when(None, "UTC") == "time unknown"
    assert when("not a time", "UTC") == "not a time"
    text = render_hits(
        [
            HistoryHit(7, "tool", "2026-03-01T10:05:00+00:00", "status: failed", "identifier",
                       1.0, "orders_get"),
            HistoryHit(1, "transcript", None, "USER: old text", "words", 2.5, None, 4),
        ],
        "UTC",
    )
    assert text == (
        "seq 7 · 2026-03-01 10:05 · tool orders_get (identifier)\nstatus: failed\n\n"
        "seq 1-4 · time unknown · transcript (words)\nUSER: old text"
    )
    assert render_hits([], "UTC") == NO_MATCHES
