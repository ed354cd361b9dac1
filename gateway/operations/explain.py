"""`gatehouse context explain`: every limit applied to a session, and where each comes from; for
a key nobody has written to yet, a preview of what would apply (`preview`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from context.engine import PlanFacts
from gateway.app import Gateway
from gateway.config import Config
from gateway.inbound.session_keys import KeyParts, parse_key
from gateway.operations.common import opened
from gateway.operations.sessions import PromptCache
from gateway.store.models import SessionRow
from gateway.turn.compaction import automatic_compaction_state
from gateway.turn.history import SessionView


@dataclass(frozen=True, slots=True)
class LastCompaction:
    """The session's latest compaction that is not undone."""

    id: int | None
    first_seq: int
    last_seq: int
    tokens_before: int
    tokens_after: int
    quality: dict[str, Any] | None
    """The quality report as stored (JSON)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "covers": [self.first_seq, self.last_seq],
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "quality": self.quality,
        }


@dataclass(frozen=True, slots=True)
class TurnLimit:
    """One limit of a turn's tool loop, with the setting that decides it."""

    name: str
    value: str
    source: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "value": self.value, "source": self.source}


def turn_limits(config: Config) -> tuple[TurnLimit, ...]:
    """The tool loop's limits (`gateway/turn/loop.py`), each with its key and whether it is
    set or the default."""
    llm = config.llm
    given = llm.model_fields_set

    def source(key: str, why: str) -> str:
        return f"[llm] {key}{'' if key in given else ' (default)'}: {why}"

    return (
        TurnLimit("tool rounds a turn", f"{llm.max_tool_rounds:,}",
                  source("max_tool_rounds", "then the turn stops and says so")),
        TurnLimit("tool calls run from one reply", f"{llm.max_tool_calls_per_round:,}",
                  source("max_tool_calls_per_round", "the rest are answered 'not run'")),
        TurnLimit("time a turn may take", f"{llm.max_turn_seconds:,.0f} s",
                  source("max_turn_seconds", "checked after each round")),
        TurnLimit("compaction inside a turn", "before every model call",
                  "the ask pinned, the newest rounds kept verbatim, the rounds between compacted"),
    )


@dataclass(frozen=True, slots=True)
class Explanation:
    """What the engine planned for the session's next turn (`plan`: None when the engine keeps
    no budget), with the session's own counts and states around it."""

    HISTORY_LIMIT_ORDER: ClassVar[str] = (
        "applied before compaction: turns outside the limit are neither sent nor summarized"
    )

    plan: PlanFacts | None
    session: str
    platform: str
    chat_type: str
    stored_messages: int
    messages_after_summary: int
    messages_in_prompt: int
    last_reported_prompt_tokens: int | None
    calibration: str
    """How provider-reported prompt sizes correct the local count."""
    history_limit_text: str
    notes: tuple[str, ...]
    window_too_small: bool
    automatic_compaction: str
    """"allowed", or why automatic compaction is paused."""
    compactions: int
    """Compactions in effect (not undone)."""
    last_compaction: LastCompaction | None
    preview: bool = False
    """No session has this key yet: what would apply to its first message (`preview`)."""
    prompt_cache: PromptCache | None = None
    """The share of the session's prompt tokens read from the provider's prompt cache (for
    `/status`); None in a preview."""
    limits: tuple[TurnLimit, ...] = ()
    """The limits of a turn's tool loop (`turn_limits`)."""

    def to_json(self) -> dict[str, Any]:
        """The plan's facts, then the session's: one flat object."""
        return {
            **(self.plan.to_dict() if self.plan is not None else {}),
            "session": self.session,
            "preview": self.preview,
            "platform": self.platform,
            "chat_type": self.chat_type,
            "stored_messages": self.stored_messages,
            "messages_after_summary": self.messages_after_summary,
            "messages_in_prompt": self.messages_in_prompt,
            "last_reported_prompt_tokens": self.last_reported_prompt_tokens,
            "calibration": self.calibration,
            "history_limit_text": self.history_limit_text,
            "history_limit_order": self.HISTORY_LIMIT_ORDER,
            "notes": list(self.notes),
            "window_too_small": self.window_too_small,
            "automatic_compaction": self.automatic_compaction,
            "compactions": self.compactions,
            "last_compaction": (
                None if self.last_compaction is None else self.last_compaction.to_json()
            ),
            "prompt_cache": None if self.prompt_cache is None else self.prompt_cache.to_json(),
            "turn_limits": [limit.to_json() for limit in self.limits],
        }


async def explain_session(
    config: Config, session_key: str, *, fetch_metadata: bool = True
) -> Explanation:
    """`explain`, or the `preview` for a key with no session yet (`SessionKeyError` for a
    string that is no session key)."""
    async with opened(config) as gateway:
        found = await session_explanation(gateway, session_key, fetch_metadata=fetch_metadata)
        if found is None:
            return await preview(gateway, session_key, fetch_metadata=fetch_metadata)
        return found


async def session_explanation(
    gateway: Gateway, session_key: str, *, fetch_metadata: bool = True
) -> Explanation | None:
    """The facts `gatehouse context explain` prints: the same resolution and engine as a turn
    (None: no session has this key; see `preview`)."""
    config = gateway.config
    session = await gateway.store.get_session(session_key)
    if session is None or session.id is None:
        return None
    if fetch_metadata and gateway.llm.configured:
        await gateway.resolver.fetch_metadata_now()
    runner = gateway.runner
    view = await runner.view(session.id, use_cache=False)
    # Who the DM's per-user limit belongs to: the newest sender (a Slack or Discord DM's
    # chat id is a channel id), as the runner takes it from the message it answers.
    senders = await gateway.store.latest_senders(session.id)
    user_id = senders.get(session.id, session.chat_id or None)
    settings = runner.settings_for(session, user_id)
    plan = gateway.engine.assemble(runner.turn_context(session_key, view, 1 << 62, settings))
    compactions = await gateway.store.compactions(session.id)
    latest = next((c for c in reversed(compactions) if not c.undone), None)
    limit = settings.history_limit
    return Explanation(
        plan=plan.facts,
        session=session_key,
        platform=session.platform,
        chat_type=session.chat_type,
        stored_messages=await gateway.store.message_count(session.id),
        messages_after_summary=len(view.history),
        messages_in_prompt=len(plan.messages),
        last_reported_prompt_tokens=session.last_prompt_tokens,
        calibration=gateway.resolver.calibration(
            session_key, session.token_ratio, session.token_ratio_samples
        ).describe(),
        history_limit_text="unlimited" if limit.unlimited else f"last {limit.limit:,} user turns",
        notes=tuple(plan.notes),
        window_too_small=settings.window.too_small,
        automatic_compaction=automatic_compaction_state(
            session, config.context.max_ineffective_compactions
        ),
        compactions=len([c for c in compactions if not c.undone]),
        last_compaction=None if latest is None else LastCompaction(
            latest.id, latest.first_seq, latest.last_seq, latest.tokens_before,
            latest.tokens_after, latest.quality,
        ),
        prompt_cache=PromptCache.of(session),
        limits=turn_limits(config),
    )


async def preview(
    gateway: Gateway, session_key: str, *, fetch_metadata: bool = True
) -> Explanation:
    """What would apply to the first message of the conversation `session_key` names, before
    anybody writes: the key read back into platform, chat and user (`parse_key`), resolved by the
    same code as a turn (window, history limit with its source, budget, thresholds), over an
    empty history. `SessionKeyError` when `session_key` is not a key the gateway builds."""
    parts = parse_key(session_key)
    platform, user_id, notes = _who(gateway, parts)
    if fetch_metadata and gateway.llm.configured:
        await gateway.resolver.fetch_metadata_now()
    draft = SessionRow(
        key=session_key, agent=parts.agent, platform=platform or "", chat_type=parts.chat_type,
        chat_id=parts.chat_id or user_id or "", thread_id=parts.thread_id,
        account=parts.account or "default",
    )
    runner = gateway.runner
    settings = runner.settings_for(draft, user_id)
    plan = gateway.engine.assemble(
        runner.turn_context(session_key, SessionView(None, []), 1 << 62, settings)
    )
    limit = settings.history_limit
    return Explanation(
        plan=plan.facts,
        session=session_key,
        platform=platform or "(any)",
        chat_type=parts.chat_type,
        stored_messages=0,
        messages_after_summary=0,
        messages_in_prompt=len(plan.messages),
        last_reported_prompt_tokens=None,
        calibration=gateway.resolver.calibration(session_key).describe(),
        history_limit_text="unlimited" if limit.unlimited else f"last {limit.limit:,} user turns",
        notes=(*notes, *plan.notes),
        window_too_small=settings.window.too_small,
        automatic_compaction="allowed",
        compactions=0,
        last_compaction=None,
        preview=True,
        limits=turn_limits(gateway.config),
    )


def _who(gateway: Gateway, parts: KeyParts) -> tuple[str | None, str | None, list[str]]:
    """(platform, user id) whose limits a new session under `parts` gets, and notes on what
    the key cannot say or this gateway would not do with it."""
    config = gateway.config
    notes: list[str] = []
    platform, user_id = parts.platform, parts.user_id
    if parts.agent != config.gateway.agent:
        notes.append(
            f"the key names agent {parts.agent!r}; this gateway is [gateway] agent = "
            f"{config.gateway.agent!r}"
        )
    if parts.scope == "main":
        notes.append(
            "one session for every DM (dm_scope = \"main\"): its platform and person are "
            "whoever writes; the limits shown are those of no particular platform"
        )
    elif parts.person is not None:
        linked = gateway.keyer.linked_ids(parts.person)
        if not linked:
            notes.append(
                f"{parts.person!r} is not in [sessions] identity_links: no message is filed "
                "under this key"
            )
        else:
            platform, user_id = linked[0]
            if len(linked) > 1:
                others = ", ".join(f"{p}:{u}" for p, u in linked[1:])
                notes.append(
                    f"{parts.person!r} is linked to {platform}:{user_id} (shown) and {others}: "
                    "a message from another of them gets that platform's limits"
                )
    scope, per_user = config.sessions.dm_scope, config.sessions.per_user_in_groups
    if parts.chat_type == "direct" and parts.scope != scope:
        notes.append(
            f"this is a dm_scope = {parts.scope!r} key, and [sessions] dm_scope is {scope!r}: "
            "DMs are filed under keys of another shape"
        )
    if parts.scope == "group" and (parts.user_id is not None) != per_user:
        notes.append(
            f"[sessions] per_user_in_groups is {str(per_user).lower()}: group sessions are "
            + ("one per sender (…:user:<sender>)" if per_user else "one per chat (no :user:)")
        )
    if platform is not None and platform not in type(config.channels).model_fields:
        notes.append(f"no channel is called {platform!r}: the [context] default applies")
    return platform, user_id, notes
