"""Resolving a session's context settings: the I/O side of the context engine.

The window (config → server-reported → built-in table → default, capped by the agent limit),
the one token counter, the history limit with its source, the budget knobs and the usage
calibration. The runner and `gatehouse context explain` both use this, so a limit is always
explained by the same code that applies it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from context.budget import BudgetSettings
from context.engine import ContextSettings
from context.history import HistoryLimits, LimitResolution, PlatformLimits, resolve_history_limit
from context.tokens import TokenCounter, UsageCalibration
from context.window import WindowResolution, resolve_window
from gateway.config import Config
from gateway.model.llm import LLMProvider
from gateway.model.tokenizer import load_counter

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Conversation:
    """Where a session lives, as the history-limit rules need it."""

    platform: str
    chat_type: str
    chat_id: str
    user_id: str | None


def history_limits(config: Config) -> HistoryLimits:
    """`[context]` and `[channels.*]` history settings as the pure engine's plain data."""
    platforms: dict[str, PlatformLimits] = {}
    for name in type(config.channels).model_fields:
        section = config.channels.get(name)
        channels = getattr(section, "channels", {}) or {}
        platforms[name] = PlatformLimits(
            dm_default=section.dm_history_limit,
            group_default=section.history_limit,
            dms={k: v.history_limit for k, v in section.dms.items()},
            groups={k: v.history_limit for k, v in section.groups.items()},
            channels={k: v.history_limit for k, v in channels.items()},
        )
    return HistoryLimits(system_default=config.context.history_limit, platforms=platforms)


def budget_settings(config: Config) -> BudgetSettings:
    return BudgetSettings(
        reserve_tokens=config.context.reserve_tokens,
        max_output_tokens=config.context.max_output_tokens,
        flush_soft_tokens=config.memory.flush_soft_tokens,
        tool_results_share=config.context.tool_results_share,
        system_share=config.context.system_share,
        history_share=config.context.history_share,
        summary_share=config.context.summary_share,
    )


class ContextResolver:
    def __init__(self, config: Config, llm: LLMProvider) -> None:
        self.config = config
        self.llm = llm
        self.limits = history_limits(config)
        self.budget = budget_settings(config)
        self._counter: TokenCounter | None = None
        self._reported: tuple[int, str] | None = None
        self._metadata_task: asyncio.Task[None] | None = None
        self._calibrations: dict[str, UsageCalibration] = {}
        self._warned: set[str] = set()
        self._window_cache: tuple[tuple[str, tuple[int, str] | None], WindowResolution] | None = None

    async def start(self, fetch_metadata: bool = True) -> None:
        """Load the token counter (reads packaged files) and fetch model metadata in the
        background: a metadata lookup never blocks a turn."""
        self._counter = await asyncio.to_thread(load_counter, self.llm.model)
        log.info("token counter: %s", self._counter.name)
        if fetch_metadata and self.llm.configured:
            self._metadata_task = asyncio.create_task(self._fetch_metadata())

    async def stop(self) -> None:
        if self._metadata_task is not None:
            self._metadata_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._metadata_task

    async def _fetch_metadata(self) -> None:
        self._reported = await self.llm.reported_window()
        if self._reported:
            log.info("server reports %s = %d for %s", self._reported[1], *self._reported[:1],
                     self.llm.model)

    async def fetch_metadata_now(self) -> None:
        await self._fetch_metadata()

    @property
    def counter(self) -> TokenCounter:
        if self._counter is None:
            self._counter = load_counter(self.llm.model)
        return self._counter

    def window(self) -> WindowResolution:
        model = self.llm.model
        reported = self._reported
        cached = self._window_cache
        if cached is not None and cached[0] == (model, reported):
            return cached[1]  # the model table is scanned once per (model, reported window)
        configured = self.config.models.get(model)
        resolution = resolve_window(
            model,
            configured.context_window if configured else None,
            reported[0] if reported else None,
            self.config.agent.max_context_tokens,
            reported_field=reported[1] if reported else "max_model_len",
            configured_source=configured.origin if configured else None,
        )
        if resolution.warning and resolution.warning not in self._warned:
            self._warned.add(resolution.warning)
            log.warning(resolution.warning)
        self._window_cache = ((model, reported), resolution)
        return resolution

    def reload_limits(self) -> None:
        """Read the history limits from the config again (after a reload changed them): the
        next prompt assembled uses them."""
        self.limits = history_limits(self.config)

    def history_limit(self, where: Conversation) -> LimitResolution:
        return resolve_history_limit(
            self.limits, where.platform, where.chat_type, where.chat_id, where.user_id
        )

    def calibration(
        self, session_key: str, stored_ratio: float | None = None, stored_samples: int = 0
    ) -> UsageCalibration:
        """The session's usage calibration; seeded from the ratio (and the number of reports it
        is made of) stored with the session, so the CLI describes what the gateway uses."""
        cal = self._calibrations.get(session_key)
        if cal is None:
            cal = UsageCalibration()
            if stored_ratio is not None:
                cal = UsageCalibration(ratio=stored_ratio, samples=max(1, stored_samples))
            self._calibrations[session_key] = cal
        return cal

    def settings_for(
        self,
        session_key: str,
        where: Conversation,
        tools_tokens: int = 0,
        stored_ratio: float | None = None,
        stored_samples: int = 0,
    ) -> ContextSettings:
        return ContextSettings(
            window=self.window(),
            counter=self.counter,
            history_limit=self.history_limit(where),
            budget=self.budget,
            calibration_ratio=self.calibration(session_key, stored_ratio, stored_samples).ratio,
            tools_tokens=tools_tokens,
            keep_recent_tool_results=self.config.context.keep_recent_tool_results,
            small_overflow=self.config.context.small_overflow,
        )

