"""Scheduled jobs: APScheduler 3.x on the gateway's event loop, jobs kept in the gateway's database.

* Reminders and cron jobs that the agent creates live in APScheduler's `SQLAlchemyJobStore`
  (table `apscheduler_jobs`, same database as the sessions), so they survive restarts. The job
  store is synchronous SQLAlchemy on the store's own driver (`gateway.config.sync_url`).
* Stored jobs name importable functions (`gateway.jobs.scheduler:fire_reminder`) and carry plain
  data; the host that runs them (a `gateway.jobs.host.JobHost`, in practice the Gateway) is
  found through a context variable that the executor sets, never pickled. Several gateways in
  one process (tests) each run their own jobs.
* Maintenance jobs come from `[scheduler]` in the config and are registered at every start in a
  memory job store, so a config change never leaves a stale job behind.
* Only a leader fires jobs: `start()` opens the scheduler paused and resumes it once the
  `leader` awaitable returns (always at once on SQLite, one process per database). Jobs can be
  added, listed and cancelled while paused, which is how `gatehouse chat`, `gatehouse jobs` and
  non-leader processes work.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, cast
from zoneinfo import ZoneInfo

from apscheduler.executors.asyncio import AsyncIOExecutor
from apscheduler.job import Job
from apscheduler.jobstores.base import JobLookupError
from apscheduler.jobstores.memory import MemoryJobStore
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.schedulers.base import STATE_RUNNING, STATE_STOPPED
from apscheduler.triggers.base import BaseTrigger
from croniter import CroniterBadDateError, croniter
from sqlalchemy import Engine, create_engine, event, make_url

from channels.base import ChatType, InboundMessage, OutboundMessage
from context.types import Message
from gateway.config import Config, sync_url
from gateway.inbound.lanes import LanesClosedError
from gateway.jobs.host import JobHost
from gateway.store import SessionInfo
from gateway.store.schema import create_table_once

log = logging.getLogger(__name__)

JOBS_TABLE = "apscheduler_jobs"
USER_STORE = "default"
MAINTENANCE_STORE = "maintenance"
SCHEDULER_SENDER = "scheduler"
CRON_SESSION_PREFIX = "cron:"

JobKind = Literal["reminder", "cron", "maintenance"]
LeaderWait = Callable[[], Awaitable[None]]
"""Returns once this process may fire jobs (see `Scheduler.step_down` for losing it)."""

async def always_leader() -> None:
    """One gateway process per SQLite database: it always leads."""


def _sqlite_busy_timeout(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


def job_store_engine(database_url: str) -> Engine:
    """The job store's own engine on the gateway's database (same driver as the store)."""
    url = make_url(sync_url(database_url))
    if url.drivername == "sqlite":
        if url.database and url.database != ":memory:":
            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url)
        event.listen(engine, "connect", _sqlite_busy_timeout)
        return engine
    return create_engine(url, pool_pre_ping=True)


# -- triggers -------------------------------------------------------------------------------


class CrontabTrigger(BaseTrigger):  # type: ignore[misc]
    """A standard 5-field crontab expression in an IANA timezone, read by croniter.

    APScheduler 3's own `CronTrigger.from_crontab` numbers weekdays from Monday = 0 and requires
    both day fields to match; people (and models) write crontab, where 0 is Sunday and either
    day field may match. This trigger keeps crontab's meaning.
    """

    __slots__ = ("expression", "timezone")

    def __init__(self, expression: str, timezone: str) -> None:
        self.expression = expression
        self.timezone = timezone

    def get_next_fire_time(
        self, previous_fire_time: datetime | None, now: datetime
    ) -> datetime | None:
        start = (previous_fire_time or now).astimezone(ZoneInfo(self.timezone))
        try:
            return cast(datetime, croniter(self.expression, start).get_next(datetime))
        except CroniterBadDateError:
            return None

    def __getstate__(self) -> dict[str, Any]:
        return {"version": 1, "expression": self.expression, "timezone": self.timezone}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.expression = state["expression"]
        self.timezone = state["timezone"]

    def __str__(self) -> str:
        return f"cron '{self.expression}' {self.timezone}"

    def __repr__(self) -> str:
        return f"<CrontabTrigger {self.expression!r} {self.timezone}>"


# -- what a stored job carries ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChatTarget:
    """Where a job's output goes: a platform, a chat and maybe a thread."""

    platform: str
    chat_id: str
    thread_id: str | None = None
    chat_type: str = "direct"
    account: str = "default"

    def describe(self) -> str:
        where = f"{self.platform} chat {self.chat_id}"
        return f"{where} (thread {self.thread_id})" if self.thread_id else where

    def session_info(self, key: str, agent: str) -> SessionInfo:
        """A session that lives in this chat (used when the session is first created)."""
        return SessionInfo(
            key=key,
            agent=agent,
            platform=self.platform,
            chat_type=self.chat_type,
            chat_id=self.chat_id,
            thread_id=self.thread_id,
            account=self.account,
        )


@dataclass(frozen=True, slots=True)
class JobSpec:
    """The plain data a reminder or cron job stores (pickled as a dict, never as objects)."""

    kind: Literal["reminder", "cron"]
    job_id: str
    session_key: str
    """The session that created the job; reminders are posted into it."""
    target: ChatTarget
    text: str
    """The reminder's text, or the cron job's prompt."""
    created_at: str
    in_origin_chat: bool = True
    """The output goes to the chat that created the job (a cron answer is kept there too)."""
    due: str | None = None
    schedule: str | None = None
    timezone: str | None = None
    created_by: str | None = None
    """The person who asked for it (`SessionKeyer.person`; None in a group or from an older
    gatehouse): its quota, `jobs list`, and whose rights a scheduled task's turn has."""
    by_owner: bool = False
    """Created by one of `[gateway] owners`."""
    platform: str | None = None
    """The platform it was created from (the per-platform quota)."""

    def to_kwargs(self) -> dict[str, Any]:
        return {"spec": asdict(self)}

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> JobSpec:
        data = dict(kwargs["spec"])
        data["target"] = ChatTarget(**data["target"])
        return cls(**data)


@dataclass(frozen=True, slots=True)
class JobInfo:
    """A job as `jobs_list` and `gatehouse jobs list` show it."""

    id: str
    kind: JobKind
    name: str
    schedule: str
    next_run: datetime | None
    session_key: str | None = None
    target: ChatTarget | None = None
    text: str | None = None
    created_by: str | None = None
    by_owner: bool = False
    platform: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "name": self.name,
            "schedule": self.schedule,
            "next_run": self.next_run.isoformat(timespec="seconds") if self.next_run else None,
            "session": self.session_key,
            "target": asdict(self.target) if self.target else None,
            "text": self.text,
            "created_by": self.created_by,
            "by_owner": self.by_owner,
            "platform": self.platform,
        }


def job_info(job: Job) -> JobInfo:
    spec = JobSpec.from_kwargs(job.kwargs)
    schedule = str(job.trigger) if spec.kind == "cron" else f"once at {spec.due}"
    return JobInfo(
        id=job.id,
        kind=spec.kind,
        name=job.name,
        schedule=schedule,
        next_run=job.next_run_time,
        session_key=spec.session_key,
        target=spec.target,
        text=spec.text,
        created_by=spec.created_by,
        by_owner=spec.by_owner,
        platform=spec.platform,
    )


def new_job_id() -> str:
    return secrets.token_hex(5)


# -- which host runs a job --------------------------------------------------------------------

_running: contextvars.ContextVar[Scheduler] = contextvars.ContextVar("gatehouse_scheduler")
"""The scheduler whose job runs in this context: it tracks the job and knows its host."""


class NoGatewayError(RuntimeError):
    pass


def current_host() -> JobHost:
    """The host the running job works for (set by the executor, never stored with the job)."""
    try:
        host = _running.get().host
    except LookupError:
        host = None
    if host is None:
        raise NoGatewayError("a scheduled job ran outside a running gateway")
    return host


@contextlib.contextmanager
def running_jobs_for(scheduler: Scheduler) -> Iterator[None]:
    """Make `scheduler` (and its host) the one that job functions started inside this block
    work for."""
    token = _running.set(scheduler)
    try:
        yield
    finally:
        _running.reset(token)


def job_started() -> JobHost:
    """The host a job runs for; the job's task is tracked so a shutdown lets it finish."""
    host = current_host()
    task = asyncio.current_task()
    if task is not None:
        _running.get().track(task)
    return host


class _HostExecutor(AsyncIOExecutor):  # type: ignore[misc]
    """Runs job coroutines on the loop with their scheduler in their context (tasks copy it)."""

    def __init__(self, owner: Scheduler) -> None:
        super().__init__()
        self._owner = owner  # not `_scheduler`: the base class keeps APScheduler's there

    def submit_job(self, job: Job, run_times: list[datetime]) -> None:
        if self._owner.host is None:
            raise NoGatewayError("this scheduler only manages jobs; it does not run them")
        with running_jobs_for(self._owner):
            super().submit_job(job, run_times)


class _SerializedScheduler(AsyncIOScheduler):  # type: ignore[misc]
    """AsyncIOScheduler whose job processing holds the store's write lock.

    The job store's SQL is synchronous and runs on the event loop; processing runs as one task at
    a time, optionally under `write_lock` (an embedder's own lock around synchronous writers).
    The gateway's store needs none: its transactions run whole on their own thread.
    """

    def __init__(self, write_lock: asyncio.Lock | None, **options: Any) -> None:
        super().__init__(**options)
        self._write_lock = write_lock
        self._processing: asyncio.Task[None] | None = None
        self._again = False

    def wakeup(self) -> None:
        loop = self._eventloop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        if self._eventloop is None:
            return
        self._stop_timer()
        if self._processing is not None and not self._processing.done():
            self._again = True
            return
        self._processing = self._eventloop.create_task(self._process(), name="scheduler")

    async def _process(self) -> None:
        while True:
            self._again = False
            async with self._write_lock or contextlib.nullcontext():
                try:
                    wait_seconds = self._process_jobs()
                except Exception:  # e.g. the database went away: try again later
                    log.exception("scheduler: processing jobs failed; retrying")
                    wait_seconds = self.jobstore_retry_interval
            if not self._again:
                break
        if self._eventloop is not None:
            self._start_timer(wait_seconds)

    def cancel_processing(self) -> None:
        if self._processing is not None:
            self._processing.cancel()


# -- the scheduler ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MaintenanceJob:
    id: str
    description: str
    trigger: BaseTrigger
    run: Callable[[], Awaitable[Any]] | None = field(default=None, compare=False)


class Scheduler:
    """The gateway's APScheduler: user jobs in the database, maintenance jobs from the config."""

    def __init__(
        self,
        config: Config,
        *,
        write_lock: asyncio.Lock | None = None,
        leader: LeaderWait = always_leader,
    ) -> None:
        self.config = config
        self.settings = config.scheduler
        self.write_lock = write_lock
        self.leader = leader
        self.fires_jobs = True
        """False in `gatehouse chat`: only `gatehouse run` fires jobs; chat just stores them."""
        self.running_jobs: set[asyncio.Task[Any]] = set()
        self._aps: _SerializedScheduler | None = None
        self._host: JobHost | None = None
        self._lead_task: asyncio.Task[None] | None = None

    @property
    def host(self) -> JobHost | None:
        """What fired jobs work for; None when this scheduler only stores jobs."""
        return self._host

    @property
    def started(self) -> bool:
        return self._aps is not None

    @property
    def leading(self) -> bool:
        return self._aps is not None and self._aps.state == STATE_RUNNING

    def _locked(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return self.write_lock or contextlib.nullcontext()

    async def start(
        self, host: JobHost | None = None, maintenance: Sequence[MaintenanceJob] = ()
    ) -> None:
        """Open the job store (paused). With a host that fires jobs, register the maintenance
        jobs and fire everything once `leader` returns."""
        if self._aps is not None:
            return
        fires = host is not None and self.fires_jobs
        self._host = host if fires else None
        engine = job_store_engine(self.config.database_url)
        user_store = SQLAlchemyJobStore(engine=engine, tablename=JOBS_TABLE)
        with engine.begin() as connection:  # not APScheduler's unlocked check-then-create
            create_table_once(connection, user_store.jobs_t)
        aps = _SerializedScheduler(
            self.write_lock,
            jobstores={
                USER_STORE: user_store,
                MAINTENANCE_STORE: MemoryJobStore(),
            },
            executors={"default": _HostExecutor(self)},
            job_defaults={
                "misfire_grace_time": self.settings.misfire_grace_seconds,
                "coalesce": self.settings.coalesce,
                "max_instances": 1,
            },
            timezone=ZoneInfo(self.config.gateway.timezone),
        )
        async with self._locked():
            aps.start(paused=True)
        self._aps = aps
        if not fires:
            return
        for job in maintenance:
            aps.add_job(
                _tracked(job.run),
                trigger=job.trigger,
                id=job.id,
                name=job.description,
                jobstore=MAINTENANCE_STORE,
                replace_existing=True,
            )
        self._lead_task = asyncio.create_task(self._lead(), name="scheduler-leader")

    def track(self, task: asyncio.Task[Any]) -> None:
        self.running_jobs.add(task)
        task.add_done_callback(self.running_jobs.discard)

    async def join(self) -> None:
        """Wait until no job runs (tests and benchmarks)."""
        while self.running_jobs:
            await asyncio.gather(*list(self.running_jobs), return_exceptions=True)

    async def _lead(self) -> None:
        await self.leader()
        assert self._aps is not None
        self._aps.resume()
        log.info("scheduler running: %d stored jobs", len(await self.jobs()))
        while True:  # jobs added by another process (CLI, `gatehouse chat`) are seen in time
            await asyncio.sleep(self.settings.poll_seconds)
            self._aps.wakeup()

    async def step_down(self) -> None:
        """Stop firing jobs (leadership lost) and wait to lead again."""
        if self._lead_task is not None:
            self._lead_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lead_task
        if self._aps is not None and self._host is not None:
            self._aps.pause()
            self._lead_task = asyncio.create_task(self._lead(), name="scheduler-leader")

    async def stop(self, grace: float = 10.0) -> None:
        """Stop firing; give running jobs `grace` seconds to finish; close the job store."""
        aps, self._aps = self._aps, None
        if aps is None:
            return
        if self._lead_task is not None:
            self._lead_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lead_task
            self._lead_task = None
        if aps.state != STATE_STOPPED:
            aps.pause()
        aps.cancel_processing()
        if self.running_jobs:
            _done, pending = await asyncio.wait(set(self.running_jobs), timeout=grace)
            for task in pending:
                log.warning("scheduled job %s still running at shutdown: cancelled",
                            task.get_name())
        async with self._locked():
            aps.shutdown(wait=False)
            await asyncio.sleep(0)  # AsyncIOScheduler shuts down on the next loop iteration

    def _require(self) -> _SerializedScheduler:
        if self._aps is None:
            raise RuntimeError("the scheduler is not started")
        return self._aps

    # -- user jobs ------------------------------------------------------------------------------

    async def add(self, spec: JobSpec, trigger: BaseTrigger, name: str) -> JobInfo:
        """Store a reminder or cron job. Reminders are never dropped for being late."""
        aps = self._require()
        func = fire_reminder if spec.kind == "reminder" else fire_cron
        extra: dict[str, Any] = {"misfire_grace_time": None} if spec.kind == "reminder" else {}
        async with self._locked():
            job = aps.add_job(
                func,
                trigger=trigger,
                id=spec.job_id,
                name=name,
                kwargs=spec.to_kwargs(),
                jobstore=USER_STORE,
                **extra,
            )
        return job_info(job)

    async def jobs(self, session_key: str | None = None) -> list[JobInfo]:
        """Stored reminders and cron jobs (of one session, when given), soonest first."""
        aps = self._require()
        async with self._locked():
            jobs = aps.get_jobs(jobstore=USER_STORE)
        infos = [job_info(j) for j in jobs]
        return [i for i in infos if session_key is None or i.session_key == session_key]

    async def job(self, job_id: str) -> JobInfo | None:
        """One stored reminder or cron job, by id."""
        aps = self._require()
        async with self._locked():
            job = aps.get_job(job_id, jobstore=USER_STORE)
        return None if job is None else job_info(job)

    async def cancel(self, job_id: str, session_key: str | None = None) -> JobInfo | None:
        """Remove a stored job (only one of `session_key`'s, when given); None if none."""
        aps = self._require()
        async with self._locked():
            job = aps.get_job(job_id, jobstore=USER_STORE)
            if job is None:
                return None
            info = job_info(job)
            if session_key is not None and info.session_key != session_key:
                return None
            try:
                aps.remove_job(job_id, jobstore=USER_STORE)
            except JobLookupError:  # fired or cancelled meanwhile by another process
                return None
        return info

    def maintenance(self) -> list[JobInfo]:
        aps = self._require()
        return [
            JobInfo(j.id, "maintenance", j.name, str(j.trigger), j.next_run_time)
            for j in aps.get_jobs(jobstore=MAINTENANCE_STORE)
        ]

    async def run_maintenance_now(self, job_id: str) -> Any:
        """Run a maintenance job at once (an operator's request, and the tests)."""
        job = self._require().get_job(job_id, jobstore=MAINTENANCE_STORE)
        if job is None:
            raise KeyError(job_id)
        assert self._host is not None
        with running_jobs_for(self):
            task = asyncio.create_task(job.func(), name=f"job:{job_id}")
        return await task


def _tracked(run: Callable[[], Awaitable[Any]] | None) -> Callable[[], Awaitable[Any]]:
    if run is None:
        raise ValueError("a maintenance job without a function")

    async def tracked() -> Any:
        job_started()
        return await run()

    tracked.__qualname__ = getattr(run, "__qualname__", "maintenance")
    return tracked


@contextlib.asynccontextmanager
async def open_job_store(config: Config) -> AsyncIterator[Scheduler]:
    """The stored jobs without a gateway and without firing anything (`gatehouse jobs`)."""
    scheduler = Scheduler(config)
    await scheduler.start()
    try:
        yield scheduler
    finally:
        await scheduler.stop()


# -- the job functions (stored by reference: keep their names and signatures) ----------------


async def fire_reminder(spec: dict[str, Any]) -> None:
    """Post a reminder into the session and chat that asked for it, and keep it in the
    session's history (an assistant message) so the model knows it was said."""
    host = job_started()
    job = JobSpec.from_kwargs({"spec": spec})
    text = f"⏰ Reminder: {job.text}"
    if job.due is not None:
        late = datetime.now(UTC) - datetime.fromisoformat(job.due)
        if late > timedelta(seconds=host.config.scheduler.misfire_grace_seconds):
            text += f"\n(This was due at {job.due}; the gateway was not running then.)"
    await post_to_session(host, job.session_key, job.target, text)


async def fire_cron(spec: dict[str, Any]) -> None:
    """Run the job's prompt as an agent turn in its own session (`cron:<job id>`, a fresh
    context every run, history kept) and post the answer to the target chat. When the target
    is the chat that created the job, the answer is also kept in that chat's session."""
    host = job_started()
    job = JobSpec.from_kwargs({"spec": spec})
    job_id = job.job_id
    key = f"{CRON_SESSION_PREFIX}{job_id}"
    target = job.target
    info = target.session_info(key, host.config.gateway.agent)
    now = datetime.now(ZoneInfo(job.timezone or host.config.gateway.timezone))
    prompt = (
        f"[Scheduled task {job_id}, {job.schedule} ({job.timezone}), running at "
        f"{now.isoformat(timespec='minutes')}. Your answer is posted to {target.describe()}.]\n"
        f"{job.text}"
    )
    async with host.hold_lane(key):
        await host.reset_session(key, f"new run of scheduled task {job_id}", flush=False)
        await host.store.accept_inbound(
            info,
            InboundMessage(
                platform=target.platform,
                chat_type=cast(ChatType, target.chat_type),
                chat_id=target.chat_id,
                sender_id=SCHEDULER_SENDER,
                sender_name=SCHEDULER_SENDER,
                text=prompt,
                account=target.account,
                thread_id=target.thread_id,
            ),
        )
    try:
        await host.run_turn_now(key)
    except LanesClosedError:
        log.info("scheduled task %s is stored and runs when the gateway starts again", job_id)
        return
    if not job.in_origin_chat or job.session_key.startswith(CRON_SESSION_PREFIX):
        return
    session = await host.store.get_session(key)
    if session is None or session.id is None:
        return
    answer = next(
        (m for m in reversed(await host.store.history(session.id))
         if m.role == "assistant" and m.text and m.meta.get("status") is None),
        None,
    )
    if answer is not None:
        await store_in_session(
            host, job.session_key, f"[Scheduled task {job_id}]\n{answer.text}"
        )


async def store_in_session(
    host: JobHost, session_key: str, text: str, outbound: OutboundMessage | None = None
) -> int | None:
    """Append an assistant message to a session's history, between turns; with `outbound`,
    also queue it for delivery and return its outbox id."""
    session = await host.store.get_session(session_key)
    if session is None or session.id is None:
        log.warning("session %s is gone; not storing %r", session_key, text[:80])
        return None
    message = Message(role="assistant", content=text)
    message = message.with_tokens(host.count_tokens(message))
    async with host.hold_lane(session_key):
        if outbound is not None:
            return await host.store.post_message(session.id, message, outbound)
        await host.store.append_messages(session.id, [message])
        return None


async def post_to_session(
    host: JobHost, session_key: str, target: ChatTarget, text: str
) -> None:
    """Store it in the session and the outbox at once, then deliver to the chat: a failed send
    is tried again, and a crash before it is sent on the next start (the outbox's recovery)."""
    if await host.store.get_session(session_key) is None:
        await host.store.ensure_session(
            target.session_info(session_key, host.config.gateway.agent)
        )
    outbound = OutboundMessage(
        platform=target.platform,
        chat_id=target.chat_id,
        thread_id=target.thread_id,
        text=text,
        session_key=session_key,
        account=target.account,
    )
    outbox_id = await store_in_session(host, session_key, text, outbound)
    if outbox_id is not None:
        await host.deliver_stored(outbox_id, outbound)
