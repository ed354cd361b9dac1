"""Issue 23, item 9: an optional feature whose `${VAR}` is unset is turned off with one warning
(the admin UI, a channel), not a config error for every command; a required one (the model
endpoint's key, the database URL...) stays an error naming the variable. And what a reload may
change in a running gateway (history limits, access lists), and what needs a restart."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp
import pytest

from gateway.config import ConfigError, parse_config
from gateway.reload import apply_reload, reload_plan
from tests.helpers.cli import GATEHOUSE, env, run_cli, write_config

UNSET = "GH_TEST_UNSET_VARIABLE"


@pytest.fixture(autouse=True)
def _unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(UNSET, raising=False)


def test_an_unset_admin_token_turns_the_admin_ui_off() -> None:
    config = parse_config({"web": {"admin_token": f"${{{UNSET}}}"}})
    assert config.web.admin_token is None
    assert config.notices == [
        f"web.admin_token: ${{{UNSET}}} is not set: the admin UI (/admin/) is off"
    ]


def test_an_unset_channel_credential_turns_that_channel_off() -> None:
    config = parse_config({"channels": {
        "telegram": {"enabled": True, "token": f"${{{UNSET}}}", "dm_history_limit": 7},
        "slack": {"enabled": True, "bot_token": "xoxb-1", "signing_secret": f"${{{UNSET}}}",
                  "mode": "http"},
        "discord": {"token": f"${{{UNSET}}}"},  # not enabled: nothing to turn off, no notice
        "webchat": {"allow_from": ["alice", f"${{{UNSET}}}", f"${{{UNSET}}}x"]},
    }})
    assert not config.channels.telegram.enabled
    assert config.channels.telegram.token is None
    assert config.channels.telegram.dm_history_limit == 7, "the rest of the section stays"
    assert not config.channels.slack.enabled, "never a webhook without its secret"
    assert not config.channels.discord.enabled
    assert not config.channels.webchat.enabled, "an access list it cannot read: closed"
    assert config.notices == [
        f"channels.telegram.token: ${{{UNSET}}} is not set: the telegram channel is off",
        f"channels.slack.signing_secret: ${{{UNSET}}} is not set: the slack channel is off",
        f"channels.webchat.allow_from[1]: ${{{UNSET}}} is not set: the webchat channel is off",
    ]


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"llm": {"base_url": "http://x/v1", "api_key": f"${{{UNSET}}}"}}, "llm.api_key"),
        ({"llm": {"base_url": f"${{{UNSET}}}"}}, "llm.base_url"),
        ({"gateway": {"database_url": f"postgresql://u:${{{UNSET}}}@db/g"}},
         "gateway.database_url"),
        ({"context": {"summary_api_key": f"${{{UNSET}}}"}}, "context.summary_api_key"),
        ({"web": {"allowed_hosts": [f"${{{UNSET}}}"]}}, "web.allowed_hosts[0]"),
    ],
)
def test_an_unset_required_variable_is_an_error_naming_it(
    data: dict[str, object], key: str
) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(data, "gatehouse.toml")
    assert f"{key}: environment variable ${{{UNSET}}} is not set" in str(exc.value)
    assert str(exc.value).startswith("gatehouse.toml: a required environment variable")


def test_every_unset_required_variable_is_listed_and_optional_ones_do_not_hide_them() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config({
            "web": {"admin_token": f"${{{UNSET}}}"},
            "llm": {"api_key": f"${{{UNSET}}}"},
            "gateway": {"database_url": "${GH_TEST_UNSET_TOO}"},
        })
    lines = str(exc.value).splitlines()[1:]
    assert lines == [
        f"  llm.api_key: environment variable ${{{UNSET}}} is not set",
        "  gateway.database_url: environment variable ${GH_TEST_UNSET_TOO} is not set",
    ]


async def test_the_cli_works_with_an_optional_variable_unset(tmp_path: Path) -> None:
    (tmp_path / "gatehouse.toml").write_text(
        '[gateway]\ndata_dir = "data"\n[memory]\nembeddings = false\n[llm]\nlocal_model = false\n'
        f'[web]\nport = 0\nadmin_token = "${{{UNSET}}}"\n'
        f'[channels.telegram]\nenabled = true\ntoken = "${{{UNSET}}}"\n',
        encoding="utf-8",
    )
    code, out, err = await run_cli("config-check", cwd=tmp_path)
    assert code == 0, err
    assert "ok " in out
    warnings = [line for line in err.splitlines() if "is not set" in line]
    assert len(warnings) == 2, err
    assert f"web.admin_token: ${{{UNSET}}} is not set: the admin UI (/admin/) is off" in err
    assert "the telegram channel is off" in err
    code, out, err = await run_cli("sessions", "list", "--json", cwd=tmp_path)
    assert (code, out.strip()) == (0, "[]"), err

    # `gatehouse run` starts, without the admin UI and without Telegram, and says so once.
    proc = await asyncio.create_subprocess_exec(
        GATEHOUSE, "run", cwd=tmp_path, env=env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=60)).decode()
        assert line.startswith("gatehouse listening on"), line
        url = line.split(" on ", 1)[1].strip()
        async with aiohttp.ClientSession() as http, http.get(f"{url}/admin/") as resp:
            assert "The admin UI is off" in await resp.text()
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err_bytes = await asyncio.wait_for(proc.communicate(), timeout=30)
    log = err_bytes.decode()
    assert proc.returncode == 0, log
    assert log.count(f"web.admin_token: ${{{UNSET}}} is not set") == 1, log
    assert log.count("the telegram channel is off") == 1, log
    assert "channel telegram enabled" not in log


async def test_the_cli_names_an_unset_required_variable(tmp_path: Path) -> None:
    write_config(tmp_path, None, f'[context]\nsummary_api_key = "${{{UNSET}}}"\n')
    code, _out, err = await run_cli("sessions", "list", cwd=tmp_path)
    assert code == 2
    assert f"context.summary_api_key: environment variable ${{{UNSET}}} is not set" in err
    assert "Traceback" not in err


def test_a_reload_plan_names_what_changes_and_what_needs_a_restart() -> None:
    old = {
        "context": {"history_limit": 0},
        "web": {"port": 8787},
        "llm": {"api_key": "sk-old-secret"},
        "channels": {
            "telegram": {"dm_history_limit": 40, "dms": {"7": {"history_limit": 100}},
                         "allow_from": ["1", "2"], "dm_policy": "pairing"},
            "slack": {"channels": {"C1": {"history_limit": 5}}, "require_mention": True},
        },
    }
    new = {
        "context": {"history_limit": 20},
        "gateway": {"queue_mode": "followup"},
        "web": {"port": 9999},
        "llm": {"api_key": "sk-new-secret"},
        "channels": {
            "telegram": {"dm_history_limit": 30, "allow_from": ["2", "3"],
                         "dm_policy": "allowlist"},
            "slack": {"channels": {"C1": {"history_limit": 0}}, "require_mention": False,
                      "group_allowlist": ["C9"], "queue_mode": "interrupt"},
        },
    }
    running, started_from, fresh = parse_config(old), parse_config(old), parse_config(new)
    plan = reload_plan(running, started_from, fresh)
    assert plan.changes == [
        "history limits: default unlimited → 20, telegram dm 40 → 30, "
        "telegram dm 7 100 → unset, slack channel C1 5 → unlimited",
        "access: telegram dm_policy pairing → allowlist; telegram allow_from +3 -1; "
        "slack group_allowlist +C9; slack require_mention true → false",
        "mid-turn modes: default collect → followup, slack default → interrupt",
    ]
    assert plan.restart == ["llm.api_key", "web.port"], "names only: a value may be a secret"
    apply_reload(running, fresh)
    assert running.context.history_limit == 20
    assert running.channels.telegram.dm_history_limit == 30
    assert running.channels.telegram.dms == {}
    assert running.channels.telegram.allow_from == ["2", "3"]
    assert running.channels.slack.group_allowlist == ["C9"]
    assert running.gateway.queue_mode == "followup"
    assert running.channels.slack.queue_mode == "interrupt"
    assert running.web.port == 8787, "not reloadable: kept"
    assert running.llm.api_key == "sk-old-secret"
    assert reload_plan(running, started_from, fresh).changes == []
