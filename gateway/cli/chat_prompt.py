"""The `you>` prompt of `gatehouse chat`.

On a terminal it is a prompt_toolkit prompt read inside `patch_stdout`: anything written while
it waits — a log line from the gateway, the bundled model's restart notice — is printed above
it and the prompt is redrawn with what was typed so far (line editing and ↑ history come with
it). Elsewhere (stdin or stdout a pipe or a file) it is rich's plain `input`, as before.
"""

from __future__ import annotations

import asyncio
import sys

from prompt_toolkit import PromptSession
from prompt_toolkit.formatted_text import FormattedText
from prompt_toolkit.patch_stdout import patch_stdout
from rich.console import Console

PROMPT = FormattedText([("bold ansiblue", "you>"), ("", " ")])
PLAIN_PROMPT = "[bold blue]you>[/bold blue] "


def on_terminal() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


class ChatPrompt:
    """Reads one line at a time; EOFError at Ctrl-D (or end of input), KeyboardInterrupt at
    Ctrl-C, like `input`."""

    def __init__(self, console: Console, *, terminal: bool | None = None) -> None:
        self._console = console
        self._session: PromptSession[str] | None = None
        if on_terminal() if terminal is None else terminal:
            self._session = PromptSession()

    async def read(self) -> str:
        if self._session is None:
            return await asyncio.to_thread(self._console.input, PLAIN_PROMPT)
        # raw: the log's colours (rich writes ANSI codes) pass through as they are.
        with patch_stdout(raw=True):
            return await self._session.prompt_async(PROMPT)
