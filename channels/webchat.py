"""The webchat channel: a chat page and `POST /api/messages`, served by the gateway's web server.

A ``message_id`` belongs to the user who sent it: the store dedupes by (platform, chat id, message
id) with the user as the chat id, and the reply waiters are keyed the same way, so one user's id
never answers another's request. A repeat of a message (same user, same id) is not answered a
second time: while the message is in flight it waits for the same reply, afterwards it gets the
stored one.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from channels.base import (
    AwaitsReplies,
    ChannelCapabilities,
    ReplyWaiters,
)


@dataclass(frozen=True, slots=True)
class WebchatReply:
    session_key: str | None
    replies: list[str]
    accepted: bool
    reason: str | None = None


class WebchatChannel(AwaitsReplies):
    name = "webchat"
    capabilities = ChannelCapabilities(max_message_chars=100_000)

    def __init__(self, reply_timeout: float = 300.0, poll_interval: float = 1.0) -> None:
        self.reply_timeout = reply_timeout
        self._waiters = ReplyWaiters(poll_interval=poll_interval)

    async def stop(self) -> None:
        self._waiters.fail_all("the gateway is shutting down")

    async def submit(
        self, user_id: str, text: str, message_id: str | None = None
    ) -> WebchatReply:
        """Send `text` as `user_id` and wait for the reply (`TimeoutError` after
        `reply_timeout`; `ConnectionAbortedError` when the gateway stops meanwhile)."""
        handler = self._started()
        message_id = message_id or uuid.uuid4().hex
        future = self._waiters.expect(user_id, message_id)
        try:
            result = await handler(self._from_user(user_id, text, message_id))
            if not result.accepted and not result.duplicate:
                return WebchatReply(result.session_key, [], False, result.reason)
            # A repeat of a stored message: the reply it has (or will have), never a second one.
            replies = await self._waiters.wait(
                user_id, message_id, future, self.reply_timeout, look_first=result.duplicate
            )
            return WebchatReply(result.session_key, replies, True)
        finally:
            self._waiters.forget(user_id, message_id, future)
