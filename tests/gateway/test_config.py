from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config, parse_config


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_without_any_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GATEHOUSE_CONFIG", raising=False)
    config = load_config()
    assert config.sessions.dm_scope == "per-channel-peer"
    assert config.gateway.max_concurrent_turns == 8
    assert config.database_url.startswith("sqlite:///")
    assert not config.llm.configured


def test_lookup_order_flag_then_env_then_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "gatehouse.toml", '[llm]\nmodel = "from-cwd"\n')
    env_file = write(tmp_path / "env.toml", '[llm]\nmodel = "from-env"\n')
    flag_file = write(tmp_path / "flag.toml", '[llm]\nmodel = "from-flag"\n')
    monkeypatch.delenv("GATEHOUSE_CONFIG", raising=False)
    assert load_config().llm.model == "from-cwd"
    monkeypatch.setenv("GATEHOUSE_CONFIG", str(env_file))
    assert load_config().llm.model == "from-env"
    assert load_config(flag_file).llm.model == "from-flag"


def test_relative_paths_resolve_against_the_config_file(tmp_path: Path) -> None:
    cfg = write(tmp_path / "g.toml", '[gateway]\ndata_dir = "state"\n')
    config = load_config(cfg)
    assert config.data_dir == (tmp_path / "state").resolve()
    assert config.workspace == (tmp_path / "state" / "workspace").resolve()


def test_unknown_key_names_key_and_file(tmp_path: Path) -> None:
    cfg = write(tmp_path / "g.toml", "[gateway]\ntimezon = 'UTC'\n")
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert str(cfg) in str(err.value)
    assert "gateway.timezon: unknown key" in str(err.value)


def test_unknown_channel_key_is_rejected(tmp_path: Path) -> None:
    cfg = write(tmp_path / "g.toml", "[channels.telegram]\ntokn = 'x'\n")
    with pytest.raises(ConfigError, match=r"channels\.telegram\.tokn: unknown key"):
        load_config(cfg)


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ("[web]\nport = 70000\n", "web.port"),
        ("[gateway]\ntimezone = 'Mars/Base'\n", "unknown timezone"),
        ("[sessions]\ndm_scope = 'everyone'\n", "sessions.dm_scope"),
        ("[llm]\ntimeout = -1\n", "llm.timeout"),
        ("[gateway]\ndatabase_url = 'mysql://x'\n", "unsupported database URL scheme .mysql."),
        ("[channels.telegram.dms.'42']\nhistory_limit = -3\n", "history_limit"),
    ],
)
def test_bad_values_are_explained(tmp_path: Path, toml: str, needle: str) -> None:
    cfg = write(tmp_path / "g.toml", toml)
    with pytest.raises(ConfigError, match=needle):
        load_config(cfg)


def test_toml_syntax_error(tmp_path: Path) -> None:
    cfg = write(tmp_path / "g.toml", "[llm\nmodel=1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(cfg)


def test_missing_explicit_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")


def test_env_interpolation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GH_TEST_KEY", "sk-secret")
    config = parse_config(
        {"llm": {"api_key": "${GH_TEST_KEY}", "base_url": "${GH_UNSET_URL:-http://x/v1}"}}
    )
    assert config.llm.api_key == "sk-secret"
    assert config.llm.base_url == "http://x/v1"


def test_missing_env_var_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GH_NOT_SET", raising=False)
    with pytest.raises(ConfigError, match=r"llm\.api_key: environment variable \$\{GH_NOT_SET\}"):
        parse_config({"llm": {"api_key": "${GH_NOT_SET}"}})


def test_identity_links_validated() -> None:
    with pytest.raises(ConfigError, match="platform:user_id"):
        parse_config({"sessions": {"identity_links": {"alice": ["12345"]}}})
    with pytest.raises(ConfigError, match="linked to both"):
        parse_config({"sessions": {"identity_links": {"a": ["tg:1"], "b": ["tg:1"]}}})


def test_shipped_template_is_valid(tmp_path: Path) -> None:
    from importlib import resources

    text = (resources.files("gateway") / "templates" / "gatehouse.toml").read_text()
    cfg = write(tmp_path / "gatehouse.toml", text)
    config = load_config(cfg)
    assert config.channels.telegram.dm_history_limit == 50
    assert config.channels.webchat.enabled


def test_stream_preview_keys_on_every_channel() -> None:
    config = parse_config({"channels": {"telegram": {"stream_preview": True}}})
    assert config.channels.telegram.stream_preview
    assert config.channels.telegram.stream_edit_interval_ms == 1000
    assert config.channels.telegram.stream_min_chars == 40
    assert not config.channels.discord.stream_preview  # opt-in
    with pytest.raises(ConfigError, match=r"channels.slack.stream_edit_interval_ms: .*250"):
        parse_config({"channels": {"slack": {"stream_edit_interval_ms": 100}}})


def test_owners_are_platform_ids_or_identity_link_names() -> None:
    ok = parse_config({"gateway": {"owners": ["telegram:42", "alice"]},
                       "sessions": {"identity_links": {"alice": ["slack:U1"]}}}, "t")
    assert ok.gateway.owners == ["telegram:42", "alice"]
    for bad, says in (("bob", "no [sessions] identity_links name"),
                      ("telegram:", "must look like 'platform:user_id'"),
                      ("webchat:carol", "a webchat id cannot be an owner")):
        with pytest.raises(ConfigError, match=re.escape(says)):
            parse_config({"gateway": {"owners": [bad]}}, "t")
    with pytest.raises(ConfigError, match="a webchat id cannot be an owner"):
        parse_config({"gateway": {"owners": ["carol"]},
                      "sessions": {"identity_links": {"carol": ["webchat:carol"]}}}, "t")
