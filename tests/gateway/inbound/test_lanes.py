from __future__ import annotations

import asyncio

import pytest

from gateway.inbound.lanes import LanesClosedError, SessionLanes


async def test_one_turn_at_a_time_per_session_and_mid_turn_collection() -> None:
    running: dict[str, int] = {}
    turns: list[str] = []
    release = asyncio.Event()

    async def turn(key: str) -> None:
        running[key] = running.get(key, 0) + 1
        assert running[key] == 1, "two turns at once in one session"
        turns.append(key)
        if len(turns) == 1:
            await release.wait()
        running[key] -= 1

    lanes = SessionLanes(turn, max_concurrent=4)
    lanes.notify("a")
    await asyncio.sleep(0)
    for _ in range(5):  # arrive mid-turn: collected into exactly one follow-up turn
        lanes.notify("a")
    release.set()
    await lanes.join()
    assert turns == ["a", "a"]


async def test_global_cap_limits_concurrency() -> None:
    active = 0
    peak = 0
    gate = asyncio.Event()

    async def turn(_key: str) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await gate.wait()
        active -= 1

    lanes = SessionLanes(turn, max_concurrent=3)
    for i in range(10):
        lanes.notify(f"s{i}")
    for _ in range(5):
        await asyncio.sleep(0)
    assert peak == 3
    gate.set()
    await lanes.join()
    assert peak == 3


async def test_failing_turn_does_not_kill_the_lane() -> None:
    calls = 0

    async def turn(_key: str) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("bug")

    lanes = SessionLanes(turn)
    lanes.notify("a")
    await lanes.join()
    lanes.notify("a")
    await lanes.join()
    assert calls == 2


async def test_close_waits_then_cancels_and_refuses_new_work() -> None:
    cancelled = asyncio.Event()

    async def turn(_key: str) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    lanes = SessionLanes(turn)
    lanes.notify("a")
    await asyncio.sleep(0)
    await lanes.close(grace=0.05)
    assert cancelled.is_set()
    with pytest.raises(LanesClosedError):
        lanes.notify("b")


async def test_hold_waits_for_the_running_turn_and_keeps_new_turns_out() -> None:
    events: list[str] = []
    release = asyncio.Event()

    async def turn(key: str) -> None:
        events.append(f"turn {key} start")
        await release.wait()
        events.append(f"turn {key} end")

    lanes = SessionLanes(turn, max_concurrent=4)
    lanes.notify("a")
    await asyncio.sleep(0)

    async def maintenance() -> None:
        async with lanes.hold("a"):
            events.append("held")
            lanes.notify("a")  # a message arriving meanwhile waits for the hold
            await asyncio.sleep(0.01)
            events.append("released")

    holder = asyncio.create_task(maintenance())
    async with lanes.hold("b"):  # other sessions are not affected
        pass
    await asyncio.sleep(0.01)
    assert events == ["turn a start"]
    release.set()
    await holder
    await lanes.join()
    assert events == [
        "turn a start", "turn a end", "held", "released", "turn a start", "turn a end",
    ]


async def test_run_now_waits_for_its_own_turn_and_respects_the_lane() -> None:
    order: list[str] = []

    async def turn(key: str) -> None:
        order.append(key)
        await asyncio.sleep(0.01)

    lanes = SessionLanes(turn, max_concurrent=1)
    async with lanes.hold("cron:1"):
        task = asyncio.create_task(lanes.run_now("cron:1"))
        await asyncio.sleep(0.02)
        assert order == [], "run_now waits for the lane"
    await task
    assert order == ["cron:1"]
    await lanes.close()
    with pytest.raises(LanesClosedError):
        await lanes.run_now("cron:1")


async def test_a_turn_that_left_messages_waiting_runs_again() -> None:
    """Queue mode `followup`: a turn answers one message and says more wait."""
    waiting = {"a": 3}
    turns: list[str] = []

    async def turn(key: str) -> bool:
        turns.append(key)
        waiting[key] -= 1
        return waiting[key] > 0

    lanes = SessionLanes(turn)
    lanes.notify("a")
    await lanes.join()
    assert turns == ["a", "a", "a"]


async def test_run_now_leaves_what_is_left_to_the_lane() -> None:
    turns: list[str] = []

    async def turn(key: str) -> bool:
        turns.append(key)
        return len(turns) == 1

    lanes = SessionLanes(turn)
    await lanes.run_now("a")
    assert turns == ["a"]
    await lanes.join()
    assert turns == ["a", "a"]
