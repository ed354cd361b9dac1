"""The admin UI and the webchat page in one real browser (Debian's Chromium via Playwright):
chat on the web page, log in to /admin/, open the session, compact it, see the new summary."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import async_playwright

from gateway.app import Gateway
from gateway.web.server import WebServer, build_app
from tests.conftest import MakeConfig, RunningGateway
from tests.fakes import FakeOpenAI
from tests.helpers.browser import ARGS, CHROMIUM
from tests.helpers.llm_scripts import FILLER, scripted

TOKEN = "browser-admin-token-42"
KEY = "agent:main:webchat:direct:"


@pytest.fixture
async def site(make_config: MakeConfig) -> AsyncIterator[tuple[str, RunningGateway]]:
    async with FakeOpenAI(default=scripted) as fake:
        config = make_config(
            fake, web={"admin_token": TOKEN}, models={"fake-model": {"context_window": 16_000}},
            context={"recent_turns": 1},
        )
        rg = RunningGateway(Gateway(config))
        await rg.gateway.start()
        server = WebServer(build_app(rg.gateway, rg.webchat), "127.0.0.1", 0)
        url = await server.start()
        try:
            yield url, rg
        finally:
            await server.stop()
            await rg.gateway.stop()


async def test_webchat_then_admin_login_session_and_compact_now(
    site: tuple[str, RunningGateway], tmp_path: Path
) -> None:
    url, rg = site
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            console: list[str] = []
            page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
            # The webchat page: type a message, see the reply (the fake echoes it).
            await page.goto(f"{url}/")
            await page.fill("#text", "Track ticket ORD-1042 for me " + FILLER[:400])
            await page.press("#text", "Enter")
            # (A locator wait: the page's CSP refuses wait_for_function's eval.)
            await page.locator(".bot", has_text="ORD").wait_for(timeout=10_000)
            assert "ORD-1042" in await page.inner_text(".bot")
            await page.screenshot(path=str(tmp_path / "webchat.png"))
            session_key = next(s.key for s in await rg.gateway.store.list_sessions())
            assert session_key.startswith(KEY)
            for i in range(3):  # more turns, so there is something to compact
                await rg.webchat.submit(session_key.rsplit(":", 1)[1], f"follow-up {i} " + FILLER[:2000])

            # The admin UI: a wrong token is refused, the right one logs in.
            await page.goto(f"{url}/admin/")
            assert page.url.startswith(f"{url}/admin/login")
            await page.fill("#token", "not-the-token")
            await page.click("#login")
            assert "not the admin token" in await page.inner_text("#login-error")
            await page.fill("#token", TOKEN)
            await page.click("#login")
            await page.wait_for_selector("#sessions")
            assert session_key in await page.inner_text("#sessions")
            await page.screenshot(path=str(tmp_path / "admin-sessions.png"), full_page=True)

            # Open the session: transcript and chart.
            await page.click(f"a.key:text('{session_key}')")
            await page.wait_for_selector("#transcript")
            assert "Track ticket ORD-1042" in await page.inner_text("#transcript")
            assert await page.locator("#token-chart circle.turn").count() == 4
            assert "Not compacted yet." in await page.inner_text("#compactions")

            # Compact now: htmx swaps the panel; the new summary is on the page.
            await page.fill("#compactions input[name=instructions]", "keep the ticket numbers")
            await page.click("#compact-now")
            await page.wait_for_selector("#compact-outcome", timeout=15_000)
            assert "Compacted the conversation" in await page.inner_text("#compact-outcome")
            summary = await page.inner_text("#compaction-history pre.summary")
            assert "## Pending user asks" in summary
            assert "ORD-1042" in summary, "the identifier survives compaction"
            await page.screenshot(path=str(tmp_path / "admin-compacted.png"), full_page=True)

            # After a reload the chart marks the compaction.
            await page.reload()
            assert await page.locator("#token-chart line.marker-compaction").count() == 1
            await page.screenshot(path=str(tmp_path / "admin-session.png"))

            # The memory browser and the pairing page render for a logged-in operator.
            await page.goto(f"{url}/admin/memory?q=ORD-1042&corpus=transcripts")
            assert session_key in await page.inner_text("#hits")
            await page.goto(f"{url}/admin/pairing")
            assert "No pending requests." in await page.inner_text("main")
            # Under the admin's Content-Security-Policy: the stylesheet applies, nothing refused.
            header = await page.eval_on_selector(
                "header", "e => getComputedStyle(e).backgroundColor"
            )
            assert header == "rgb(29, 35, 42)"
            assert not [m for m in console if "Content Security Policy" in m], console
        finally:
            await browser.close()
    for name in ("webchat", "admin-sessions", "admin-compacted", "admin-session"):
        assert (tmp_path / f"{name}.png").stat().st_size > 5_000
