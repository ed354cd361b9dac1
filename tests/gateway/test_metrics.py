"""`/metrics` over a real socket, parsed with prometheus_client's own parser."""

from __future__ import annotations

from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import Gateway
from gateway.web.server import WebServer, build_app
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import FakeOpenAI, error
from tests.helpers.llm_scripts import FILLER, kind, scripted


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} for every sample in the exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def scrape(url: str) -> tuple[str, str]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/metrics") as r:
            assert r.status == 200
            return r.headers["Content-Type"], await r.text()


async def test_metrics_count_turns_tokens_compactions_flushes_and_failures(
    make_config: MakeConfig,
) -> None:
    async with FakeOpenAI(default=scripted) as fake:
        config = make_config(
            fake, models={"fake-model": {"context_window": 16_000}}, context={"recent_turns": 2}
        )
        rg = RunningGateway(Gateway(config))
        await rg.gateway.start()
        server = WebServer(build_app(rg.gateway, rg.webchat), "127.0.0.1", 0)
        url = await server.start()
        try:
            _ctype, text = await scrape(url)
            before = samples(text)
            assert before[("gatehouse_lanes_active", ())] == 0
            assert before[("gatehouse_lane_queue_depth", ())] == 0

            for i in range(7):
                await rg.ask(f"message {i} " + FILLER)
            def fails_this_turn(body: dict[str, Any]) -> Any:
                # Only the chat call fails (and the SDK's retry of it), not a summary or the
                # memory flush that the same turn may run first.
                if kind(body) == "chat" and body["messages"][-1]["content"] == "this turn fails":
                    return error(500)
                return scripted(body)

            fake.default = fails_this_turn
            await rg.ask("this turn fails")
            fake.default = scripted
            for i in range(3):  # the failing turn compacted: new turns for /compact to take
                await rg.ask(f"short {i}")
            await rg.ask("/compact")

            ctype, text = await scrape(url)
            assert ctype.startswith("text/plain; version=")
            got = samples(text)
        finally:
            await server.stop()
            await rg.gateway.stop()

    ok = got[("gatehouse_turns_total", (("outcome", "ok"), ("platform", "webchat")))]
    failed = got[("gatehouse_turns_total", (("outcome", "error"), ("platform", "webchat")))]
    assert (ok, failed) == (11, 1), "10 chats and the /compact turn; one failure"
    assert got[("gatehouse_turn_duration_seconds_count", (("platform", "webchat"),))] == 12
    assert got[("gatehouse_turn_duration_seconds_sum", (("platform", "webchat"),))] > 0
    assert got[("gatehouse_llm_tokens_total", (("direction", "in"),))] > 7 * 1_000
    assert got[("gatehouse_llm_tokens_total", (("direction", "out"),))] > 0
    automatic = got[("gatehouse_compactions_total", (("fallback", "no"), ("reason", "overflow")))]
    manual = got.get(("gatehouse_compactions_total", (("fallback", "no"), ("reason", "command"))))
    assert automatic >= 1
    assert manual == 1
    assert got[("gatehouse_memory_flushes_total", (("outcome", "ok"),))] >= 1
    assert ("gatehouse_compaction_failures_total", (("reason", "overflow"),)) not in got


async def test_a_crashing_compaction_is_counted_as_a_failure(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    gateway = Gateway(make_config(fake_llm))

    async def broken(*_args: object, **_kw: object) -> None:
        raise RuntimeError("summarizer exploded")

    gateway.runner.engine.compact = broken  # type: ignore[method-assign]
    rg = RunningGateway(gateway)
    await gateway.start()
    try:
        await rg.ask("hello")
        await rg.ask("/compact")
    finally:
        await gateway.stop()
    got = samples(gateway.metrics.render().decode())
    assert got[("gatehouse_compaction_failures_total", (("reason", "command"),))] == 1
