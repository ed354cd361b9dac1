"""`gatehouse context explain`: every limit applied to a session, and where each comes from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from context.engine import PlanFacts
from gateway.app import Gateway
from gateway.config import Config
from gateway.operations.common import opened
from gateway.turn.runner import compaction_blocked_reason


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

    def to_json(self) -> dict[str, Any]:
        """The plan's facts, then the session's: one flat object."""
        return {
            **(self.plan.to_dict() if self.plan is not None else {}),
            "session": self.session,
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
        }


async def explain_session(
    config: Config, session_key: str, *, fetch_metadata: bool = True
) -> Explanation | None:
    async with opened(config) as gateway:
        return await explain(gateway, session_key, fetch_metadata=fetch_metadata)


async def explain(
    gateway: Gateway, session_key: str, *, fetch_metadata: bool = True
) -> Explanation | None:
    """The facts `gatehouse context explain` prints: the same resolution and engine as a turn."""
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
        automatic_compaction=compaction_blocked_reason(
            session, config.context.max_ineffective_compactions
        )
        or "allowed",
        compactions=len([c for c in compactions if not c.undone]),
        last_compaction=None if latest is None else LastCompaction(
            latest.id, latest.first_seq, latest.last_seq, latest.tokens_before,
            latest.tokens_after, latest.quality,
        ),
    )
