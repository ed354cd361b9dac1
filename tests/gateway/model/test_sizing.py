"""The context engine wired into the gateway: config -> limits -> prompt, explain, tool caps."""

from __future__ import annotations

from typing import Any

from gateway.app import Gateway
from gateway.operations import explain_session
from gateway.tools.registry import Tool, ToolContext, default_registry
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import FakeOpenAI, reply, tool_call


async def start(config: Any, tools: Any = None) -> RunningGateway:
    gateway = Gateway(config, tools=tools)
    rg = RunningGateway(gateway)
    await gateway.start()
    return rg


def users_sent(fake: FakeOpenAI) -> list[str]:
    return [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "user"]


async def test_per_user_dm_limit_beats_platform_default(
    fake_llm: FakeOpenAI, make_config: MakeConfig
) -> None:
    config = make_config(
        fake_llm,
        context={"history_limit": 10},
        channels={"webchat": {"dm_history_limit": 3, "dms": {"vip": {"history_limit": 1}}}},
    )
    rg = await start(config)
    try:
        for i in range(5):
            await rg.ask(f"m{i}", user="vip")
            await rg.ask(f"m{i}", user="pleb")
        assert users_sent(fake_llm) == ["m1", "m2", "m3", "m4"]  # pleb: 3 turns + current
        await rg.ask("again", user="vip")
        assert users_sent(fake_llm) == ["m4", "again"]
        facts = await explain_session(config, "agent:main:webchat:direct:vip", fetch_metadata=False)
        assert facts is not None and facts.plan is not None
        assert facts.plan.history_limit == 1
        assert facts.plan.history_limit_source == '[channels.webchat.dms."vip"] history_limit'
        facts = await explain_session(
            config, "agent:main:webchat:direct:pleb", fetch_metadata=False
        )
        assert facts is not None and facts.plan is not None
        assert facts.plan.history_limit_source == "[channels.webchat] dm_history_limit"
    finally:
        await rg.gateway.stop()


async def test_window_and_counter_are_explained(
    fake_llm: FakeOpenAI, make_config: MakeConfig
) -> None:
    config = make_config(
        fake_llm,
        models={"fake-model": {"context_window": 64_000}},
        agent={"max_context_tokens": 50_000},
    )
    rg = await start(config)
    try:
        await rg.ask("hello")
        facts = await explain_session(
            config, "agent:main:webchat:direct:tester", fetch_metadata=False
        )
        assert facts is not None and facts.plan is not None
        plan = facts.plan
        assert plan.window == 50_000
        assert "capped by [agent] max_context_tokens" in plan.window_source
        assert plan.counter.startswith("tiktoken:")
        assert plan.compaction_threshold == 50_000 - 12_500
        assert plan.to_compaction == plan.compaction_threshold - (plan.tokens.prompt or 0)
        assert "provider report" in facts.calibration
    finally:
        await rg.gateway.stop()


async def test_the_cli_describes_the_calibration_the_gateway_uses(
    fake_llm: FakeOpenAI, make_config: MakeConfig
) -> None:
    config = make_config(fake_llm)
    key = "agent:main:webchat:direct:tester"
    rg = await start(config)
    try:
        for i in range(3):
            await rg.ask(f"hello {i}")
        running = rg.gateway.resolver.calibration(key).describe()
        assert "from 3 provider reports" in running
        facts = await explain_session(config, key, fetch_metadata=False)  # another Gateway
        assert facts is not None and facts.calibration == running
    finally:
        await rg.gateway.stop()


async def test_server_reported_window_is_used(make_config: MakeConfig) -> None:
    async with FakeOpenAI(model_meta={"fake-model": {"max_model_len": 40_000}}) as fake:
        config = make_config(fake)
        facts_holder: dict[str, Any] = {}
        rg = await start(config)
        try:
            await rg.ask("hi")
            facts = await explain_session(config, "agent:main:webchat:direct:tester")
            assert facts is not None
            facts_holder.update(facts.to_json())
        finally:
            await rg.gateway.stop()
    assert facts_holder["window"] == 40_000
    assert "max_model_len" in facts_holder["window_source"]


async def test_too_small_window_refuses_the_turn(
    fake_llm: FakeOpenAI, make_config: MakeConfig
) -> None:
    rg = await start(make_config(fake_llm, models={"fake-model": {"context_window": 8_192}}))
    try:
        [answer] = await rg.ask("hi")
        assert "below the minimum of 16,000" in answer
        assert fake_llm.requests == []
    finally:
        await rg.gateway.stop()


async def test_token_counts_are_cached_in_the_store(running: RunningGateway) -> None:
    await running.ask("count me once")
    store = running.gateway.store
    session = await store.get_session("agent:main:webchat:direct:tester")
    assert session is not None and session.id is not None
    history = await store.history(session.id)
    assert all(m.tokens for m in history), [(m.role, m.tokens) for m in history]


async def test_huge_tool_output_is_capped_and_saved(
    fake_llm: FakeOpenAI, make_config: MakeConfig
) -> None:
    huge = "line of output\n" * 200_000 + "Traceback (most recent call last):\nValueError: boom\n"

    async def dump(_args: dict[str, Any], _ctx: ToolContext) -> str:
        return huge

    tools = default_registry()
    tools.register(
        Tool("dump", "Print a lot", {"type": "object", "properties": {}}, dump)
    )
    config = make_config(fake_llm, models={"fake-model": {"context_window": 32_000}})
    rg = await start(config, tools)
    try:
        fake_llm.script(tool_call("dump", {}), reply("saw it"))
        assert await rg.ask("run it") == ["saw it"]
        sent = next(m for m in fake_llm.requests[-1]["messages"] if m["role"] == "tool")["content"]
        assert len(sent) < 40_000
        assert "ValueError: boom" in sent, "the error tail is kept"
        assert "full output saved to artifacts/" in sent
        artifacts = list((config.workspace / "artifacts").glob("*/*dump*.txt"))
        assert len(artifacts) == 1 and artifacts[0].read_text() == huge
    finally:
        await rg.gateway.stop()
