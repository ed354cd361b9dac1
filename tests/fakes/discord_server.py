"""A fake Discord (REST + gateway websocket) for driving the real discord.py offline.

The fake runs a real aiohttp server on ``127.0.0.1`` with a random port. Point discord.py at it
(``DiscordSettings(api_base_url=fake.api_base_url, gateway_url=fake.gateway_url)``, which sets
``discord.http.Route.BASE`` and ``discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY``) and the
genuine client logs in, connects and receives real ``Message`` objects::

    async with FakeDiscord() as fake:
        channel = DiscordChannel(DiscordSettings(token=fake.token, api_base_url=...,
                                                 gateway_url=...), guild_ready_timeout=0.05)
        await channel.start(collector)
        fake.dm_message("hello")                   # queued MESSAGE_CREATE dispatch
        [call] = await fake.wait_for_call("POST", f"/channels/{fake.text_channel_id}/messages")

REST (paths are recorded relative to the API root, without ``/api/v10``):

- ``GET /users/@me`` (401 for a token other than ``fake.token``), ``GET /oauth2/applications/@me``,
  ``GET /gateway``, ``GET /gateway/bot`` (used by ``AutoShardedClient``);
- ``GET /channels/{id}`` for the guild text channel, the thread and every DM channel a helper
  created; 404 ``Unknown Channel`` otherwise;
- ``POST /channels/{id}/messages`` answers a message authored by the bot;
  ``POST /channels/{id}/typing`` answers 204.
- ``PATCH /channels/{id}/messages/{mid}`` edits a message the bot sent there (``messages`` holds
  each as it is now); an unknown one, or one removed with ``delete_message``, answers 404
  ``Unknown Message`` (code 10008). ``fake.rate_limit_next_edit(...)`` makes the next edit(s)
  answer 429 like ``rate_limit_next_post``.
- ``fake.rate_limit_next_post(times=1, retry_after=0.05)`` makes the next ``times``
  ``POST /channels/{id}/messages`` answer 429 the way Discord does (body ``{"message": "You are
  being rate limited.", "retry_after": ..., "global": false}``, ``X-RateLimit-*`` and
  ``Retry-After`` headers, and ``Via`` — without it discord.py takes a 429 for a Cloudflare ban
  and gives up at once; pass ``via=False`` to get exactly that). Nothing is sent for a 429.
- ``fake.listeners`` are called with every `RecordedCall` as it is answered (benchmarks use
  this to time replies); each call also carries ``at`` (``time.perf_counter()`` on arrival).
- Application commands: ``PUT /applications/{app}/commands`` (a bulk overwrite, what
  ``CommandTree.sync`` sends) stores and answers them (``app_commands`` holds the last set);
  ``slash_command(name, options)`` dispatches an ``INTERACTION_CREATE`` for one (in a DM, or the
  guild text channel with ``dm=False``); ``POST /interactions/{id}/{token}/callback`` (the
  deferral), ``POST /webhooks/{app}/{token}`` (follow-ups) and ``PATCH
  /webhooks/{app}/{token}/messages/{id}`` are answered without the bot token, as on Discord.

Attachments: ``attachment(filename, data)`` returns an attachment payload (for ``attachments=``
of a message helper) whose ``url`` is served by ``GET /attachments/<id>/<filename>`` on the fake
(the channel fetches it on discord.py's session); ``attachment_downloads`` lists the paths
served. ``attachment(served=…)`` answers with a `tests.fakes.file_bodies.Served` instead of the
bytes (a 300 MB stream, a redirect, an error status, a stall).

Every JSON answer carries ``Content-Type: application/json`` exactly (discord.py ignores bodies
with a charset suffix). Anything else is a 404 with a Discord-shaped error body, and is recorded.

Gateway at ``/gw`` and ``/gw/``: HELLO → (client) IDENTIFY → READY (bot user, session id,
``resume_gateway_url``, the guild as unavailable, and ``shard`` echoed from IDENTIFY) →
GUILD_CREATE (a guild with a text channel, a thread, the bot's managed role and the bot member)
→ queued dispatches in order. With ``FakeDiscord(shard_count=N, guild_shard=k)`` the guild lives on
shard ``k``: only a session that identified as shard ``k`` of ``N`` gets it and its messages, DMs go
to shard 0 (as on Discord), and an IDENTIFY with another shard count is closed with 4011. Heartbeats (op 1) are ACKed (op 11); a RESUME gets RESUMED.
Frames are sent as plain text JSON (no zlib), which discord.py accepts.

Snowflakes are real-looking (18–19 digits, time based): discord.py's mention parsing needs 17+.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypeAlias

from aiohttp import WSMsgType, web

from tests.fakes.file_bodies import Served
from tests.fakes.loopback import LoopbackServer

__all__ = ["DISCORD_EPOCH_MS", "FakeDiscord", "RecordedCall", "snowflake"]

JSON: TypeAlias = dict[str, Any]

DISCORD_EPOCH_MS = 1_420_070_400_000
API_PREFIX = "/api/v10"

_OP_DISPATCH = 0
_OP_HEARTBEAT = 1
_OP_IDENTIFY = 2
_OP_RESUME = 6
_OP_HELLO = 10
_OP_HEARTBEAT_ACK = 11

_counter = itertools.count()


def snowflake() -> str:
    """A fresh, unique, time-based snowflake (19 digits in 2026)."""
    ms = int(time.time() * 1000) - DISCORD_EPOCH_MS
    return str((ms << 22) | (next(_counter) & 0x3FFFFF))


def snowflake_on_shard(shard: int, shard_count: int) -> str:
    """A fresh snowflake whose guild would live on ``shard``: ``(id >> 22) % shard_count``."""
    while True:
        candidate = snowflake()
        if (int(candidate) >> 22) % shard_count == shard:
            return candidate
        time.sleep(0.001)  # the next millisecond is the next shard


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


def _json(data: Any, status: int = 200) -> web.Response:
    # Built by hand: web.json_response adds "; charset=utf-8", which discord.py rejects.
    return web.Response(
        status=status, body=json.dumps(data).encode(), headers={"Content-Type": "application/json"}
    )


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """One REST request: ``path`` is relative to the API root (``/channels/1/messages``)."""

    method: str
    path: str
    json: Any = None
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 200
    at: float = field(default_factory=time.perf_counter)


class FakeDiscord(LoopbackServer):
    """A scriptable fake of Discord's REST API and gateway; see the module docstring."""

    def __init__(
        self,
        *,
        token: str = "fake-bot-token",
        bot_name: str = "gatehouse",
        heartbeat_interval_ms: int = 45_000,
        host: str = "127.0.0.1",
        shard_count: int = 1,
        guild_shard: int = 0,
    ) -> None:
        self.token = token
        self.host = host
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.shard_count = shard_count
        """What ``GET /gateway/bot`` recommends; dispatches go to the shard Discord would use:
        the guild's ``(guild_id >> 22) % shard_count``, and shard 0 for DMs."""
        self.bot_id = snowflake()
        self.bot_name = bot_name
        self.app_id = self.bot_id
        self.owner_id = snowflake()
        self.guild_id = snowflake_on_shard(guild_shard, shard_count)
        self.text_channel_id = snowflake()
        self.thread_id = snowflake()
        self.bot_role_id = snowflake()
        self.everyone_role_id = self.guild_id
        self.alice = self.user(snowflake(), "alice", global_name="Alice A.")
        self.bob = self.user(snowflake(), "bob")
        self.other_bot = self.user(snowflake(), "otherbot", bot=True)
        self.bot_user = self.user(self.bot_id, bot_name, bot=True)
        self.dm_channels: dict[str, JSON] = {}
        """DM channel id -> channel payload (created by ``dm_message``)."""
        self.app_commands: list[JSON] = []
        """The application commands the bot registered last (``PUT .../commands``)."""

        self.calls: list[RecordedCall] = []
        self.sent_messages: list[JSON] = []
        """Payloads of the messages the fake answered ``POST /channels/{id}/messages`` with."""
        self.messages: dict[str, JSON] = {}
        """Message id -> each message the bot sent, as it is now (edits applied)."""
        self.identifies: list[JSON] = []
        self.gateway_frames: list[JSON] = []
        """Every frame the client sent on the gateway (heartbeats included)."""
        self.connections = 0
        """Gateway websockets currently open."""
        self.listeners: list[Callable[[RecordedCall], None]] = []
        """Called with each REST call (after it is answered and recorded)."""
        self._rate_limits: list[tuple[float, bool, bool]] = []
        self._edit_rate_limits: list[tuple[float, bool, bool]] = []

        self._cond = asyncio.Condition()
        self._outboxes: dict[int, asyncio.Queue[tuple[str, JSON]]] = {
            shard: asyncio.Queue() for shard in range(shard_count)
        }
        self._session_shards: dict[str, int] = {}
        self._sockets: set[web.WebSocketResponse] = set()
        self.attachment_files: dict[str, tuple[bytes, str]] = {}
        """URL path -> (bytes, content type) of each file `attachment` made."""
        self.attachment_downloads: list[str] = []
        self.attachment_answers: dict[str, Served] = {}
        """URL path -> what it answers instead of the bytes (``attachment(served=…)``)."""

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/gw", self._handle_gateway)
        app.router.add_get("/gw/", self._handle_gateway)
        app.router.add_route("*", API_PREFIX + "/{tail:.*}", self._handle_rest)
        app.router.add_get("/attachments/{tail:.*}", self._handle_attachment)
        await self._listen(app, shutdown_timeout=1.0)

    async def stop(self) -> None:
        for ws in list(self._sockets):
            with contextlib.suppress(Exception):
                await ws.close(code=1001, message=b"fake stopping")
        await self._close()

    @property
    def api_base_url(self) -> str:
        """``http://127.0.0.1:PORT/api/v10`` — the value for ``discord.http.Route.BASE``."""
        return f"http://{self.host}:{self.port}{API_PREFIX}"

    @property
    def gateway_url(self) -> str:
        """``ws://127.0.0.1:PORT/gw/`` — the value for ``DiscordWebSocket.DEFAULT_GATEWAY``."""
        return f"ws://{self.host}:{self.port}/gw/"

    # -- waiting ------------------------------------------------------------------------------

    async def _wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:  # noqa: ASYNC109
        try:
            async with asyncio.timeout(timeout), self._cond:
                await self._cond.wait_for(predicate)
        except TimeoutError:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}") from None

    def calls_to(self, method: str, path_prefix: str) -> list[RecordedCall]:
        return [
            c for c in self.calls if c.method == method.upper() and c.path.startswith(path_prefix)
        ]

    async def wait_for_call(
        self,
        method: str,
        path_prefix: str,
        n: int = 1,
        timeout: float = 5.0,  # noqa: ASYNC109
        where: Callable[[RecordedCall], bool] | None = None,
    ) -> list[RecordedCall]:
        """Wait until ``n`` calls matching ``method``, ``path_prefix`` (and ``where``) arrived;
        return them all."""

        def matching() -> list[RecordedCall]:
            return [c for c in self.calls_to(method, path_prefix) if where is None or where(c)]

        await self._wait(
            lambda: len(matching()) >= n,
            timeout,
            f"{n} {method} {path_prefix} call(s) (got {len(matching())})",
        )
        return matching()

    async def wait_for_disconnect(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109
        """Wait until no gateway websocket is open."""
        await self._wait(lambda: self.connections == 0, timeout, "the gateway to disconnect")

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    # -- payload builders ---------------------------------------------------------------------

    @staticmethod
    def user(
        user_id: str, username: str, *, global_name: str | None = None, bot: bool = False
    ) -> JSON:
        data: JSON = {
            "id": user_id,
            "username": username,
            "global_name": global_name,
            "discriminator": "0",
            "avatar": None,
            "public_flags": 0,
        }
        if bot:
            data["bot"] = True
        return data

    def member(
        self, user: JSON, *, nick: str | None = None, roles: list[str] | None = None
    ) -> JSON:
        return {
            "user": user,
            "nick": nick,
            "roles": roles or [],
            "joined_at": "2024-01-01T00:00:00+00:00",
            "deaf": False,
            "mute": False,
            "flags": 0,
        }

    def text_channel(self) -> JSON:
        return {
            "id": self.text_channel_id,
            "type": 0,
            "guild_id": self.guild_id,
            "name": "general",
            "position": 0,
            "permission_overwrites": [],
            "nsfw": False,
            "parent_id": None,
            "topic": None,
            "last_message_id": None,
            "rate_limit_per_user": 0,
        }

    def thread(self) -> JSON:
        return {
            "id": self.thread_id,
            "type": 11,
            "guild_id": self.guild_id,
            "parent_id": self.text_channel_id,
            "owner_id": self.alice["id"],
            "name": "a thread",
            "last_message_id": None,
            "rate_limit_per_user": 0,
            "message_count": 0,
            "member_count": 2,
            "flags": 0,
            "thread_metadata": {
                "archived": False,
                "auto_archive_duration": 1440,
                "archive_timestamp": "2024-01-01T00:00:00+00:00",
                "locked": False,
            },
        }

    def guild(self) -> JSON:
        everyone = {
            "id": self.everyone_role_id,
            "name": "@everyone",
            "color": 0,
            "hoist": False,
            "position": 0,
            "permissions": "1071698660929",
            "managed": False,
            "mentionable": False,
            "flags": 0,
        }
        bot_role = {
            **everyone,
            "id": self.bot_role_id,
            "name": self.bot_name,
            "position": 1,
            "managed": True,
            "tags": {"bot_id": self.bot_id},
        }
        return {
            "id": self.guild_id,
            "name": "Fake Guild",
            "icon": None,
            "owner_id": self.owner_id,
            "unavailable": False,
            "member_count": 3,
            "large": False,
            "features": [],
            "roles": [everyone, bot_role],
            "emojis": [],
            "stickers": [],
            "channels": [self.text_channel()],
            "threads": [self.thread()],
            "members": [self.member(self.bot_user, roles=[self.bot_role_id])],
            "voice_states": [],
            "presences": [],
            "stage_instances": [],
            "guild_scheduled_events": [],
            "soundboard_sounds": [],
            "joined_at": "2024-01-01T00:00:00+00:00",
            "premium_tier": 0,
            "preferred_locale": "en-US",
            "verification_level": 0,
            "default_message_notifications": 0,
            "explicit_content_filter": 0,
            "mfa_level": 0,
            "nsfw_level": 0,
            "system_channel_flags": 0,
        }

    def _partial_member(self, user_id: str) -> JSON:
        member = self.member({}, roles=[self.bot_role_id] if user_id == self.bot_id else [])
        member.pop("user")
        return member

    def message(
        self,
        content: str,
        *,
        channel_id: str,
        author: JSON,
        guild: bool,
        mentions: Sequence[JSON] = (),
        mention_roles: Sequence[str] = (),
        referenced: JSON | None = None,
        attachments: Sequence[JSON] = (),
        type_: int | None = None,
    ) -> JSON:
        """A MESSAGE_CREATE payload (also the shape of a REST message)."""
        data: JSON = {
            "id": snowflake(),
            "channel_id": channel_id,
            "author": author,
            "content": content,
            "timestamp": _now_iso(),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": [
                {**m, "member": self._partial_member(m["id"])} if guild else dict(m)
                for m in mentions
            ],
            "mention_roles": list(mention_roles),
            "attachments": list(attachments),
            "embeds": [],
            "pinned": False,
            "type": type_ if type_ is not None else (19 if referenced else 0),
            "flags": 0,
            "components": [],
        }
        if guild:
            data["guild_id"] = self.guild_id
            data["member"] = self._partial_member(author["id"])
        if referenced is not None:
            data["message_reference"] = {
                "type": 0,
                "message_id": referenced["id"],
                "channel_id": referenced["channel_id"],
                **({"guild_id": self.guild_id} if guild else {}),
            }
            data["referenced_message"] = referenced
        return data

    # -- dispatch helpers ---------------------------------------------------------------------

    def dispatch(self, event: str, data: JSON) -> JSON:
        """Queue a gateway dispatch for its shard; sent in order once a session of that shard
        is READY. Returns ``data``."""
        guild_id = data.get("guild_id")
        shard = (int(guild_id) >> 22) % self.shard_count if guild_id else 0
        self._outboxes[shard].put_nowait((event, data))
        return data

    def dm_message(self, text: str, *, author: JSON | None = None, **kw: Any) -> JSON:
        """A direct message to the bot; the DM channel is created (and served) on first use."""
        author = author or self.alice
        channel_id = self.dm_channel(author)["id"]
        return self.dispatch(
            "MESSAGE_CREATE",
            self.message(text, channel_id=channel_id, author=author, guild=False, **kw),
        )

    def slash_command(
        self,
        name: str,
        options: dict[str, str] | None = None,
        *,
        dm: bool = True,
        author: JSON | None = None,
    ) -> JSON:
        """Someone runs the bot's application command ``/name`` (string ``options``), in a DM
        with the bot or in the guild text channel: an ``INTERACTION_CREATE`` dispatch."""
        author = author or self.alice
        interaction_id = snowflake()
        data: JSON = {"id": snowflake(), "name": name, "type": 1}
        if options:
            data["options"] = [{"name": k, "type": 3, "value": v} for k, v in options.items()]
        payload: JSON = {
            "id": interaction_id,
            "application_id": self.app_id,
            "type": 2,
            "data": data,
            "token": f"interaction-token-{interaction_id}",
            "version": 1,
            "locale": "en-US",
            "app_permissions": "0",
            "entitlements": [],
            "authorizing_integration_owners": {},
            "attachment_size_limit": 8_388_608,
        }
        if dm:
            channel = self.dm_channel(author)
            payload.update(channel_id=channel["id"], channel=channel, user=author, context=1)
        else:
            member = {**self.member(author), "permissions": "0"}
            payload.update(
                guild_id=self.guild_id, channel_id=self.text_channel_id,
                channel=self.text_channel(), member=member, context=0,
            )
        return self.dispatch("INTERACTION_CREATE", payload)

    def dm_channel(self, author: JSON) -> JSON:
        """The DM channel between `author` and the bot (created, and served, on first use)."""
        channel_id = next(
            (
                cid
                for cid, ch in self.dm_channels.items()
                if ch["recipients"][0]["id"] == author["id"]
            ),
            None,
        )
        if channel_id is None:
            channel_id = snowflake()
            self.dm_channels[channel_id] = {
                "id": channel_id,
                "type": 1,
                "recipients": [author],
                "last_message_id": None,
            }
        return self.dm_channels[channel_id]

    def guild_message(
        self,
        text: str,
        *,
        mention: bool = False,
        author: JSON | None = None,
        channel_id: str | None = None,
        **kw: Any,
    ) -> JSON:
        """A message in the guild text channel; ``mention=True`` prefixes ``<@bot>``."""
        if mention:
            text = f"<@{self.bot_id}> {text}"
            kw["mentions"] = [*kw.get("mentions", []), self.bot_user]
        return self.dispatch(
            "MESSAGE_CREATE",
            self.message(
                text,
                channel_id=channel_id or self.text_channel_id,
                author=author or self.alice,
                guild=True,
                **kw,
            ),
        )

    def role_mention_message(self, text: str, *, author: JSON | None = None) -> JSON:
        """A guild message mentioning the bot's managed role (``<@&role>``)."""
        return self.guild_message(
            f"<@&{self.bot_role_id}> {text}", author=author, mention_roles=[self.bot_role_id]
        )

    def bot_message_payload(self, text: str, *, channel_id: str | None = None) -> JSON:
        """A message the bot wrote earlier (not dispatched), e.g. to reply to."""
        return self.message(
            text, channel_id=channel_id or self.text_channel_id, author=self.bot_user, guild=True
        )

    def reply_to_bot(self, text: str, *, author: JSON | None = None) -> JSON:
        """A guild reply (type 19) to an earlier bot message, without an explicit mention."""
        earlier = self.bot_message_payload("an earlier answer")
        return self.guild_message(text, author=author, referenced=earlier)

    def thread_message(
        self, text: str, *, mention: bool = False, author: JSON | None = None
    ) -> JSON:
        """A message in the guild thread (whose parent is the text channel)."""
        return self.guild_message(text, mention=mention, author=author, channel_id=self.thread_id)

    def own_message(self, text: str) -> JSON:
        """A message authored by the bot itself (a client must ignore it)."""
        return self.guild_message(text, author=self.bot_user)

    def attachment(
        self,
        filename: str,
        data: bytes,
        *,
        content_type: str | None = None,
        size: int | None = None,
        served: Served | None = None,
    ) -> JSON:
        """An attachment payload whose ``url`` this fake serves (``size``: what Discord reports,
        by default the length of ``data``; ``served``: the answer instead of `data`)."""
        attachment_id = snowflake()
        path = f"/attachments/{attachment_id}/{filename}"
        self.attachment_files[path] = (data, content_type or "application/octet-stream")
        if served is not None:
            self.attachment_answers[path] = served
        url = f"http://{self.host}:{self.port}{path}"
        payload: JSON = {
            "id": attachment_id,
            "filename": filename,
            "size": len(data) if size is None else size,
            "url": url,
            "proxy_url": url,
        }
        if content_type is not None:
            payload["content_type"] = content_type
        return payload

    async def _handle_attachment(self, request: web.Request) -> web.StreamResponse:
        found = self.attachment_files.get(request.path)
        async with self._cond:
            self.attachment_downloads.append(request.path)
            self._cond.notify_all()
        if found is None:
            return web.Response(status=404, text="Not Found")
        served = self.attachment_answers.get(request.path)
        if served is not None:
            return await served.respond(request)
        data, content_type = found
        return web.Response(body=data, content_type=content_type)

    # -- REST ---------------------------------------------------------------------------------

    async def _handle_rest(self, request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info["tail"]
        body: Any = None
        raw = await request.read()
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode(errors="replace")
        call = RecordedCall(
            method=request.method,
            path=path,
            json=body,
            query=dict(request.query),
            headers={k.lower(): v for k, v in request.headers.items()},
        )
        response = self._answer(call)
        if response.status != call.status:
            call = replace(call, status=response.status)
        async with self._cond:
            self.calls.append(call)
            self._cond.notify_all()
        for listener in list(self.listeners):
            listener(call)
        return response

    def rate_limit_next_post(
        self,
        times: int = 1,
        *,
        retry_after: float = 0.05,
        global_: bool = False,
        via: bool = True,
    ) -> None:
        """Answer the next ``times`` ``POST /channels/{id}/messages`` with a 429."""
        self._rate_limits.extend([(retry_after, global_, via)] * times)

    def rate_limit_next_edit(
        self,
        times: int = 1,
        *,
        retry_after: float = 0.05,
        global_: bool = False,
        via: bool = True,
    ) -> None:
        """Answer the next ``times`` ``PATCH /channels/{id}/messages/{mid}`` with a 429."""
        self._edit_rate_limits.extend([(retry_after, global_, via)] * times)

    def delete_message(self, message_id: str) -> None:
        """Someone deleted a message the bot sent: editing it answers 404 Unknown Message."""
        self.messages.pop(message_id, None)

    def _rate_limited(self, retry_after: float, global_: bool, via: bool) -> web.Response:
        headers = {
            "Content-Type": "application/json",
            "Retry-After": str(max(1, math.ceil(retry_after))),
            "X-RateLimit-Limit": "5",
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset": f"{time.time() + retry_after:.3f}",
            "X-RateLimit-Reset-After": f"{retry_after:.3f}",
            "X-RateLimit-Bucket": "fake-messages-bucket",
            "X-RateLimit-Scope": "shared" if not global_ else "global",
        }
        if global_:
            headers["X-RateLimit-Global"] = "true"
        if via:
            headers["Via"] = "1.1 google"
        body = {
            "message": "You are being rate limited.",
            "retry_after": retry_after,
            "global": global_,
        }
        return web.Response(status=429, body=json.dumps(body).encode(), headers=headers)

    def _answer(self, call: RecordedCall) -> web.Response:
        parts = call.path.strip("/").split("/")
        method = call.method
        if parts[0] in ("interactions", "webhooks"):  # the interaction token authorizes these
            return self._answer_interaction(call, parts)
        if call.headers.get("authorization") != f"Bot {self.token}":
            return _json({"message": "401: Unauthorized", "code": 0}, 401)
        if method == "GET" and parts == ["users", "@me"]:
            return _json(self.bot_user)
        if method == "GET" and parts == ["oauth2", "applications", "@me"]:
            return _json(
                {
                    "id": self.app_id,
                    "name": self.bot_name,
                    "description": "",
                    "icon": None,
                    "bot_public": True,
                    "bot_require_code_grant": False,
                    "owner": self.user(self.owner_id, "owner"),
                    "verify_key": "0" * 64,
                    "flags": 0,
                }
            )
        if method == "PUT" and parts == ["applications", self.app_id, "commands"]:
            self.app_commands = [
                {
                    **command,
                    "id": snowflake(),
                    "application_id": self.app_id,
                    "version": snowflake(),
                    "type": command.get("type", 1),
                }
                for command in call.json or []
            ]
            return _json(self.app_commands)
        if method == "GET" and parts == ["gateway"]:
            return _json({"url": self.gateway_url.rstrip("/")})
        if method == "GET" and parts == ["gateway", "bot"]:
            return _json(
                {
                    "url": self.gateway_url.rstrip("/"),
                    "shards": self.shard_count,
                    "session_start_limit": {
                        "total": 1000,
                        "remaining": 999,
                        "reset_after": 0,
                        "max_concurrency": 1,
                    },
                }
            )
        if len(parts) >= 2 and parts[0] == "channels":
            channel_id = parts[1]
            channel = self._channel(channel_id)
            if channel is None:
                return _json({"message": "Unknown Channel", "code": 10003}, 404)
            if method == "GET" and len(parts) == 2:
                return _json(channel)
            if method == "POST" and parts[2:] == ["typing"]:
                return web.Response(status=204)
            if method == "POST" and parts[2:] == ["messages"] and isinstance(call.json, dict):
                if self._rate_limits:
                    return self._rate_limited(*self._rate_limits.pop(0))
                sent = self.message(
                    call.json.get("content") or "",
                    channel_id=channel_id,
                    author=self.bot_user,
                    guild="guild_id" in channel,
                )
                if call.json.get("message_reference"):
                    ref = dict(call.json["message_reference"])
                    sent["message_reference"] = {**ref, "type": 0}
                    sent["type"] = 19
                self.sent_messages.append(sent)
                self.messages[sent["id"]] = sent
                return _json(sent)
            if method == "PATCH" and parts[2:3] == ["messages"] and len(parts) == 4:
                if self._edit_rate_limits:
                    return self._rate_limited(*self._edit_rate_limits.pop(0))
                edited = self.messages.get(parts[3])
                if edited is None or edited["channel_id"] != channel_id:
                    return _json({"message": "Unknown Message", "code": 10008}, 404)
                if isinstance(call.json, dict) and "content" in call.json:
                    edited["content"] = call.json["content"] or ""
                edited["edited_timestamp"] = _now_iso()
                return _json(edited)
        return _json({"message": "404: Not Found", "code": 0}, 404)

    def _answer_interaction(self, call: RecordedCall, parts: list[str]) -> web.Response:
        body = call.json if isinstance(call.json, dict) else {}
        if call.method == "POST" and parts[0] == "interactions" and parts[3:] == ["callback"]:
            return _json(
                {
                    "interaction": {
                        "id": parts[1],
                        "type": 2,
                        "response_message_loading": body.get("type") == 5,
                        "response_message_ephemeral": False,
                    }
                }
            )
        if parts[0] == "webhooks" and len(parts) >= 3 and parts[1] == self.app_id:
            if call.method == "POST" and len(parts) == 3:  # a follow-up message
                sent = self.message(
                    body.get("content") or "", channel_id=self.text_channel_id,
                    author=self.bot_user, guild=False,
                )
                sent["webhook_id"] = self.app_id
                self.messages[sent["id"]] = sent
                return _json(sent)
            if call.method == "PATCH" and parts[3:4] == ["messages"]:
                edited = self.message(
                    body.get("content") or "", channel_id=self.text_channel_id,
                    author=self.bot_user, guild=False,
                )
                return _json(edited)
        return _json({"message": "Unknown Webhook", "code": 10015}, 404)

    def _channel(self, channel_id: str) -> JSON | None:
        if channel_id == self.text_channel_id:
            return self.text_channel()
        if channel_id == self.thread_id:
            return self.thread()
        return self.dm_channels.get(channel_id)

    # -- gateway ------------------------------------------------------------------------------

    async def _handle_gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._sockets.add(ws)
        self.connections += 1
        await self._notify()
        seq = itertools.count(1)
        pump: asyncio.Task[None] | None = None

        async def send_dispatch(event: str, data: JSON) -> None:
            await ws.send_str(
                json.dumps({"op": _OP_DISPATCH, "t": event, "s": next(seq), "d": data})
            )

        async def pump_outbox(shard: int) -> None:
            outbox = self._outboxes[shard]
            while True:
                event, data = await outbox.get()
                await send_dispatch(event, data)

        try:
            await ws.send_str(
                json.dumps(
                    {
                        "op": _OP_HELLO,
                        "d": {"heartbeat_interval": self.heartbeat_interval_ms},
                        "s": None,
                        "t": None,
                    }
                )
            )
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                frame = json.loads(msg.data)
                async with self._cond:
                    self.gateway_frames.append(frame)
                    self._cond.notify_all()
                op = frame.get("op")
                if op == _OP_HEARTBEAT:
                    await ws.send_str(json.dumps({"op": _OP_HEARTBEAT_ACK, "d": None}))
                elif op == _OP_IDENTIFY:
                    identify = frame.get("d") or {}
                    async with self._cond:
                        self.identifies.append(identify)
                        self._cond.notify_all()
                    shard, count = identify.get("shard") or (0, 1)
                    if count != self.shard_count:
                        await ws.close(code=4011, message=b"Sharding required.")
                        break
                    guild_here = (int(self.guild_id) >> 22) % count == shard
                    session_id = f"fake-session-{snowflake()}"
                    self._session_shards[session_id] = shard
                    ready: JSON = {
                        "v": 10,
                        "user": self.bot_user,
                        "guilds": [{"id": self.guild_id, "unavailable": True}] if guild_here else [],
                        "session_id": session_id,
                        "resume_gateway_url": self.gateway_url,
                        "application": {"id": self.app_id, "flags": 0},
                        "private_channels": [],
                        "relationships": [],
                    }
                    if "shard" in identify:
                        ready["shard"] = identify["shard"]
                    await send_dispatch("READY", ready)
                    if guild_here:
                        await send_dispatch("GUILD_CREATE", self.guild())
                    if pump is None:
                        pump = asyncio.create_task(pump_outbox(shard))
                elif op == _OP_RESUME:
                    await send_dispatch("RESUMED", {})
                    session = str((frame.get("d") or {}).get("session_id"))
                    if pump is None:
                        pump = asyncio.create_task(pump_outbox(self._session_shards.get(session, 0)))
        finally:
            if pump is not None:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
            self._sockets.discard(ws)
            self.connections -= 1
            await self._notify()
        return ws
