"""What the webchat page shows of a user's conversation: `GET /api/history`.

The session is the one this user's own messages go to (the session key the gateway gives a
webchat direct message from `user_id`), never one named by the request. The page shows the
messages after the latest reset (`/new`: a boundary, nothing deleted) -- a summary compaction
hides nothing from it -- at most `limit` of them, newest last. Tool results and tool-call-only
steps are left out; a message's content is text (image parts are named, not sent).

With ``[sessions] dm_scope = "main"`` every direct chat on every platform shares one session:
its history is other people's too, so none is shown (``shared`` is true).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from channels.base import InboundMessage
from gateway.app import Gateway
from gateway.store.models import MessageRow
from gateway.turn.history import is_reset

HISTORY_LIMIT = 50
"""Messages the page asks for when it loads."""
MAX_HISTORY_LIMIT = 200


@dataclass(frozen=True, slots=True)
class ChatLine:
    seq: int
    role: str  # "user" or "assistant"
    text: str
    status: str | None
    message_id: str | None  # the page's own id for a message it sent (webchat, this user)
    at: str  # ISO 8601, UTC

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq, "role": self.role, "text": self.text, "status": self.status,
            "message_id": self.message_id, "at": self.at,
        }


@dataclass(frozen=True, slots=True)
class ChatHistory:
    session_key: str
    shared: bool
    busy: bool
    """A turn of this session is running (or due) in this process."""
    reset_seq: int
    """The latest reset's last seq: nothing at or before it is shown (0: never reset)."""
    last_seq: int
    """The newest seq the session has given out (0: no session yet)."""
    messages: list[ChatLine] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "session_key": self.session_key, "shared": self.shared, "busy": self.busy,
            "reset_seq": self.reset_seq, "last_seq": self.last_seq,
            "messages": [m.to_json() for m in self.messages],
        }


def text_of(content: Any) -> str:
    """A message's content as text: a string as it is, content parts joined (an image part
    as "[image]"), anything else empty."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif part.get("type") == "image_url":
            parts.append("[image]")
    return "\n".join(parts)


def _line(row: MessageRow, platform: str, user_id: str) -> ChatLine | None:
    text = text_of(row.content)
    if row.seq is None or not text.strip():
        return None
    own = row.role == "user" and row.platform == platform and row.chat_id == user_id
    return ChatLine(
        seq=row.seq,
        role=row.role,
        text=text,
        status=row.status,
        message_id=row.platform_message_id if own else None,
        at=row.created_at.isoformat(),
    )


async def chat_history(
    gateway: Gateway, platform: str, user_id: str, *, after: int = 0, limit: int = HISTORY_LIMIT
) -> ChatHistory:
    """The newest `limit` messages after seq `after` (and after the latest reset) of the
    session `user_id`'s direct messages on `platform` go to."""
    probe = InboundMessage(
        platform=platform, chat_type="direct", chat_id=user_id, sender_id=user_id, text=""
    )
    key = gateway.keyer.key_for(probe)
    busy = key in gateway.lanes.busy
    if gateway.config.sessions.dm_scope == "main":
        return ChatHistory(key, shared=True, busy=busy, reset_seq=0, last_seq=0)
    session = await gateway.store.get_session(key)
    if session is None or session.id is None:
        return ChatHistory(key, shared=False, busy=busy, reset_seq=0, last_seq=0)
    resets = [
        c.last_seq for c in await gateway.store.compactions(session.id)
        if not c.undone and is_reset(c)
    ]
    reset_seq = max(resets, default=0)
    rows = await gateway.store.recent_messages(session.id, max(after, reset_seq), limit)
    lines = [line for row in rows if (line := _line(row, platform, user_id)) is not None]
    return ChatHistory(
        key, shared=False, busy=busy, reset_seq=reset_seq, last_seq=session.next_seq - 1,
        messages=lines,
    )
