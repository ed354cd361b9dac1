"""The Gateway: wires config, store, session keys, lanes, runner and channels together."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial

from channels.base import (
    AnswersRequests,
    Channel,
    InboundMessage,
    InboundResult,
    OutboundMessage,
    PartlySent,
    TypingChannel,
    is_blank,
    platform_failure,
)
from channels.commands import parse_command
from context.compaction import CompactionResult
from context.types import Message
from gateway.config import Config
from gateway.inbound.access import AccessPolicy
from gateway.inbound.attachments import AttachmentIntake
from gateway.inbound.lanes import LanesClosedError, SessionLanes
from gateway.inbound.session_keys import SessionKeyer
from gateway.inbound.text import clean_inbound, clean_text, inbound_problem
from gateway.jobs.host import PromptSize
from gateway.jobs.leader import Leadership
from gateway.jobs.maintenance import Maintenance
from gateway.jobs.scheduler import Scheduler
from gateway.metrics import GatewayMetrics
from gateway.model.engines import load_engine
from gateway.model.llm import NOT_CONFIGURED, LLMProvider
from gateway.model.sizing import ContextResolver
from gateway.model.summarizer import make_summary_call, summary_provider
from gateway.reload import ReloadPlan, apply_reload, reload_plan
from gateway.store import CompactionRow, SessionInfo, SessionRow, Store
from gateway.store.faults import StorageHealth, storage_faults
from gateway.store.messages import CONTEXT_STATUS, FETCHING_STATUS
from gateway.tools.history import HistoryTools
from gateway.tools.memory import MemoryFlush, MemoryTools
from gateway.tools.registry import ToolRegistry, default_registry
from gateway.tools.schedule import ScheduleTools
from gateway.tools.scope import Scopes
from gateway.turn.outbox import SENT, Delivery, DeliveryLog, failure_text
from gateway.turn.previews import Previews
from gateway.turn.runner import Runner, TurnHooks, compaction_blocked_reason
from gateway.turn.storage import ReplyNotStoredError
from memory.embeddings import shared_encoder
from memory.index import ArchivedMessage, MemoryIndex, RefreshStats
from memory.workspace import ensure_workspace

log = logging.getLogger(__name__)

STORAGE_WATCH_SECONDS = 1.0
"""How often a running gateway checks that its SQLite file is still the one it opened, and
whether a session the database refused is due for another try (gateway/turn/storage.py)."""


class EmbeddingProgress:
    """Logs a background embedding's progress: at most every `every` seconds, and at the end
    (a large index takes minutes on 2 cores; silence would look like a hang)."""

    def __init__(self, every: float = 10.0) -> None:
        self.every = every
        self._last = time.monotonic()
        self._began = self._last

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._last < self.every:
            return
        self._last = now
        log.info(
            "memory search: embedded %s/%s rows (%.0f s)", f"{done:,}", f"{total:,}",
            now - self._began,
        )


class Gateway:
    def __init__(self, config: Config, tools: ToolRegistry | None = None) -> None:
        self.config = config
        self.store = Store(config.database_url, threads=config.gateway.database_threads)
        self.keyer = SessionKeyer(config.sessions, config.gateway.agent)
        self.llm = LLMProvider(config.llm)
        self.engine = load_engine(config.context.engine)
        self.channels: dict[str, Channel] = {}
        self.resolver = ContextResolver(config, self.llm)
        self.summary_llm = summary_provider(config, self.llm)
        index_path = config.data_dir / "memory-index.db"
        with storage_faults(index_path):  # a fault names this file, not the database's
            self.memory_index = MemoryIndex(
                index_path,
                config.workspace,
                search_transcripts=config.memory.archive_transcripts,
            )
        # No encoder yet (cheap for the CLI): `start` loads the model in the background.
        memory = MemoryTools(
            config.workspace, self.memory_index, config.gateway.timezone,
            search_mode=config.memory.search_mode,
            half_life_days=config.memory.half_life_days,
        )
        self.tools = tools or default_registry()
        memory_only = ToolRegistry()
        for tool in memory.tools():
            memory_only.register(tool)
            if tool.name not in self.tools.tools:
                self.tools.register(tool)
        for tool in HistoryTools(self.memory_index).tools():
            if tool.name not in self.tools.tools:
                self.tools.register(tool)
        self.metrics = GatewayMetrics()
        self.delivery = DeliveryLog(
            config.data_dir,
            self.store,
            resend=self.deliver,
            max_attempts=config.gateway.delivery_attempts,
        )
        hooks = TurnHooks(
            typing=self.typing,
            previews=Previews(config.channels, self.channels, config.llm.stream),
            delivery=self.delivery,
            # Always: history_search must work after every compaction. `archive_transcripts`
            # only decides whether memory_search may search the archive too (across sessions).
            archive=self._archive,
            on_turn=self.metrics.observe_turn,
            on_compaction=self.metrics.observe_compaction,
            describe=self.describe_session,
        )
        # Who each tool call is for: owners, guests, a scheduled task's creator.
        self.scopes = Scopes(config, self.keyer, cron_creator=self._cron_creator)
        self.runner = Runner(
            config,
            self.store,
            self.engine,
            self.llm,
            self.tools,
            self.deliver,
            self.resolver,
            make_summary_call(config, self.summary_llm),
            MemoryFlush(
                self.llm, memory_only, self.store, config.gateway.timezone,
                workspace=config.workspace,
                on_flush=self.metrics.observe_flush,
                on_notes=self.metrics.observe_flush_notes,
                scopes=self.scopes,
            ),
            hooks,
            scopes=self.scopes,
        )
        self.lanes = SessionLanes(
            self.runner.run_turn,
            config.gateway.max_concurrent_turns,
            session_lock=None if self.store.is_sqlite else self.store.session_lock,
        )
        self.leadership = Leadership(self.store, config.scheduler.leader_poll_seconds)
        self.scheduler = Scheduler(config, leader=self.leadership.wait)
        self._leader_watch: asyncio.Task[None] | None = None
        self.maintenance = Maintenance(self)
        if config.scheduler.enabled:
            for tool in ScheduleTools(self.scheduler, config).tools():
                if tool.name not in self.tools.tools:
                    self.tools.register(tool)
        self.metrics.watch_lanes(self.lanes)
        self.access = AccessPolicy(config, self.store)
        self.intake = AttachmentIntake(
            config, self.store, self.channels,
            notify=self._arrived, hold=self.lanes.hold,
            send_stored=self.delivery.send, count_tokens=self.count_tokens,
        )
        self.llm.show_workspace_images(config.workspace)  # photos, to a vision model
        self._started = False
        self._sweeper: asyncio.Task[None] | None = None
        self._storage_watch: asyncio.Task[None] | None = None
        self._storage_changed = asyncio.Event()
        self.store.watch(self._storage_health)
        self._encoder_task: asyncio.Task[None] | None = None

    def add_channel(self, channel: Channel) -> None:
        self.channels[channel.name] = channel
        if isinstance(channel, AnswersRequests):
            # A caller waiting for a reply can find it stored (a repeat, or a reply sent
            # elsewhere): see `channels.base.ReplyWaiters`.
            channel.stored_reply = partial(self._stored_reply, channel.name)

    async def _stored_reply(
        self, platform: str, chat_id: str, message_id: str
    ) -> list[str] | None:
        """The stored reply to a message a caller waits for (`ReplyWaiters`); a
        `ReplyNotStoredError` once the database refused its turn, so the caller hears of it now
        rather than at its timeout (the message stays and is answered later)."""
        reason = self.runner.blocked.reason_for(platform, chat_id, message_id)
        if reason is not None:
            raise ReplyNotStoredError(reason)
        return await self.store.reply_to(platform, chat_id, message_id)

    def _storage_health(self, health: StorageHealth) -> None:
        """The database works again (a write succeeded): every refused session is tried now."""
        if health.failing is None:
            self.runner.blocked.hurry()
            self._storage_changed.set()

    async def _watch_storage(self) -> None:
        """Run the turns the database refused again when due (gateway/turn/storage.py), and
        notice a SQLite file deleted or replaced under the running gateway even while nothing
        is written (`Store.check_file`: logged, `/healthz` 503, no more turns)."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(STORAGE_WATCH_SECONDS):
                    await self._storage_changed.wait()
            self._storage_changed.clear()
            if self.store.check_file() is not None:
                continue  # a write cannot succeed before a restart: no try would help
            try:
                for key in self.runner.blocked.due():
                    # A lane running now tries anyway; told again, it would run once more at
                    # once, and a turn whose own claim cleared the fault would loop.
                    if key not in self.lanes.busy:
                        self.lanes.notify(key)
            except LanesClosedError:
                return

    def reload_config(self, new: Config, started_from: Config) -> ReloadPlan:
        """Apply what a reload may change while running: history limits and access lists,
        copied into the running config in place, in one step between two awaits, so nothing
        stops: a turn in flight finishes, the next prompt and the next access check use the new
        values. The plan also names the other changed keys, which need a restart."""
        plan = reload_plan(self.config, started_from, new)
        apply_reload(self.config, new)
        self.resolver.reload_limits()
        return plan

    async def open(self, fetch_metadata: bool = True) -> None:
        """Workspace, store and token counter: what the CLI needs without any channel."""
        ensure_workspace(self.config.workspace)
        await self.store.init()
        await self.resolver.start(fetch_metadata=fetch_metadata)

    @property
    def memory_search(self) -> str:
        """What memory_search ranks by now (for /healthz): "off" (`[memory] embeddings = false`),
        "loading" (the model warms up after start; BM25 meanwhile), "embedding" (the index's rows
        get their vectors), the search mode once ready, or "bm25" (the model did not load: the
        reason is in the log). Loading takes a core for seconds; a probe can wait it out."""
        if not self.config.memory.embeddings:
            return "off"
        loading = self._encoder_task is not None and not self._encoder_task.done()
        if self.memory_index.encoder is None:
            return "loading" if loading else "bm25"
        return "embedding" if loading else self.config.memory.search_mode

    async def _load_encoder(self) -> None:
        """Load and warm up the embedding model (slow: off the event loop, once per process),
        give it to the memory index and embed what lacks a vector; until then, and without
        it, memory search is BM25 (the reason logged once)."""
        encoder, reason = await asyncio.to_thread(shared_encoder)
        if encoder is None:
            why = reason.removeprefix("Semantic memory search is off, BM25 only: ")
            log.warning("memory search: BM25 only: %s", why)
            return
        try:  # the files' changes since the last run, by words (cheap) ...
            await asyncio.to_thread(self.memory_index.refresh)
        except Exception as exc:
            log.warning("memory search: indexing the notes failed: %s", exc)
        self.memory_index.use_encoder(encoder)
        log.info("memory search: %s, embedding %s", self.config.memory.search_mode, encoder.name)
        try:  # ... then every row without a current vector, with progress in the log
            await asyncio.to_thread(self.memory_index.reembed, EmbeddingProgress())
        except Exception as exc:  # the next refresh (a search, maintenance) tries again
            log.warning("memory search: embedding the index failed: %s", exc)

    async def close(self) -> None:
        if self._encoder_task is not None:
            self._encoder_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._encoder_task
            self._encoder_task = None
        await self.resolver.stop()
        await self.llm.close()
        if self.summary_llm is not self.llm:
            await self.summary_llm.close()
        await self.store.close()
        self.memory_index.close()

    async def start(self) -> None:
        """Open the store and workspace, start channels, resume any unanswered messages."""
        await self.open()
        if self.config.memory.embeddings and self._encoder_task is None:
            self._encoder_task = asyncio.create_task(self._load_encoder(), name="memory-encoder")
        unsent = await self.delivery.recover()
        if not self.llm.configured:
            log.warning(NOT_CONFIGURED)
        for channel in self.channels.values():
            await channel.start(self.handle_inbound)
        self._started = True
        # What is alive now (modules, SDK clients, caches) lives as long as the process: keep
        # it out of every full garbage collection, which otherwise walks it all again (tens of
        # milliseconds each, in the middle of someone's turn).
        gc.freeze()
        await self._send_unsent(unsent)
        for session in await self.store.sessions_with_pending():
            log.info("resuming unanswered messages in %s", session.key)
            self.lanes.notify(session.key)
        self._sweeper = asyncio.create_task(self._sweep_pending(), name="pending-sweep")
        self._storage_watch = asyncio.create_task(self._watch_storage(), name="storage-watch")
        await self.intake.resume()  # downloads a stop interrupted
        if self.config.scheduler.enabled:
            await self.scheduler.start(self, self.maintenance.jobs())
            if not self.store.is_sqlite and self.scheduler.fires_jobs:
                self._leader_watch = asyncio.create_task(
                    self.leadership.watch(self.scheduler.step_down), name="leader-watch"
                )

    async def _send_unsent(
        self,
        unsent: list[tuple[int, OutboundMessage]],
        why: str = "a stopped run stored but did not send",
    ) -> None:
        """Replies a stopped run stored with its turn but never sent (or, `why`, others)."""
        for outbox_id, message in unsent:
            if message.platform not in self.channels:
                continue  # kept for a run that has this channel (`gatehouse chat` has not)
            log.info("sending a reply %s (%s)", why, message.session_key)
            await self.delivery.send(outbox_id, message)

    async def _sweep_pending(self) -> None:
        """Send replies an operator retried; on PostgreSQL, also answer what a process that
        stopped left behind.

        Each process answers what it accepted; if one dies between persisting a message and
        answering it, the others find the message here (its lane lock died with the process).
        Alone on SQLite, every message and reply is this process's already, except the replies
        `gatehouse outbox retry` gave their tries back.
        """
        every = self.config.gateway.pending_sweep_seconds
        while True:
            await asyncio.sleep(every)
            try:
                if self.store.is_sqlite:
                    await self._send_unsent(await self.delivery.retried(), "an operator retried")
                    continue
                await self._send_unsent(await self.delivery.recover())
                for session in await self.store.sessions_with_pending(older_than=every):
                    if session.key not in self.lanes.busy:
                        log.info("picking up unanswered messages in %s", session.key)
                        self.lanes.notify(session.key)
            except LanesClosedError:
                return
            except Exception:
                log.exception("sweeping for unanswered messages failed; trying again later")

    async def stop(self, grace: float = 10.0) -> None:
        """Finish in-flight turns (or record them as interrupted), then close everything."""
        await self.scheduler.stop(grace)
        if self._leader_watch is not None:
            self._leader_watch.cancel()
            self._leader_watch = None
        await self.leadership.release()
        for task in (self._sweeper, self._storage_watch):
            if task is not None:
                task.cancel()
        self._sweeper = self._storage_watch = None
        await self.intake.close(grace)
        await self.lanes.close(grace)
        await self.delivery.close()
        for channel in self.channels.values():
            try:
                await channel.stop()
            except Exception:
                log.exception("channel %s failed to stop", channel.name)
        await self.close()
        self._started = False

    async def handle_inbound(self, msg: InboundMessage) -> InboundResult:
        """Persist first, then wake the session's lane. Bad input gets a polite answer.

        A message whose ids the store cannot keep as they are, or from a blank sender or chat,
        is refused before anything else (no session, no reply: there is no chat to trust).
        """
        refused = inbound_problem(msg)
        if refused is not None:
            log.warning("refused a %s message: %s", msg.platform, refused)
            return InboundResult(None, accepted=False, reason=refused)
        msg = clean_inbound(msg)
        text, problem = clean_text(msg.text, self.config.gateway.max_message_chars)
        alone = bool(msg.attachments) and is_blank(text)  # an attachment alone is a message
        if alone:
            text, problem = "", None
        key = self.keyer.key_for(msg)
        # Who may talk is decided first: a stranger's empty or oversized messages get no
        # answer beyond the refusal (at most one per window: gateway/inbound/access.py).
        decision = await self.access.check(msg)
        if decision.verdict == "reject":
            log.log(
                decision.log_level, "not answering %s:%s: %s",
                msg.platform, msg.sender_id, decision.reason,
            )
            if decision.reply:
                await self._reply_directly(msg, key, decision.reply)
            return InboundResult(key, accepted=False, reason=decision.reason)
        if problem is not None:
            if decision.verdict != "context":  # unmentioned group chatter gets no answer
                await self._reply_directly(msg, key, problem)
            return InboundResult(key, accepted=False, reason=problem)
        if not msg.is_direct and parse_command(text) is None:  # a command stays as typed
            text = f"{msg.sender_name or msg.sender_id}: {text}"  # who said it, for the model
        if text != msg.text:
            msg = replace(msg, text=text)
        info = SessionInfo(
            key=key,
            agent=self.config.gateway.agent,
            platform=msg.platform,
            chat_type=msg.chat_type,
            chat_id=msg.chat_id,
            thread_id=msg.thread_id,
            account=msg.account,
        )
        as_context = decision.verdict == "context"
        status, content = (CONTEXT_STATUS if as_context else None), None
        if msg.attachments:  # stored now, downloaded after: gateway/inbound/attachments.py
            status, content = self.intake.arrival(msg, alone=alone, as_context=as_context)
        _session_id, row = await self.store.accept_inbound(
            info, msg, status=status, content=content
        )
        if row is None:
            return InboundResult(key, accepted=False, duplicate=True, reason="duplicate message")
        if as_context:
            return InboundResult(key, accepted=True, reason=decision.reason)
        if row.status == FETCHING_STATUS:  # its turn comes once the files are saved
            self.intake.fetch(row, key, msg.thread_id, msg.account)
            return InboundResult(key, accepted=True)
        try:
            self.lanes.notify(key)
        except LanesClosedError:
            # Persisted: it will be answered when the gateway starts again.
            return InboundResult(key, accepted=False, reason="the gateway is shutting down")
        self.runner.arrivals.arrived(key)  # a running turn may steer or stop (queue_mode)
        return InboundResult(key, accepted=True)

    def _arrived(self, key: str) -> None:
        """A message with attachments is complete: its lane, and a running turn (queue_mode),
        hear of it as of any arrival."""
        self.lanes.notify(key)
        self.runner.arrivals.arrived(key)

    async def _reply_directly(self, msg: InboundMessage, key: str, text: str) -> None:
        await self.deliver(
            OutboundMessage(
                platform=msg.platform,
                chat_id=msg.chat_id,
                thread_id=msg.thread_id,
                text=text,
                session_key=key,
                reply_to=msg.platform_message_id,
                answers=(msg.platform_message_id,) if msg.platform_message_id else (),
            )
        )

    async def _archive(
        self,
        key: str,
        messages: Sequence[ArchivedMessage],
        identifiers: Sequence[tuple[str, str, Sequence[int]]],
    ) -> None:
        def archive() -> None:
            self.memory_index.archive_messages(key, messages)
            self.memory_index.archive_identifiers(key, identifiers)

        await asyncio.to_thread(archive)

    async def typing(self, platform: str, chat_id: str, thread_id: str | None) -> None:
        channel = self.channels.get(platform)
        if isinstance(channel, TypingChannel) and channel.capabilities.typing:
            await channel.typing(chat_id, thread_id)

    async def deliver(self, message: OutboundMessage) -> Delivery:
        """Send through the message's channel; what failed is logged and described."""
        channel = self.channels.get(message.platform)
        if channel is None:
            log.error("no channel %r to deliver a reply for %s", message.platform, message.session_key)
            return Delivery(False, message.sent_parts, f"no {message.platform!r} channel running")
        try:
            await channel.send(message)
        except Exception as exc:
            parts, cause = (
                (exc.parts, exc.__cause__ or exc)
                if isinstance(exc, PartlySent)
                else (message.sent_parts, exc)
            )
            error = failure_text(cause)
            after = f" after {parts} chunk(s)" if parts else ""
            # A refusal or an outage is one line (it may repeat for every try); a bug is not.
            log.error(
                "delivery failed on %s for %s%s: %s",
                message.platform, message.session_key, after, error,
                exc_info=None if platform_failure(channel, cause) else cause,
            )
            return Delivery(False, parts, error)
        return SENT

    # -- what scheduled jobs need (gateway.jobs.host: JobHost, MaintenanceHost) --------------

    def hold_lane(self, session_key: str) -> contextlib.AbstractAsyncContextManager[None]:
        return self.lanes.hold(session_key)

    async def reset_session(
        self, session_key: str, why: str, *, flush: bool = True
    ) -> CompactionRow | None:
        return await self.runner.reset_session(session_key, why, flush=flush)

    async def run_turn_now(self, session_key: str) -> None:
        await self.lanes.run_now(session_key)

    def count_tokens(self, message: Message) -> int:
        return self.resolver.counter.count_message(message)

    async def deliver_stored(self, outbox_id: int, message: OutboundMessage) -> None:
        await self.delivery.send(outbox_id, message)

    async def _cron_creator(self, job_id: str) -> tuple[str | None, bool] | None:
        """(person, owner) who created scheduled task `job_id`: whose rights its turn has."""
        try:
            info = await self.scheduler.job(job_id)
        except RuntimeError:  # the scheduler is not running: no rights beyond the session
            return None
        return None if info is None else (info.created_by, info.by_owner)

    def compaction_blocked(self, session: SessionRow) -> str | None:
        return compaction_blocked_reason(session, self.config.context.max_ineffective_compactions)

    async def prompt_size(self, session: SessionRow) -> PromptSize | None:
        """Assembled exactly as the next turn would be (no new messages), so an idle sweep
        decides on the same count a turn compacts on."""
        assert session.id is not None
        view = await self.runner.view(session.id)
        if not view.history:
            return None
        settings = self.runner.settings_for(session, None)
        plan = self.engine.assemble(
            self.runner.turn_context(session.key, view, 1 << 62, settings)
        )
        facts = plan.facts
        if facts is None or not facts.compaction_threshold:
            return None
        return PromptSize(
            tokens=facts.tokens.calibrated_total, compaction_threshold=facts.compaction_threshold
        )

    async def describe_session(self, session_key: str, command: str) -> str:
        """The answer to the chat command `/status` or `/context` (gateway/turn/commands.py)."""
        # The operations import this module: imported when first used, not at the top.
        from gateway.operations.chat import describe

        return await describe(self, session_key, command)

    async def compact_idle(self, session_key: str) -> CompactionResult | None:
        return await self.runner.compact_session(session_key, reason="idle")

    async def refresh_memory_index(self) -> RefreshStats:
        return await asyncio.to_thread(self.memory_index.refresh)
