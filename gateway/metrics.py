"""Prometheus metrics for one gateway: a registry it owns, fed by small runner hooks.

The registry is per Gateway (not prometheus_client's global one), so two gateways in one process
— tests, benchmarks — never share counters. `/metrics` serves `render()`.
Labels are low-cardinality on purpose: platform, outcome, reason — never a session key or user.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from context.compaction import CompactionResult
from gateway.inbound.lanes import SessionLanes
from gateway.turn.stats import TurnStats

CONTENT_TYPE = CONTENT_TYPE_LATEST

TURN_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)


class GatewayMetrics:
    """Turns, latency, tokens, compactions (and their failures), flushes, lane depth."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.turns = Counter(
            "gatehouse_turns", "Turns answered, by platform and outcome (ok or error).",
            ["platform", "outcome"], registry=r,
        )
        self.turn_seconds = Histogram(
            "gatehouse_turn_duration_seconds",
            "Time from claiming a turn's messages to its reply being ready.",
            ["platform"], buckets=TURN_SECONDS_BUCKETS, registry=r,
        )
        self.tokens = Counter(
            "gatehouse_llm_tokens",
            "Tokens the model endpoint reported: direction=in (prompt) or out (completion).",
            ["direction"], registry=r,
        )
        self.cached_tokens = Counter(
            "gatehouse_llm_cached_prompt_tokens",
            "Of the prompt tokens (direction=in), those the model endpoint read from its prompt "
            "cache, where it reports them (OpenAI, vLLM, llama.cpp's server).",
            registry=r,
        )
        self.compactions = Counter(
            "gatehouse_compactions",
            "Committed compactions, by reason (overflow, provider-overflow, command, manual) and "
            "whether the deterministic fallback summary was used.",
            ["reason", "fallback"], registry=r,
        )
        self.compaction_failures = Counter(
            "gatehouse_compaction_failures",
            "Compactions that committed nothing (history kept) or crashed, by reason.",
            ["reason"], registry=r,
        )
        self.flushes = Counter(
            "gatehouse_memory_flushes", "Silent memory-flush turns, by outcome (ok or failed).",
            ["outcome"], registry=r,
        )
        self.flush_notes = Counter(
            "gatehouse_memory_flush_notes",
            "Notes memory flushes wrote, by source: the model, or extracted from the "
            "conversation when the model wrote none.",
            ["source"], registry=r,
        )
        self.lanes_active = Gauge(
            "gatehouse_lanes_active", "Sessions with a turn running or waiting for a slot.",
            registry=r,
        )
        self.lane_queue_depth = Gauge(
            "gatehouse_lane_queue_depth",
            "Sessions with unanswered messages waiting for their next turn.", registry=r,
        )

        self._turn_children: dict[tuple[str, str], tuple[Counter, Histogram]] = {}
        self._tokens_in = self.tokens.labels("in")
        self._tokens_out = self.tokens.labels("out")

    def watch_lanes(self, lanes: SessionLanes) -> None:
        """Read lane gauges at scrape time, so they are never stale."""
        self.lanes_active.set_function(lambda: lanes.active)
        self.lane_queue_depth.set_function(lambda: lanes.queued)

    def observe_turn(self, stats: TurnStats) -> None:
        platform = stats.platform or "unknown"
        outcome = "error" if stats.error else "ok"
        # The labelled children, looked up once (`labels()` takes a lock and checks the values).
        children = self._turn_children.get((platform, outcome))
        if children is None:
            children = self._turn_children[(platform, outcome)] = (
                self.turns.labels(platform, outcome),
                self.turn_seconds.labels(platform),
            )
        children[0].inc()
        children[1].observe(stats.seconds)
        if stats.prompt_tokens:
            self._tokens_in.inc(stats.prompt_tokens)
        if stats.completion_tokens:
            self._tokens_out.inc(stats.completion_tokens)
        if stats.cached_tokens:
            self.cached_tokens.inc(stats.cached_tokens)

    def observe_compaction(self, reason: str, result: CompactionResult | None) -> None:
        if result is None or not result.committed:
            self.compaction_failures.labels(reason).inc()
            return
        self.compactions.labels(reason, "yes" if result.fallback else "no").inc()

    def observe_flush(self, ok: bool) -> None:
        self.flushes.labels("ok" if ok else "failed").inc()

    def observe_flush_notes(self, source: str, count: int) -> None:
        self.flush_notes.labels(source).inc(count)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
