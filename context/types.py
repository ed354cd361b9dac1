"""Message types the context engine works on: the OpenAI chat shape plus store metadata."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call requested by the assistant (OpenAI `tool_calls[]` item)."""

    id: str
    name: str
    arguments: str = "{}"

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    @classmethod
    def from_openai(cls, raw: dict[str, Any]) -> ToolCall:
        fn = raw.get("function") or {}
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        return cls(id=str(raw.get("id", "")), name=str(fn.get("name", "")), arguments=args)


@dataclass(frozen=True, slots=True)
class Message:
    """A chat message in OpenAI shape.

    `seq` is the store's per-session sequence number (None for messages not stored, such as the
    system prompt); `tokens` is the cached count from the one token authority, so a message is
    counted once in its life.
    """

    role: Role
    content: str | list[dict[str, Any]] | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    seq: int | None = None
    tokens: int | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def text(self) -> str:
        """The textual content (image parts ignored)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(
            str(part.get("text", "")) for part in self.content if part.get("type") == "text"
        )

    def with_tokens(self, tokens: int) -> Message:
        # Not `dataclasses.replace`: it re-reads the fields every call, several times a turn.
        return Message(
            self.role, self.content, self.tool_calls, self.tool_call_id, self.name, self.seq,
            tokens, self.meta,
        )

    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [tc.to_openai() for tc in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    @classmethod
    def from_openai(cls, raw: dict[str, Any]) -> Message:
        role = raw.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"unknown role {role!r}")
        content = raw.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ValueError("content must be a string, a list of parts or null")
        calls = tuple(ToolCall.from_openai(tc) for tc in raw.get("tool_calls") or ())
        return cls(
            role=role,
            content=content,
            tool_calls=calls,
            tool_call_id=raw.get("tool_call_id"),
            name=raw.get("name"),
        )


@dataclass(frozen=True, slots=True)
class Identifier:
    """One identifier a summary must keep verbatim (`context.identifiers`); for a secret
    (`context.secrets`), `value` is its redaction marker, never the secret."""

    value: str
    kind: str
    secret: bool = False
