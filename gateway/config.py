"""Configuration: `gatehouse.toml`, validated by pydantic, secrets from `${ENV_VAR}`.

Lookup order: `--config PATH`, then `$GATEHOUSE_CONFIG`, then `./gatehouse.toml`. Unknown keys and
bad values are rejected with the exact dotted key and the file named, so a typo never silently
falls back to a default. An error never shows the value of a key that holds a secret (tokens,
secrets, API keys, passwords; a URL is shown with its password masked): see `is_secret_key`.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

# Each channel's settings live with its adapter; re-exported here for the rest of the gateway.
from channels.settings import ChannelSection as ChannelSection
from channels.settings import ConsoleSettings as ConsoleSettings
from channels.settings import DiscordSettings as DiscordSettings
from channels.settings import DmPolicy as DmPolicy
from channels.settings import HistoryOverride as HistoryOverride
from channels.settings import QueueMode as QueueMode
from channels.settings import SlackSettings as SlackSettings
from channels.settings import TelegramSettings as TelegramSettings
from channels.settings import WebchatSettings as WebchatSettings

CONFIG_ENV = "GATEHOUSE_CONFIG"
DEFAULT_CONFIG_NAME = "gatehouse.toml"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")



#: The drivers the store runs on, by the URL spellings a config may use (older async ones too).
_DRIVERS = {
    "sqlite": "sqlite",
    "sqlite+aiosqlite": "sqlite",
    "sqlite+pysqlite": "sqlite",
    "postgresql": "postgresql+psycopg",
    "postgresql+asyncpg": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
}
SUPPORTED_SCHEMES = tuple(sorted(_DRIVERS))


def sync_url(url: str) -> str:
    """The driver the store runs on for a configured URL (older async spellings still accepted)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ValueError(
            "not a database URL: use sqlite:///PATH or postgresql://USER:PASSWORD@HOST/DB"
        ) from None
    driver = _DRIVERS.get(parsed.drivername)
    if driver is None:
        raise ValueError(
            f"unsupported database URL scheme {parsed.drivername!r}: use sqlite:///PATH or "
            "postgresql://USER:PASSWORD@HOST/DB"
        )
    return parsed.set(drivername=driver).render_as_string(hide_password=False)


class ConfigError(Exception):
    """A configuration problem, phrased for the person who edits the file."""


_SECRET_NAME = re.compile(r"(^|_)(token|secret|key)$|pass(word|wd)", re.IGNORECASE)


def is_secret_key(name: str) -> bool:
    """Whether a config key (or a URL's query parameter) holds a credential: admin_token,
    api_key, summary_api_key, token, bot_token, app_token, signing_secret, webhook_secret..."""
    return bool(_SECRET_NAME.search(name))


def is_url_key(name: str) -> bool:
    """Keys holding a URL (database_url, base_url, webhook_url...): a password may be in it."""
    return name == "url" or name.endswith("_url")


def url_secrets(url: str) -> list[str]:
    """The credentials written in a URL: its password, and secret query values (?password=)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = [parts.password] if parts.password else []
    for param in parts.query.split("&") if parts.query else ():
        name, _, value = param.partition("=")
        if value and is_secret_key(name):
            found.append(value)
    return found


def redacted_url(url: str) -> str:
    """A URL with its password (user:***@host) and secret query values masked, the rest as
    written: fit for a log, an error or a table."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if "@" in parts.netloc:
        userinfo, host = parts.netloc.rsplit("@", 1)
        if ":" in userinfo:
            masked = f"{userinfo.split(':', 1)[0]}:***@{host}"
            url = url.replace(parts.netloc, masked, 1)
    if parts.query:
        params = []
        for param in parts.query.split("&"):
            name, sep, value = param.partition("=")
            params.append(f"{name}{sep}***" if value and is_secret_key(name) else param)
        url = url.replace(f"?{parts.query}", "?" + "&".join(params), 1)
    return url


def secret_values(config: BaseModel) -> list[str]:
    """Every credential a loaded config holds: the values of secret keys, the passwords in its
    URLs. The log filter masks them (`gateway.logging_setup`)."""
    found: list[str] = []

    def walk(value: Any, name: str) -> None:
        if isinstance(value, BaseModel):
            for field in type(value).model_fields:
                walk(getattr(value, field), field)
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, str(key))
        elif isinstance(value, list):
            for item in value:
                walk(item, name)
        elif isinstance(value, str) and value:
            if is_secret_key(name):
                found.append(value)
            elif is_url_key(name):
                found.extend(url_secrets(value))

    walk(config, "")
    return found


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class GatewaySection(_Strict):
    data_dir: Path = Path("./data")
    database_url: str | None = Field(
        default=None, repr=False, description="Default: sqlite:///<data_dir>/gatehouse.db"
    )
    workspace: Path | None = Field(default=None, description="Default: <data_dir>/workspace")
    database_threads: int = Field(
        default=2,
        ge=1,
        le=64,
        description="PostgreSQL: threads running the ORM's steps (the per-message statements "
        "run on the event loop, through asyncpg), each waiting for one round trip at a time; "
        "more help when the server is across a network, and cost CPU in contention for "
        "Python's GIL (docs/scaling.md)",
    )
    timezone: str = "UTC"
    agent: str = "main"
    max_concurrent_turns: int = Field(default=8, ge=1, le=1024)
    pending_sweep_seconds: float = Field(
        default=15.0,
        gt=0,
        description="how often to send replies an operator retried (`gatehouse outbox retry`) "
        "and, on PostgreSQL, to pick up messages a stopped process left unanswered",
    )
    delivery_attempts: int = Field(
        default=10,
        ge=1,
        le=1000,
        description="tries at sending a reply its platform refuses before it is given up "
        "(kept in the outbox: `gatehouse outbox list`, `retry`)",
    )
    typing_delay_ms: int = Field(
        default=500, ge=0, description="show typing only when a turn takes longer than this"
    )
    system_prompt: str = "You are a helpful assistant."
    owners: list[str] = Field(
        default_factory=list,
        description='the people the agent works for: "platform:user_id" or an identity-link '
        "name; they see every note and file, and may schedule posts to other conversations. "
        "Everyone else is a guest of their own conversation (the terminal user is an owner)",
    )
    max_message_chars: int = Field(default=100_000, ge=1, description="longer inbound is refused")
    queue_mode: QueueMode = Field(
        default="collect",
        description="messages arriving mid-turn (collect, followup, steer, interrupt); "
        "[channels.<name>] queue_mode overrides it",
    )

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown timezone {value!r} (use an IANA name)") from exc
        return value

    @field_validator("database_url")
    @classmethod
    def _supported_url(cls, value: str | None) -> str | None:
        if value is None:
            return None

        sync_url(value)  # raises a ValueError that names the accepted schemes
        return value


class LLMSection(_Strict):
    base_url: str | None = None
    api_key: str | None = Field(default=None, repr=False)
    model: str = "gpt-4o-mini"
    timeout: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=2, ge=0, le=10)
    stream: bool = True
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_tool_rounds: int = Field(
        default=90, ge=1, le=5_000,
        description="model calls with tool calls one turn may make (long agent work: hundreds)",
    )
    max_tool_calls_per_round: int = Field(
        default=32, ge=1, le=1_000,
        description="tool calls run from one model reply; the rest are answered 'not run'",
    )
    max_turn_seconds: float = Field(
        default=1_800.0, ge=1, le=86_400,
        description="wall-clock budget of one turn: its tool loop stops at the next round",
    )
    max_tokens: int | None = Field(
        default=None, ge=1, description="cap on each reply's tokens; default: the server's own"
    )
    local_model: bool = Field(
        default=True,
        description="with no endpoint configured, start the bundled offline model if installed",
    )
    vision: bool = Field(
        default=False,
        description="the model reads images: photos people send reach it as image parts",
    )
    prompt_cache_key: bool = Field(
        default=True,
        description=(
            "send each session's stable prompt_cache_key (a hash of agent and session key) so "
            "the provider routes its calls to the same prompt cache; stops by itself if the "
            "endpoint rejects the parameter"
        ),
    )
    _managed_by: str | None = PrivateAttr(default=None)

    @property
    def managed_by(self) -> str | None:
        """What runs the endpoint when the gateway itself does (the bundled model), else None."""
        return self._managed_by

    def manage(self, what: str) -> None:
        """The endpoint is a server the gateway runs (and restarts): `what` names it to users."""
        self._managed_by = what

    @property
    def configured(self) -> bool:
        return bool(self.base_url or self.api_key)


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class WebSection(_Strict):
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(default=8787, ge=0, le=65535)
    admin_token: str | None = Field(
        default=None,
        min_length=16,
        repr=False,
        description="bearer token (or login password) for /admin/; unset: the admin UI is off",
    )
    admin_anonymous: bool = Field(
        default=False, description="serve /admin/ without a login; only when host is loopback"
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="names this server is reached by besides host and loopback (a reverse "
        "proxy's public name): other Host headers are refused (DNS rebinding)",
    )

    @field_validator("allowed_hosts")
    @classmethod
    def _plain_host_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not name or any(c in name for c in "/@ \t") or "://" in name:
                raise ValueError(f"{name!r} is not a host name (write e.g. \"bot.example.com\")")
        return [name.lower() for name in value]

    @model_validator(mode="after")
    def _anonymous_only_on_loopback(self) -> WebSection:
        if self.admin_anonymous and self.host not in LOOPBACK_HOSTS:
            raise ValueError(
                f"admin_anonymous = true needs host = \"127.0.0.1\" (got {self.host!r}); "
                "set admin_token to reach /admin/ from other machines"
            )
        return self


DmScope = Literal["main", "per-peer", "per-channel-peer", "per-account-channel-peer"]


class SessionsSection(_Strict):
    dm_scope: DmScope = "per-channel-peer"
    per_user_in_groups: bool = False
    identity_links: dict[str, list[str]] = Field(
        default_factory=dict,
        description='canonical person id -> ["telegram:123", "slack:U42", ...]',
    )

    @field_validator("identity_links")
    @classmethod
    def _links_are_platform_ids(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        seen: dict[str, str] = {}
        for person, ids in value.items():
            for ident in ids:
                if ":" not in ident or not ident.split(":", 1)[1]:
                    raise ValueError(f"{person}: {ident!r} must look like 'platform:user_id'")
                if ident in seen and seen[ident] != person:
                    raise ValueError(f"{ident!r} is linked to both {seen[ident]!r} and {person!r}")
                seen[ident] = person
        return value


class ChannelsSection(_Strict):
    console: ConsoleSettings = Field(default_factory=ConsoleSettings)
    webchat: WebchatSettings = Field(default_factory=WebchatSettings)
    telegram: TelegramSettings = Field(default_factory=TelegramSettings)
    slack: SlackSettings = Field(default_factory=SlackSettings)
    discord: DiscordSettings = Field(default_factory=DiscordSettings)

    def get(self, name: str) -> ChannelSection:
        section = getattr(self, name, None)
        if not isinstance(section, ChannelSection):
            raise KeyError(f"unknown channel {name!r}")
        return section


class ContextSection(_Strict):
    engine: str = "default"
    history_limit: int = Field(default=0, ge=0, description="0 means unlimited")
    reserve_tokens: int = Field(default=20_000, ge=0, description="reserve floor")
    max_output_tokens: int = Field(default=4_096, ge=1)
    tool_result_share: float = Field(
        default=0.3, gt=0, le=1, description="one tool result may use this share of the window"
    )
    tool_results_share: float = Field(
        default=0.25, gt=0, le=1, description="all tool results in a prompt, before old ones trim"
    )
    system_share: float = Field(default=0.05, gt=0, le=1, description="system prompt share")
    history_share: float = Field(
        default=0.60, gt=0, le=1, description="verbatim turns kept by compaction"
    )
    summary_share: float = Field(
        default=0.10, gt=0, le=1, description="the most a compaction summary may take"
    )
    keep_recent_tool_results: int = Field(default=3, ge=0)
    small_overflow: Literal["compact", "drop-blocks", "drop-turns"] = Field(
        default="compact",
        description=(
            "a prompt at most 5 % over the usable tokens: compact at once (one prompt-cache "
            "break per compaction cycle), drop the oldest turns a block at a time, or drop the "
            "least important turns anew each turn"
        ),
    )
    # Compaction
    recent_turns: int = Field(default=3, ge=0, le=12, description="user turns kept verbatim")
    compaction_parts: int = Field(default=2, ge=1, le=8)
    identifier_policy: Literal["strict", "off", "custom"] = "strict"
    identifier_patterns: list[str] = Field(
        default_factory=list, description="regexes for identifier_policy = 'custom'"
    )
    quality_guard: bool = True
    quality_retries: int = Field(default=1, ge=0, le=3)
    summary_model: str | None = Field(default=None, description="default: [llm] model")
    summary_base_url: str | None = Field(default=None, description="default: [llm] base_url")
    summary_api_key: str | None = Field(
        default=None, repr=False, description="default: [llm] api_key"
    )
    summary_timeout: float = Field(default=120.0, gt=0)
    summary_max_chars: int = Field(default=16_000, ge=1_000)
    compaction_cooldown_seconds: int = Field(default=600, ge=0)
    max_ineffective_compactions: int = Field(default=2, ge=1)
    overflow_retries: int = Field(default=3, ge=0, le=10)
    notify_compaction: bool = Field(
        default=True,
        description="tell the chat when a compaction starts and, after it, what it kept",
    )

    @model_validator(mode="after")
    def _shares_fit(self) -> ContextSection:
        total = self.system_share + self.history_share + self.tool_results_share + (
            self.summary_share
        )
        if total > 1.0001:
            raise ValueError(
                "system_share + history_share + tool_results_share + summary_share is "
                f"{total:.2f}; the shares of the usable budget must add up to at most 1"
            )
        return self

    @field_validator("identifier_patterns")
    @classmethod
    def _patterns_compile(cls, value: list[str]) -> list[str]:
        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"bad regular expression {pattern!r}: {exc}") from exc
        return value


class MemorySection(_Strict):
    flush_soft_tokens: int = Field(default=4_000, ge=0)
    post_compaction_sections: list[str] = Field(
        default_factory=lambda: ["Session Startup", "Red Lines"]
    )
    archive_transcripts: bool = Field(
        default=True,
        description=(
            "let memory_search (the agent's tool, `gatehouse memory search`, the admin memory "
            "page) search compacted messages of every session with corpus=transcripts; when "
            "false that corpus finds nothing. Compacted messages and their identifiers are "
            "archived either way: history_search (confined to the asking session) always works"
        ),
    )
    search_mode: Literal["hybrid", "bm25", "vector"] = Field(
        default="hybrid",
        description=(
            "how memory_search ranks: hybrid (words by BM25 fused with meaning by embedding, "
            "an exact identifier first), bm25 (words only) or vector (meaning only); without "
            "the embedding model every mode is BM25"
        ),
    )
    half_life_days: float | None = Field(
        default=None,
        gt=0,
        description=(
            "temporal decay of memory_search: a daily note's score halves every this many "
            "days of age (MEMORY.md and undated files never decay); unset: no decay"
        ),
    )
    embeddings: bool = Field(
        default=True,
        description=(
            "load the offline multilingual embedding model (memory/embeddings.py) at start so "
            "memory_search can rank by meaning; false: BM25 only, no model in memory"
        ),
    )


class SchedulerSection(_Strict):
    """Reminders and cron jobs for the agent, and the gateway's own maintenance jobs."""

    enabled: bool = Field(default=True, description="the scheduling tools, jobs and maintenance")
    misfire_grace_seconds: int = Field(
        default=300, ge=1, description="a cron or maintenance run missed by longer is skipped"
    )
    coalesce: bool = Field(default=True, description="several missed runs of a job run once")
    poll_seconds: float = Field(
        default=10.0, gt=0, description="how soon jobs added by another process are seen"
    )
    leader_poll_seconds: float = Field(
        default=5.0,
        gt=0,
        description="PostgreSQL: how soon another process takes over firing jobs from a dead one",
    )
    max_jobs_per_session: int = Field(default=20, ge=1)
    max_jobs_per_person: int = Field(
        default=20, ge=1,
        description="reminders and scheduled tasks one person may have across conversations",
    )
    max_jobs_per_platform: int = Field(
        default=200, ge=1, description="reminders and scheduled tasks created from one platform"
    )
    idle_compaction_minutes: int = Field(
        default=120, ge=0, description="compact sessions idle this long; 0 = off"
    )
    idle_compaction_min_share: float = Field(
        default=0.5, gt=0, le=1, description="only when the prompt is this share of the threshold"
    )
    daily_reset: str | None = Field(
        default=None, description='"HH:MM" in [gateway] timezone: sessions start a fresh context'
    )
    reset_flush_memory: bool = Field(
        default=True, description="the memory flush runs before a session's daily reset"
    )
    memory_refresh_minutes: int = Field(default=10, ge=0, description="0 = off")
    pairing_expiry_minutes: int = Field(default=5, ge=0, description="0 = off")

    @field_validator("daily_reset")
    @classmethod
    def _clock_time(cls, value: str | None) -> str | None:
        if value is None:
            return None
        match = re.fullmatch(r"([01]?\d|2[0-3]):([0-5]\d)", value.strip())
        if match is None:
            raise ValueError("daily_reset must be a local time like 04:00")
        return f"{int(match.group(1)):02d}:{match.group(2)}"


class ModelSection(_Strict):
    context_window: int | None = Field(default=None, ge=1)
    _origin: str | None = PrivateAttr(default=None)

    @classmethod
    def supplied(cls, context_window: int, origin: str) -> ModelSection:
        """An entry the gateway adds itself (the bundled model's), explained as `origin`."""
        section = cls(context_window=context_window)
        section._origin = origin
        return section

    @property
    def origin(self) -> str | None:
        """Where the entry comes from when not from the config file."""
        return self._origin


class AgentSection(_Strict):
    max_context_tokens: int | None = Field(default=None, ge=1)


class AttachmentsSection(_Strict):
    """Files people send (photos, documents, voice notes): saved to the workspace's inbox/."""

    max_bytes: int = Field(
        default=20 * 1024 * 1024, ge=1, description="larger attachments are refused, not saved"
    )
    download_timeout: float = Field(default=60.0, gt=0, description="seconds per attachment")
    retention_days: int = Field(
        default=30, ge=0, description="saved files older than this are deleted (0 = kept)"
    )
    max_total_mb: int = Field(
        default=1_024, ge=1, description="the inbox's total size; a file over it is not saved"
    )


UNVERIFIED_PLATFORMS = frozenset({"webchat"})
"""Where the sender's id is whatever the client says (the web page's visitors): never an owner."""


class Config(_Strict):
    gateway: GatewaySection = Field(default_factory=GatewaySection)
    llm: LLMSection = Field(default_factory=LLMSection)
    web: WebSection = Field(default_factory=WebSection)
    sessions: SessionsSection = Field(default_factory=SessionsSection)
    channels: ChannelsSection = Field(default_factory=ChannelsSection)
    context: ContextSection = Field(default_factory=ContextSection)
    memory: MemorySection = Field(default_factory=MemorySection)
    scheduler: SchedulerSection = Field(default_factory=SchedulerSection)
    models: dict[str, ModelSection] = Field(default_factory=dict)
    agent: AgentSection = Field(default_factory=AgentSection)
    attachments: AttachmentsSection = Field(default_factory=AttachmentsSection)

    source: Path | None = Field(default=None, exclude=True)
    _notices: list[str] = PrivateAttr(default_factory=list)

    @property
    def notices(self) -> list[str]:
        """Optional features turned off because their `${VAR}` is not set, one line each (the
        variable's name, never a value): logged once by whoever loads the config."""
        return list(self._notices)

    @property
    def data_dir(self) -> Path:
        return self._resolve(self.gateway.data_dir)

    @property
    def workspace(self) -> Path:
        return self._resolve(self.gateway.workspace or self.gateway.data_dir / "workspace")

    @property
    def database_url(self) -> str:
        if self.gateway.database_url:
            return self.gateway.database_url
        return f"sqlite:///{self.data_dir / 'gatehouse.db'}"

    def channel(self, name: str) -> ChannelSection:
        return self.channels.get(name)

    @model_validator(mode="after")
    def _owners_are_people(self) -> Config:
        for owner in self.gateway.owners:
            platform, sep, user = owner.partition(":")
            if sep and not (platform and user):
                raise ValueError(f"gateway.owners: {owner!r} must look like 'platform:user_id'")
            if not sep and owner not in self.sessions.identity_links:
                raise ValueError(
                    f"gateway.owners: {owner!r} is no [sessions] identity_links name; write "
                    "'platform:user_id' (e.g. 'telegram:123456') or add the link"
                )
            ids = [owner] if sep else self.sessions.identity_links.get(owner, [])
            spoofable = [i for i in ids if i.partition(":")[0] in UNVERIFIED_PLATFORMS]
            if spoofable:
                raise ValueError(
                    f"gateway.owners: {spoofable[0]!r}: the web page's visitors choose their own "
                    "id (nothing proves who they are), so a webchat id cannot be an owner; name "
                    "the person's Telegram, Slack or Discord id (the terminal user always is one)"
                )
        return self

    def _resolve(self, path: Path) -> Path:
        path = path.expanduser()
        if not path.is_absolute() and self.source is not None:
            path = self.source.parent / path
        return path.resolve()


def interpolate_env(value: Any, env: dict[str, str] | None = None, where: str = "") -> Any:
    """Replace `${NAME}` (or `${NAME:-default}`) in every string, recursively; an unset
    variable without a default is a ConfigError naming the key and the variable."""
    unset: list[tuple[tuple[str | int, ...], str]] = []
    result = _interpolate(value, dict(os.environ) if env is None else env, (), unset)
    if unset:
        path, name = unset[0]
        shown = ".".join(p for p in (where, _dotted(path)) if p)
        raise ConfigError(f"{shown or 'value'}: environment variable ${{{name}}} is not set")
    return result


def _interpolate(
    value: Any, env: dict[str, str], path: tuple[str | int, ...],
    unset: list[tuple[tuple[str | int, ...], str]],
) -> Any:
    """`interpolate_env`, noting each (key path, variable) left unset instead of raising: the
    value of such a key is left as written."""
    if isinstance(value, str):
        missing = [
            m.group(1) for m in _ENV_REF.finditer(value)
            if m.group(1) not in env and m.group(2) is None
        ]
        if missing:
            unset.extend((path, name) for name in dict.fromkeys(missing))
            return value

        def sub(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            return env[name] if name in env else str(default)

        return _ENV_REF.sub(sub, value)
    if isinstance(value, dict):
        return {k: _interpolate(v, env, (*path, k), unset) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env, (*path, i), unset) for i, v in enumerate(value)]
    return value


def _dotted(path: tuple[str | int, ...]) -> str:
    """A key path as the errors write it: `channels.telegram.token`, `web.allowed_hosts[0]`."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


OPTIONAL_FEATURE_KEYS: dict[tuple[str | int, ...], str] = {
    ("web", "admin_token"): "the admin UI (/admin/) is off",
}
"""Keys whose unset `${VAR}` turns a feature off (one warning) instead of failing the config;
so does any unset variable under `[channels.<name>]`: that channel is off. Every other unset
variable (the [llm] endpoint and key, the database URL, the summarizer's endpoint...) is an
error naming the key and the variable: running on without it would answer with another model,
or store into another database."""


def _drop_unset_features(
    data: dict[str, Any], unset: list[tuple[tuple[str | int, ...], str]], source: str
) -> tuple[list[str], dict[str, str]]:
    """Remove the keys of optional features whose variable is unset from `data`: (one notice
    per feature turned off, the channels to turn off with the notice for each). A required
    key's unset variable is a ConfigError listing every such key."""
    notices: list[str] = []
    channels_off: dict[str, str] = {}
    required: list[str] = []
    for path, name in unset:
        key = _dotted(path)
        channel = path[1] if len(path) >= 3 and path[0] == "channels" else None
        if path in OPTIONAL_FEATURE_KEYS:
            notices.append(f"{key}: ${{{name}}} is not set: {OPTIONAL_FEATURE_KEYS[path]}")
        elif isinstance(channel, str) and channel in ChannelsSection.model_fields:
            channels_off.setdefault(
                channel, f"{key}: ${{{name}}} is not set: the {channel} channel is off"
            )
            path = path[:3]  # the channel's key, a list or a table under it included
        else:
            required.append(f"  {key}: environment variable ${{{name}}} is not set")
            continue
        parent: Any = data
        for part in path[:-1]:
            parent = parent[part]
        parent.pop(path[-1], None)
    if required:
        raise ConfigError("\n".join([
            f"{source}: a required environment variable is not set (export it, or write "
            "${NAME:-default} in the file)", *dict.fromkeys(required),
        ]))
    return notices, channels_off


def _raw_secrets(value: Any, name: str = "") -> list[str]:
    """The credentials in raw (interpolated) config data, valid or not: masked in errors."""
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in _raw_secrets(item, str(key))]
    if isinstance(value, list):
        return [s for item in value for s in _raw_secrets(item, name)]
    if isinstance(value, str | int) and not isinstance(value, bool) and is_secret_key(name):
        return [str(value)]
    if isinstance(value, str) and is_url_key(name):
        return url_secrets(value)
    return []


def _shown(name: str, value: Any) -> str:
    """What an error says the value was: never a secret's, a URL only with its password masked."""
    if isinstance(value, dict | list) or is_secret_key(name):
        return ""
    if is_url_key(name) and isinstance(value, str):
        if "://" not in value or not urlsplit(value).scheme:
            return ""  # not a URL: where a password would be is anyone's guess
        return f" (got {redacted_url(value)!r})"
    return f" (got {value!r})"


def _format_validation_error(exc: ValidationError, source: str, data: Any = None) -> str:
    secrets = sorted({s for s in _raw_secrets(data) if len(s) >= 4}, key=len, reverse=True)
    lines = [f"{source}: invalid configuration"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        name = next((p for p in reversed(err["loc"]) if isinstance(p, str)), "")
        if err["type"] == "extra_forbidden":
            line = f"  {loc}: unknown key"
        else:
            line = f"  {loc}: {err['msg']}{_shown(name, err.get('input'))}"
        for secret in secrets:  # a validator's own message may quote the value
            line = line.replace(secret, "***")
        lines.append(line)
    return "\n".join(lines)


def parse_config(data: dict[str, Any], source: str = "<config>") -> Config:
    """Validate config data after `${VAR}` expansion. An optional feature whose variable is
    unset is turned off, with a notice in `Config.notices` (see OPTIONAL_FEATURE_KEYS)."""
    unset: list[tuple[tuple[str | int, ...], str]] = []
    data = _interpolate(data, dict(os.environ), (), unset)
    notices, channels_off = _drop_unset_features(data, unset, source)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, source, data)) from None
    for name, notice in channels_off.items():
        section = config.channels.get(name)
        if section.enabled:  # a disabled channel's missing token turns nothing off
            section.enabled = False
            notices.append(notice)
    config._notices = notices
    return config


def find_config_path(explicit: Path | None = None) -> Path | None:
    if explicit is not None:
        return explicit
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env)
    local = Path.cwd() / DEFAULT_CONFIG_NAME
    return local if local.exists() else None


def load_config(explicit: Path | None = None) -> Config:
    """Load and validate the config; with no file anywhere, return the defaults."""
    path = find_config_path(explicit)
    if path is None:
        return Config()
    if not path.exists():
        raise ConfigError(f"{path}: config file not found")
    if path.is_dir():
        raise ConfigError(
            f"{path} is a directory, not a config file: give --config (or $GATEHOUSE_CONFIG) "
            "the path of a gatehouse.toml"
        )
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not valid UTF-8") from None
    config = parse_config(data, str(path))
    config.source = path.resolve()
    return config
