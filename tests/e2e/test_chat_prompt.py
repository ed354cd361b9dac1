"""`gatehouse chat` at a real terminal: a pseudo-terminal drives the real command (a subprocess
talking to the fake OpenAI server) and pyte plays the screen. A log line written while the
`you>` prompt waits lands above it, and the prompt comes back with what was typed so far."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import pty
import signal
import struct
import sys
import termios
from collections.abc import Callable
from pathlib import Path

import pyte

from tests.fakes import FakeOpenAI
from tests.helpers.cli import env, write_config

LOG_LINE = "a log line while you type"
# The real console script's `main`, plus a way for the test to make it log at a moment it
# chooses: SIGUSR1 logs one warning, from the main thread, as any gateway part would.
LAUNCH = (
    "import logging, signal\n"
    "from gateway.cli import main\n"
    "signal.signal(signal.SIGUSR1, lambda *_: "
    f"logging.getLogger('gatehouse.probe').warning({LOG_LINE!r}))\n"
    "main()\n"
)
ROWS, COLS = 24, 100


class Screen(pyte.Screen):
    """A screen that answers the cursor-position requests prompt_toolkit sends, like a
    terminal does."""

    def __init__(self, master: int) -> None:
        super().__init__(COLS, ROWS)
        self.master = master

    def write_process_input(self, data: str) -> None:
        os.write(self.master, data.encode())


class Terminal:
    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
        self.screen = Screen(self.master)
        self.stream = pyte.ByteStream(self.screen)
        self.changed = asyncio.Event()
        asyncio.get_running_loop().add_reader(self.master, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: the command closed the terminal
            asyncio.get_running_loop().remove_reader(self.master)
            return
        self.stream.feed(data)
        self.changed.set()

    @property
    def lines(self) -> list[str]:
        return [line.rstrip() for line in self.screen.display]

    @property
    def cursor_line(self) -> str:
        return self.lines[self.screen.cursor.y]

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    async def wait_for(self, ready: Callable[[], bool], what: str, seconds: float = 30) -> None:
        async def until() -> None:
            while not ready():
                self.changed.clear()
                await self.changed.wait()

        try:
            await asyncio.wait_for(until(), timeout=seconds)
        except TimeoutError:
            raise AssertionError(f"never: {what}; screen:\n" + "\n".join(self.lines)) from None

    def close(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(self.master)
        for fd in (self.master, self.slave):
            with contextlib.suppress(OSError):
                os.close(fd)


async def test_a_log_line_while_the_prompt_waits_goes_above_it(
    tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    config = write_config(tmp_path, fake_llm)
    term = Terminal()
    environment = {k: v for k, v in env().items() if k not in ("COLUMNS", "LINES")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LAUNCH, "--config", str(config), "chat", "--user", "alice",
        cwd=tmp_path, env={**environment, "TERM": "xterm"},
        stdin=term.slave, stdout=term.slave, stderr=term.slave,
    )
    try:
        await term.wait_for(lambda: term.cursor_line == "you>", "the prompt")
        term.type("hel")
        await term.wait_for(lambda: term.cursor_line == "you> hel", "the typed text")

        proc.send_signal(signal.SIGUSR1)
        await term.wait_for(lambda: any(LOG_LINE in line for line in term.lines), "the log line")
        await term.wait_for(lambda: term.cursor_line == "you> hel", "the prompt redrawn")
        [logged] = [row for row, line in enumerate(term.lines) if LOG_LINE in line]
        assert logged < term.screen.cursor.y, "the log line is above the prompt"
        assert "WARNING" in term.lines[logged] and "you>" not in term.lines[logged]
        assert [line for line in term.lines if "you>" in line] == ["you> hel"]

        term.type("lo\r")  # the line goes on from where it was
        await term.wait_for(lambda: any(line.startswith("agent> ") for line in term.lines),
                            "the reply")
        [request] = fake_llm.requests
        assert request["messages"][-1]["content"] == "hello"
        await term.wait_for(lambda: term.cursor_line == "you>", "the next prompt")
        term.type("\x04")  # Ctrl-D
        assert await asyncio.wait_for(proc.wait(), timeout=30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        term.close()
