"""The parts of a prompt the runner resolves for the engine: settings, system prompt, tools.

Each is rebuilt only when what it depends on changes (the tool set, the window, AGENTS.md), since
every turn and every compaction asks for them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from typing import Any

from context.compaction import ARCHIVE_TOOL, CompactionSettings
from context.engine import ContextSettings, TurnContext
from gateway.config import Config
from gateway.model.llm import LLMProvider
from gateway.model.sizing import ContextResolver, Conversation
from gateway.store import SessionRow
from gateway.tools.registry import ToolRegistry
from gateway.turn.history import SessionView
from memory.agents_md import AgentsFile

HISTORY_HINT = (
    f"Earlier messages of this conversation are archived, not deleted: call {ARCHIVE_TOOL} with "
    "an exact identifier (an id, path, URL, host) or a few words to read them, with their seq "
    "and time. The summary lists the most salient identifiers and says how many more are "
    "archived."
)

ToolSpecs = list[dict[str, Any]]


@dataclass(eq=False)
class TurnPrompts:
    """Builds each turn's `TurnContext` and the `ContextSettings` it carries."""

    config: Config
    llm: LLMProvider
    tools: ToolRegistry
    resolver: ContextResolver
    agents: AgentsFile
    _specs_cache: tuple[tuple[str, ...], ToolSpecs, int, ToolSpecs, int] | None = field(
        init=False, default=None
    )
    _compaction_settings: tuple[tuple[int, str], CompactionSettings] | None = field(
        init=False, default=None
    )

    def settings_for(self, session: SessionRow, user_id: str | None) -> ContextSettings:
        where = Conversation(session.platform, session.chat_type, session.chat_id, user_id)
        settings = self.resolver.settings_for(
            session.key,
            where,
            tools_tokens=self.tools_tokens(),
            stored_ratio=session.token_ratio,
            stored_samples=session.token_ratio_samples,
        )
        return replace(
            settings,
            tool_result_share=self.config.context.tool_result_share,
            compaction=self.compaction_settings(settings.window.tokens),
        )

    def tool_specs(self) -> tuple[ToolSpecs, int, ToolSpecs]:
        """The tools' JSON schemas, their token count, and the schemas for a session with
        nothing compacted yet (without the lookup over compacted messages), built once per set
        of tools rather than on every turn. The count is of every tool: a budget that holds
        after a compaction, when the lookup is offered too."""
        names = tuple(self.tools.tools)
        if self._specs_cache is None or self._specs_cache[0] != names:
            specs = self.tools.specs()
            fresh = [s for s in specs if s.get("function", {}).get("name") != ARCHIVE_TOOL]
            count = self.resolver.counter.count_tools
            self._specs_cache = (names, specs, count(specs), fresh, count(fresh))
        return self._specs_cache[1], self._specs_cache[2], self._specs_cache[3]

    def lookup_tool_tokens(self) -> int:
        """Tokens of the lookup tool's schema: counted in every budget, sent only once the
        session has something to look up (a calibration sample of a call without it must not
        count them)."""
        self.tool_specs()
        assert self._specs_cache is not None
        return self._specs_cache[2] - self._specs_cache[4]

    def tools_tokens(self) -> int:
        """Tokens of every tool schema sent with a call."""
        return self.tool_specs()[1]

    def compaction_settings(self, window: int) -> CompactionSettings:
        rules = self.critical_rules()
        cached = self._compaction_settings
        if cached is not None and cached[0] == (window, rules):
            return cached[1]  # the same every turn until the window or AGENTS.md changes
        c = self.config.context
        made = CompactionSettings(
            window=window,
            recent_turns=c.recent_turns,
            parts=c.compaction_parts,
            identifier_policy=c.identifier_policy,
            custom_patterns=tuple(c.identifier_patterns),
            quality_guard=c.quality_guard,
            quality_retries=c.quality_retries,
            summary_max_chars=c.summary_max_chars,
            critical_rules=rules,
        )
        self._compaction_settings = ((window, rules), made)
        return made

    def refresh_block(self) -> str | None:
        """The block every model call after a compaction carries, until the next one (in one
        place, so the prompt keeps its prefix): AGENTS.md's sections and,
        when the lookup tool is there, how to reach the compacted messages."""
        block = self.agents.refresh_block(self.config.memory.post_compaction_sections)
        if ARCHIVE_TOOL not in self.tools.tools:
            return block
        return f"{block}\n\n{HISTORY_HINT}" if block else HISTORY_HINT

    def critical_rules(self) -> str:
        """AGENTS.md's configured sections (default "Session Startup" and "Red Lines")."""
        return self.agents.sections(self.config.memory.post_compaction_sections, 3_000)

    def system_prompt(self) -> str:
        """The configured system prompt, plus AGENTS.md's red lines on every turn."""
        red_lines = self.agents.red_lines()
        base = self.config.gateway.system_prompt
        return f"{base}\n\n{red_lines}" if red_lines else base

    def turn_context(
        self, session_key: str, view: SessionView, first_seq: int, settings: ContextSettings
    ) -> TurnContext:
        """History before this turn, and this turn's messages (its tool rounds included)."""
        history = view.history
        split = bisect.bisect_left(history, first_seq, key=lambda m: m.seq or 0)
        summary = view.summary
        after_compaction = self.refresh_block()
        # The refresh block stays in its place, right after the summary, until the next
        # compaction: removing it after one call would change the prompt's prefix again, and
        # providers bill an unchanged prefix at a fraction (issue 24).
        refresh = after_compaction if summary is not None else None
        return TurnContext(
            session_key=session_key,
            system_prompt=self.system_prompt(),
            refresh=refresh,
            compaction_refresh=after_compaction,
            history=history[:split],
            incoming=history[split:],
            model=self.llm.model,
            settings=settings,
            summary=view.summary.summary if view.summary else None,
            summary_first_seq=view.summary.first_seq if view.summary else None,
        )
