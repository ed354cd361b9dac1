"""PostgreSQL, several processes: messages a stopped process accepted are answered by another."""

from __future__ import annotations

import asyncio

from channels.base import InboundMessage
from gateway.app import Gateway
from gateway.store import SessionInfo, Store
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import FakeOpenAI
from tests.postgres import ThrowawayPostgres


async def test_unanswered_messages_of_a_dead_process_are_picked_up(
    postgres: ThrowawayPostgres, fake_llm: FakeOpenAI, make_config: MakeConfig
) -> None:
    url = postgres.new_database()
    config = make_config(fake_llm, gateway={"database_url": url, "pending_sweep_seconds": 0.2})
    survivor = Gateway(config)
    RunningGateway(survivor)  # adds the webchat channel the reply goes out on
    await survivor.start()
    try:
        # Another process persisted this message, then died before its turn ran.
        dead = Store(url)
        await dead.init()
        info = SessionInfo(key="webchat:direct:late", platform="webchat", chat_type="direct",
                           chat_id="late")
        message = InboundMessage(platform="webchat", chat_type="direct", chat_id="late",
                                 sender_id="late", text="anyone there?", platform_message_id="m1")
        session_id, row = await dead.accept_inbound(info, message)
        assert row is not None
        await dead.close()
        for _ in range(100):
            history = await survivor.store.history(session_id)
            if any(m.role == "assistant" for m in history):
                break
            await asyncio.sleep(0.05)
        assert [(m.role, m.text) for m in history] == [
            ("user", "anyone there?"),
            ("assistant", "echo: anyone there?"),
        ]
    finally:
        await survivor.stop()
