"""Issue 20, item 5: a bad config value never comes back in an error when its key holds a secret
(tokens, secrets, API keys, passwords, database URLs with a password), whether the value was
written in the file or came from `${VAR}`; `config-check` and `doctor` mask them too, and the
log filter knows every one of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.config import parse_config
from gateway.doctor import redacted_url
from gateway.logging_setup import config_secrets
from tests.helpers.cli import in_process, run_cli

SECRET = "EnvSecretXy"  # from ${ADM}: 11 characters, too short for an admin token
PASSWORD = "Sup3rSecretPw"


def config_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "gatehouse.toml"
    path.write_text(f'[gateway]\ndata_dir = "data"\n[web]\nport = 0\n{body}', encoding="utf-8")
    return path


def only_errors(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return err.strip().splitlines()


@pytest.mark.parametrize(
    ("body", "key", "secret"),
    [
        ('[web]\nadmin_token = "${ADM}"\n', "web.admin_token", SECRET),
        ("[llm]\napi_key = 12345678901234\n", "llm.api_key", "12345678901234"),
        ("[context]\nsummary_api_key = 23456789012345\n", "context.summary_api_key",
         "23456789012345"),
        ("[channels.telegram]\ntoken = 72123456789\n", "channels.telegram.token", "72123456789"),
        ("[channels.telegram]\nwebhook_secret = 98765432101\n",
         "channels.telegram.webhook_secret", "98765432101"),
        ("[channels.slack]\nsigning_secret = 31415926535\n", "channels.slack.signing_secret",
         "31415926535"),
        ("[channels.slack]\nbot_token = 27182818284\n", "channels.slack.bot_token", "27182818284"),
        ("[channels.discord]\ntoken = 16180339887\n", "channels.discord.token", "16180339887"),
        (f'[gateway]\ndatabase_url = "mysql://gh:{PASSWORD}@db.example/gh"\n',
         "gateway.database_url", PASSWORD),
        (f'[gateway]\ndatabase_url = "not a url {PASSWORD}"\n', "gateway.database_url", PASSWORD),
    ],
)
async def test_config_errors_name_the_key_never_the_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, key: str, secret: str
) -> None:
    monkeypatch.setenv("ADM", SECRET)
    path = tmp_path / "gatehouse.toml"
    path.write_text(body, encoding="utf-8")
    code, out, err = await in_process(path, "config-check")
    assert code == 2, out + err
    lines = only_errors(err)
    assert any(line.strip().startswith(f"{key}:") for line in lines), err
    assert secret not in out + err


async def test_the_admin_token_from_the_environment_is_not_printed_by_the_real_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ADM", SECRET)
    path = config_file(tmp_path, "")
    path.write_text(path.read_text().replace("[web]\n", '[web]\nadmin_token = "${ADM}"\n'))
    code, out, err = await run_cli("--config", str(path), "config-check", cwd=tmp_path)
    assert code == 2
    assert "web.admin_token: String should have at least 16 characters" in err
    assert SECRET not in out + err
    # doctor's config check shows the same text.
    code, out, err = await in_process(path, "doctor", "--json")
    assert code == 1
    [check] = json.loads(out)["checks"]
    assert "web.admin_token" in check["detail"] and SECRET not in out


async def test_database_url_shows_without_its_password(tmp_path: Path) -> None:
    path = config_file(tmp_path, "")
    path.write_text(path.read_text().replace(
        "[gateway]\n", f'[gateway]\ndatabase_url = "mysql://gh:{PASSWORD}@db.example/gh"\n'
    ))
    code, _out, err = await in_process(path, "config-check")
    assert code == 2
    assert "unsupported database URL scheme 'mysql'" in err
    assert "mysql://gh:***@db.example/gh" in err  # what was written, minus the password
    assert PASSWORD not in err


async def test_config_check_masks_credentials_in_the_urls_it_prints(tmp_path: Path) -> None:
    path = config_file(
        tmp_path,
        '[llm]\nbase_url = "https://me:BaseUrlPw123@llm.example/v1"\n',
    )
    path.write_text(path.read_text().replace(
        "[gateway]\n",
        '[gateway]\ndatabase_url = "postgresql://gh@db.example/gh?password=QueryPw456"\n',
    ))
    code, out, err = await in_process(path, "config-check")
    assert code == 0, err
    assert "llm.example/v1" in out and "db.example/gh" in out
    assert "BaseUrlPw123" not in out and "QueryPw456" not in out


async def test_doctor_masks_credentials_in_the_urls_it_reports(tmp_path: Path) -> None:
    path = config_file(
        tmp_path,
        '[llm]\nbase_url = "http://me:BaseUrlPw123@127.0.0.1:9/v1"\napi_key = "sk-unused-0000"\n',
    )
    code, out, _err = await in_process(path, "doctor", "--json")
    assert code == 1
    [llm] = [c for c in json.loads(out)["checks"] if c["name"] == "llm"]
    assert "127.0.0.1:9/v1" in llm["detail"]
    assert "BaseUrlPw123" not in out


def test_every_secret_of_a_config_is_known_to_the_log_filter() -> None:
    config = parse_config({
        "web": {"admin_token": "admin-token-0123456789"},
        "llm": {"base_url": "https://me:BaseUrlPw123@llm.example/v1"},
        "gateway": {"database_url": f"postgresql://gh:{PASSWORD}@db.example/gh"},
    })
    secrets = config_secrets(config)
    assert {"admin-token-0123456789", "BaseUrlPw123", PASSWORD} <= set(secrets)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"postgresql://gh:{PASSWORD}@db.example:5432/gh", "postgresql://gh:***@db.example:5432/gh"),
        ("postgresql://gh@db.example/gh?password=QueryPw456&sslmode=require",
         "postgresql://gh@db.example/gh?password=***&sslmode=require"),
        ("sqlite:////srv/data@home/gatehouse.db", "sqlite:////srv/data@home/gatehouse.db"),
        ("https://me:pw-0123@llm.example/v1", "https://me:***@llm.example/v1"),
        ("not a url", "not a url"),
    ],
)
def test_redacted_url(url: str, shown: str) -> None:
    assert redacted_url(url) == shown
