"""Prompts that keep the provider's prompt cache warm, and the cached tokens it reports (issue
24): through a real Gateway and a recording fake model, the system prompt and tool schemas are
byte-identical turn after turn; between two compactions each prompt is the previous one plus
appended messages; the refresh block keeps its place until the next compaction; each session
sends its own stable `prompt_cache_key` (dropped once an endpoint rejects it); cached tokens are
read from usage and shown in `sessions show`, `/metrics`, the admin page and `/status`'s facts."""

from __future__ import annotations

import itertools
import json
import logging
import random
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from gateway import operations
from gateway.app import Gateway
from gateway.config import load_config
from memory.agents_md import POST_COMPACTION_HEADER
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import FakeOpenAI, echo, error, reply
from tests.helpers.admin import BEARER, TOKEN, serve
from tests.helpers.cli import in_process, write_config
from tests.helpers.llm_scripts import KEY, kind, scripted

AGENTS_MD = (
    "# Agent\n\n## Session Startup\n- Greet by name.\n\n"
    "## Red Lines\n- Never share the staging password.\n"
)


def words(rng: random.Random, n: int) -> str:
    return " ".join(f"w{rng.randrange(10_000)}" for _ in range(n))


async def converse(
    make_config: MakeConfig, fake: FakeOpenAI, window: int, turns: int, **context: Any
) -> Gateway:
    """`turns` webchat messages of varied length (100-400 words, seeded) through a gateway on a
    `window`-token model; the fake echoes, summarizes and flushes (`scripted`)."""
    config = make_config(
        fake, models={"fake-model": {"context_window": window}},
        context={"recent_turns": 2, **context}, scheduler={"enabled": False},
    )
    config.workspace.mkdir(parents=True, exist_ok=True)
    (config.workspace / "AGENTS.md").write_text(AGENTS_MD, encoding="utf-8")
    rg = RunningGateway(Gateway(config))
    await rg.gateway.start()
    rng = random.Random(window + turns)
    try:
        for i in range(turns):
            await rg.ask(f"message {i} {words(rng, rng.randrange(100, 400))}")
    finally:
        await rg.gateway.stop()
    return rg.gateway


def chat_calls(fake: FakeOpenAI) -> list[tuple[dict[str, Any], bool]]:
    """Each chat request, and whether a compaction (a summary call) came before it since the
    previous chat request."""
    out: list[tuple[dict[str, Any], bool]] = []
    compacted = False
    for body in fake.requests:
        k = kind(body)
        if k == "summary":
            compacted = True
        elif k == "chat":
            out.append((body, compacted))
            compacted = False
    return out


def extends(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """`after` is `before` with messages appended: the same tools, the same messages first."""
    old = before["messages"]
    return after.get("tools") == before.get("tools") and after["messages"][: len(old)] == old


def breaks(fake: FakeOpenAI) -> tuple[int, int]:
    """(prefix breaks, compactions) over the chat calls."""
    calls = chat_calls(fake)
    broken = sum(1 for (a, _), (b, _) in itertools.pairwise(calls) if not extends(a, b))
    return broken, sum(1 for _, compacted in calls if compacted)


@pytest.mark.parametrize(("window", "turns"), [(16_384, 45), (32_768, 80)])
async def test_between_compactions_each_prompt_extends_the_previous(
    make_config: MakeConfig, window: int, turns: int
) -> None:
    async with FakeOpenAI(default=scripted) as fake:
        await converse(make_config, fake, window, turns)
    calls = chat_calls(fake)
    compactions = sum(1 for _, compacted in calls if compacted)
    assert compactions >= 2, "the conversation spans several compaction cycles"
    for (before, _), (after, compacted) in itertools.pairwise(calls):
        if not compacted:
            assert extends(before, after), "a prompt changed between two compactions"
    broken, compactions = breaks(fake)
    assert broken <= compactions, "at most one prefix break per compaction cycle"


async def test_the_old_per_turn_drop_breaks_the_prefix_more_often(
    make_config: MakeConfig,
) -> None:
    """What the measure above would see without the change: `small_overflow = "drop-turns"`
    shifts the prompt turn after turn while the overflow is small."""
    async with FakeOpenAI(default=scripted) as fake:
        await converse(make_config, fake, 16_384, 45, small_overflow="drop-turns")
    broken, compactions = breaks(fake)
    assert broken > compactions


async def test_drop_blocks_keeps_the_prefix_between_block_drops(
    make_config: MakeConfig,
) -> None:
    async with FakeOpenAI(default=scripted) as fake:
        await converse(make_config, fake, 16_384, 45, small_overflow="drop-blocks")
    broken, compactions = breaks(fake)
    assert compactions >= 2 and broken <= 2 * compactions


async def test_system_prompt_and_tools_are_byte_identical_across_turns(
    make_config: MakeConfig,
) -> None:
    async with FakeOpenAI(default=scripted) as fake:
        await converse(make_config, fake, 16_384, 30)
    calls = chat_calls(fake)
    systems = {json.dumps(body["messages"][0], ensure_ascii=False) for body, _ in calls}
    assert len(systems) == 1, "the system prompt never changes within a session"
    assert "Never share the staging password." in next(iter(systems))
    # The tool schemas change once, with the first compaction (history_search joins them,
    # in the call whose prefix the compaction breaks anyway), and never again.
    tools = [json.dumps(body.get("tools"), sort_keys=False) for body, _ in calls]
    changes = [i for i in range(1, len(tools)) if tools[i] != tools[i - 1]]
    first_compaction = next(i for i, (_, compacted) in enumerate(calls) if compacted)
    assert changes == [first_compaction]


async def test_the_refresh_block_stays_in_place_until_the_next_compaction(
    make_config: MakeConfig,
) -> None:
    async with FakeOpenAI(default=scripted) as fake:
        await converse(make_config, fake, 16_384, 45)
    calls = chat_calls(fake)
    cycles: list[list[int]] = []
    for body, compacted in calls:
        where = [
            i for i, m in enumerate(body["messages"])
            if POST_COMPACTION_HEADER in (m.get("content") or "")
        ]
        if compacted:
            cycles.append([])
        if cycles:
            assert where, "every call after a compaction carries the refresh block"
            cycles[-1].append(where[0])
        else:
            assert not where, "no refresh block before the first compaction"
    assert len(cycles) >= 2
    assert all(len(places) >= 2 for places in cycles[:-1]), cycles
    assert all(len(set(places)) == 1 for places in cycles), cycles


# -- prompt_cache_key -------------------------------------------------------------------------


async def test_prompt_cache_key_is_stable_per_session_and_differs_across_sessions(
    fake_llm: FakeOpenAI, running: RunningGateway
) -> None:
    for i in range(3):
        await running.ask(f"alice says hello {i}", user="alice")
        await running.ask(f"bob says hello {i}", user="bob")
    keys: dict[str, set[str]] = {"alice": set(), "bob": set()}
    for body in fake_llm.requests:
        who = body["messages"][-1]["content"].split()[0]
        keys[who].add(body["prompt_cache_key"])
    assert len(keys["alice"]) == 1 and len(keys["bob"]) == 1 and keys["alice"] != keys["bob"]
    key = next(iter(keys["alice"]))
    assert "alice" not in key and "webchat" not in key and len(key) <= 64


async def test_prompt_cache_key_is_dropped_after_a_400_naming_it(
    fake_llm: FakeOpenAI, running: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.model.llm")
    fake_llm.script(
        error(
            400,
            body={
                "error": {
                    "message": "Unrecognized request argument supplied: prompt_cache_key",
                    "type": "invalid_request_error", "param": None, "code": None,
                }
            },
        )
    )
    assert await running.ask("first") == ["echo: first"]
    assert await running.ask("second") == ["echo: second"]
    assert "prompt_cache_key" in fake_llm.requests[0]
    assert all("prompt_cache_key" not in b for b in fake_llm.requests[1:])
    lines = [r for r in caplog.records if "prompt_cache_key" in r.getMessage()]
    assert len(lines) == 1


async def test_other_400s_keep_the_key(
    fake_llm: FakeOpenAI, running: RunningGateway
) -> None:
    fake_llm.script(error(400))
    await running.ask("refused")
    await running.ask("again")
    assert all("prompt_cache_key" in b for b in fake_llm.requests)


async def test_prompt_cache_key_can_be_turned_off(
    fake_llm: FakeOpenAI, make_config: MakeConfig
) -> None:
    rg = RunningGateway(Gateway(make_config(fake_llm, llm={"prompt_cache_key": False})))
    await rg.gateway.start()
    try:
        await rg.ask("hi")
    finally:
        await rg.gateway.stop()
    assert fake_llm.requests and "prompt_cache_key" not in fake_llm.requests[0]


# -- cached tokens: read, stored, shown ---------------------------------------------------------


def cached_usage(body: dict[str, Any]) -> Any:
    """An echo whose usage says 100 prompt tokens, 80 of them from the cache."""
    text = echo(body).text
    return reply(
        text,
        usage={"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 80}},
    )


async def test_cached_tokens_are_stored_per_turn_and_per_session_and_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_LLM_KEY", "sk-test")
    async with FakeOpenAI(default=cached_usage) as fake:
        path = write_config(tmp_path, fake, "[scheduler]\nenabled = false\n")
        gateway = Gateway(load_config(path))
        rg = RunningGateway(gateway)
        await gateway.start()
        try:
            await rg.ask("one")
            await rg.ask("two")
            session = await gateway.store.get_session(KEY)
            assert session is not None and session.id is not None
            assert (session.tokens_in, session.tokens_cached) == (200, 160)
            records = await gateway.store.turn_records(session.id)
            assert [(r.prompt_tokens, r.cached_tokens) for r in records] == [(100, 80)] * 2
            metrics = gateway.metrics.render().decode()
            assert "gatehouse_llm_cached_prompt_tokens_total 160.0" in metrics
            facts = await operations.session_explanation(gateway, KEY, fetch_metadata=False)
            assert facts is not None and facts.prompt_cache is not None
            assert facts.prompt_cache.share == 0.8
            assert facts.to_json()["prompt_cache"] == {
                "prompt_tokens": 200, "cached_tokens": 160, "cached_share": 0.8,
            }
            overview = await operations.session_overview(gateway)
            assert overview[0].to_json()["prompt_cache"]["cached_share"] == 0.8
            history = await operations.token_history(gateway, KEY)
            assert history is not None and [t.cached_tokens for t in history.turns] == [80, 80]
        finally:
            await gateway.stop()
    code, out, err = await in_process(path, "sessions", "show", KEY)
    assert code == 0, err
    assert "read from the provider's prompt cache: 80% of 200 prompt tokens" in out
    code, out, err = await in_process(path, "sessions", "show", KEY, "--json")
    assert code == 0, err
    assert json.loads(out)["prompt_cache"]["cached_share"] == 0.8


async def test_an_endpoint_that_reports_no_cache_says_so(
    fake_llm: FakeOpenAI, running: RunningGateway
) -> None:
    await running.ask("hi")
    detail = await operations.session_detail(running.gateway, KEY)
    assert detail is not None and detail.prompt_cache is not None
    assert detail.prompt_cache.cached_tokens is None
    assert detail.prompt_cache.describe() == "not reported by the endpoint"


async def test_the_admin_session_page_shows_the_cached_share_and_line(
    make_config: MakeConfig,
) -> None:
    async with FakeOpenAI(default=cached_usage) as fake:
        async for admin in serve(make_config, fake, admin_token=TOKEN):
            await admin.rg.ask("one")
            await admin.rg.ask("two")
            status, page, _ = await admin.get(
                f"/admin/session?key={quote(KEY, safe='')}", headers=BEARER
            )
    assert status == 200
    fact = re.search(r'<dd id="prompt-cache">(.*?)</dd>', page, re.S)
    assert fact is not None
    assert "80% of 200 prompt tokens" in " ".join(fact[1].split())
    assert 'id="cached-line"' in page
    assert "80 of 100 prompt tokens from the provider&#39;s cache" in page
