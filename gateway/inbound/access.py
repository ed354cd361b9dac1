"""Who may talk to the agent: DM policy (pairing | allowlist | open | disabled), allow lists,
group allowlists and mention gating.

Unknown DM senders under `pairing` get an 8-character code valid for an hour (at most 3 pending
per platform); nothing they send is processed until `gatehouse pairing approve CODE`.
Unmentioned group messages are kept as context and shown to the model on the next mention.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from channels.base import InboundMessage
from gateway.config import ChannelSection, Config
from gateway.store import PairingRow, Store
from gateway.store.models import utcnow

PAIRING_TTL = timedelta(hours=1)
MAX_PENDING_PER_PLATFORM = 3
_CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: easy to read aloud

Verdict = Literal["answer", "context", "reject"]


@dataclass(frozen=True, slots=True)
class AccessDecision:
    verdict: Verdict
    reply: str | None = None
    """What to tell the sender (a pairing code, a refusal), or None to stay silent."""
    reason: str = ""


def new_code() -> str:
    return "".join(secrets.choice(_CODE_ALPHABET) for _ in range(8))


class AccessPolicy:
    def __init__(self, config: Config, store: Store) -> None:
        self.config = config
        self.store = store

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
            return AccessDecision(
                "reject",
                "Sorry, I only talk to people on my allow list.",
                reason="sender not in allow_from",
            )
        # pairing
        if latest is not None and latest.status == "denied":
            return AccessDecision("reject", reason="pairing was denied")
        now = utcnow()
        if latest is not None and latest.status == "pending":
            expires = latest.expires_at
            if expires.tzinfo is None:
                from datetime import UTC

                expires = expires.replace(tzinfo=UTC)
            if expires > now:
                return AccessDecision("reject", _pairing_text(latest.code), "pairing pending")
        pending = await self.store.pending_pairings(msg.platform)
        if len(pending) >= MAX_PENDING_PER_PLATFORM:
            return AccessDecision(
                "reject",
                "I can't take new contacts right now; please try again later.",
                reason="too many pending pairing requests",
            )
        row = await self.store.add_pairing(
            PairingRow(
                platform=msg.platform,
                sender_id=msg.sender_id,
                sender_name=msg.sender_name,
                code=new_code(),
                expires_at=now + PAIRING_TTL,
            )
        )
        return AccessDecision("reject", _pairing_text(row.code), "pairing requested")


def _pairing_text(code: str) -> str:
    return (
        f"Hi! I don't know you yet. Your pairing code is {code} (valid for one hour). "
        f"Ask the owner of this bot to run: gatehouse pairing approve {code}"
    )
