"""Shared fixtures: a fake OpenAI server on 127.0.0.1, configs in tmp dirs, a running gateway."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Rich reads COLUMNS when a console is made (the CLI's are made at import): one width for every
# test, in-process or subprocess, whatever imports the CLI first and however tests are spread.
os.environ["COLUMNS"] = "200"

from channels.console import ConsoleChannel
from channels.webchat import WebchatChannel
from gateway.app import Gateway
from gateway.config import Config, parse_config
from tests.fakes import FakeOpenAI
from tests.postgres import ThrowawayPostgres

MakeConfig = Callable[..., Config]


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as fake:
        yield fake


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


@pytest.fixture(scope="session")
def postgres() -> Iterator[ThrowawayPostgres]:
    """One PostgreSQL server for the run (started on first use)."""
    server = ThrowawayPostgres().start()
    try:
        yield server
    finally:
        server.stop()


def on_postgres() -> bool:
    """`GATEHOUSE_TEST_DB=postgres` runs the store-backed tests on PostgreSQL instead of SQLite."""
    return os.environ.get("GATEHOUSE_TEST_DB", "sqlite") == "postgres"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On PostgreSQL, run every test that uses the gateway's database (and only those)."""
    if not on_postgres():
        return
    keep = [i for i in items if "database_url" in getattr(i, "fixturenames", ())]
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep


@pytest.fixture
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The database a test's gateway uses: a SQLite file, or an empty PostgreSQL database."""
    if on_postgres():
        server: ThrowawayPostgres = request.getfixturevalue("postgres")
        return server.new_database()
    return f"sqlite:///{tmp_path / 'data' / 'gatehouse.db'}"


@pytest.fixture
def make_config(tmp_path: Path, database_url: str) -> MakeConfig:
    def make(fake: FakeOpenAI | None = None, **sections: Any) -> Config:
        data: dict[str, Any] = {
            "gateway": {"data_dir": str(tmp_path / "data"), "database_url": database_url},
            "web": {"port": 0},
            "llm": {"max_retries": 1, "timeout": 5, "stream": False},
            # Loading the embedding model costs each gateway seconds of CPU: tests that check
            # search by meaning turn it on (memory={"embeddings": True}).
            "memory": {"embeddings": False},
        }
        if fake is not None:
            data["llm"].update(
                {"base_url": fake.base_url, "api_key": "test", "model": "fake-model"}
            )
        return parse_config(_merge(data, sections), "test")

    return make


class RunningGateway:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.console = ConsoleChannel(user_id="tester", reply_timeout=10)
        self.webchat = WebchatChannel(reply_timeout=10)
        gateway.add_channel(self.console)
        gateway.add_channel(self.webchat)

    async def ask(self, text: str, user: str = "tester") -> list[str]:
        reply = await self.webchat.submit(user, text)
        return reply.replies


@contextlib.asynccontextmanager
async def started(config: Config) -> AsyncIterator[RunningGateway]:
    """A gateway on `config` with the console and webchat channels, started; stopped after."""
    gateway = Gateway(config)
    rg = RunningGateway(gateway)
    await gateway.start()
    try:
        yield rg
    finally:
        await gateway.stop()


@pytest.fixture
async def running(fake_llm: FakeOpenAI, make_config: MakeConfig) -> AsyncIterator[RunningGateway]:
    async with started(make_config(fake_llm)) as rg:
        yield rg


@pytest.fixture
async def base_url(running: RunningGateway) -> AsyncIterator[str]:
    """The running gateway's web server (webchat, admin, /metrics, /healthz) on a free port."""
    from gateway.web.server import WebServer, build_app

    server = WebServer(build_app(running.gateway, running.webchat), "127.0.0.1", 0)
    url = await server.start()
    yield url
    await server.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Captured output may hold lone surrogates (the fuzz tests send them on purpose); escape
    them so a test worker can send its report to the main process (pytest-xdist needs UTF-8)."""
    report.sections = [
        (title, text.encode("utf-8", "backslashreplace").decode("utf-8"))
        for title, text in report.sections
    ]
