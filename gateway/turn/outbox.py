"""Which stored replies reached their platform: the other half of the outbox.

A reply enters the ``outbox`` table in the transaction that finishes its turn (`Store.finish_turn`),
so a crash after that commit cannot lose it: the next start sends whatever is still there. Once
a channel has sent a reply, its outbox id is appended to a small log file in the data directory
(one ``write(2)``; it survives the process being killed) instead of a database transaction per
turn, which would queue behind every other write on SQLite. The rows are deleted in batches, and
the log is read back on start.

Why a file: the gap between "the platform has the reply" and "the gateway recorded that" is the
one window in which a kill -9 makes a reply go out twice (no Bot API lets a sender ask whether
a message was already sent). A write to an open file takes microseconds and waits for nothing,
so the window is as small as it can be.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

from channels.base import OutboundMessage
from gateway.store import Store
from gateway.store.faults import StorageError

log = logging.getLogger(__name__)

LOG_GLOB = "outbox-sent.*.log"


SHARED_GRACE_SECONDS = 120.0
"""PostgreSQL: a reply left in the outbox this long belongs to a process that died (a live one
sends within moments, or within its 429 waits), so another may claim and send it."""


RETRY_DELAYS: tuple[float, ...] = (2.0, 10.0, 30.0, 60.0, 300.0, 900.0)
"""Seconds before each new try of a reply its channel could not send. The channel has already
retried 429s and dropped connections itself, so what reaches here is an outage or a refusal; after
the last try (about 22 minutes in all) the reply waits in the outbox for the next start."""

DELIVERY_ATTEMPTS = 10
"""Failed tries after which a reply is given up (`[gateway] delivery_attempts`): it stays in the
outbox, listed by `gatehouse outbox list`, until an operator retries or drops it."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """What one try at sending a reply came to (`Gateway.deliver`)."""

    sent: bool
    sent_parts: int = 0
    """When not sent: chunks of the reply the platform has (earlier tries included)."""
    error: str | None = None


SENT = Delivery(sent=True)


def failure_text(exc: BaseException) -> str:
    """One line for an outbox row's `last_error`: the exception's type and first line (the
    type only once: PTB's ``Forbidden`` already says "Forbidden: bot was blocked…")."""
    name = type(exc).__name__
    lines = str(exc).strip().splitlines()
    if not lines:
        return name
    first = lines[0]
    return (first if first.startswith(name) else f"{name}: {first}")[:300]


Deliver = Callable[[OutboundMessage], Awaitable[Delivery]]
"""Sends a reply through its channel (`Gateway.deliver`)."""


class DeliveryLog:
    """Records sent replies in an append-only file; deletes their outbox rows in batches.

    With several processes on one PostgreSQL database (`shared`), the log files would be shared
    too, so each sent reply's row is deleted right away instead, and only replies left behind
    longer than `SHARED_GRACE_SECONDS` are claimed (one process wins each) and sent again.
    "Right away" is one DELETE at a time: replies sent while one runs go together in the next
    (no wait when the gateway is quiet; under load one statement serves many replies).
    """

    def __init__(
        self,
        directory: Path,
        store: Store,
        batch: int = 256,
        interval: float = 5.0,
        resend: Deliver | None = None,
        retry_delays: tuple[float, ...] = RETRY_DELAYS,
        max_attempts: int = DELIVERY_ATTEMPTS,
    ) -> None:
        self.shared = not store.is_sqlite
        self.shared_grace = SHARED_GRACE_SECONDS
        self.resend = resend
        self.retry_delays = retry_delays
        self.max_attempts = max_attempts
        self._retrying: dict[int, asyncio.Task[None]] = {}
        self._in_flight: set[int] = set()
        self._to_delete: list[int] = []  # shared: sent, waiting for the DELETE in flight
        self._deleting: asyncio.Task[None] | None = None
        self.directory = directory
        self.store = store
        self.batch = batch
        self.interval = interval
        self._fd: int | None = None
        self._path: Path | None = None
        self._generation = 0
        self._pending: list[int] = []
        self._clearing: list[int] = []  # logged as sent; their rows are being deleted
        self._oldest = 0.0
        self._flushing: asyncio.Task[None] | None = None

    async def recover(self) -> list[tuple[int, OutboundMessage]]:
        """On start: forget replies the last run sent; return the ones it did not (in order)."""
        if self.shared:
            return await self.store.claim_stale_outbox(self.shared_grace)
        logs = sorted(self.directory.glob(LOG_GLOB))
        await self.store.forget_outbox(logged_sent(self.directory))
        for path in logs:
            path.unlink(missing_ok=True)
        self._generation = max((_generation(p) for p in logs), default=0)
        self._open()
        return await self.store.undelivered()

    def sent(self, outbox_id: int) -> None:
        """The channel sent this reply (called right after it returned)."""
        if self.shared:
            self._to_delete.append(outbox_id)
            if self._deleting is None:
                self._deleting = asyncio.create_task(self._delete_sent())
            return
        if self._fd is None:
            self._open()
        assert self._fd is not None
        os.write(self._fd, f"{outbox_id}\n".encode())
        if not self._pending:
            self._oldest = time.monotonic()
        self._pending.append(outbox_id)
        due = len(self._pending) >= self.batch or time.monotonic() - self._oldest >= self.interval
        if due and self._flushing is None:
            self._flushing = asyncio.create_task(self._flush())

    async def send(self, outbox_id: int, message: OutboundMessage) -> None:
        """Send a reply that is in the outbox: logged as sent, or kept and tried again."""
        resend = self.resend
        if resend is None:
            raise RuntimeError("DeliveryLog.send needs the `resend` callable")
        self._in_flight.add(outbox_id)
        try:
            left = await self._attempt(outbox_id, message, resend, 1)
        finally:
            self._in_flight.discard(outbox_id)
        if left is not None:
            self._try_again_later(outbox_id, left, resend)

    async def retried(self) -> list[tuple[int, OutboundMessage]]:
        """SQLite: replies an operator gave their tries back (`gatehouse outbox retry`) while
        this process runs, which nothing here is sending or trying again already.

        (With several processes the sweep's `recover` finds them: a retried row is old.)
        """
        before = self._handling()
        rows = await self.store.undelivered(retried=True)
        mine = before | self._handling()  # while the rows were read, a send may have finished
        return [(outbox_id, message) for outbox_id, message in rows if outbox_id not in mine]

    def _handling(self) -> set[int]:
        """Replies this process is sending, will try again, or has sent (rows not yet gone)."""
        return (
            self._in_flight | self._retrying.keys() | set(self._pending) | set(self._clearing)
            | set(self._to_delete)
        )

    async def _attempt(
        self, outbox_id: int, message: OutboundMessage, resend: Deliver, attempt: int
    ) -> OutboundMessage | None:
        """One try: logged as sent, or counted as failed. What is left to send; None when
        nothing is (sent, or given up)."""
        result = await resend(message)
        if result.sent:
            if attempt > 1:
                log.info("delivered a reply for %s on try %d", message.session_key, attempt)
            self.sent(outbox_id)
            return None
        return await self._failed(outbox_id, message, result)

    async def _failed(
        self, outbox_id: int, message: OutboundMessage, result: Delivery
    ) -> OutboundMessage | None:
        """Count the failed try in the outbox row; what to send next time, or None when the
        reply is given up (or gone)."""
        left = replace(message, sent_parts=max(message.sent_parts, result.sent_parts))
        try:
            row = await self.store.outbox_failed(
                outbox_id, left.sent_parts, result.error or "not sent", self.max_attempts
            )
        except StorageError as exc:
            log.error("could not record a failed delivery for %s: %s", message.session_key, exc)
            return left
        except Exception:
            log.exception("could not record a failed delivery for %s", message.session_key)
            return left
        if row is None:
            return None
        if row.given_up_at is not None:
            log.error(
                "gave up on a reply for %s after %d tries (last error: %s); it stays in the "
                "outbox: `gatehouse outbox retry %d` sends it again, `drop` forgets it",
                message.session_key, row.attempts, row.last_error, outbox_id,
            )
            return None
        return left

    def _try_again_later(self, outbox_id: int, message: OutboundMessage, resend: Deliver) -> None:
        """The channel could not send this reply: it stays in the outbox and is tried again.

        With several processes the sweep does that (it claims the row once it is `shared_grace`
        seconds old, again and again until a send succeeds or the reply is given up); alone,
        this process tries again after each of `retry_delays`, then leaves the reply for the
        next start.
        """
        if self.shared or outbox_id in self._retrying:
            return
        task = asyncio.create_task(self._retry(outbox_id, message, resend))
        self._retrying[outbox_id] = task
        task.add_done_callback(lambda _done: self._retrying.pop(outbox_id, None))

    async def _retry(self, outbox_id: int, message: OutboundMessage, resend: Deliver) -> None:
        for attempt, delay in enumerate(self.retry_delays, start=2):
            await asyncio.sleep(delay)
            left = await self._attempt(outbox_id, message, resend, attempt)
            if left is None:
                return
            message = left
        log.error(
            "could not deliver a reply for %s in %d tries; it stays in the outbox and is sent "
            "again when the gateway next starts", message.session_key, len(self.retry_delays) + 1,
        )

    async def close(self) -> None:
        """Delete the rows of every reply sent so far; the log is then empty and removed.

        Replies still waiting for another try stay in the outbox for the next start.
        """
        retrying = list(self._retrying.values())
        for task in retrying:
            task.cancel()
        await asyncio.gather(*retrying, return_exceptions=True)
        if self._deleting is not None:
            await asyncio.gather(self._deleting, return_exceptions=True)
        while self._flushing is not None:
            await self._flushing
        if self._pending:
            await self._flush()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._path is not None:
            self._path.unlink(missing_ok=True)
            self._path = None

    async def _delete_sent(self) -> None:
        """Shared: delete the sent replies' rows, those sent meanwhile in the next statement. A
        failed DELETE leaves its rows for the stale-outbox sweep, as a crash would."""
        try:
            while self._to_delete:
                ids, self._to_delete = self._to_delete, []
                try:
                    await self.store.forget_outbox(ids)
                except Exception:
                    log.exception("could not forget %d sent replies' outbox rows", len(ids))
        finally:
            self._deleting = None

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._generation += 1
        self._path = self.directory / f"outbox-sent.{self._generation:08d}.log"
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    async def _flush(self) -> None:
        """Start a new log, delete the rows the old one names, then remove the old log."""
        ids, self._pending = self._pending, []
        self._clearing = ids
        old_fd, old_path = self._fd, self._path
        self._open()
        if old_fd is not None:
            os.close(old_fd)
        try:
            await self.store.forget_outbox(ids)
        except StorageError as exc:  # the ids stay in the old log, which the next start reads
            log.error("could not clear %d sent replies from the outbox: %s", len(ids), exc)
        except Exception:
            log.exception("could not clear %d sent replies from the outbox", len(ids))
        else:
            if old_path is not None:
                old_path.unlink(missing_ok=True)
        finally:
            self._flushing = None
            self._clearing = []


def logged_sent(directory: Path) -> list[int]:
    """Outbox ids the delivery logs in `directory` record as sent."""
    ids: list[int] = []
    for path in sorted(directory.glob(LOG_GLOB)):
        with contextlib.suppress(OSError):
            for line in path.read_text(encoding="ascii", errors="replace").splitlines():
                if line.strip().isdigit():
                    ids.append(int(line))
    return ids


def _generation(path: Path) -> int:
    middle = path.name.split(".")[1]
    return int(middle) if middle.isdigit() else 0
