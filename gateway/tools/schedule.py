"""The agent's scheduling tools: `reminder_create`, `cron_create`, `jobs_list`, `job_cancel`.

A reminder is posted back into the session and chat that asked for it; a cron job runs the
given prompt as an agent turn in its own session and posts the answer to that chat, or to the
target given. Bad input (an unreadable time, a time in the past, a cron expression that is
wrong or never fires, an unknown timezone or channel) comes back as a tool error that says what
to write instead. A session sees and cancels only its own jobs.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.date import DateTrigger
from croniter import CroniterBadDateError, CroniterError, croniter
from pytimeparse.timeparse import timeparse

from channels.base import id_problem, is_blank
from gateway.config import Config
from gateway.jobs.scheduler import (
    ChatTarget,
    CrontabTrigger,
    JobInfo,
    JobSpec,
    Scheduler,
    new_job_id,
)
from gateway.tools.registry import Tool, ToolContext, ToolError

log = logging.getLogger(__name__)

MAX_REMINDER_DAYS = 5 * 366


class ScheduleError(ValueError):
    """Input the model should correct; the message says how."""


def _job_spec(
    kind: Literal["reminder", "cron"],
    ctx: ToolContext,
    target: ChatTarget,
    text: str,
    now: datetime,
    tz: ZoneInfo,
    *,
    due: datetime | None = None,
    schedule: str | None = None,
    in_origin_chat: bool = True,
) -> JobSpec:
    """A job this conversation creates `now`, its times read in `tz`, recorded with who asked."""
    caller = ctx.who
    return JobSpec(
        kind=kind,
        job_id=new_job_id(),
        session_key=ctx.session_key,
        target=target,
        text=text,
        created_at=now.isoformat(timespec="seconds"),
        in_origin_chat=in_origin_chat,
        due=None if due is None else due.isoformat(timespec="seconds"),
        schedule=schedule,
        timezone=tz.key,
        created_by=caller.person,
        by_owner=caller.owner,
        platform=ctx.platform or None,
    )


def check_target_id(name: str, value: str) -> None:
    """A target chat's id is stored and keyed as it is, like any inbound id: a blank one, or one
    the store cannot hold (`channels.base.id_problem`), is refused."""
    if is_blank(value):
        raise ScheduleError(f"target {name} is blank")
    problem = id_problem(value)
    if problem is not None:
        raise ScheduleError(f"target {name} {problem}; ids must be plain text")


def parse_timezone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"unknown timezone {name!r}: use an IANA name like Europe/Paris or America/New_York"
        ) from None


def parse_delay(value: str | float) -> timedelta:
    """Seconds as a number, or text like "20 minutes", "in 2 hours", "1h30m", "90s"."""
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = value.strip().lower()
        text = text.removeprefix("in ").strip()
        try:
            seconds = float(text)
        except ValueError:
            parsed = timeparse(text)
            if parsed is None:
                raise ScheduleError(
                    f"could not read the delay {value!r}: write e.g. '20 minutes', "
                    "'2 hours', '1h30m' or a number of seconds"
                ) from None
            seconds = float(parsed)
    if seconds <= 0:
        raise ScheduleError(f"the delay must be positive (got {value!r})")
    if seconds > MAX_REMINDER_DAYS * 86_400:
        raise ScheduleError("the delay is too long: at most about five years")
    return timedelta(seconds=seconds)


def parse_at(value: str, tz: ZoneInfo) -> datetime:
    """An ISO 8601 date-time; one without an offset is read in `tz`."""
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ScheduleError(
            f"could not read the time {value!r}: write ISO 8601 like 2026-12-03T09:00 "
            "(local time) or 2026-12-03T09:00:00+01:00"
        ) from None
    return when.replace(tzinfo=tz) if when.tzinfo is None else when


def reminder_due(
    at: str | None, delay: str | float | None, tz: ZoneInfo, now: datetime
) -> datetime:
    if (at is None) == (delay is None):
        raise ScheduleError("give exactly one of 'at' (a date-time) or 'delay' (e.g. '20 minutes')")
    due = parse_at(at, tz) if at is not None else now + parse_delay(delay)  # type: ignore[arg-type]
    if due <= now:
        raise ScheduleError(
            f"{due.astimezone(tz).isoformat(timespec='minutes')} is in the past: it is now "
            f"{now.astimezone(tz).isoformat(timespec='minutes')} ({tz.key})"
        )
    if due - now > timedelta(days=MAX_REMINDER_DAYS):
        raise ScheduleError("that is too far ahead: at most about five years")
    return due


def validate_cron(expression: str, tz: ZoneInfo, now: datetime) -> datetime:
    """Check a 5-field crontab expression; return its next run after `now`."""
    expression = " ".join(expression.split())
    fields = expression.split(" ")
    if not expression.startswith("@") and len(fields) != 5:
        raise ScheduleError(
            f"a cron expression has 5 fields (minute hour day-of-month month day-of-week), "
            f"e.g. '0 9 * * 1-5' for 09:00 on weekdays; {expression!r} has {len(fields)}"
        )
    try:
        return croniter(expression, now.astimezone(tz)).get_next(datetime)  # type: ignore[no-any-return]
    except CroniterBadDateError:
        raise ScheduleError(f"the cron expression {expression!r} never fires") from None
    except (CroniterError, ValueError, KeyError) as exc:
        raise ScheduleError(
            f"bad cron expression {expression!r} ({exc}); fields are minute (0-59), hour "
            "(0-23), day of month (1-31), month (1-12), day of week (0-6, 0 = Sunday)"
        ) from None


def humanize(delta: timedelta) -> str:
    seconds = max(0, round(delta.total_seconds()))
    parts: list[str] = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60), ("s", 1)):
        if seconds >= size or (unit == "s" and not parts):
            amount, seconds = divmod(seconds, size)
            parts.append(f"{amount} {unit}")
        if len(parts) == 2:
            break
    return " ".join(parts)


def describe_job(info: JobInfo, tz: ZoneInfo) -> str:
    when = info.next_run.astimezone(tz).isoformat(timespec="minutes") if info.next_run else "-"
    text = (info.text or "").replace("\n", " ")
    text = text if len(text) <= 120 else text[:119] + "…"
    if info.kind == "reminder":
        return f"- {info.id}: reminder at {when}: {text}"
    where = f", posts to {info.target.describe()}" if info.target else ""
    return f"- {info.id}: {info.schedule}, next run {when}{where}: {text}"


class ScheduleTools:
    """The four scheduling tools, bound to one scheduler."""

    def __init__(self, scheduler: Scheduler, config: Config) -> None:
        self.scheduler = scheduler
        self.config = config

    def tools(self) -> list[Tool]:
        timezone_prop = {
            "type": "string",
            "description": "IANA timezone, e.g. Europe/Paris (default: the gateway's)",
        }
        return [
            Tool(
                "reminder_create",
                "Set a one-time reminder, posted back into this chat (and kept in this "
                "conversation) at a given time or after a delay. Give exactly one of 'at' or "
                "'delay'.",
                {
                    "type": "object",
                    "properties": {
                        "text": {"type": "string", "minLength": 1, "maxLength": 2000},
                        "at": {
                            "type": "string",
                            "description": "ISO 8601, e.g. 2026-12-03T09:00 (local time)",
                        },
                        "delay": {
                            "type": ["string", "number"],
                            "description": "e.g. '20 minutes', '2 hours', '1h30m', or seconds",
                        },
                        "timezone": timezone_prop,
                    },
                    "required": ["text"],
                    "additionalProperties": False,
                },
                self._reminder,
            ),
            Tool(
                "cron_create",
                "Schedule a recurring task: at each time of a cron expression, the prompt runs "
                "as an agent turn in a fresh, separate conversation and the answer is posted "
                "to this chat (or, for the gateway's owners only, to 'target').",
                {
                    "type": "object",
                    "properties": {
                        "schedule": {
                            "type": "string",
                            "description": "5-field cron: minute hour day-of-month month "
                            "day-of-week (0 = Sunday), e.g. '0 9 * * 1-5'",
                        },
                        "prompt": {"type": "string", "minLength": 1, "maxLength": 4000},
                        "timezone": timezone_prop,
                        "target": {
                            "type": "object",
                            "properties": {
                                "platform": {"type": "string", "minLength": 1},
                                "chat_id": {"type": "string", "minLength": 1},
                                "thread_id": {"type": "string"},
                            },
                            "required": ["platform", "chat_id"],
                            "additionalProperties": False,
                        },
                    },
                    "required": ["schedule", "prompt"],
                    "additionalProperties": False,
                },
                self._cron,
            ),
            Tool(
                "jobs_list",
                "List this conversation's reminders and scheduled tasks with their ids.",
                {"type": "object", "properties": {}, "additionalProperties": False},
                self._list,
            ),
            Tool(
                "job_cancel",
                "Cancel one of this conversation's reminders or scheduled tasks by id.",
                {
                    "type": "object",
                    "properties": {"id": {"type": "string", "minLength": 1}},
                    "required": ["id"],
                    "additionalProperties": False,
                },
                self._cancel,
            ),
        ]

    def _tz(self, args: dict[str, Any], ctx: ToolContext) -> ZoneInfo:
        return parse_timezone(str(args.get("timezone") or ctx.timezone))

    def _origin(self, ctx: ToolContext) -> ChatTarget:
        if not ctx.platform or not ctx.chat_id:
            raise ScheduleError("this conversation has no chat to post into")
        return ChatTarget(
            platform=ctx.platform,
            chat_id=ctx.chat_id,
            thread_id=ctx.thread_id,
            chat_type=ctx.chat_type or "direct",
            account=ctx.account,
        )

    async def _check_quota(self, ctx: ToolContext) -> None:
        """The quotas: per conversation, per person (a new conversation — every new webchat
        id is one — starts no fresh quota) and per platform."""
        every = await self.scheduler.jobs()
        settings = self.config.scheduler
        person = ctx.who.person
        counts = (
            ("this conversation", [j for j in every if j.session_key == ctx.session_key],
             settings.max_jobs_per_session),
            ("you", [j for j in every if person is not None and j.created_by == person],
             settings.max_jobs_per_person),
            (f"{ctx.platform or 'this platform'}",
             [j for j in every if ctx.platform and j.platform == ctx.platform],
             settings.max_jobs_per_platform),
        )
        for who, jobs, limit in counts:
            if len(jobs) >= limit:
                raise ScheduleError(
                    f"{who} already {'have' if who == 'you' else 'has'} {len(jobs)} scheduled "
                    f"jobs (the limit is {limit}); cancel one with job_cancel first"
                )

    async def _reminder(self, args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            tz = self._tz(args, ctx)
            now = datetime.now(UTC)
            due = reminder_due(args.get("at"), args.get("delay"), tz, now)
            target = self._origin(ctx)
            await self._check_quota(ctx)
        except ScheduleError as exc:
            raise ToolError(str(exc)) from None
        text = str(args["text"]).strip()
        spec = _job_spec("reminder", ctx, target, text, now, tz, due=due)
        info = await self.scheduler.add(spec, DateTrigger(run_date=due), f"reminder: {text[:60]}")
        local = due.astimezone(tz)
        return (
            f"Reminder {info.id} set for {local.isoformat(timespec='minutes')} ({tz.key}), in "
            f"{humanize(due - now)}. It will be posted in this chat."
        )

    def _target(self, raw: dict[str, Any] | None, ctx: ToolContext) -> tuple[ChatTarget, bool]:
        origin = self._origin(ctx) if ctx.platform and ctx.chat_id else None
        if raw is None:
            if origin is None:
                raise ScheduleError("say where to post the results: give 'target'")
            return origin, True
        platform = str(raw["platform"]).strip().lower()
        try:
            enabled = self.config.channels.get(platform).enabled
        except KeyError:
            enabled = False
        if not enabled:
            known = [n for n in type(self.config.channels).model_fields
                     if self.config.channels.get(n).enabled]
            raise ScheduleError(
                f"no enabled channel {platform!r}; enabled channels: {', '.join(known) or 'none'}"
            )
        chat_id = str(raw["chat_id"]).strip()
        thread_id = str(raw["thread_id"]).strip() if raw.get("thread_id") else None
        check_target_id("chat_id", chat_id)
        if thread_id is not None:
            check_target_id("thread_id", thread_id)
        if origin is not None and (platform, chat_id, thread_id) == (
            origin.platform, origin.chat_id, origin.thread_id
        ):
            return origin, True
        if not ctx.who.owner:
            # Anyone could otherwise make the bot post anything anywhere, forever.
            raise ScheduleError(
                "results can only be posted to this conversation: leave out 'target' (only "
                "the gateway's owners may schedule posts to another chat)"
            )
        return ChatTarget(platform, chat_id, thread_id, chat_type="group"), False

    async def _cron(self, args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            tz = self._tz(args, ctx)
            now = datetime.now(UTC)
            expression = " ".join(str(args["schedule"]).split())
            first = validate_cron(expression, tz, now)
            target, in_origin = self._target(args.get("target"), ctx)
            await self._check_quota(ctx)
        except ScheduleError as exc:
            raise ToolError(str(exc)) from None
        prompt = str(args["prompt"]).strip()
        spec = _job_spec(
            "cron", ctx, target, prompt, now, tz, schedule=expression, in_origin_chat=in_origin
        )
        info = await self.scheduler.add(
            spec, CrontabTrigger(expression, tz.key), f"cron: {prompt[:60]}"
        )
        where = "this chat" if in_origin else target.describe()
        next_run = (info.next_run or first).astimezone(tz)
        return (
            f"Scheduled task {info.id} created: '{expression}' ({tz.key}), next run "
            f"{next_run.isoformat(timespec='minutes')}; each run's answer is posted to {where}."
        )

    async def _list(self, _args: dict[str, Any], ctx: ToolContext) -> str:
        jobs = await self.scheduler.jobs(ctx.session_key)
        if not jobs:
            return "No reminders or scheduled tasks in this conversation."
        tz = parse_timezone(ctx.timezone)
        return "\n".join(describe_job(info, tz) for info in jobs)

    async def _cancel(self, args: dict[str, Any], ctx: ToolContext) -> str:
        job_id = str(args["id"]).strip()
        info = await self.scheduler.cancel(job_id, ctx.session_key)
        if info is None:
            raise ToolError(
                f"no job {job_id!r} in this conversation (it may have fired already); "
                "see jobs_list"
            )
        return f"Cancelled {info.kind} {info.id}."
