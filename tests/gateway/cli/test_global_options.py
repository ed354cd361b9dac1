"""Issue 23, item 7: the global options work after the command too (`gatehouse run --config
x.toml`, `gatehouse sessions list --config x.toml`), the one after the command winning; and
`--help` shows every help text as written ("[gateway] delivery_attempts", not " delivery_attempts")
and flags without a `<bool>`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
from typer.main import get_command

from gateway.cli import app
from tests.helpers.cli import invoke, run_cli, write_config

#: Every command that reads the config, with the arguments it needs to get that far.
COMMANDS = [
    ["run"],
    ["reload"],
    ["chat", "-m", "hi"],
    ["config-check"],
    ["sessions", "list"],
    ["sessions", "show", "agent:main:webchat:direct:alice"],
    ["sessions", "uncompact", "agent:main:webchat:direct:alice"],
    ["context", "explain", "agent:main:webchat:direct:alice"],
    ["pairing", "list"],
    ["jobs", "list"],
    ["outbox", "list"],
    ["db", "current"],
    ["memory", "ls"],
]


@pytest.fixture
def configs(tmp_path: Path) -> tuple[Path, Path]:
    """(a good config, a config with a typo): which one a command read is plain from its exit."""
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    good = write_config(tmp_path / "good", None, "[llm]\nlocal_model = false\n")
    bad = tmp_path / "bad" / "bad.toml"
    bad.write_text("[sessions]\ndm_scop = 'main'\n", encoding="utf-8")
    return good, bad


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
async def test_config_after_the_command_is_the_one_read(
    configs: tuple[Path, Path], command: list[str]
) -> None:
    good, bad = configs
    code, out, err = await invoke(*command, "--config", str(bad))
    assert code == 2, out + err
    assert f"{bad}: invalid configuration" in err
    assert "sessions.dm_scop: unknown key" in err
    assert "No such option" not in err
    code, out, err = await invoke("--config", str(good), *command, "-c", str(bad))
    assert code == 2, "given before and after the command, the one after wins"
    assert f"{bad}: invalid configuration" in err


@pytest.mark.parametrize(
    "command",
    [["config-check"], ["sessions", "list", "--json"], ["pairing", "list"], ["jobs", "list"],
     ["outbox", "list", "--json"], ["db", "upgrade"], ["memory", "ls", "--json"]],
    ids=" ".join,
)
async def test_config_after_the_command_wins_over_the_one_before(
    configs: tuple[Path, Path], command: list[str]
) -> None:
    good, bad = configs
    code, out, err = await invoke("--config", str(bad), *command, "--config", str(good))
    assert code == 0, out + err


async def test_a_group_takes_the_options_too(configs: tuple[Path, Path]) -> None:
    good, bad = configs
    code, _out, err = await invoke("sessions", "--config", str(bad), "list")
    assert code == 2
    assert f"{bad}: invalid configuration" in err
    code, out, err = await invoke(
        "--config", str(bad), "sessions", "--config", str(good), "list", "--json"
    )
    assert (code, out.strip()) == (0, "[]"), err


async def test_log_level_after_the_command(configs: tuple[Path, Path]) -> None:
    good, _bad = configs
    code, out, err = await invoke("config-check", "--config", str(good), "--log-level", "debug")
    assert code == 0, out + err
    code, _out, err = await invoke("config-check", "--config", str(good), "--log-level", "LOUD")
    assert code == 2
    assert "Invalid value for '--log-level'" in err
    assert "DEBUG, INFO, WARNING, ERROR" in err


def _command_paths() -> list[list[str]]:
    """Every command and group of `gatehouse`, as the words that name it."""
    root = get_command(app)
    ctx = typer.Context(root)
    paths: list[list[str]] = [[]]
    pending: list[tuple[list[str], object]] = [([], root)]
    while pending:
        path, command = pending.pop()
        for name in getattr(command, "commands", {}):
            sub = command.get_command(ctx, name)  # type: ignore[attr-defined]
            paths.append([*path, name])
            pending.append(([*path, name], sub))
    return sorted(paths)


def _bracketed(text: str | None) -> list[str]:
    """The "[gateway] delivery_attempts"-style words of a help text."""
    return re.findall(r"\[[^\]\s]+\]", text or "")


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_every_command_is_walked() -> None:
    paths = _command_paths()
    assert ["outbox", "retry"] in paths
    assert ["reload"] in paths
    assert len(paths) > 30


@pytest.mark.parametrize("path", _command_paths(), ids=lambda p: " ".join(p) or "gatehouse")
async def test_help_shows_texts_as_written_and_flags_without_types(path: list[str]) -> None:
    root = get_command(app)
    ctx = typer.Context(root)
    command = root
    for name in path:
        command = command.get_command(ctx, name)  # type: ignore[attr-defined]
    code, out, err = await invoke(*path, "--help")
    assert code == 0, err
    assert "<bool>" not in out
    texts = [command.help, *(getattr(p, "help", None) for p in command.params)]
    for sub in getattr(command, "commands", {}).values():
        texts.append((sub.help or "").split("\n\n")[0])  # the first paragraph, in the list
    for text in texts:
        for word in _bracketed(text):
            assert word in out, f"{word} lost from `{' '.join(path)} --help`"
    assert "--config" in out and "--log-level" in out


async def test_the_real_command_shows_gateway_keys_in_help(tmp_path: Path) -> None:
    code, out, err = await run_cli("outbox", "retry", "--help", cwd=tmp_path)
    assert code == 0, err
    assert "([gateway] pending_sweep_seconds)" in _flat(out)
    assert "<bool>" not in out
    assert re.search(r"^\s+--all\s+Every given-up reply", out, re.MULTILINE), out
    code, out, err = await run_cli("outbox", "--help", cwd=tmp_path)
    assert code == 0, err
    assert "[gateway] delivery_attempts" in _flat(out)
