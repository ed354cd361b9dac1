"""The gateway's own scheduled jobs, from `[scheduler]` in the config.

* idle-session compaction: a session quiet for `idle_compaction_minutes` whose prompt is past
  `idle_compaction_min_share` of the compaction threshold is compacted while nobody waits for
  it (the memory flush runs first, as always), instead of at the start of the next turn.
* daily reset (`daily_reset = "04:00"`, [gateway] timezone): every session starts a fresh
  context. Nothing is deleted (see `Runner.reset_session`).
* memory index refresh: notes edited by hand are searchable without waiting for a search.
* pairing expiry: pending codes past their hour are marked expired.
* inbox retention: files people sent older than `[attachments] retention_days` are deleted
  (hourly; their messages keep saying what was sent).

Every session operation holds the session's lane, so it never races a turn. The sweeps work
through a `gateway.jobs.host.MaintenanceHost` (the Gateway), never the runner itself.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from gateway.jobs.scheduler import CRON_SESSION_PREFIX, MaintenanceJob

if TYPE_CHECKING:  # `jobs list` needs the schedule alone, not what the sweeps work on
    from gateway.config import Config
    from gateway.jobs.host import MaintenanceHost
    from gateway.store import PairingRow, SessionRow
    from memory.index import RefreshStats

log = logging.getLogger(__name__)

IDLE_COMPACTION = "maintenance:idle-compaction"
DAILY_RESET = "maintenance:daily-reset"
MEMORY_REFRESH = "maintenance:memory-refresh"
PAIRING_EXPIRY = "maintenance:pairing-expiry"
INBOX_RETENTION = "maintenance:inbox-retention"
INBOX_RETENTION_MINUTES = 60


def idle_sweep_minutes(idle_minutes: int) -> int:
    """How often idle sessions are looked for: a quarter of the idle time, 1 to 15 minutes."""
    return max(1, min(15, idle_minutes // 4))


def maintenance_schedule(config: Config) -> list[MaintenanceJob]:
    """The enabled maintenance jobs and their triggers (no functions: for listing)."""
    s = config.scheduler
    tz = config.gateway.timezone
    jobs: list[MaintenanceJob] = []
    if s.idle_compaction_minutes > 0:
        jobs.append(
            MaintenanceJob(
                IDLE_COMPACTION,
                f"compact sessions idle for {s.idle_compaction_minutes} min",
                IntervalTrigger(minutes=idle_sweep_minutes(s.idle_compaction_minutes),
                                timezone=tz),
            )
        )
    if s.daily_reset is not None:
        hour, minute = (int(p) for p in s.daily_reset.split(":"))
        jobs.append(
            MaintenanceJob(
                DAILY_RESET,
                f"reset every session's context at {s.daily_reset} {tz}",
                CronTrigger(hour=hour, minute=minute, timezone=tz),
            )
        )
    days = config.attachments.retention_days
    every = [
        (MEMORY_REFRESH, "refresh the memory search index", s.memory_refresh_minutes),
        (PAIRING_EXPIRY, "expire pending pairing codes", s.pairing_expiry_minutes),
        (INBOX_RETENTION, f"delete inbox files older than {days} days",
         INBOX_RETENTION_MINUTES if days > 0 else 0),
    ]
    for name, description, minutes in every:
        if minutes > 0:
            trigger = IntervalTrigger(minutes=minutes, timezone=tz)
            jobs.append(MaintenanceJob(name, description, trigger))
    return jobs


class Maintenance:
    """The maintenance jobs of one gateway."""

    def __init__(self, host: MaintenanceHost) -> None:
        self.host = host
        self._checked: dict[int, datetime] = {}
        """Session id -> the updated_at it had when found not worth compacting."""

    def jobs(self) -> list[MaintenanceJob]:
        run = {
            IDLE_COMPACTION: self.compact_idle_sessions,
            DAILY_RESET: self.reset_sessions,
            MEMORY_REFRESH: self.refresh_memory_index,
            PAIRING_EXPIRY: self.expire_pairings,
            INBOX_RETENTION: self.prune_inbox,
        }
        return [
            MaintenanceJob(j.id, j.description, j.trigger, run[j.id])
            for j in maintenance_schedule(self.host.config)
        ]

    async def compact_idle_sessions(self) -> list[str]:
        """Compact the idle sessions worth it; return their keys."""
        h = self.host
        settings = h.config.scheduler
        cutoff = datetime.now(UTC) - timedelta(minutes=settings.idle_compaction_minutes)
        compacted: list[str] = []
        for session in await h.store.sessions_idle_since(cutoff):
            assert session.id is not None
            if self._checked.get(session.id) == session.updated_at:
                continue
            if h.compaction_blocked(session):
                continue
            async with h.hold_lane(session.key):
                fresh = await h.store.get_session(session.key)
                if fresh is None or fresh.updated_at != session.updated_at:
                    continue  # a turn ran meanwhile: no longer idle
                if await h.store.has_pending(session.id) or not await self._worth_compacting(
                    fresh
                ):
                    self._checked[session.id] = session.updated_at
                    continue
                result = await h.compact_idle(session.key)
            if result is not None and result.committed:
                compacted.append(session.key)
                log.info("idle compaction of %s: %d -> %d tokens", session.key,
                         result.tokens_before, result.tokens_after)
        return compacted

    async def _worth_compacting(self, session: SessionRow) -> bool:
        """The prompt (by the same count a turn uses) is past the configured share of the
        compaction threshold."""
        size = await self.host.prompt_size(session)
        if size is None:
            return False
        share = self.host.config.scheduler.idle_compaction_min_share
        return size.tokens >= share * size.compaction_threshold

    async def reset_sessions(self) -> list[str]:
        """The daily reset: every session with something in its context starts fresh."""
        h = self.host
        why = f"daily reset at {h.config.scheduler.daily_reset} {h.config.gateway.timezone}"
        reset: list[str] = []
        for session in await h.store.list_sessions():
            if session.key.startswith(CRON_SESSION_PREFIX):
                continue  # every scheduled run starts fresh already
            async with h.hold_lane(session.key):
                row = await h.reset_session(
                    session.key, why, flush=h.config.scheduler.reset_flush_memory
                )
            if row is not None:
                reset.append(session.key)
        if reset:
            log.info("%s: %d sessions start a fresh context", why, len(reset))
        return reset

    async def refresh_memory_index(self) -> RefreshStats:
        stats = await self.host.refresh_memory_index()
        log.debug("memory index refreshed: %s", stats)
        return stats

    async def expire_pairings(self) -> list[PairingRow]:
        expired = await self.host.store.expire_pairings()
        for row in expired:
            log.info("pairing code for %s user %s expired", row.platform, row.sender_id)
        return expired

    async def prune_inbox(self) -> tuple[int, int]:
        """Delete inbox files past `[attachments] retention_days`: (files, bytes)."""
        config = self.host.config
        cutoff = datetime.now(UTC) - timedelta(days=config.attachments.retention_days)
        from gateway.inbound.attachments import prune_inbox

        files, freed = await asyncio.to_thread(prune_inbox, config.workspace, cutoff)
        if files:
            log.info("inbox retention: %d files (%d bytes) older than %d days deleted",
                     files, freed, config.attachments.retention_days)
        return files, freed
