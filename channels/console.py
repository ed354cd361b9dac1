"""The console channel: chat with the agent from a terminal (`gatehouse chat`).

A notice the gateway sends the console user that answers none of their lines ("compacting
earlier messages…", what a compaction kept) goes to `on_notice` at once when it is set (the
terminal shows it while the reply is awaited); otherwise `ask` returns it ahead of the reply.
"""

from __future__ import annotations

import getpass
import uuid
from collections import deque
from collections.abc import Callable

from channels.base import (
    AwaitsReplies,
    ChannelCapabilities,
    OutboundMessage,
    ReplyWaiters,
    id_problem,
    is_blank,
)


class ConsoleChannel(AwaitsReplies):
    name = "console"
    capabilities = ChannelCapabilities(max_message_chars=1_000_000)

    def __init__(
        self,
        user_id: str | None = None,
        reply_timeout: float = 600.0,
        on_notice: Callable[[str], None] | None = None,
    ) -> None:
        """`user_id` None chats as the login name; a blank one (or one holding a NUL or an
        unpaired surrogate, from a non-UTF-8 command line) is refused by `ask`."""
        self.user_id = getpass.getuser() if user_id is None else user_id
        self.reply_timeout = reply_timeout
        self.on_notice = on_notice
        self._waiters = ReplyWaiters()
        self._notices: deque[str] = deque(maxlen=50)

    async def send(self, message: OutboundMessage) -> None:
        if message.answers or message.reply_to is not None:
            self._waiters.resolve(message)
        elif message.chat_id == self.user_id:
            if self.on_notice is not None:
                self.on_notice(message.text)
            else:
                self._notices.append(message.text)

    def user_problem(self) -> str | None:
        """Why `user_id` cannot name a chat (None: it can), as the console tells its user."""
        if is_blank(self.user_id):
            return "Your user id is blank (empty, spaces or zero-width characters only)."
        problem = id_problem(self.user_id)
        return None if problem is None else f"Your user id {problem}; ids must be plain text."

    async def stop(self) -> None:
        self._waiters.fail_all("console channel stopped")

    async def ask(self, text: str) -> tuple[str | None, list[str]]:
        """Send one line as the console user; return (session key, replies)."""
        handler = self._started()
        refused = self.user_problem()
        if refused is not None:
            return None, [f"{refused} Choose another with --user."]
        message_id = uuid.uuid4().hex
        future = self._waiters.expect(self.user_id, message_id)
        try:
            result = await handler(self._from_user(self.user_id, text, message_id))
            if result.duplicate:
                return result.session_key, []
            if not result.accepted and not future.done():
                return result.session_key, [result.reason or "Message not accepted."]
            replies = await self._waiters.wait(
                self.user_id, message_id, future, self.reply_timeout
            )
            notices = list(self._notices)
            self._notices.clear()
            return result.session_key, [*notices, *replies]
        finally:
            self._waiters.forget(self.user_id, message_id, future)
