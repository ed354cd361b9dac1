"""The webchat channel: a chat page and `POST /api/messages`, served by the gateway's web server.

A ``message_id`` belongs to the user who sent it: the store dedupes by (platform, chat id, message
id) with the user as the chat id, and the reply waiters are keyed the same way, so one user's id
never answers another's request. A repeat of a message (same user, same id) is not answered a
second time: while the message is in flight it waits for the same reply, afterwards it gets the
stored one.

What the gateway sends a user that answers none of their messages -- a notice such as
"compacting earlier messages…", a reminder -- has no request waiting for it: the channel keeps
it for a while (`take_notices`), and the page picks it up when it polls `GET /api/history`.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass

from channels.base import (
    AwaitsReplies,
    ChannelCapabilities,
    OutboundMessage,
    ReplyWaiters,
)

NOTICE_TTL_SECONDS = 600.0
"""How long an unclaimed notice is kept for the page."""
MAX_NOTICES_PER_USER = 20
MAX_NOTICE_USERS = 1_000
"""Users whose notices are kept at once (the least recently noticed are forgotten first)."""


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
        self._notices: OrderedDict[str, deque[tuple[float, str]]] = OrderedDict()

    async def send(self, message: OutboundMessage) -> None:
        if not message.answers and message.reply_to is None:
            self._keep_notice(message.chat_id, message.text)
        self._waiters.resolve(message)

    def _keep_notice(self, user_id: str, text: str) -> None:
        notices = self._notices.pop(user_id, None)
        if notices is None:
            notices = deque(maxlen=MAX_NOTICES_PER_USER)
        notices.append((time.monotonic(), text))
        self._notices[user_id] = notices
        while len(self._notices) > MAX_NOTICE_USERS:
            self._notices.popitem(last=False)

    def take_notices(self, user_id: str) -> list[str]:
        """The notices sent to `user_id` that answer no message (oldest first), once each."""
        notices = self._notices.pop(user_id, None)
        if notices is None:
            return []
        fresh = time.monotonic() - NOTICE_TTL_SECONDS
        return [text for at, text in notices if at >= fresh]

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
