"""Session keys: which conversation an inbound message belongs to.

Shapes (ARCHITECTURE.md):
  dm_scope per-channel-peer   agent:<agent>:<platform>:direct:<peer>            (default)
  dm_scope per-peer           agent:<agent>:direct:<person>
  dm_scope main               agent:<agent>:main
  dm_scope per-account-…      agent:<agent>:<platform>:<account>:direct:<peer>
  groups / channels           agent:<agent>:<platform>:group|channel:<chat>[:thread:<id>][:user:<sender>]

Every free-form part is percent-encoded (`:` and `+` included), so no id can forge a separator,
and nothing else is done to it: a part is its id, so two ids share a key only when they are the
same id. An id the store cannot hold (a NUL, an unpaired surrogate) is no key at all: the gateway
refuses the message first (`gateway.inbound.text.inbound_problem`), and `encode_part` raises, because any
storable stand-in for it would be the id of somebody else.
Under per-peer, an unlinked person is `<platform>+<id>` (the `+` is literal and can't come from an
encoded part); a linked person is the identity-link name, shared across platforms.

`parse_key` reads a key back into its parts (`KeyParts`), the exact inverse of `key_for`, so
`gatehouse context explain` can preview the limits of a conversation nobody has started yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import quote, unquote

from channels.base import InboundMessage, id_problem
from gateway.config import SessionsSection


def encode_part(value: str) -> str:
    """Percent-encode one key segment; empty strings get a visible marker ("%00", which no
    storable id encodes to: a NUL is refused). `ValueError` for an id the store cannot hold."""
    problem = id_problem(value)
    if problem is not None:
        raise ValueError(f"a session key part {problem}; the gateway refuses such ids")
    return quote(value, safe="") or "%00"


class SessionKeyError(ValueError):
    """A string that is not a session key `SessionKeyer` could have built."""


KeyScope = Literal["main", "per-peer", "per-channel-peer", "per-account-channel-peer", "group"]


@dataclass(frozen=True, slots=True)
class KeyParts:
    """A session key read back into the conversation it names (ids decoded)."""

    agent: str
    scope: KeyScope
    """The `dm_scope` that builds this shape, or "group" for groups, channels and threads."""
    chat_type: Literal["direct", "group", "channel"]
    platform: str | None = None
    """None for `dm_scope = "main"` and a linked person: whichever platform they write from."""
    account: str | None = None
    chat_id: str | None = None
    """A group's or channel's id; None for a DM (its chat id is the platform's business)."""
    thread_id: str | None = None
    user_id: str | None = None
    """A DM's peer, or the sender of a per-user group session."""
    person: str | None = None
    """The identity-link name of a linked person (per-peer)."""


def _decode(part: str, what: str, key: str) -> str:
    """One key part back to its id; only the exact form `encode_part` writes is accepted, so a
    key that is parsed is the key the gateway would file that conversation under."""
    try:
        value = "" if part == "%00" else unquote(part, errors="strict")
        canonical = encode_part(value)
    except (UnicodeDecodeError, ValueError):
        raise SessionKeyError(f"{key!r}: the {what} {part!r} is not a percent-encoded id") from None
    if canonical != part:
        raise SessionKeyError(
            f"{key!r}: the {what} {part!r} must be written {canonical!r} (ids in a key are "
            "percent-encoded; copy the key from `gatehouse sessions list`)"
        )
    return value


SHAPES = (
    "agent:<agent>:<platform>:direct:<peer>, agent:<agent>:<platform>:<account>:direct:<peer>, "
    "agent:<agent>:direct:<person>, agent:<agent>:main, "
    "agent:<agent>:<platform>:group|channel:<chat>[:thread:<id>][:user:<sender>]"
)


def parse_key(key: str) -> KeyParts:
    """The conversation `key` names (the inverse of `SessionKeyer.key_for`); `SessionKeyError`
    (saying which shapes there are) for anything `key_for` cannot have built."""
    parts = key.split(":")
    if len(parts) < 3 or parts[0] != "agent":
        raise SessionKeyError(f"{key!r} is not a session key; the shapes are: {SHAPES}")
    agent = _decode(parts[1], "agent", key)
    rest = parts[2:]
    if rest == ["main"]:
        return KeyParts(agent, "main", "direct")
    if len(rest) == 2 and rest[0] == "direct":
        person = rest[1]
        if "+" in person:
            platform, _, peer = person.partition("+")
            return KeyParts(
                agent, "per-peer", "direct", platform=_decode(platform, "platform", key),
                user_id=_decode(peer, "peer", key),
            )
        return KeyParts(agent, "per-peer", "direct", person=_decode(person, "person", key))
    if len(rest) == 3 and rest[1] == "direct":
        return KeyParts(
            agent, "per-channel-peer", "direct", platform=_decode(rest[0], "platform", key),
            user_id=_decode(rest[2], "peer", key),
        )
    if len(rest) == 4 and rest[2] == "direct":
        return KeyParts(
            agent, "per-account-channel-peer", "direct",
            platform=_decode(rest[0], "platform", key), account=_decode(rest[1], "account", key),
            user_id=_decode(rest[3], "peer", key),
        )
    if len(rest) >= 3 and rest[1] in ("group", "channel"):
        kind: Literal["group", "channel"] = "channel" if rest[1] == "channel" else "group"
        tail = rest[3:]
        found: dict[str, str] = {}
        for label in ("thread", "user"):
            if tail[:1] == [label] and len(tail) >= 2:
                found[label] = _decode(tail[1], label, key)
                tail = tail[2:]
        if not tail:
            return KeyParts(
                agent, "group", kind, platform=_decode(rest[0], "platform", key),
                chat_id=_decode(rest[2], "chat id", key), thread_id=found.get("thread"),
                user_id=found.get("user"),
            )
    raise SessionKeyError(f"{key!r} is not a session key; the shapes are: {SHAPES}")


class SessionKeyer:
    """Builds session keys from `[sessions]` settings (dm_scope, groups, identity links)."""

    def __init__(self, settings: SessionsSection, agent: str = "main") -> None:
        self.settings = settings
        self.prefix = f"agent:{encode_part(agent)}"
        self._links: dict[str, str] = {
            ident: person for person, ids in settings.identity_links.items() for ident in ids
        }

    def person(self, platform: str, sender_id: str) -> str:
        """The person across platforms: the identity-link name, else `<platform>+<id>`."""
        linked = self._links.get(f"{platform}:{sender_id}")
        if linked is not None:
            return encode_part(linked)
        return f"{encode_part(platform)}+{encode_part(sender_id)}"

    def linked_ids(self, person: str) -> list[tuple[str, str]]:
        """The (platform, user id) pairs `[sessions] identity_links` joins under `person`."""
        ids = self.settings.identity_links.get(person, [])
        return [(p, u) for p, _, u in (ident.partition(":") for ident in ids)]

    def key_for(self, msg: InboundMessage) -> str:
        platform = encode_part(msg.platform)
        if msg.is_direct:
            scope = self.settings.dm_scope
            if scope == "main":
                return f"{self.prefix}:main"
            if scope == "per-peer":
                return f"{self.prefix}:direct:{self.person(msg.platform, msg.sender_id)}"
            peer = encode_part(msg.sender_id)
            if scope == "per-channel-peer":
                return f"{self.prefix}:{platform}:direct:{peer}"
            return f"{self.prefix}:{platform}:{encode_part(msg.account)}:direct:{peer}"
        kind = "channel" if msg.chat_type == "channel" else "group"
        key = f"{self.prefix}:{platform}:{kind}:{encode_part(msg.chat_id)}"
        if msg.thread_id is not None:
            key += f":thread:{encode_part(msg.thread_id)}"
        if self.settings.per_user_in_groups:
            key += f":user:{encode_part(msg.sender_id)}"
        return key
