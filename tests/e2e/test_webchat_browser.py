"""The webchat page in a real browser (Debian's Chromium driven by Playwright)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import async_playwright

from gateway.web.server import WebServer, build_app
from tests.conftest import RunningGateway
from tests.fakes import FakeOpenAI, reply
from tests.helpers.browser import ARGS, CHROMIUM


@pytest.fixture
async def page_url(running: RunningGateway) -> AsyncIterator[str]:
    server = WebServer(build_app(running.gateway, running.webchat), "127.0.0.1", 0)
    url = await server.start()
    yield url
    await server.stop()


async def test_chat_page_sends_and_shows_the_reply(
    page_url: str, fake_llm: FakeOpenAI, tmp_path: Path
) -> None:
    fake_llm.script(reply("Deploying ORD-1042 now."))
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = await browser.new_page()
            await page.goto(f"{page_url}/")
            await page.fill("#text", "Deploy ORD-1042 to staging")
            await page.press("#text", "Enter")
            await page.wait_for_function(
                "[...document.querySelectorAll('.bot')].some(e => e.textContent.includes('ORD'))",
                timeout=10_000,
            )
            assert await page.inner_text(".user") == "Deploy ORD-1042 to staging"
            assert await page.inner_text(".bot") == "Deploying ORD-1042 now."
            # An empty message is not sent.
            await page.fill("#text", "   ")
            await page.press("#text", "Enter")
            assert await page.locator(".user").count() == 1
            await page.screenshot(path=str(tmp_path / "webchat.png"))
        finally:
            await browser.close()
    assert fake_llm.requests[-1]["messages"][-1]["content"] == "Deploy ORD-1042 to staging"
