"""Pairing requests in the store: one pending code per sender, a cap per platform that holds
when requests arrive at once, stale codes replaced."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta

from gateway.store import PairingRow, Store
from gateway.store.pairings import PairingRequest

HOUR = timedelta(hours=1)
_codes = (f"CODE{n:04d}" for n in itertools.count(1))


async def ask(store: Store, sender: str, *, cap: int = 50, platform: str = "telegram") -> PairingRequest:
    return await store.request_pairing(
        platform, sender, f"user{sender}", code=next(_codes), ttl=HOUR, max_pending=cap
    )


async def open_store(url: str) -> Store:
    store = Store(url)
    await store.init()
    return store


async def test_a_sender_holds_one_pending_code(database_url: str) -> None:
    store = await open_store(database_url)
    try:
        first = await ask(store, "1")
        again = await ask(store, "1")
        assert first.issued and not again.issued
        assert first.row is not None and again.row is not None
        assert again.row.code == first.row.code
        assert [r.sender_id for r in await store.pending_pairings("telegram")] == ["1"]
    finally:
        await store.close()


async def test_the_platform_cap_counts_senders_and_platforms_apart(database_url: str) -> None:
    store = await open_store(database_url)
    try:
        assert (await ask(store, "1", cap=2)).issued
        assert (await ask(store, "2", cap=2)).issued
        full = await ask(store, "3", cap=2)
        assert full.row is None and not full.issued
        assert (await ask(store, "1", cap=2)).row is not None, "a holder still gets theirs"
        assert (await ask(store, "3", cap=2, platform="discord")).issued
        assert len(await store.pending_pairings("telegram")) == 2
    finally:
        await store.close()


async def test_requests_at_once_neither_double_a_code_nor_pass_the_cap(database_url: str) -> None:
    store = await open_store(database_url)
    try:
        same = await asyncio.gather(*(ask(store, "7") for _ in range(10)))
        assert sum(r.issued for r in same) == 1
        assert len({r.row.code for r in same if r.row is not None}) == 1
        many = await asyncio.gather(*(ask(store, str(n), cap=5) for n in range(100, 120)))
        assert sum(r.issued for r in many) == 4  # 7 holds one of the 5
        assert len(await store.pending_pairings("telegram")) == 5
    finally:
        await store.close()


async def test_a_stale_code_is_expired_when_its_sender_asks_again(database_url: str) -> None:
    store = await open_store(database_url)
    try:
        stale = await store.add_pairing(PairingRow(
            platform="telegram", sender_id="1", code="STALE234",
            expires_at=datetime.now(UTC) - timedelta(seconds=1),
        ))
        fresh = await ask(store, "1", cap=1)
        assert fresh.issued and fresh.row is not None and fresh.row.code != stale.code
        assert fresh.row.expires_at.replace(tzinfo=UTC) > datetime.now(UTC) + HOUR - timedelta(minutes=1)
        rows = {r.code: r.status for r in await store.list_pairings()}
        assert rows == {"STALE234": "expired", fresh.row.code: "pending"}
        assert await store.decide_pairing("STALE234", "approved") is None
    finally:
        await store.close()
