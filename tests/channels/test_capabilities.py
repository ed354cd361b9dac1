"""The declared channel seams: which adapter has which optional part, with one signature each.

The gateway finds an optional part with ``isinstance(channel, <protocol>)``, which only checks
that the names exist: a method whose parameters drifted from its protocol would still match and
fail at the call. These tests pin the table and compare the signatures, so drift fails here.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import pytest

import channels
from channels import base
from channels.base import (
    AnswersRequests,
    Channel,
    NamesSendErrors,
    PreviewChannel,
    TypingChannel,
    WebhookChannel,
)
from channels.console import ConsoleChannel
from channels.discord import DiscordChannel
from channels.slack import SlackChannel
from channels.telegram import TelegramChannel
from channels.webchat import WebchatChannel

OPTIONAL: tuple[type[Any], ...] = (
    PreviewChannel,
    TypingChannel,
    WebhookChannel,
    NamesSendErrors,
    AnswersRequests,
)

DECLARED: dict[type[Any], set[type[Any]]] = {
    ConsoleChannel: {AnswersRequests},
    WebchatChannel: {AnswersRequests},
    TelegramChannel: {PreviewChannel, TypingChannel, WebhookChannel, NamesSendErrors},
    SlackChannel: {PreviewChannel, WebhookChannel, NamesSendErrors},
    DiscordChannel: {PreviewChannel, TypingChannel, NamesSendErrors},
}


def _protocol_methods(protocol: type[Any]) -> list[str]:
    return [
        name
        for name, value in vars(protocol).items()
        if not name.startswith("_") and inspect.isfunction(value)
    ]


def _shape(function: Any) -> tuple[Any, ...]:
    """What a caller relies on: parameter names, kinds, defaults and annotations, the return
    annotation, and whether it is awaited."""
    signature = inspect.signature(function)
    params = tuple(
        (p.name, p.kind, p.default, p.annotation) for p in signature.parameters.values()
    )
    return params, signature.return_annotation, inspect.iscoroutinefunction(function)


def test_every_optional_protocol_is_in_the_table() -> None:
    """A new optional protocol in channels.base must be added here (and to each adapter's row)."""
    protocols = {
        value
        for value in vars(base).values()
        if isinstance(value, type)
        and value.__module__ == base.__name__
        and getattr(value, "_is_protocol", False)
    }
    assert protocols - {Channel} == set(OPTIONAL)


@pytest.mark.parametrize("adapter", list(DECLARED), ids=lambda a: a.__name__)
def test_adapter_declares_exactly_its_capabilities(adapter: type[Any]) -> None:
    assert isinstance(adapter, Channel)
    found = {protocol for protocol in OPTIONAL if isinstance(adapter, protocol)}
    assert found == DECLARED[adapter]


@pytest.mark.parametrize("adapter", list(DECLARED), ids=lambda a: a.__name__)
def test_capability_flags_agree_with_the_protocols(adapter: type[Any]) -> None:
    """The gateway asks both: a flag on without its methods would silently do nothing."""
    flags = adapter.capabilities
    if flags.typing:
        assert isinstance(adapter, TypingChannel)
    if flags.edits:
        assert isinstance(adapter, PreviewChannel)


@pytest.mark.parametrize(
    ("adapter", "protocol"),
    [(a, p) for a, ps in DECLARED.items() for p in sorted(ps, key=lambda p: p.__name__)],
    ids=lambda x: x.__name__,
)
def test_signatures_match_the_protocol(adapter: type[Any], protocol: type[Any]) -> None:
    for name in _protocol_methods(protocol):
        assert _shape(getattr(adapter, name)) == _shape(getattr(protocol, name)), (
            f"{adapter.__name__}.{name} drifted from {protocol.__name__}.{name}"
        )


@pytest.mark.parametrize("adapter", [a for a, ps in DECLARED.items() if NamesSendErrors in ps])
def test_send_errors_are_exception_types(adapter: type[Any]) -> None:
    errors = adapter.send_errors
    assert isinstance(errors, tuple) and errors
    assert all(isinstance(e, type) and issubclass(e, BaseException) for e in errors)


def test_no_adapter_imports_the_gateway() -> None:
    """channels/ is below gateway/: an adapter gets its settings and webhook helpers from here."""
    offenders = []
    for path in sorted(Path(channels.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            offenders += [
                f"{path.name}:{node.lineno} {n}"
                for n in names
                if n == "gateway" or n.startswith("gateway.")
            ]
    assert offenders == []
