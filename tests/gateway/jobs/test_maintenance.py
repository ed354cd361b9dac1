"""Maintenance jobs in a running gateway (real SQLite store, fake OpenAI server over a socket),
each triggered directly through the scheduler rather than waited for."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import update

from gateway.app import Gateway
from gateway.jobs.maintenance import (
    DAILY_RESET,
    IDLE_COMPACTION,
    INBOX_RETENTION,
    MEMORY_REFRESH,
    PAIRING_EXPIRY,
    Maintenance,
    maintenance_schedule,
)
from gateway.operations import show_session, uncompact_session
from gateway.store import PairingRow, SessionRow
from gateway.tools.memory import FLUSH_PROMPT
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import FakeOpenAI
from tests.helpers.llm_scripts import FILLER, is_summary_request, summarizer_and_echo

ALICE = "agent:main:webchat:direct:alice"
BOB = "agent:main:webchat:direct:bob"


async def start(make_config: MakeConfig, fake: FakeOpenAI, **scheduler: Any) -> RunningGateway:
    config = make_config(
        fake,
        models={"fake-model": {"context_window": 16_000}},
        context={"recent_turns": 1},
        scheduler=scheduler,
    )
    rg = RunningGateway(Gateway(config))
    await rg.gateway.start()
    return rg


async def make_idle(gateway: Gateway, minutes: int) -> None:
    past = datetime.now(UTC) - timedelta(minutes=minutes)

    def backdate() -> None:
        with gateway.store.engine.begin() as conn:
            conn.execute(update(SessionRow).values(updated_at=past))

    await asyncio.to_thread(backdate)


def flush_requests(fake: FakeOpenAI) -> list[dict[str, Any]]:
    return [b for b in fake.requests if b["messages"][-1]["content"] == FLUSH_PROMPT]


async def test_maintenance_jobs_follow_the_config(make_config: MakeConfig) -> None:
    config = make_config(scheduler={"daily_reset": "4:30"}, gateway={"timezone": "Asia/Tokyo"})
    jobs = {j.id: j for j in maintenance_schedule(config)}
    assert set(jobs) == {
        IDLE_COMPACTION, DAILY_RESET, MEMORY_REFRESH, PAIRING_EXPIRY, INBOX_RETENTION
    }
    fire = jobs[DAILY_RESET].trigger.get_next_fire_time(None, datetime.now(UTC))
    assert fire is not None and (fire.hour, fire.minute) == (4, 30)
    assert fire.utcoffset() == timedelta(hours=9)
    off = make_config(scheduler={"idle_compaction_minutes": 0, "memory_refresh_minutes": 0,
                                 "pairing_expiry_minutes": 0}, attachments={"retention_days": 0})
    assert maintenance_schedule(off) == []


async def test_idle_sessions_worth_it_are_compacted_once(make_config: MakeConfig) -> None:
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        rg = await start(make_config, fake, idle_compaction_minutes=30,
                         idle_compaction_min_share=0.3)
        gateway = rg.gateway
        try:
            registered = {j.id for j in gateway.scheduler.maintenance()}
            assert IDLE_COMPACTION in registered and DAILY_RESET not in registered
            await rg.ask("Ticket ORD-77 is about host build-3.internal. " + FILLER, "alice")
            await rg.ask("next part " + FILLER, "alice")
            await rg.ask("last part", "alice")
            await rg.ask("hi", "bob")
            assert not any(is_summary_request(b) for b in fake.requests), "below the threshold"

            assert await gateway.scheduler.run_maintenance_now(IDLE_COMPACTION) == [], (
                "nobody is idle yet"
            )
            await make_idle(gateway, 45)
            compacted = await gateway.scheduler.run_maintenance_now(IDLE_COMPACTION)
            assert compacted == [ALICE], "bob's tiny session is not worth a compaction"
            assert len(flush_requests(fake)) == 1, "the memory flush ran before compacting"
            shown = await show_session(gateway.config, ALICE)
            assert shown is not None and shown.summary
            assert shown.compactions[0].quality["reason"] == "idle"

            requests = len(fake.requests)
            await make_idle(gateway, 45)
            assert await gateway.scheduler.run_maintenance_now(IDLE_COMPACTION) == []
            assert len(fake.requests) == requests, "nothing new: no second compaction"

            await rg.ask("what was the ticket?", "alice")
            sent = fake.requests[-1]["messages"]
            assert any("ORD-77" in (m["content"] or "") for m in sent if m["role"] == "system")
        finally:
            await gateway.stop()


async def test_idle_compaction_waits_for_a_running_turn(make_config: MakeConfig) -> None:
    release = asyncio.Event()
    waiting = asyncio.Event()

    async def slow_echo(body: dict[str, Any]) -> Any:
        if not is_summary_request(body) and body["messages"][-1]["content"] == "slow one":
            waiting.set()
            await release.wait()
        return summarizer_and_echo(body)

    async with FakeOpenAI(default=slow_echo) as fake:
        rg = await start(make_config, fake, idle_compaction_minutes=30,
                         idle_compaction_min_share=0.01)
        gateway = rg.gateway
        try:
            for i in range(3):
                await rg.ask(f"part {i} " + FILLER, "alice")
            asking = asyncio.create_task(rg.ask("slow one", "alice"))
            # The turn's model call is in flight (after any flush and compaction it ran first).
            await asyncio.wait_for(waiting.wait(), 30)
            summaries = sum(1 for b in fake.requests if is_summary_request(b))
            await make_idle(gateway, 45)  # looks idle, but a turn is in flight
            sweep = asyncio.create_task(gateway.scheduler.run_maintenance_now(IDLE_COMPACTION))
            await asyncio.sleep(0.2)
            assert not sweep.done(), "the sweep waits for the session's lane"
            release.set()
            assert await asking == ["echo: slow one"]
            assert await sweep == [], "the turn made the session active again: left alone"
            assert sum(1 for b in fake.requests if is_summary_request(b)) == summaries
        finally:
            await gateway.stop()


async def test_daily_reset_starts_fresh_without_losing_anything(make_config: MakeConfig) -> None:
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        rg = await start(make_config, fake, daily_reset="04:00")
        gateway = rg.gateway
        try:
            await rg.ask("my locker code is 4471-KX", "alice")
            await rg.ask("and I park on level 3", "alice")
            assert await gateway.scheduler.run_maintenance_now(DAILY_RESET) == [ALICE]
            assert len(flush_requests(fake)) == 1, "durable facts get a chance to be saved"
            assert await gateway.scheduler.run_maintenance_now(DAILY_RESET) == [], (
                "nothing said since the reset"
            )

            await rg.ask("good morning", "alice")
            sent = fake.requests[-1]["messages"]
            assert not any("4471-KX" in (m["content"] or "") for m in sent), "fresh context"
            assert [m["content"] for m in sent if m["role"] == "user"] == ["good morning"]

            shown = await show_session(gateway.config, ALICE, show_all=True)
            assert shown is not None
            assert shown.messages[0].message.content == "my locker code is 4471-KX", "kept"
            hits = gateway.memory_index.search("4471-KX", corpus="transcripts")
            assert hits, "the reset text stays searchable for the agent"
        finally:
            await gateway.stop()
        undone = await uncompact_session(gateway.config, ALICE)
        assert undone.undone is not None, "a reset can be undone like a compaction"
        shown = await show_session(gateway.config, ALICE)
        assert shown is not None and shown.summary is None
        assert shown.messages[0].message.content == "my locker code is 4471-KX"


async def test_memory_index_refresh_picks_up_hand_edits(
    running: RunningGateway,
) -> None:
    gateway = running.gateway
    note = gateway.config.workspace / "memory" / "2026-01-05.md"
    note.write_text("# 2026-01-05\n- The zeppelin hangar code is ZX-9981.\n", encoding="utf-8")
    assert gateway.memory_index.search("zeppelin") == []
    stats = await gateway.scheduler.run_maintenance_now(MEMORY_REFRESH)
    assert stats.files_scanned >= 1
    [hit] = gateway.memory_index.search("zeppelin")
    assert "2026-01-05.md" in hit.location


async def test_expired_pairing_codes_are_marked_expired(running: RunningGateway) -> None:
    store = running.gateway.store
    now = datetime.now(UTC)
    old = await store.add_pairing(PairingRow(platform="telegram", sender_id="1", code="OLDCODE1",
                                             expires_at=now - timedelta(minutes=1)))
    fresh = await store.add_pairing(PairingRow(platform="telegram", sender_id="2",
                                               code="NEWCODE2",
                                               expires_at=now + timedelta(minutes=30)))
    expired = await running.gateway.scheduler.run_maintenance_now(PAIRING_EXPIRY)
    assert [r.code for r in expired] == ["OLDCODE1"]
    by_code = {r.code: r.status for r in await store.list_pairings()}
    assert by_code == {"OLDCODE1": "expired", "NEWCODE2": "pending"}
    assert await store.decide_pairing(old.code, "approved") is None
    assert await store.decide_pairing(fresh.code, "approved") is not None
    assert await running.gateway.scheduler.run_maintenance_now(PAIRING_EXPIRY) == []


async def test_inbox_files_past_their_retention_are_deleted(make_config: MakeConfig) -> None:
    """`[attachments] retention_days`: the hourly job deletes older files, keeps newer ones,
    and removes the folders it empties."""
    import os

    config = make_config(attachments={"retention_days": 7})
    old = config.workspace / "inbox" / "telegram-direct-7-abc" / "2026-11-01" / "old.jpg"
    new = config.workspace / "inbox" / "telegram-direct-7-abc" / "2026-12-07" / "new.jpg"
    for path in (old, new):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 100)
    stale = (datetime.now(UTC) - timedelta(days=8)).timestamp()
    os.utime(old, (stale, stale))
    maintenance = Maintenance(Gateway(config))
    assert await maintenance.prune_inbox() == (1, 100)
    assert not old.exists() and not old.parent.exists() and new.exists()
