"""`gatehouse jobs`: reminders, cron tasks and maintenance, whether or not the gateway runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from gateway.cli.common import JsonFlag, console, execute, load, refuse, show, sub_app

if TYPE_CHECKING:  # the scheduler and its job store: imported by the commands that open them
    from gateway.config import Config
    from gateway.jobs.scheduler import JobInfo, Scheduler

app = sub_app("Scheduled jobs: reminders, cron tasks and maintenance.")


@asynccontextmanager
async def _job_store(config: Config) -> AsyncIterator[Scheduler]:
    """The stored jobs; APScheduler's job store has its own engine on the database, so its
    faults are named here."""
    from gateway.jobs.scheduler import open_job_store
    from gateway.store.faults import database_where, storage_faults

    with storage_faults(database_where(config.database_url)):
        async with open_job_store(config) as scheduler:
            yield scheduler


async def _list_jobs(config: Config) -> list[JobInfo]:
    """The stored jobs, soonest first, then the maintenance jobs (when the scheduler is on)."""
    from gateway.jobs.maintenance import maintenance_schedule
    from gateway.jobs.scheduler import JobInfo

    async with _job_store(config) as scheduler:
        jobs = await scheduler.jobs()
    now = datetime.now(UTC)
    maintenance = [
        JobInfo(j.id, "maintenance", j.description, str(j.trigger),
                j.trigger.get_next_fire_time(None, now))
        for j in maintenance_schedule(config)
    ] if config.scheduler.enabled else []
    return sorted(jobs, key=lambda j: j.next_run or now) + maintenance


async def _cancel_job(config: Config, job_id: str) -> JobInfo | None:
    async with _job_store(config) as scheduler:
        return await scheduler.cancel(job_id)


@app.command("list")
def jobs_list(as_json: JsonFlag = False) -> None:
    """Reminders and cron tasks stored in the database, then the maintenance jobs."""
    jobs = execute(_list_jobs)
    show(jobs, as_json, _print_jobs, lambda jobs: [j.to_json() for j in jobs])


def _print_jobs(jobs: list[JobInfo]) -> None:
    table = Table("kind", "schedule", "next run", "session / target", "created by", "what")
    table.add_column("id", no_wrap=True)
    for j in jobs:
        where = j.session_key or ""
        if j.target is not None and j.kind == "cron":
            where += f" → {j.target.describe()}"
        who = "" if j.kind == "maintenance" else (j.created_by or "(a group / unknown)")
        if j.by_owner:
            who += " (owner)"
        table.add_row(
            j.kind, escape(j.schedule),
            j.next_run.isoformat(timespec="minutes") if j.next_run else "-",
            escape(where), escape(who), escape((j.text or j.name)[:80]), j.id,
        )
    console.print(table)


@app.command("cancel")
def jobs_cancel(job_id: Annotated[str, typer.Argument(help="The job id (see `jobs list`)")]) -> None:
    """Cancel a reminder or cron task (works whether or not the gateway runs)."""
    from gateway.jobs.maintenance import maintenance_schedule

    config = load()
    if job_id in {j.id for j in maintenance_schedule(config)}:
        refuse(escape(f"{job_id} is a maintenance job: turn it off in [scheduler] of the config"))
    info = execute(lambda c: _cancel_job(c, job_id), config=config)
    if info is None:
        refuse(escape(f"no job {job_id!r} (see `gatehouse jobs list`)"))
    console.print(f"cancelled {info.kind} {info.id} of {escape(info.session_key or '-')}")
