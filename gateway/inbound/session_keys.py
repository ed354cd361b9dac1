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
"""

from __future__ import annotations

from urllib.parse import quote

from channels.base import InboundMessage, id_problem
from gateway.config import SessionsSection


def encode_part(value: str) -> str:
    """Percent-encode one key segment; empty strings get a visible marker ("%00", which no
    storable id encodes to: a NUL is refused). `ValueError` for an id the store cannot hold."""
    problem = id_problem(value)
    if problem is not None:
        raise ValueError(f"a session key part {problem}; the gateway refuses such ids")
    return quote(value, safe="") or "%00"


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
