"""The webchat page in a real browser (Debian's Chromium driven by Playwright).

History after a reload (in order, newest in view), Markdown rendered safely, progress while a
held-open model request runs (and a compaction notice as its label), New chat, and the layout
on a phone-sized screen. Screenshots are saved in the test's tmp dir and checked: size, not
blank, the colours of what must be on them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, async_playwright

from channels.base import OutboundMessage
from gateway.web.server import WebServer, build_app
from tests.conftest import MakeConfig, RunningGateway, started
from tests.fakes import FakeOpenAI, fn, reply
from tests.helpers.browser import ARGS, CHROMIUM
from tests.helpers.png import distinct_colours, read_png, share_of, widest_run

USER = "web-alice"
KEY = f"agent:main:webchat:direct:{USER}"
BLUE = (0x1D, 0x4E, 0xD8)  # the user's bubbles (and the Send button)
CODE_BG = (0x1C, 0x19, 0x17)  # a code block
PAGE_BG = (0xF5, 0xF5, 0xF4)

FIRST_REPLY = """Here is the plan:

- build the image
- deploy **ORD-1042** to `staging`

```python
print("<b>not bold</b>")
```

See [the runbook](https://example.com/runbook) or javascript links like [this](javascript:alert(1))."""

SECOND_REPLY = (
    "Done. <script>window.__pwned = 1</script> <img src=x onerror=\"window.__pwned = 2\">\n\n"
    + "\n".join(f"{i}. step {i} of the rollout" for i in range(1, 31))
)


@pytest.fixture
async def running(fake_llm: FakeOpenAI, make_config: MakeConfig) -> AsyncIterator[RunningGateway]:
    """As conftest's, with a model timeout of a minute: a test here holds the model open while
    the page is reloaded, which takes longer than the usual 5 s on a loaded machine (the held
    request timed out and the turn failed)."""
    async with started(make_config(fake_llm, llm={"timeout": 60})) as rg:
        yield rg


@pytest.fixture
async def page_url(running: RunningGateway) -> AsyncIterator[str]:
    server = WebServer(build_app(running.gateway, running.webchat), "127.0.0.1", 0)
    url = await server.start()
    yield url
    await server.stop()


@contextlib.asynccontextmanager
async def chat_page(
    url: str, width: int = 1000, height: int = 700, user: str | None = USER
) -> AsyncIterator[tuple[Page, list[str]]]:
    """A page on the chat (as `user`); yields it and the console errors it logged (CSP
    refusals included), which the test checks at the end."""
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = await browser.new_page(viewport={"width": width, "height": height})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            if user is not None:
                await page.add_init_script(f"localStorage.setItem('gatehouse-user', '{user}')")
            await page.goto(f"{url}/")
            await page.wait_for_selector("body[data-ready=true]")
            yield page, errors
        finally:
            await browser.close()


async def exchange(page: Page, text: str, bots_before: int) -> None:
    await page.fill("#text", text)
    await page.press("#text", "Enter")
    await wait_until(
        page,
        f"document.querySelectorAll('.bot').length > {bots_before}"
        " && !document.querySelector('.progress')",
    )


async def wait_until(page: Page, expression: str, within_ms: float = 10_000) -> None:
    """Until the JS `expression` is true. (Playwright's own wait_for_function evaluates its
    predicate with eval, which the page's Content-Security-Policy refuses.)"""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_ms / 1000
    while not await page.evaluate(expression):
        if loop.time() > deadline:
            raise TimeoutError(f"still false after {within_ms / 1000:g} s: {expression}")
        await asyncio.sleep(0.05)


def check_screenshot(path: Path, width: int, height: int) -> Any:
    """Not blank and the expected size: (pixels, distinct colours)."""
    pixels = read_png(path)
    assert pixels.shape == (height, width, 3), pixels.shape
    colours = distinct_colours(pixels)
    assert colours > 50, f"{path.name} looks blank ({colours} colours)"
    assert share_of(pixels, PAGE_BG) < 0.99, f"{path.name} is almost only background"
    return pixels


async def test_chat_page_sends_and_shows_the_reply(
    page_url: str, fake_llm: FakeOpenAI, tmp_path: Path
) -> None:
    fake_llm.script(reply("Deploying ORD-1042 now."))
    async with chat_page(page_url, user=None) as (page, errors):
        await page.fill("#text", "Deploy ORD-1042 to staging")
        await page.press("#text", "Enter")
        await wait_until(
            page, "[...document.querySelectorAll('.bot')].some(e => e.textContent.includes('ORD'))"
        )
        assert await page.inner_text(".user") == "Deploy ORD-1042 to staging"
        assert await page.inner_text(".bot") == "Deploying ORD-1042 now."
        # An empty message is not sent.
        await page.fill("#text", "   ")
        await page.press("#text", "Enter")
        assert await page.locator(".user").count() == 1
        # A new browser gets a long random id (not guessable like an 8-digit one).
        user = await page.evaluate("localStorage.getItem('gatehouse-user')")
        assert user.startswith("web-") and len(user) == 36
        await page.screenshot(path=str(tmp_path / "webchat.png"))
    pixels = check_screenshot(tmp_path / "webchat.png", 1000, 700)
    assert widest_run(pixels, BLUE) > 200  # the user's bubble
    assert fake_llm.requests[-1]["messages"][-1]["content"] == "Deploy ORD-1042 to staging"
    assert errors == []


async def test_a_reload_shows_the_history_rendered_and_scrolled_to_the_newest(
    page_url: str, fake_llm: FakeOpenAI, tmp_path: Path
) -> None:
    fake_llm.script(reply(FIRST_REPLY), reply(SECOND_REPLY))
    async with chat_page(page_url) as (page, errors):
        await exchange(page, "What is the plan for ORD-1042?", 0)
        await exchange(page, "Go. <script>window.__pwned = 3</script>", 1)
        await page.reload()
        await page.wait_for_selector("body[data-ready=true]")
        await wait_until(page, "document.querySelectorAll('.msg').length === 4")

        # In order, from the server (each bubble carries its seq).
        rows = await page.eval_on_selector_all(
            ".msg", "els => els.map(e => [e.className, Number(e.dataset.seq), e.innerText])"
        )
        assert [r[0] for r in rows] == ["msg user", "msg bot md", "msg user", "msg bot md"]
        assert [r[1] for r in rows] == sorted(r[1] for r in rows) and rows[0][1] > 0
        assert rows[0][2] == "What is the plan for ORD-1042?"
        assert rows[2][2] == "Go. <script>window.__pwned = 3</script>"  # the user's text, as text

        # Markdown: a code block is <pre><code>, a list is <ul>, links are safe.
        first = page.locator(".bot").nth(0)
        assert await first.locator("pre > code.language-python").inner_text() == (
            'print("<b>not bold</b>")'
        )
        assert await first.locator("b").count() == 0
        assert await first.locator("ul > li").all_inner_texts() == [
            "build the image", "deploy ORD-1042 to staging",
        ]
        assert await first.locator("li strong").inner_text() == "ORD-1042"
        assert await first.locator("li code").inner_text() == "staging"
        links = await first.locator("a").evaluate_all(
            "as => as.map(a => [a.getAttribute('href'), a.rel, a.target, a.textContent])"
        )
        assert links == [["https://example.com/runbook", "noopener noreferrer", "_blank",
                          "the runbook"]]  # the javascript: one stays text
        assert "[this](javascript:alert(1))" in await first.inner_text()

        # <script> and <img onerror> in a reply are text: nothing ran, no such element exists.
        second = page.locator(".bot").nth(1)
        assert "<script>window.__pwned = 1</script>" in await second.inner_text()
        assert '<img src=x onerror="window.__pwned = 2">' in await second.inner_text()
        assert await page.locator("#log script, #log img").count() == 0
        assert await page.evaluate("window.__pwned") is None
        assert await second.locator("ol > li").count() == 30

        # The newest message is in view: the log scrolled to its end.
        scroll = await page.evaluate(
            """() => { const log = document.getElementById('log');
                 const last = log.lastElementChild.getBoundingClientRect();
                 const box = log.getBoundingClientRect();
                 return {top: log.scrollTop, end: log.scrollHeight - log.clientHeight,
                         lastBottom: last.bottom, boxBottom: box.bottom}; }"""
        )
        assert scroll["top"] > 0 and abs(scroll["top"] - scroll["end"]) <= 2, scroll
        assert scroll["lastBottom"] <= scroll["boxBottom"] + 1, scroll
        await page.screenshot(path=str(tmp_path / "history-end.png"))
        # Scrolled to the top, the first exchange is there too.
        await page.evaluate("document.getElementById('log').scrollTop = 0")
        await page.screenshot(path=str(tmp_path / "history-top.png"))
    end = check_screenshot(tmp_path / "history-end.png", 1000, 700)
    top = check_screenshot(tmp_path / "history-top.png", 1000, 700)
    assert widest_run(top, BLUE) > 200  # the user's bubble at the top
    assert widest_run(top, CODE_BG) > 400  # the dark code block (text is only short runs)
    assert widest_run(end, CODE_BG) < 50  # the end shows the numbered list, not the code
    assert errors == []


async def test_progress_shows_while_the_model_is_held_open(
    page_url: str, running: RunningGateway, fake_llm: FakeOpenAI, tmp_path: Path
) -> None:
    release = asyncio.Event()

    async def held(_body: Any) -> Any:
        await release.wait()
        return reply("The long job is **done**.")

    fake_llm.script(fn(held))
    async with chat_page(page_url) as (page, errors):
        await page.fill("#text", "Run the long job")
        await page.press("#text", "Enter")
        await fake_llm.wait_for_requests(1)
        progress = page.locator(".progress")
        await progress.wait_for(state="visible")
        assert await progress.get_attribute("role") == "status"
        assert await page.locator(".progress .label").inner_text() == "Working…"
        assert await page.is_disabled("#send") and await page.is_disabled("#new-chat")
        # It keeps showing that it works: the time so far appears after a few seconds.
        await wait_until(
            page, "/^\\d+ s$/.test(document.querySelector('.progress .elapsed').textContent)", 6_000
        )
        # A compaction notice (what the runner sends while it compacts) labels the progress.
        await running.gateway.deliver(OutboundMessage(
            platform="webchat", chat_id=USER, text="Compacting earlier messages…",
            session_key=KEY,
        ))
        await wait_until(
            page,
            "document.querySelector('.progress .label').textContent"
            " === 'Compacting earlier messages…'",
            5_000,
        )
        assert await page.locator(".notice").inner_text() == "Compacting earlier messages…"
        await page.screenshot(path=str(tmp_path / "progress.png"))

        # A reload mid-turn: the history has the question, and the page still shows progress.
        await page.reload()
        await page.wait_for_selector("body[data-ready=true]")
        await progress.wait_for(state="visible")
        assert await page.locator(".user").all_inner_texts() == ["Run the long job"]
        release.set()
        # The reply arrives by polling (the POST that waited for it went with the reload).
        await page.locator(".bot strong").wait_for(timeout=10_000)
        assert await page.locator(".bot").inner_text() == "The long job is done."
        await progress.wait_for(state="detached", timeout=5_000)
        assert await page.is_enabled("#send")
    pixels = check_screenshot(tmp_path / "progress.png", 1000, 700)
    assert widest_run(pixels, BLUE) > 100  # the user's bubble
    assert errors == []


async def test_new_chat_clears_the_view_and_the_next_exchange_starts_fresh(
    page_url: str, fake_llm: FakeOpenAI, tmp_path: Path
) -> None:
    async with chat_page(page_url) as (page, errors):
        await exchange(page, "First topic: ORD-7", 0)
        assert await page.locator(".msg").count() == 2
        async with page.expect_request("**/api/messages") as sent:
            await page.click("#new-chat")
        body = (await sent.value).post_data_json
        assert isinstance(body, dict) and body["text"] == "/new"
        assert await page.locator(".user").count() == 0  # cleared at once, "/new" not shown
        await wait_until(page, "!document.querySelector('.progress')", 10_000)
        new_chat_reply = await page.locator(".msg").all_inner_texts()
        await exchange(page, "Second topic: ORD-8", await page.locator(".bot").count())
        assert await page.locator(".user").all_inner_texts() == ["Second topic: ORD-8"]
        await page.reload()
        await page.wait_for_selector("body[data-ready=true]")
        await wait_until(page, "document.querySelectorAll('.msg').length >= 2")
        assert await page.locator(".user").all_inner_texts() == ["Second topic: ORD-8"]
        assert "ORD-7" not in await page.inner_text("#log")
        await page.screenshot(path=str(tmp_path / "new-chat.png"))
    check_screenshot(tmp_path / "new-chat.png", 1000, 700)
    asked = [r["messages"][-1]["content"] for r in fake_llm.requests]
    if "/new" not in asked:  # the chat command ran: the model never saw it, nor the old topic
        assert len(new_chat_reply) == 1, new_chat_reply
        last = fake_llm.requests[-1]["messages"]
        assert not any("ORD-7" in str(m.get("content")) for m in last), last
    assert errors == []


async def test_the_phone_layout_keeps_the_placeholder_readable(
    page_url: str, running: RunningGateway, fake_llm: FakeOpenAI, tmp_path: Path
) -> None:
    fake_llm.script(reply(
        "A long line: `" + "x" * 120 + "`\n\n```\n" + "y" * 200 + "\n```\n\nhttps://example.com/"
        + "a" * 150
    ))
    await running.webchat.submit(USER, "show me something wide")
    async with chat_page(page_url, width=375, height=667) as (page, errors):
        await wait_until(page, "document.querySelectorAll('.msg').length === 2")
        layout = await page.evaluate(
            """() => {
              const ta = document.getElementById('text');
              const cs = getComputedStyle(ta);
              const box = (e) => { const r = e.getBoundingClientRect();
                                   return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
              // How tall the placeholder is, laid out in the textarea's content box.
              const fits = (text) => {
                const probe = document.createElement('div');
                for (const p of ['fontFamily', 'fontSize', 'fontWeight', 'lineHeight',
                                 'letterSpacing', 'wordSpacing'])
                  probe.style[p] = cs[p];
                probe.style.position = 'absolute'; probe.style.visibility = 'hidden';
                probe.style.whiteSpace = 'pre-wrap'; probe.style.overflowWrap = 'break-word';
                const inner = ta.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
                probe.style.width = inner + 'px';
                probe.textContent = text;
                document.body.appendChild(probe);
                const h = probe.getBoundingClientRect().height;
                probe.remove();
                return h <= ta.clientHeight - parseFloat(cs.paddingTop) - parseFloat(cs.paddingBottom) + 0.5;
              };
              return {
                placeholder: ta.placeholder,
                fits: fits(ta.placeholder),
                longFits: fits('Message the agent… (Enter to send, Shift+Enter for a new line)'),
                textarea: box(ta), send: box(document.getElementById('send')),
                newChat: box(document.getElementById('new-chat')),
                docWidth: document.documentElement.scrollWidth,
                bodyWidth: document.body.scrollWidth,
                logWidth: document.getElementById('log').scrollWidth,
                logClient: document.getElementById('log').clientWidth,
                viewport: window.innerWidth,
              };
            }"""
        )
        assert layout["viewport"] == 375
        assert layout["placeholder"] == "Message the agent…"
        assert layout["fits"], layout
        assert not layout["longFits"], layout  # (the probe does measure: the long one would not)
        ta, send, new = layout["textarea"], layout["send"], layout["newChat"]
        assert 0 <= ta["left"] and ta["right"] <= send["left"] and send["right"] <= 375, layout
        assert ta["bottom"] <= 667 and send["bottom"] <= 667, layout
        assert new["right"] <= 375 and new["top"] >= 0, layout
        assert layout["docWidth"] <= 375 and layout["bodyWidth"] <= 375, layout
        assert layout["logWidth"] <= layout["logClient"], layout  # wide code scrolls in its block
        await page.screenshot(path=str(tmp_path / "phone.png"))
    pixels = check_screenshot(tmp_path / "phone.png", 375, 667)
    assert widest_run(pixels, CODE_BG) > 200  # the code block, inside the screen
    assert errors == []


async def test_the_markdown_renderer_makes_no_markup_from_text_and_stays_fast(
    page_url: str,
) -> None:
    async with chat_page(page_url) as (page, errors):
        render = "t => { const d = document.createElement('div');" \
                 " d.appendChild(GatehouseMarkdown.render(t)); return d.innerHTML; }"
        cases = {
            "[x](javascript:alert(1)) [y](data:text/html,hi) [z](/rel) <javascript:alert(1)>":
                "<p>[x](javascript:alert(1)) [y](data:text/html,hi) [z](/rel) "
                "&lt;javascript:alert(1)&gt;</p>",
            '<img src=x onerror="alert(1)"> & <b>':
                '<p>&lt;img src=x onerror="alert(1)"&gt; &amp; &lt;b&gt;</p>',
            "- a\n  - nested\n- b": "<ul><li>a<ul><li>nested</li></ul></li><li>b</li></ul>",
            "| k | v |\n|---|--:|\n| a | `1` |":
                '<div class="table-wrap"><table><thead><tr><th>k</th><th class="align-right">v'
                '</th></tr></thead><tbody><tr><td>a</td><td class="align-right"><code>1</code>'
                "</td></tr></tbody></table></div>",
            "```sh\necho '<x>'\n```": "<pre><code class=\"language-sh\">echo '&lt;x&gt;'"
                                     "</code></pre>",
            "snake_case_name and 2 * 3 * 4": "<p>snake_case_name and 2 * 3 * 4</p>",
            "see https://example.com/a_(b). ok":
                '<p>see <a href="https://example.com/a_(b)" rel="noopener noreferrer" '
                'target="_blank">https://example.com/a_(b)</a>. ok</p>',
        }
        for text, html in cases.items():
            assert await page.evaluate(render, text) == html, text
        # Pathological input (100,000 characters of unmatched openers) renders in well under
        # a second each: no closing-delimiter search is repeated per opener.
        for text in ("*a " * 33_000, "[" * 100_000, "`a " * 33_000, "**a *b _c ~~d [e](f " * 5000):
            took = await page.evaluate(
                "t => { const s = performance.now(); GatehouseMarkdown.render(t);"
                " return performance.now() - s; }", text,
            )
            assert took < 1500, (text[:10], took)
    assert errors == []
