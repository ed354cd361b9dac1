"""Which process fires scheduled jobs: on PostgreSQL, the one holding the leader advisory lock.

Every `gatehouse run` on one database tries for the lock every `leader_poll_seconds`; the holder
keeps it on a connection of its own. When the holder dies its connection goes, PostgreSQL drops
the lock, and the next process to ask becomes the leader. A leader whose connection breaks
steps down (stops firing) before anyone else can take over, so no job fires twice. On SQLite
there is one process per database: it always leads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gateway.store import Store
from gateway.store.locks import AdvisoryLock, LockBusyError

log = logging.getLogger(__name__)

LEADER_LOCK_ID = 0x6761746568_01  # "gateh" + 1: the scheduler's leader


class Leadership:
    def __init__(self, store: Store, poll_seconds: float) -> None:
        self.store = store
        self.poll_seconds = poll_seconds
        self._lock: AdvisoryLock | None = None

    @property
    def leading(self) -> bool:
        return self.store.is_sqlite or self._lock is not None

    async def wait(self) -> None:
        """Return once this process leads (the scheduler's `leader` awaitable)."""
        if self.store.is_sqlite:
            return
        while self._lock is None:
            try:
                self._lock = await self.store.advisory_lock(LEADER_LOCK_ID, wait=False)
            except LockBusyError:
                await asyncio.sleep(self.poll_seconds)
        log.info("this process now fires scheduled jobs (leader)")

    async def watch(self, step_down: Callable[[], Awaitable[None]]) -> None:
        """Check the lock's connection; if it broke, stop firing and compete again."""
        while True:
            await asyncio.sleep(self.poll_seconds)
            lock = self._lock
            if lock is not None and not await self.store.lock_alive(lock):
                log.warning("lost the scheduler's leader lock; stepping down")
                self._lock = None
                await self.store.release_lock(lock)
                await step_down()

    async def release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            await self.store.release_lock(lock)
