"""The outbox: a finished turn's reply survives a crash until a channel has sent it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from channels.base import ChannelCapabilities, OutboundMessage
from channels.console import ConsoleChannel
from context.types import Message
from gateway.app import Gateway
from gateway.store import SessionInfo, Store, TurnUsage
from gateway.turn.outbox import LOG_GLOB, SENT, Delivery, DeliveryLog, failure_text, logged_sent
from tests.conftest import MakeConfig
from tests.fakes import FakeOpenAI
from tests.helpers.outbox import reply_to


async def finished_turn(store: Store, text: str) -> int:
    session = await store.ensure_session(SessionInfo(key="k"))
    assert session.id is not None
    outbox_id = await store.finish_turn(
        session.id, Message(role="assistant", content=text), [], TurnUsage(),
        outbound=reply_to(text),
    )
    assert outbox_id is not None
    return outbox_id


async def test_reply_is_in_the_outbox_with_the_turn_until_logged_as_sent(tmp_path: Path) -> None:
    store = Store(f"sqlite+aiosqlite:///{tmp_path / 'g.db'}")
    await store.init()
    first = await finished_turn(store, "answer one")
    second = await finished_turn(store, "answer two")
    assert [(i, m) for i, m in await store.undelivered()] == [
        (first, reply_to("answer one")), (second, reply_to("answer two")),
    ]
    delivery = DeliveryLog(tmp_path, store)
    assert [i for i, _m in await delivery.recover()] == [first, second]
    delivery.sent(first)  # ... and the process dies: no close(), rows still in the table
    assert logged_sent(tmp_path) == [first]

    restarted = DeliveryLog(tmp_path, store)
    assert [m.text for _i, m in await restarted.recover()] == ["answer two"]
    assert [i for i, _m in await store.undelivered()] == [second]
    assert logged_sent(tmp_path) == []  # the old log was applied, then removed
    restarted.sent(second)
    await restarted.close()
    assert await store.undelivered() == []
    assert await asyncio.to_thread(lambda: list(tmp_path.glob(LOG_GLOB))) == []
    await store.close()


async def test_sent_replies_are_cleared_in_batches(tmp_path: Path) -> None:
    store = Store(f"sqlite+aiosqlite:///{tmp_path / 'g.db'}")
    await store.init()
    delivery = DeliveryLog(tmp_path, store, batch=3)
    await delivery.recover()
    ids = [await finished_turn(store, f"answer {n}") for n in range(4)]
    for outbox_id in ids[:3]:
        delivery.sent(outbox_id)
    assert delivery._flushing is not None  # the third one started a batch delete
    await delivery._flushing
    assert [i for i, _m in await store.undelivered()] == [ids[3]]
    assert logged_sent(tmp_path) == []
    delivery.sent(ids[3])
    assert logged_sent(tmp_path) == [ids[3]]
    await delivery.close()
    assert await store.undelivered() == []
    await store.close()


async def test_a_reply_for_a_channel_this_run_lacks_waits_for_one_that_has_it(
    make_config: MakeConfig, fake_llm: FakeOpenAI
) -> None:
    config = make_config(fake_llm)
    store = Store(config.database_url)
    await store.init()
    await finished_turn(store, "for telegram")  # stored by a `gatehouse run` that then died
    await store.close()
    chat_only = Gateway(config)  # what `gatehouse chat` starts: the console channel only
    chat_only.add_channel(ConsoleChannel(user_id="me"))
    await chat_only.start()
    await chat_only.stop()
    store = Store(config.database_url)
    try:
        assert [m.text for _i, m in await store.undelivered()] == ["for telegram"]
    finally:
        await store.close()


async def test_failed_tries_are_counted_until_the_reply_is_given_up(database_url: str) -> None:
    store = Store(database_url)
    await store.init()
    try:
        first = await finished_turn(store, "refused")
        second = await finished_turn(store, "also refused")
        row = await store.outbox_failed(first, 2, "HTTPError: 502", max_attempts=2)
        assert row is not None and row.attempts == 1 and row.given_up_at is None
        [(_id, resumed), _other] = await store.undelivered()
        assert resumed.sent_parts == 2  # the next try starts at the third chunk
        row = await store.outbox_failed(first, 1, "Forbidden", max_attempts=2)
        assert row is not None and row.given_up_at is not None
        assert row.sent_parts == 2 and row.last_error == "Forbidden"
        assert [i for i, _m in await store.undelivered()] == [second]
        assert [i for i, _m in await store.claim_stale_outbox(-60)] == [second]
        assert await store.undelivered(retried=True) == []
        assert await store.retry_outbox([first]) == 1
        assert [i for i, _m in await store.undelivered()] == [first, second]
        # Retried: an error on record and no failed try since (a fresh reply has no error).
        assert [i for i, _m in await store.undelivered(retried=True)] == [first]
        assert await store.forget_outbox([first, second, 12345]) == 2
        assert await store.outbox() == []
        assert await store.outbox_failed(first, 0, "gone", max_attempts=2) is None
    finally:
        await store.close()


def test_a_failure_is_one_line_naming_its_type_once() -> None:
    from telegram.error import Forbidden

    assert failure_text(Forbidden("Forbidden: bot was blocked by the user")) == (
        "Forbidden: bot was blocked by the user"
    )
    assert failure_text(ConnectionResetError("peer\nreset")) == "ConnectionResetError: peer"
    assert failure_text(TimeoutError()) == "TimeoutError"


async def test_a_running_gateway_finds_retried_replies_it_is_not_sending_already(
    tmp_path: Path,
) -> None:
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    await store.init()
    release = asyncio.Event()
    tried: list[int] = []

    async def slow_send(message: OutboundMessage) -> Delivery:
        tried.append(1)
        await release.wait()
        return SENT

    delivery = DeliveryLog(tmp_path, store, resend=slow_send)
    try:
        await delivery.recover()
        ids = [await finished_turn(store, f"reply {n}") for n in range(3)]
        for outbox_id in ids:
            await store.outbox_failed(outbox_id, 0, "Forbidden", max_attempts=1)
        assert await delivery.retried() == []  # given up, and nobody retried them yet
        assert await store.retry_outbox() == 3
        assert [i for i, _m in await delivery.retried()] == ids

        sending = asyncio.create_task(delivery.send(ids[0], reply_to("reply 0")))
        await asyncio.sleep(0.05)
        assert tried and [i for i, _m in await delivery.retried()] == ids[1:]  # in flight
        release.set()
        await sending
        assert [i for i, _m in await delivery.retried()] == ids[1:]  # sent, row not yet deleted
        await delivery.close()
        assert [i for i, _m in await store.undelivered(retried=True)] == ids[1:]
    finally:
        await store.close()


class _Refusing:
    """A channel whose sends fail with `error`; `send_errors` as a platform adapter names them."""

    name = "telegram"
    capabilities = ChannelCapabilities()
    send_errors = (PermissionError,)

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def start(self, on_message: Any) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def send(self, message: OutboundMessage) -> None:
        raise self.error


@pytest.mark.parametrize(
    ("error", "traceback"),
    [
        (PermissionError("Forbidden: bot was blocked by the user"), False),  # the platform's
        (ConnectionRefusedError("connect failed"), False),  # the network's, on any platform
        (KeyError("chat"), True),  # a bug: its traceback is what someone needs to fix it
    ],
)
async def test_a_refused_send_is_logged_as_one_line_and_a_bug_with_its_traceback(
    make_config: MakeConfig, fake_llm: FakeOpenAI, caplog: pytest.LogCaptureFixture,
    error: Exception, traceback: bool,
) -> None:
    gateway = Gateway(make_config(fake_llm))
    gateway.add_channel(_Refusing(error))
    result = await gateway.deliver(reply_to("hello"))
    assert not result.sent and result.error == failure_text(error)
    [record] = [r for r in caplog.records if r.getMessage().startswith("delivery failed")]
    assert record.getMessage().endswith(failure_text(error))
    assert (record.exc_info is not None) is traceback


class _SharedStore:
    """A store on PostgreSQL as DeliveryLog sees it: its DELETEs held until released."""

    is_sqlite = False

    def __init__(self, fail_first: bool = False) -> None:
        self.deletes: list[list[int]] = []
        self.release = asyncio.Event()
        self.fail_first = fail_first

    async def forget_outbox(self, ids: list[int]) -> int:
        self.deletes.append(list(ids))
        await self.release.wait()
        if self.fail_first and len(self.deletes) == 1:
            raise ConnectionError("the server went away")
        return len(ids)


async def test_shared_sent_replies_are_forgotten_together_while_a_delete_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = _SharedStore(fail_first=True)
    delivery = DeliveryLog(tmp_path, store)  # type: ignore[arg-type]
    delivery.sent(1)
    await asyncio.sleep(0)  # the first DELETE starts at once: nothing waits when quiet
    assert store.deletes == [[1]]
    for outbox_id in (2, 3, 4):  # sent while it runs
        delivery.sent(outbox_id)
    assert store.deletes == [[1]], "one DELETE at a time"
    store.release.set()
    await delivery.close()
    assert store.deletes == [[1], [2, 3, 4]], "those sent meanwhile go in one statement"
    assert "could not forget 1 sent replies' outbox rows" in caplog.text  # left for the sweep
