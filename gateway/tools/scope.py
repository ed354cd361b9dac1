"""Who a tool call is made for, and what of the workspace that person may see.

One agent serves many people. `[gateway] owners` (platform ids or identity-link names) are the
people it works for; everyone else is a guest of their own conversation. The terminal user of
`gatehouse chat` is always an owner. Every tool that reads notes or files asks the `Caller`:

- **Notes** (`memory/*.md`): text written by hand, MEMORY.md and entries marked `shared` are
  everyone's; an entry the agent wrote belongs to the conversation it came from and, in a
  direct conversation, to its person (their other conversations see it too, through identity
  links). Owners see every entry, in their direct conversations and the terminal.
- **A group conversation** is its own scope whoever speaks in it: it sees its own entries and
  the shared ones, never a member's direct-conversation notes (everyone in the group reads the
  answers), and no owner rights even when an owner writes there.
- **Files**: `inbox/<conversation>/` (what people sent) and `artifacts/<conversation>/` (whole
  tool outputs) are readable only from that conversation, and by owners; any other workspace
  file outside `memory/` (besides MEMORY.md and AGENTS.md) only by owners.
- A scheduled task's turn acts for the person who created it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway.config import UNVERIFIED_PLATFORMS, Config
from gateway.inbound.session_keys import SessionKeyer
from memory.visibility import Visibility
from memory.workspace import ARTIFACTS_DIR, INBOX_DIR, conversation_folder

OWNER_PLATFORMS = frozenset({"console"})
"""Whoever types in `gatehouse chat` runs the gateway: an owner."""
DIRECT_TYPES = frozenset({"direct", "dm"})
SHARED_FILES = frozenset({"memory.md", "agents.md"})


@dataclass(frozen=True, slots=True)
class Caller:
    """The person and conversation a tool call is made for."""

    session_key: str
    person: str | None = None
    """The person of a direct conversation (`SessionKeyer.person`); None in a group."""
    owner: bool = False
    folder: str = ""
    """The conversation's folder under inbox/ and artifacts/ (`conversation_folder`)."""

    @property
    def notes(self) -> Visibility | None:
        """What this caller may see of the notes (None: every entry)."""
        if self.owner:
            return None
        return Visibility((self.session_key,), (self.person,) if self.person else ())

    def refuses(self, relative: str) -> str | None:
        """Why this caller may not read the workspace file `relative` (the canonical relative
        path, after `memory.workspace.resolve_in_workspace`), or None when it may."""
        if self.owner:
            return None
        parts = relative.split("/")
        if len(parts) == 1 and parts[0].lower() in SHARED_FILES:
            return None
        if parts[0] == "memory":
            return None  # entries it may not see are blanked (memory.visibility)
        if parts[0] in (INBOX_DIR, ARTIFACTS_DIR):
            if len(parts) > 2 and parts[1] == self.folder:
                return None
            return f"{relative} belongs to another conversation"
        return f"{relative} is readable by the gateway's owners only"


def guest(session_key: str) -> Caller:
    """The least a tool call may see: a guest of `session_key` (no person, no owner)."""
    return Caller(session_key, folder=conversation_folder(session_key))


CronCreator = Callable[[str], Awaitable[tuple[str | None, bool] | None]]
"""(person, owner) of the scheduled task a `cron:<job id>` session runs, or None."""


class Scopes:
    """Resolves callers from `[gateway] owners` and `[sessions] identity_links`."""

    def __init__(
        self, config: Config, keyer: SessionKeyer, cron_creator: CronCreator | None = None
    ) -> None:
        self.keyer = keyer
        self.cron_creator = cron_creator
        self._owner_ids = {o for o in config.gateway.owners if ":" in o}
        self._owner_people = {o for o in config.gateway.owners if ":" not in o}
        self._links = {
            ident: person
            for person, ids in config.sessions.identity_links.items()
            for ident in ids
        }

    @property
    def owners(self) -> list[str]:
        return sorted(self._owner_ids | self._owner_people)

    def is_owner(self, platform: str, sender_id: str | None) -> bool:
        """Whether this sender is one of the owners (the terminal user always is)."""
        if platform in OWNER_PLATFORMS:
            return True
        if not sender_id or platform in UNVERIFIED_PLATFORMS:
            return False  # a web visitor's id is theirs to choose: never an owner
        ident = f"{platform}:{sender_id}"
        return ident in self._owner_ids or self._links.get(ident) in self._owner_people

    def person(self, platform: str, sender_id: str) -> str:
        return self.keyer.person(platform, sender_id)

    async def caller(
        self, session_key: str, platform: str, chat_type: str, sender_id: str | None
    ) -> Caller:
        """The caller of a turn in `session_key`, answering `sender_id` on `platform`."""
        folder = conversation_folder(session_key)
        if self.cron_creator is not None and session_key.startswith("cron:"):
            creator = await self.cron_creator(session_key.removeprefix("cron:"))
            if creator is None:
                return Caller(session_key, folder=folder)
            person, owner = creator
            return Caller(session_key, person, owner, folder)
        if chat_type not in DIRECT_TYPES or not sender_id:
            return Caller(session_key, folder=folder)  # a group: its own scope
        return Caller(
            session_key, self.person(platform, sender_id),
            self.is_owner(platform, sender_id), folder,
        )
