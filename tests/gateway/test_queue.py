from __future__ import annotations

import asyncio

import pytest

from gateway.queue import LanesClosedError, SessionLanes


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


async def test_exclusive_waits_for_the_running_turn_and_holds_new_ones_back() -> None:
    events: list[str] = []
    release = asyncio.Event()

    async def turn(key: str) -> None:
        events.append(f"turn {key} start")
        if not release.is_set():
            await release.wait()
        events.append(f"turn {key} end")

    lanes = SessionLanes(turn)
    lanes.notify("a")
    await asyncio.sleep(0)

    async def operator() -> None:
        async with lanes.exclusive("a"):
            events.append("operator")
            lanes.notify("a")  # a message arrives while the operator holds the lane
            await asyncio.sleep(0.01)
            events.append("operator done")

    held = asyncio.create_task(operator())
    await asyncio.sleep(0.01)
    assert events == ["turn a start"], "the operator waits for the running turn"
    release.set()
    await held
    await lanes.join()
    assert events == [
        "turn a start", "turn a end", "operator", "operator done",
        "turn a start", "turn a end",
    ], "the message that arrived meanwhile is answered right after"
