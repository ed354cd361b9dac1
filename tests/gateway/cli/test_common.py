"""The scaffold every command stands on (gateway/cli/common.py): what went wrong becomes one
line on stderr and an exit code, and the command tree keeps its shape."""

from __future__ import annotations

import pytest
import typer
from typer.main import get_command

from gateway.cli import app
from gateway.cli.common import execute, found
from gateway.config import Config
from gateway.operations import TranscriptError
from tests.conftest import MakeConfig


def test_a_missing_session_is_one_line_and_exit_1(
    make_config: MakeConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    async def op(_config: Config) -> int:
        raise KeyError("agent:main:x")

    with pytest.raises(typer.Exit) as exit_:
        execute(op, config=make_config(), session="agent:main:x")
    assert exit_.value.exit_code == 1
    assert capsys.readouterr().err == (
        "no session 'agent:main:x' (see `gatehouse sessions list`)\n"
    )
    with pytest.raises(typer.Exit):
        found(None, "agent:main:x")
    assert found(0, "agent:main:x") == 0, "a falsy result is still a result"


def test_refusals_are_labelled_with_their_exit_code(
    make_config: MakeConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    refusals = [(TranscriptError, "transcript error", 2), (ValueError, "error", 1)]

    async def bad_file(_config: Config) -> None:
        raise TranscriptError("t.jsonl:2: not valid JSON")

    async def taken(_config: Config) -> None:
        raise ValueError("already has 3 messages")

    with pytest.raises(typer.Exit) as exit_:
        execute(bad_file, config=make_config(), refusals=refusals)
    assert exit_.value.exit_code == 2, "the first matching refusal wins"
    assert capsys.readouterr().err == "transcript error: t.jsonl:2: not valid JSON\n"
    with pytest.raises(typer.Exit) as exit_:
        execute(taken, config=make_config(), refusals=refusals)
    assert exit_.value.exit_code == 1
    assert capsys.readouterr().err == "error: already has 3 messages\n"


def test_other_errors_are_not_swallowed(make_config: MakeConfig) -> None:
    async def broken(_config: Config) -> None:
        raise KeyError("not a session")

    with pytest.raises(KeyError):
        execute(broken, config=make_config())


def test_the_command_tree_keeps_its_order() -> None:
    """`gatehouse --help` lists the root's commands, then the groups, as they always were."""
    root = get_command(app)
    ctx = typer.Context(root)
    assert root.list_commands(ctx) == [  # type: ignore[attr-defined]
        "init", "run", "reload", "chat", "doctor", "config-check",
        "sessions", "context", "pairing", "memory", "db", "jobs", "outbox",
    ]
    groups = {
        name: root.get_command(ctx, name).list_commands(ctx)  # type: ignore[attr-defined]
        for name in ("sessions", "context", "pairing", "memory", "db", "jobs", "outbox")
    }
    assert groups == {
        "sessions": ["list", "show", "compact", "export", "import", "uncompact", "search"],
        "context": ["compact", "explain"],
        "pairing": ["list", "approve", "deny"],
        "memory": ["ls", "show", "search", "reindex", "stats", "reembed"],
        "db": ["upgrade", "current"],
        "jobs": ["list", "cancel"],
        "outbox": ["list", "retry", "drop"],
    }
