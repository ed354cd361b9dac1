"""The chat commands every channel accepts (`/status`, `/context`, `/new`, `/compact`, `/help`).

A command is plain text on every platform: the adapters hand it on like any message (so it is
stored like any message) and the gateway answers it without calling the model
(`gateway/turn/commands.py`). The list lives here, in the pure channel package, because the
adapters register it in their platform's command menu too: Telegram ``setMyCommands``, Discord
application (slash) commands, a Slack slash command whose text names the command.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ChatCommand:
    name: str
    """Lower-case letters only: valid on every platform's command menu."""
    description: str
    """One line, at most 100 characters (Discord's limit; Telegram's is 256)."""
    argument: str | None = None
    """The name of the one free-text argument it takes, if any (`/compact [instructions]`)."""
    aliases: tuple[str, ...] = ()


CHAT_COMMANDS: tuple[ChatCommand, ...] = (
    ChatCommand("status", "Model, window, tokens used, next compaction, last compaction"),
    ChatCommand("context", "What the next prompt holds, part by part, against each share"),
    ChatCommand(
        "new", "Start a fresh context from here (nothing is deleted; undoable)", aliases=("reset",)
    ),
    ChatCommand("compact", "Summarize the earlier messages now", argument="instructions"),
    ChatCommand("help", "List the commands"),
)

_COMMAND = re.compile(r"/([A-Za-z]+)(?:\s+(.*))?", re.DOTALL)
_BY_NAME = {name: c for c in CHAT_COMMANDS for name in (c.name, *c.aliases)}


def find_command(name: str) -> ChatCommand | None:
    """The command `name` (or one of its aliases) stands for, with or without its slash."""
    return _BY_NAME.get(name.removeprefix("/").lower())


def parse_command(content: Any) -> tuple[ChatCommand, str] | None:
    """`/name [text]` -> (the command, its text: '' when none); None for anything else.

    The whole message must be the command: ``/status`` and ``  /new  `` are commands, ``please
    /new`` and ``/newest`` are not. An argument given to a command that takes none is ignored.
    """
    if not isinstance(content, str):
        return None
    found = _COMMAND.fullmatch(content.strip())
    if found is None:
        return None
    command = find_command(found[1])
    if command is None:
        return None
    return command, (found[2] or "").strip() if command.argument else ""


def help_text() -> str:
    """The `/help` answer: every command with its aliases and what it does."""
    lines = ["Commands (the bot answers them itself, without the model):"]
    for c in CHAT_COMMANDS:
        usage = f"/{c.name}" + (f" [{c.argument}]" if c.argument else "")
        aliases = "".join(f" (or /{a})" for a in c.aliases)
        lines.append(f"- `{usage}`{aliases}: {c.description}")
    return "\n".join(lines)
