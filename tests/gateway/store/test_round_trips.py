"""Round trips to PostgreSQL per message: a fixed upper bound, so a regression is caught.

A message's cost on PostgreSQL is mostly its round trips: each one a statement the server
runs, and a wake-up of the event loop and of the server's backend (see docs/scaling.md). The
gateway talks to PostgreSQL through a proxy here that counts, per connection, each time the
client speaks again after the server answered: one round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from gateway.app import Gateway
from tests.conftest import MakeConfig, RunningGateway, on_postgres
from tests.fakes.openai_server import FakeOpenAI

MESSAGES = 20
ROUND_TRIPS_PER_MESSAGE = 9.5
"""Measured 8.7 over these 20 messages, 8.35 over 40 (the first use of a statement on a connection
prepares it: a round trip more); 25.6 before issue 24 (BEGIN and COMMIT each a round trip of
their own, every statement one, a pool pre-ping). By design 8, a statement each: accept 1,
session lock 1, claim 3 (the session with its unanswered messages, placing them, the summary
with the history after it), the turn's end 1, the sent reply forgotten 1 (one DELETE for the
replies sent while another runs), unlock 1."""


class RoundTrips:
    """A TCP proxy in front of PostgreSQL that counts round trips."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.count = 0

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, turn: list[bool],
        client: bool,
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                if client and turn[0]:  # the client speaks after the server answered
                    self.count += 1
                turn[0] = not client
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        turn = [True]
        await asyncio.gather(
            self._pipe(reader, up_writer, turn, True), self._pipe(up_reader, writer, turn, False)
        )

    @contextlib.contextmanager
    def running(self) -> Iterator[int]:
        """On an event loop of its own, in a thread: the gateway blocks its loop at times on
        a database connection (the scheduler's job store), which must still get through."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        started = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), loop
        )
        server = started.result(10)
        try:
            yield int(server.sockets[0].getsockname()[1])
        finally:
            loop.call_soon_threadsafe(server.close)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)


@pytest.mark.skipif(not on_postgres(), reason="round trips to PostgreSQL")
async def test_a_message_costs_a_bounded_number_of_round_trips(
    fake_llm: FakeOpenAI, make_config: MakeConfig, database_url: str, tmp_path: Path
) -> None:
    url = make_url(database_url)
    proxy = RoundTrips(url.host or "127.0.0.1", url.port or 5432)
    with proxy.running() as port:
        proxied = url.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
        config = make_config(fake_llm, gateway={"database_url": proxied})
        gateway = Gateway(config)
        running = RunningGateway(gateway)
        await gateway.start()
        try:
            assert await running.ask("warm up") == ["echo: warm up"]  # session, connections
            await asyncio.sleep(0.2)
            before = proxy.count
            for n in range(MESSAGES):
                assert await running.ask(f"message {n}") == [f"echo: message {n}"]
            await asyncio.sleep(0.2)  # the last reply's outbox row is forgotten after sending
            per_message = (proxy.count - before) / MESSAGES
        finally:
            await gateway.stop()
    assert per_message <= ROUND_TRIPS_PER_MESSAGE, f"{per_message:.2f} round trips a message"
