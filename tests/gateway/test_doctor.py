"""`gatehouse doctor` against the fake Telegram, Slack, Discord and OpenAI servers: every check
green when things are right, red with a clear fix when a token is wrong or an endpoint is down."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.doctor import Check, diagnose, run_doctor
from memory.workspace import ensure_workspace
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def platforms(
    tg: FakeTelegram, sl: FakeSlack, dc: FakeDiscord, **override: Any
) -> dict[str, Any]:
    channels: dict[str, Any] = {
        "telegram": {"enabled": True, "token": tg.token, "base_url": tg.base_url},
        "slack": {"enabled": True, "bot_token": "xoxb-test", "app_token": "xapp-test",
                  "base_url": sl.api_url},
        "discord": {"enabled": True, "token": dc.token, "api_base_url": dc.api_base_url},
    }
    for name, values in override.items():
        channels[name] = {**channels[name], **values}
    return channels


@pytest.fixture
async def fakes() -> Any:
    async with FakeTelegram() as tg, FakeSlack() as slack, FakeDiscord() as dc:
        yield tg, slack, dc


async def test_everything_ready_against_the_fakes(
    make_config: MakeConfig, fake_llm: FakeOpenAI, fakes: Any
) -> None:
    tg, slack, dc = fakes
    config = make_config(fake_llm, channels=platforms(tg, slack, dc),
                         web={"admin_token": "x" * 16}, memory={"embeddings": True},
                         gateway={"owners": ["telegram:123456"]})
    ensure_workspace(config.workspace)
    checks = by_name(await diagnose(config))
    assert {n: c.status for n, c in checks.items()} == {
        "database": "ready", "workspace": "ready", "memory search": "ready", "llm": "ready",
        "telegram": "ready", "slack": "ready", "discord": "ready", "owners": "ready",
    }
    assert checks["owners"].detail == "telegram:123456 (and the terminal user)"
    assert "use-multilingual-v3" in checks["memory search"].detail
    assert "notes 0/0" in checks["memory search"].detail
    assert "@gatehouse_bot" in checks["telegram"].detail
    assert "fake-model" in checks["llm"].detail
    assert "gatehouse" in checks["discord"].detail
    # One harmless call each, through the real SDKs, at the configured base URLs.
    assert [c.method for c in tg.calls] == ["getMe"]
    assert [c.method for c in slack.calls] == ["auth.test"]
    assert [c.path for c in dc.calls] == ["/users/@me"]
    assert fake_llm.model_list_requests == 1 and fake_llm.requests == []


async def test_wrong_tokens_are_red_with_the_key_to_fix(
    make_config: MakeConfig, fake_llm: FakeOpenAI, fakes: Any
) -> None:
    tg, slack, dc = fakes
    slack.fail("auth.test", "invalid_auth")
    config = make_config(fake_llm, channels=platforms(
        tg, slack, dc, telegram={"token": "999:WRONG"}, discord={"token": "wrong"},
    ))
    ensure_workspace(config.workspace)
    checks = by_name(await diagnose(config))
    for name, key in (("telegram", "channels.telegram.token"), ("slack", "channels.slack.bot_token"),
                      ("discord", "channels.discord.token")):
        assert checks[name].status == "problem", checks[name]
        assert key in checks[name].fix
    assert "refused" in checks["telegram"].detail
    assert "invalid_auth" in checks["slack"].detail
    assert "refused" in checks["discord"].detail


async def test_socket_mode_without_an_app_token_is_a_problem(
    make_config: MakeConfig, fakes: Any
) -> None:
    tg, slack, dc = fakes
    slack_only = platforms(tg, slack, dc, slack={"app_token": None})["slack"]
    config = make_config(channels={"slack": slack_only})
    check = by_name(await diagnose(config))["slack"]
    assert check.status == "problem" and "xapp-" in check.detail
    assert slack.calls == []


async def test_llm_endpoint_down_or_refusing_the_key(make_config: MakeConfig) -> None:
    async with FakeOpenAI() as fake:
        url = fake.base_url
    config = make_config(llm={"base_url": url, "api_key": "k", "model": "m"})
    check = by_name(await diagnose(config))["llm"]
    assert check.status == "problem"
    assert "cannot connect" in check.detail
    assert "[llm] base_url" in check.fix


async def test_llm_model_missing_from_the_server_is_a_warning(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    config = make_config(fake_llm, llm={"model": "not-served"})
    check = by_name(await diagnose(config))["llm"]
    assert check.status == "warning"
    assert "fake-model" in check.detail and "[llm] model" in check.fix


async def test_no_llm_configured_says_how(make_config: MakeConfig) -> None:
    config = make_config(llm={"local_model": False})
    check = by_name(await diagnose(config))["llm"]
    assert check.status == "problem"
    assert "[llm] base_url, api_key and model" in check.fix


async def test_database_and_workspace_problems(make_config: MakeConfig, tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        closed = fake.port  # nothing listens there any more
    config = make_config(gateway={
        "database_url": f"postgresql+asyncpg://u:secret@127.0.0.1:{closed}/db",
        "workspace": str(tmp_path / "nowhere"),
    })
    checks = by_name(await diagnose(config))
    assert checks["database"].status == "problem"
    assert "secret" not in checks["database"].detail, "passwords never printed"
    assert "database_url" in checks["database"].fix
    assert checks["workspace"].status == "problem"
    assert "gatehouse init" in checks["workspace"].fix


async def test_memory_search_without_embeddings_is_a_bm25_warning(
    make_config: MakeConfig,
) -> None:
    config = make_config(memory={"embeddings": False})
    check = by_name(await diagnose(config))["memory search"]
    assert check.status == "warning" and check.detail.startswith("BM25 only")
    assert "[memory] embeddings" in check.fix


async def test_a_bad_config_is_the_first_and_only_problem(tmp_path: Path) -> None:
    path = tmp_path / "gatehouse.toml"
    path.write_text("[web]\nadmin_tokn = 'x'\n", encoding="utf-8")
    config, checks = await run_doctor(path)
    assert config is None
    assert [(c.name, c.status) for c in checks] == [("config", "problem")]
    assert "web.admin_tokn: unknown key" in checks[0].detail



async def test_no_owners_is_a_warning_that_says_everyone_is_a_guest(make_config: MakeConfig) -> None:
    checks = by_name(await diagnose(make_config()))
    assert checks["owners"].status == "warning"
    assert "everyone who writes is a guest" in checks["owners"].detail
    assert "[gateway] owners" in checks["owners"].fix
