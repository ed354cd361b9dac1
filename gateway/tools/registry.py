"""The tool registry: JSON-schema tools the model may call.

A bad call (unknown tool, arguments that are not JSON or do not match the schema, a tool that
raises) goes back to the model as a tool error it can read and correct; it never crashes a turn.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import jsonschema

from channels.base import storable
from gateway.tools.scope import Caller, guest

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool may know about the turn that called it: the session, and the chat the turn
    answers (where a reminder or a scheduled result is posted back)."""

    session_key: str
    timezone: str = "UTC"
    platform: str = ""
    chat_id: str = ""
    thread_id: str | None = None
    chat_type: str = ""
    account: str = "default"
    caller: Caller | None = None
    """Who the call is made for (`gateway.tools.scope`); None: a guest of the session."""

    @property
    def who(self) -> Caller:
        return self.caller if self.caller is not None else guest(self.session_key)


ToolHandler = Callable[[dict[str, Any], ToolContext], Awaitable[str]]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    handler: ToolHandler

    def spec(self) -> dict[str, Any]:
        """The OpenAI `tools[]` entry."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass
class ToolResult:
    content: str
    is_error: bool = False
    """The tool's own word that it failed: stored with the result (`messages.tool_error`)."""


class ToolError(Exception):
    """A failure a tool reports in words (bad input, nothing found): the model reads
    "error: <message>", the result is flagged as an error, and no traceback is logged."""


@dataclass
class ToolRegistry:
    tools: dict[str, Tool] = field(default_factory=dict)

    def register(self, tool: Tool) -> None:
        if tool.name in self.tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        jsonschema.Draft202012Validator.check_schema(tool.parameters)
        self.tools[tool.name] = tool

    def specs(self) -> list[dict[str, Any]]:
        return [t.spec() for t in self.tools.values()]

    async def call(self, name: str, arguments: str, ctx: ToolContext) -> ToolResult:
        """Run the tool the model asked for; its result (or what went wrong) as text the
        store can hold (`storable`: a tool may return a NUL or a broken surrogate)."""
        result = await self._call(name, arguments, ctx)
        return ToolResult(storable(result.content), result.is_error)

    async def _call(self, name: str, arguments: str, ctx: ToolContext) -> ToolResult:
        tool = self.tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return ToolResult(f"error: unknown tool {name!r}; available tools: {known}", True)
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            return ToolResult(f"error: arguments are not valid JSON ({exc.msg})", True)
        if not isinstance(args, dict):
            return ToolResult("error: arguments must be a JSON object", True)
        errors = sorted(
            jsonschema.Draft202012Validator(tool.parameters).iter_errors(args), key=str
        )
        if errors:
            detail = "; ".join(
                f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors
            )
            return ToolResult(f"error: invalid arguments for {name}: {detail}", True)
        try:
            return ToolResult(await tool.handler(args, ctx))
        except ToolError as exc:
            return ToolResult(f"error: {exc}", True)
        except Exception as exc:
            log.exception("tool %s failed", name)
            return ToolResult(f"error: {name} failed: {type(exc).__name__}: {exc}", True)


async def _current_time(args: dict[str, Any], ctx: ToolContext) -> str:
    tz = ZoneInfo(args.get("timezone") or ctx.timezone)
    return datetime.now(tz).isoformat(timespec="seconds")


CURRENT_TIME = Tool(
    name="current_time",
    description="The current date and time (ISO 8601) in the gateway's or a given IANA timezone.",
    parameters={
        "type": "object",
        "properties": {"timezone": {"type": "string", "description": "e.g. Europe/Paris"}},
        "additionalProperties": False,
    },
    handler=_current_time,
)


def default_registry() -> ToolRegistry:
    registry = ToolRegistry()
    registry.register(CURRENT_TIME)
    return registry
