"""The admin UI served by a real gateway over a real socket, and a client for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from gateway.app import Gateway
from gateway.web.server import WebServer, build_app
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import FakeOpenAI

TOKEN = "admin-token-0123456789"


class Admin:
    def __init__(self, rg: RunningGateway, url: str) -> None:
        self.rg = rg
        self.url = url

    async def get(
        self, path: str, headers: dict[str, str] | None = None, **kw: Any
    ) -> tuple[int, str, aiohttp.ClientResponse]:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
            async with http.get(f"{self.url}{path}", headers=headers or {},
                                allow_redirects=False, **kw) as r:
                return r.status, await r.text(), r

    async def post(
        self, path: str, data: dict[str, str], headers: dict[str, str] | None = None
    ) -> tuple[int, str, aiohttp.ClientResponse]:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
            async with http.post(f"{self.url}{path}", data=data, headers=headers or {},
                                 allow_redirects=False) as r:
                return r.status, await r.text(), r


BEARER = {"Authorization": f"Bearer {TOKEN}"}


async def serve(make_config: MakeConfig, fake: FakeOpenAI, **web: Any) -> AsyncIterator[Admin]:
    config = make_config(
        fake, web=web, models={"fake-model": {"context_window": 16_000}},
        context={"recent_turns": 2}, channels={"webchat": {"dm_history_limit": 40}},
    )
    rg = RunningGateway(Gateway(config))
    await rg.gateway.start()
    server = WebServer(build_app(rg.gateway, rg.webchat), "127.0.0.1", 0)
    url = await server.start()
    try:
        yield Admin(rg, url)
    finally:
        await server.stop()
        await rg.gateway.stop()
