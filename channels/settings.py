"""Each channel's settings (``[channels.<name>]`` in gatehouse.toml), as pydantic models.

They live with the adapters that read them, so an adapter needs nothing from the gateway;
the gateway's configuration assembles them into the whole. Keys holding credentials are
recognised by their names (``token``, ``*_secret``...) wherever values are shown, and are kept
out of ``repr`` here, so neither an error nor a log shows them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    """Unknown keys are errors, and so is a bad value assigned later: a typo never falls back
    to a default."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class HistoryOverride(_Strict):
    history_limit: int | None = Field(default=None, ge=0)


DmPolicy = Literal["pairing", "allowlist", "open", "disabled"]
QueueMode = Literal["collect", "followup", "steer", "interrupt"]
"""What happens to messages that arrive while a turn runs (docs/channels.md, "Messages that
arrive mid-turn"): answered together after it (`collect`), one turn each in order (`followup`),
added to the running turn at its next model call (`steer`), or the running turn stops and they
are answered (`interrupt`)."""


class ChannelSection(_Strict):
    """Keys every channel shares: enablement, access policy and history limits."""

    enabled: bool = False
    history_limit: int | None = Field(default=None, ge=0, description="groups/channels/threads")
    dm_history_limit: int | None = Field(default=None, ge=0)
    dms: dict[str, HistoryOverride] = Field(default_factory=dict)
    groups: dict[str, HistoryOverride] = Field(default_factory=dict)
    dm_policy: DmPolicy = "pairing"
    allow_from: list[str] = Field(default_factory=list)
    # Strangers (not allowed to talk: not in allow_from, not paired) must not cost sends.
    refusal_interval_seconds: int = Field(
        default=600, ge=0,
        description="at most one refusal (or pairing-code reminder) per stranger per interval; "
        "later messages in it are not answered; 0 = every message is answered",
    )
    max_pending_pairings: int = Field(
        default=50, ge=1, le=10_000,
        description="pending pairing codes per platform at once (one per sender)",
    )
    group_allowlist: list[str] = Field(default_factory=list)
    require_mention: bool = True
    group_buffer: int = Field(default=50, ge=0)
    queue_mode: QueueMode | None = Field(
        default=None, description="messages arriving mid-turn; default: [gateway] queue_mode"
    )
    # Streaming by editing a preview message (channels that can edit: Telegram, Slack, Discord).
    stream_preview: bool = Field(
        default=False, description="show the reply as it is written, in one edited message"
    )
    stream_edit_interval_ms: int = Field(
        default=1000, ge=250, description="at most one preview edit per interval (rate limits)"
    )
    stream_min_chars: int = Field(
        default=40, ge=1, description="no preview until the reply is this long"
    )


class ConsoleSettings(ChannelSection):
    enabled: bool = True
    dm_policy: DmPolicy = "open"


class WebchatSettings(ChannelSection):
    enabled: bool = True
    dm_policy: DmPolicy = "open"


class TelegramSettings(ChannelSection):
    token: str | None = Field(default=None, repr=False)
    base_url: str | None = Field(default=None, description="a self-hosted Bot API server")
    mode: Literal["polling", "webhook"] = "polling"
    webhook_url: str | None = None
    webhook_secret: str | None = Field(default=None, repr=False)


class SlackSettings(ChannelSection):
    bot_token: str | None = Field(default=None, repr=False)
    app_token: str | None = Field(default=None, repr=False)
    signing_secret: str | None = Field(default=None, repr=False)
    mode: Literal["socket", "http"] = "socket"
    base_url: str | None = None
    channels: dict[str, HistoryOverride] = Field(default_factory=dict)
    reply_in_thread: bool = Field(
        default=True,
        description="answer a top-level channel mention in a thread under it (its own "
        "conversation); off: at top level, in the channel's conversation",
    )
    slash_command: str | None = Field(
        default="/gatehouse",
        pattern=r"^/[a-z0-9_-]{1,31}$",
        description="the app's slash command for the chat commands (`/gatehouse status`); "
        "create it in the Slack app; None: none",
    )


class DiscordSettings(ChannelSection):
    token: str | None = Field(default=None, repr=False)
    api_base_url: str | None = None
    gateway_url: str | None = None
    shard_count: int | None = Field(default=None, ge=1)
    shard_ids: list[int] | None = None
    channels: dict[str, HistoryOverride] = Field(default_factory=dict)
