"""Loading the context engine `[context] engine` names: entry points first, then built-ins."""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import EntryPoint

import pytest

from context.compaction import CompactionResult, SummaryCall
from context.engine import (
    ContextPlan,
    ContextSettings,
    DefaultContextEngine,
    FullHistoryEngine,
    TurnContext,
)
from context.types import Identifier
from gateway.model import engines
from gateway.model.engines import GROUP, available_engines, load_engine


class TinyEngine:
    """A third-party engine as a package would publish it."""

    name = "tiny"

    def assemble(self, turn: TurnContext) -> ContextPlan:
        return ContextPlan(messages=list(turn.incoming))

    async def compact(
        self, turn: TurnContext, summarize: SummaryCall, instructions: str = ""
    ) -> CompactionResult | None:
        return None

    def compaction_threshold(self, settings: ContextSettings) -> int | None:
        return None

    def tool_result_limit(self, settings: ContextSettings) -> int:
        return 100

    def cap_tool_result(self, text: str, limit: int, artifact: str | None) -> str:
        return text[:limit]

    def identifiers(self, text: str, custom_patterns: Sequence[str] = ()) -> list[Identifier]:
        return []


class OnlyAssembles:
    """Missing most of the protocol: refused at load time, not mid-turn."""

    name = "half"

    def assemble(self, turn: TurnContext) -> ContextPlan:
        return ContextPlan(messages=[])


def installed(monkeypatch: pytest.MonkeyPatch, **targets: str) -> None:
    """Pretend these entry points (name -> "module:attr") are installed, and only them."""
    points = [EntryPoint(name, value, GROUP) for name, value in targets.items()]

    def entry_points(*, group: str) -> list[EntryPoint]:
        return [p for p in points if p.group == group]

    monkeypatch.setattr(engines, "entry_points", entry_points)


def test_the_built_in_engines_load_by_name() -> None:
    assert isinstance(load_engine("default"), DefaultContextEngine)
    assert isinstance(load_engine("full-history"), FullHistoryEngine)
    assert {"default", "full-history"} <= set(available_engines())


def test_each_load_is_a_fresh_engine() -> None:
    assert load_engine("default") is not load_engine("default")


def test_the_built_ins_load_without_their_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch)
    assert isinstance(load_engine("default"), DefaultContextEngine)
    assert available_engines() == ["default", "full-history"]


def test_an_installed_engine_loads_through_its_entry_point(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed(monkeypatch, tiny=f"{__name__}:TinyEngine")
    assert isinstance(load_engine("tiny"), TinyEngine)
    assert available_engines() == ["default", "full-history", "tiny"]


def test_an_entry_point_wins_over_a_built_in_of_the_same_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed(monkeypatch, default=f"{__name__}:TinyEngine")
    assert isinstance(load_engine("default"), TinyEngine)


def test_an_unknown_name_says_what_is_available(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, tiny=f"{__name__}:TinyEngine")
    with pytest.raises(ValueError, match="'nope' is not installed") as caught:
        load_engine("nope")
    assert str(caught.value).endswith("available: default, full-history, tiny")


def test_an_engine_missing_the_protocol_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, half=f"{__name__}:OnlyAssembles")
    with pytest.raises(TypeError, match="'half' does not implement the ContextEngine protocol"):
        load_engine("half")
