"""The scheduler inside a real gateway: APScheduler 3 with its job store in a real SQLite file,
the real openai SDK against the fake server, the real python-telegram-bot against the fake
Bot API. Jobs are made due by moving their stored run time, never by sleeping for minutes."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from channels.telegram import TelegramChannel
from gateway.app import Gateway
from gateway.jobs.scheduler import (
    CRON_SESSION_PREFIX,
    JobInfo,
    Scheduler,
    open_job_store,
    sync_url,
)
from gateway.tools.registry import ToolContext
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI, reply, tool_call
from tests.fakes.telegram_server import FakeTelegram
from tests.helpers.jobs import (
    KEY,
    USER,
    call,
    ctx,
    make_due,
    start_gateway,
    telegram_config,
    to_chat,
    tool_results,
)

# -- reminders --------------------------------------------------------------------------------


async def test_reminder_from_the_agent_is_posted_in_the_chat_and_kept_in_history(
    make_config: MakeConfig, fake_llm: FakeOpenAI, tg: FakeTelegram
) -> None:
    gateway = await start_gateway(telegram_config(make_config, fake_llm, tg))
    try:
        fake_llm.script(
            tool_call("reminder_create", {"text": "stretch your legs", "delay": "in 0.3 seconds"}),
            reply("Done: I will remind you."),
        )
        tg.private_message(USER, "remind me to stretch in a moment")
        sent = await tg.wait_for_call("sendMessage", n=2, where=to_chat(USER))
        assert sent[0]["text"] == "Done: I will remind you."
        assert sent[1]["text"] == "⏰ Reminder: stretch your legs"
        [result] = tool_results(fake_llm.requests[1])
        assert result.startswith("Reminder ") and "posted in this chat" in result

        session = await gateway.store.get_session(KEY)
        assert session is not None and session.id is not None
        history = await gateway.store.history(session.id)
        assert [m.role for m in history][-1] == "assistant"
        assert history[-1].content == "⏰ Reminder: stretch your legs"
        assert await gateway.scheduler.jobs() == [], "a fired reminder is gone"

        # The model knows it was said: the next turn's prompt carries it.
        tg.private_message(USER, "did you remind me?")
        await tg.wait_for_call("sendMessage", n=3, where=to_chat(USER))
        sent_messages = fake_llm.requests[-1]["messages"]
        assert any(m["content"] == "⏰ Reminder: stretch your legs" for m in sent_messages)
    finally:
        await gateway.stop(grace=2)


async def test_a_reminder_telegram_refused_is_sent_again(
    make_config: MakeConfig, fake_llm: FakeOpenAI, tg: FakeTelegram
) -> None:
    config = telegram_config(make_config, fake_llm, tg, gateway={"pending_sweep_seconds": 0.1})
    gateway = Gateway(config)
    gateway.add_channel(TelegramChannel(config.channels.telegram))
    gateway.delivery.retry_delays = (0.05,)
    gateway.delivery.shared_grace = 0.3  # PostgreSQL: the sweep is what tries again
    await gateway.start()
    try:
        answer = await call(gateway, "reminder_create",
                            {"text": "water the plants", "delay": "in 0.2 seconds"}, ctx())
        assert answer.startswith("Reminder ")
        tg.fail_next["sendMessage"] = (502, "Bad Gateway")
        failed, resent = await tg.wait_for_call("sendMessage", n=2, where=to_chat(USER))
        assert failed["text"] == resent["text"] == "⏰ Reminder: water the plants"
        await asyncio.sleep(0.5)
        assert len(tg.calls_to("sendMessage")) == 2
    finally:
        await gateway.stop(grace=2)


async def test_tool_errors_are_clear_and_reach_the_model(
    make_config: MakeConfig, fake_llm: FakeOpenAI, tg: FakeTelegram
) -> None:
    gateway = await start_gateway(telegram_config(make_config, fake_llm, tg))
    try:
        past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
        fake_llm.script(
            tool_call("reminder_create", {"text": "x", "at": past}),
            tool_call("cron_create", {"schedule": "61 * * * *", "prompt": "report"}),
            reply("Sorry."),
        )
        tg.private_message(USER, "remind me yesterday, and every 61st minute")
        await tg.wait_for_call("sendMessage", where=to_chat(USER))
        [past_error] = tool_results(fake_llm.requests[1])
        assert past_error.startswith("error: ") and "is in the past: it is now" in past_error
        cron_error = tool_results(fake_llm.requests[2])[-1]
        assert "bad cron expression '61 * * * *'" in cron_error
        assert "0 = Sunday" in cron_error

        c = ctx()
        cases = {
            ("reminder_create", "text", "at"): ({"text": "x", "at": "tomorrow-ish"},
                                                "could not read the time"),
            ("reminder_create", "both"): ({"text": "x", "at": "2099-01-01T09:00", "delay": 60},
                                          "exactly one of 'at'"),
            ("reminder_create", "delay"): ({"text": "x", "delay": "a while"},
                                           "could not read the delay"),
            ("reminder_create", "tz"): ({"text": "x", "delay": 60, "timezone": "Mars/Olympus"},
                                        "unknown timezone 'Mars/Olympus'"),
            ("cron_create", "fields"): ({"schedule": "0 9 * *", "prompt": "p"}, "has 4"),
            ("cron_create", "never"): ({"schedule": "0 0 31 2 *", "prompt": "p"}, "never fires"),
            ("cron_create", "tz"): ({"schedule": "0 9 * * *", "prompt": "p",
                                     "timezone": "Europe/Atlantis"}, "unknown timezone"),
            ("cron_create", "target"): ({"schedule": "0 9 * * *", "prompt": "p",
                                         "target": {"platform": "irc", "chat_id": "#x"}},
                                        "no enabled channel 'irc'"),
        }
        for (tool, *_why), (args, expected) in cases.items():
            text = await call(gateway, tool, args, c)
            assert text.startswith("error: ") and expected in text, (tool, args, text)
        assert await gateway.scheduler.jobs() == [], "nothing bad was stored"
    finally:
        await gateway.stop(grace=2)


async def test_jobs_are_private_to_their_session_and_capped(
    make_config: MakeConfig, fake_llm: FakeOpenAI, tg: FakeTelegram
) -> None:
    config = telegram_config(make_config, fake_llm, tg, scheduler={"max_jobs_per_session": 2})
    gateway = await start_gateway(config)
    try:
        mine, other = ctx(), ctx("agent:main:telegram:direct:8", "8")
        first = await call(gateway, "reminder_create", {"text": "water", "delay": "2 hours"}, mine)
        assert "Europe/Paris), in 2 h. It will be posted in this chat." in first
        june = f"{datetime.now(UTC).year + 1}-06-01T09:30"
        at = await call(gateway, "reminder_create", {"text": "call", "at": june}, mine)
        assert f"{june}+02:00 (Europe/Paris)" in at, at
        far = await call(gateway, "reminder_create", {"text": "x", "at": "2099-06-01T09:30"}, mine)
        assert far == "error: that is too far ahead: at most about five years"
        refused = await call(gateway, "cron_create", {"schedule": "0 9 * * 1-5", "prompt": "p"},
                             mine)
        assert "already has 2 scheduled jobs" in refused
        listing = await call(gateway, "jobs_list", {}, mine)
        assert "water" in listing and "call" in listing
        assert await call(gateway, "jobs_list", {}, other) == (
            "No reminders or scheduled tasks in this conversation."
        )
        job_id = next(j.id for j in await gateway.scheduler.jobs() if j.text == "water")
        assert "no job" in await call(gateway, "job_cancel", {"id": job_id}, other)
        assert await call(gateway, "job_cancel", {"id": job_id}, mine) == (
            f"Cancelled reminder {job_id}."
        )
        assert [j.text for j in await gateway.scheduler.jobs()] == ["call"]
    finally:
        await gateway.stop(grace=2)


# -- cron -------------------------------------------------------------------------------------


async def test_cron_job_runs_an_isolated_turn_and_posts_the_answer(
    make_config: MakeConfig, fake_llm: FakeOpenAI, tg: FakeTelegram
) -> None:
    gateway = await start_gateway(telegram_config(make_config, fake_llm, tg))
    try:
        fake_llm.script(
            tool_call("cron_create", {"schedule": "0 9 * * 1-5", "prompt": "Summarize the news",
                                      "timezone": "America/New_York"}),
            reply("Scheduled."),
        )
        tg.private_message(USER, "my secret word is PINEAPPLE; brief me at 9 on weekdays")
        await tg.wait_for_call("sendMessage", where=to_chat(USER))
        [created] = tool_results(fake_llm.requests[1])
        assert "'0 9 * * 1-5' (America/New_York)" in created
        [job] = await gateway.scheduler.jobs()
        assert job.kind == "cron" and job.session_key == KEY
        assert job.next_run is not None
        local = job.next_run.astimezone(datetime.now().astimezone().tzinfo)
        assert job.next_run.utcoffset() is not None and local.weekday() in range(0, 6)

        for run in (1, 2):
            fake_llm.script(reply(f"Briefing number {run}."))
            await make_due(gateway, job.id)
            sent = await tg.wait_for_call("sendMessage", n=1 + run, where=to_chat(USER))
            await gateway.scheduler.join()
            assert sent[-1]["text"] == f"Briefing number {run}."
            body = fake_llm.requests[-1]
            texts = [m["content"] or "" for m in body["messages"]]
            assert "Summarize the news" in texts[-1]
            assert not any("PINEAPPLE" in t for t in texts), "the cron turn is isolated"
            assert not any("Briefing number 1" in t for t in texts), "each run starts fresh"
        [still] = await gateway.scheduler.jobs()
        assert still.next_run is not None and still.next_run > datetime.now(UTC)

        cron_session = await gateway.store.get_session(f"{CRON_SESSION_PREFIX}{job.id}")
        assert cron_session is not None and cron_session.id is not None
        kept = [m.content for m in await gateway.store.history(cron_session.id)]
        assert "Briefing number 1." in kept and "Briefing number 2." in kept, "history kept"
        origin = await gateway.store.get_session(KEY)
        assert origin is not None and origin.id is not None
        mirrored = [m.content for m in await gateway.store.history(origin.id)]
        assert f"[Scheduled task {job.id}]\nBriefing number 2." in mirrored
    finally:
        await gateway.stop(grace=2)


async def test_cron_result_goes_to_the_target_an_owner_gave(
    make_config: MakeConfig, fake_llm: FakeOpenAI, tg: FakeTelegram
) -> None:
    config = telegram_config(make_config, fake_llm, tg, gateway={"owners": [f"telegram:{USER}"]})
    gateway = await start_gateway(config)
    try:
        group = -100777
        args = {"schedule": "*/5 * * * *", "prompt": "status",
                "target": {"platform": "telegram", "chat_id": str(group)}}
        # A guest (someone else's DM) may not make the bot post into another chat.
        refused = await call(gateway, "cron_create", args, ctx("agent:main:telegram:direct:8", "8"))
        assert refused.startswith("error: results can only be posted to this conversation")
        assert await gateway.scheduler.jobs() == []
        owner = await gateway.scopes.caller(KEY, "telegram", "direct", str(USER))
        assert owner.owner
        text = await call(gateway, "cron_create", args, replace(ctx(), caller=owner))
        assert f"posted to telegram chat {group}" in text
        [job] = await gateway.scheduler.jobs()
        fake_llm.script(reply("all green"))
        await make_due(gateway, job.id)
        [posted] = await tg.wait_for_call("sendMessage", where=to_chat(group))
        assert posted["text"] == "all green"
        assert tg.calls_to("sendMessage") == [posted], "nothing went to the creator's chat"
    finally:
        await gateway.stop(grace=2)


# -- persistence, misfires, leadership ----------------------------------------------------------


async def test_jobs_survive_a_restart_and_a_missed_reminder_still_arrives(
    make_config: MakeConfig, fake_llm: FakeOpenAI, tg: FakeTelegram
) -> None:
    config = telegram_config(make_config, fake_llm, tg, scheduler={"misfire_grace_seconds": 1})
    gateway = await start_gateway(config)
    try:
        await call(gateway, "reminder_create", {"text": "take the cake out", "delay": 0.4}, ctx())
        await call(gateway, "cron_create", {"schedule": "30 6 * * 0", "prompt": "weekly"}, ctx())
        before = {j.id: j for j in await gateway.scheduler.jobs()}
    finally:
        await gateway.stop(grace=2)
    await asyncio.sleep(1.6)  # due while the gateway is down, and later than the grace
    assert tg.calls_to("sendMessage") == []

    gateway = await start_gateway(config)
    try:
        [late] = await tg.wait_for_call("sendMessage", where=to_chat(USER))
        assert late["text"].startswith("⏰ Reminder: take the cake out")
        assert "the gateway was not running then" in late["text"]
        [cron] = await gateway.scheduler.jobs()
        assert cron.schedule == "cron '30 6 * * 0' Europe/Paris"
        assert cron.next_run == next(j for j in before.values() if j.kind == "cron").next_run
        assert cron.next_run is not None
        assert cron.next_run.astimezone(datetime.now().astimezone().tzinfo).isoweekday() in (6, 7)
    finally:
        await gateway.stop(grace=2)


async def test_missed_cron_runs_coalesce_into_one_and_past_grace_are_skipped(
    make_config: MakeConfig, fake_llm: FakeOpenAI, tg: FakeTelegram
) -> None:
    config = telegram_config(make_config, fake_llm, tg, scheduler={"misfire_grace_seconds": 600})
    gateway = await start_gateway(config)
    try:
        await call(gateway, "cron_create", {"schedule": "* * * * *", "prompt": "tick"}, ctx())
        [job] = await gateway.scheduler.jobs()
        fake_llm.script(reply("tock"))
        await make_due(gateway, job.id, datetime.now(UTC) - timedelta(minutes=5))
        [tock] = await tg.wait_for_call("sendMessage", where=to_chat(USER))
        assert tock["text"] == "tock"
        await asyncio.sleep(0.3)
        assert len(tg.calls_to("sendMessage")) == 1, "five missed runs ran once (coalesced)"

        # A daily job whose last run time was two hours ago, while the gateway was down.
        two_hours_ago = (datetime.now(UTC) - timedelta(hours=2)).replace(second=0, microsecond=0)
        local = two_hours_ago.astimezone(ZoneInfo("Europe/Paris"))
        await call(gateway, "cron_create",
                   {"schedule": f"{local.minute} {local.hour} * * *", "prompt": "daily"}, ctx())
        [daily] = [j for j in await gateway.scheduler.jobs() if j.text == "daily"]
        await gateway.scheduler.join()
        cron_requests = len(fake_llm.requests)
        await make_due(gateway, daily.id, two_hours_ago)
        await asyncio.sleep(0.3)
        assert len(fake_llm.requests) == cron_requests, "missed by more than the grace: skipped"
        [after] = [j for j in await gateway.scheduler.jobs() if j.text == "daily"]
        assert after.next_run is not None
        assert timedelta(hours=23) <= after.next_run - two_hours_ago <= timedelta(hours=25)
    finally:
        await gateway.stop(grace=2)


async def test_only_the_leader_fires_jobs(
    make_config: MakeConfig, fake_llm: FakeOpenAI, tg: FakeTelegram
) -> None:
    config = telegram_config(make_config, fake_llm, tg)
    elected = asyncio.Event()
    gateway = Gateway(config)
    gateway.add_channel(TelegramChannel(config.channels.telegram))
    gateway.scheduler.leader = elected.wait
    await gateway.start()
    try:
        assert not gateway.scheduler.leading
        await call(gateway, "reminder_create", {"text": "soon", "delay": 0.05}, ctx())
        await asyncio.sleep(0.3)
        assert tg.calls_to("sendMessage") == [], "a follower stores jobs but never fires them"
        elected.set()
        [sent] = await tg.wait_for_call("sendMessage", where=to_chat(USER))
        assert sent["text"] == "⏰ Reminder: soon"
        assert gateway.scheduler.leading
        await gateway.scheduler.step_down()
        assert not gateway.scheduler.leading
    finally:
        await gateway.stop(grace=2)


async def test_chat_process_stores_jobs_without_firing_them(make_config: MakeConfig) -> None:
    config = make_config()
    gateway = Gateway(config)
    gateway.scheduler.fires_jobs = False
    await gateway.start()
    try:
        text = await call(gateway, "reminder_create", {"text": "later", "delay": 0.01},
                          ToolContext("agent:main:console:direct:me", "UTC", "console", "me"))
        assert text.startswith("Reminder ")
        await asyncio.sleep(0.2)
        [stored] = await gateway.scheduler.jobs()
        assert stored.text == "later" and gateway.scheduler.maintenance() == []
    finally:
        await gateway.stop()


# -- units --------------------------------------------------------------------------------------


def test_sync_url_maps_every_accepted_spelling() -> None:
    assert sync_url("sqlite+aiosqlite:////tmp/x/g.db") == "sqlite:////tmp/x/g.db"
    assert sync_url("sqlite:////tmp/x/g.db") == "sqlite:////tmp/x/g.db"
    pg = sync_url("postgresql+asyncpg://u:secret@db:5432/gh")
    assert pg == "postgresql+psycopg://u:secret@db:5432/gh"
    assert sync_url("postgresql://u@db/gh") == "postgresql+psycopg://u@db/gh"
    with pytest.raises(ValueError, match="unsupported database URL scheme"):
        sync_url("mysql+aiomysql://db/x")


def test_crontab_trigger_keeps_crontab_weekdays_and_day_or_semantics() -> None:
    from gateway.jobs.scheduler import CrontabTrigger

    paris = ZoneInfo("Europe/Paris")
    saturday = datetime(2026, 3, 28, 12, 0, tzinfo=paris)
    sunday_only = CrontabTrigger("0 9 * * 0", "Europe/Paris")
    fire = sunday_only.get_next_fire_time(None, saturday)
    assert fire is not None and fire.isoweekday() == 7, "0 is Sunday, as in crontab"
    assert fire.utcoffset() == timedelta(hours=2), "DST started that night"
    either = CrontabTrigger("0 9 1 * 1", "Europe/Paris")  # the 1st OR a Monday
    fire = either.get_next_fire_time(None, saturday)
    assert fire is not None and (fire.day, fire.isoweekday()) == (30, 1)
    never = CrontabTrigger("0 0 31 2 *", "UTC")
    assert never.get_next_fire_time(None, saturday) is None
    import pickle

    copy = pickle.loads(pickle.dumps(sunday_only))
    assert copy.get_next_fire_time(None, saturday) == sunday_only.get_next_fire_time(None, saturday)


def test_delays_read_like_people_write_them() -> None:
    from gateway.tools.schedule import ScheduleError, humanize, parse_delay

    assert parse_delay("in 20 minutes") == timedelta(minutes=20)
    assert parse_delay("1h30m") == timedelta(hours=1, minutes=30)
    assert parse_delay(90) == timedelta(seconds=90)
    assert parse_delay("45") == timedelta(seconds=45)
    for bad in ("soon", "-5", 0):
        with pytest.raises(ScheduleError):
            parse_delay(bad)
    assert humanize(timedelta(hours=26, minutes=3)) == "1 d 2 h"
    assert humanize(timedelta(seconds=0.4)) == "0 s"


async def test_job_store_opens_without_a_gateway(make_config: MakeConfig) -> None:
    config = make_config()
    async with open_job_store(config) as scheduler:
        assert await scheduler.jobs() == []
        assert not scheduler.leading
    unstarted = Scheduler(config)
    with pytest.raises(RuntimeError, match="not started"):
        await unstarted.jobs()


def job_ids(jobs: list[JobInfo]) -> set[str]:
    return {j.id for j in jobs}
