"""What every fake server shares: an aiohttp app on 127.0.0.1 at a free port, `async with`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

from aiohttp import web


class LoopbackServer(ABC):
    """Subclasses build their app in `start()` and call `_listen(app)`; `stop()` calls `_close()`."""

    host: str = "127.0.0.1"
    _runner: web.AppRunner | None = None
    _port: int | None = None

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    async def _listen(self, app: web.Application, shutdown_timeout: float = 0.25) -> None:
        """Serve `app` on `host` at a free port. `shutdown_timeout` bounds `stop()` for handlers
        that ignore the fake's own stop signal."""
        if self._runner is not None:
            raise RuntimeError(f"{type(self).__name__} already started")
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=shutdown_timeout
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, 0)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._port = int(runner.addresses[0][1])
        self._runner = runner

    async def _close(self) -> None:
        """Stop serving (idempotent)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._port

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
