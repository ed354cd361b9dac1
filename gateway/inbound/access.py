"""Who may talk to the agent: DM policy (pairing | allowlist | open | disabled), allow lists,
group allowlists and mention gating — and what a stranger costs.

Unknown DM senders under `pairing` get an 8-character code valid for an hour; nothing they send
is processed until `gatehouse pairing approve CODE`. A sender holds one pending code at a time
(asking again re-sends it) and a platform at most `max_pending_pairings` (default 50), so a few
throwaway accounts cannot take every slot. A stranger (not allowed, not paired) is answered at
most once per `refusal_interval_seconds` (default 600): a flood costs one send per window, not
one per message. Unmentioned group messages are kept as context and shown to the model on the
next mention.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from channels.base import InboundMessage
from gateway.config import ChannelSection, Config
from gateway.store import Store
from gateway.store.models import utcnow

PAIRING_TTL = timedelta(hours=1)
MAX_TRACKED_STRANGERS = 10_000
"""Strangers whose refusal window is remembered at once (a few hundred bytes each); past it the
oldest window is forgotten, so that sender may be refused once more, early."""
_CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: easy to read aloud

Verdict = Literal["answer", "context", "reject"]


@dataclass(frozen=True, slots=True)
class AccessDecision:
    verdict: Verdict
    reply: str | None = None
    """What to tell the sender (a pairing code, a refusal), or None to stay silent."""
    reason: str = ""
    log_level: int = logging.INFO
    """How loudly to log a refusal: a flood's unanswered messages after the first are DEBUG."""


def new_code() -> str:
    return "".join(secrets.choice(_CODE_ALPHABET) for _ in range(8))


@dataclass(slots=True)
class _Window:
    ends: float
    held: int = 0


class RefusalLimiter:
    """At most one reply to each stranger per interval; the messages in between are not
    answered (and, being refused, not stored).

    In memory, per process: a restart (or another process on the same PostgreSQL database)
    may refuse a sender once more early, which costs one send — not worth a table.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        capacity: int = MAX_TRACKED_STRANGERS,
    ) -> None:
        self.clock = clock
        self.capacity = capacity
        self._windows: OrderedDict[tuple[str, str], _Window] = OrderedDict()

    def admit(self, key: tuple[str, str], interval: int, *, must: bool = False) -> int:
        """0: reply now (a window starts); else how many messages this window has held,
        this one included. `must`: a reply that is news (a new pairing code) goes anyway."""
        if interval <= 0:
            return 0
        now = self.clock()
        window = self._windows.get(key)
        if window is not None and window.ends > now and not must:
            window.held += 1
            return window.held
        self._windows.pop(key, None)
        self._forget_old(now)
        self._windows[key] = _Window(now + interval)
        return 0

    def held_before(self, key: tuple[str, str]) -> int:
        """Messages the sender's last window held (told once the next refusal goes out)."""
        window = self._windows.get(key)
        return window.held if window is not None else 0

    def remaining(self, key: tuple[str, str]) -> float:
        window = self._windows.get(key)
        return max(0.0, window.ends - self.clock()) if window is not None else 0.0

    def _forget_old(self, now: float) -> None:
        """Windows are kept in the order they started: drop the ended ones at the front, then
        the oldest while over capacity."""
        while self._windows:
            first = next(iter(self._windows.values()))
            if first.ends > now and len(self._windows) < self.capacity:
                break
            self._windows.popitem(last=False)


class AccessPolicy:
    def __init__(self, config: Config, store: Store) -> None:
        self.config = config
        self.store = store
        self.refusals = RefusalLimiter()

    def _section(self, platform: str) -> ChannelSection:
        try:
            return self.config.channels.get(platform)
        except KeyError:
            return ChannelSection()

    async def check(self, msg: InboundMessage) -> AccessDecision:
        section = self._section(msg.platform)
        if msg.is_direct:
            return await self._direct(msg, section)
        if section.group_allowlist and msg.chat_id not in section.group_allowlist:
            return AccessDecision("reject", reason=f"group {msg.chat_id} is not in group_allowlist")
        if section.require_mention and not msg.was_mentioned:
            return AccessDecision("context", reason="not mentioned: kept as context")
        return AccessDecision("answer")

    async def _direct(self, msg: InboundMessage, section: ChannelSection) -> AccessDecision:
        policy = section.dm_policy
        if policy == "open" or msg.sender_id in section.allow_from:
            return AccessDecision("answer")
        if policy == "disabled":
            return AccessDecision("reject", reason="direct messages are disabled")
        latest = await self.store.pairing_for(msg.platform, msg.sender_id)
        if latest is not None and latest.status == "approved":
            return AccessDecision("answer")
        if policy == "allowlist":
            return self._refuse(
                msg, section, "Sorry, I only talk to people on my allow list.",
                "sender not in allow_from",
            )
        # pairing
        if latest is not None and latest.status == "denied":
            return AccessDecision("reject", reason="pairing was denied")
        request = await self.store.request_pairing(
            msg.platform, msg.sender_id, msg.sender_name, code=new_code(), ttl=PAIRING_TTL,
            max_pending=section.max_pending_pairings,
        )
        if request.row is None:
            return self._refuse(
                msg, section, "I can't take new contacts right now; please try again later.",
                f"too many pending pairing requests ({section.max_pending_pairings}, "
                "max_pending_pairings)",
            )
        text = _pairing_text(request.row.code, request.row.expires_at)
        if request.issued:
            return self._refuse(msg, section, text, "pairing requested", news=True)
        return self._refuse(msg, section, text, "pairing pending")

    def _refuse(
        self, msg: InboundMessage, section: ChannelSection, reply: str, reason: str,
        *, news: bool = False,
    ) -> AccessDecision:
        """A refusal with a reply, unless this stranger was answered within the interval: then
        silence, logged once per window (the rest at DEBUG)."""
        key = (msg.platform, msg.sender_id)
        interval = section.refusal_interval_seconds
        before = self.refusals.held_before(key)
        held = self.refusals.admit(key, interval, must=news)
        if held == 0:
            if before:
                reason += f" ({before} message(s) since the last reply were not answered)"
            return AccessDecision("reject", reply, reason)
        if held == 1:
            until = datetime.now(UTC) + timedelta(seconds=self.refusals.remaining(key))
            return AccessDecision(
                "reject",
                reason=f"{reason}; answered already, so not answering this sender again until "
                f"{until:%H:%M:%S} UTC (refusal_interval_seconds = {interval})",
            )
        return AccessDecision(
            "reject", reason=f"{reason}; not answered (held {held} this window)",
            log_level=logging.DEBUG,
        )


def _pairing_text(code: str, expires_at: datetime) -> str:
    expires = expires_at if expires_at.tzinfo is not None else expires_at.replace(tzinfo=UTC)
    minutes = math.ceil((expires - utcnow()).total_seconds() / 60)
    valid = "one hour" if minutes >= 60 else f"{max(minutes, 1)} more minute(s)"
    return (
        f"Hi! I don't know you yet. Your pairing code is {code} (valid for {valid}). "
        f"Ask the owner of this bot to run: gatehouse pairing approve {code}"
    )
