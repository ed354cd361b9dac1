"""`gatehouse context`: compact a transcript file, explain a session's limits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from gateway.cli.common import JsonFlag, console, execute, show, sub_app

if TYPE_CHECKING:  # the operations open a gateway: imported by the command that runs them
    from gateway.operations import Explanation, TranscriptCompaction

app = sub_app("Inspect and manage the context engine.")


@app.command("compact")
def context_compact(
    transcript: Annotated[Path, typer.Argument(help="OpenAI-format JSONL, one message a line")],
    window: Annotated[
        int | None, typer.Option("--window", help="Context window in tokens (default: resolved)")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Compact a transcript with the configured LLM and print the resulting prompt."""
    from gateway.operations import TranscriptCompaction, TranscriptError, compact_transcript

    data = execute(
        lambda c: compact_transcript(c, transcript, window), quiet="WARNING", bundled_model=True,
        refusals=[(TranscriptError, "transcript error", 2)],
    )
    show(data, as_json, _print_compacted, TranscriptCompaction.to_json)


def _print_compacted(data: TranscriptCompaction) -> None:
    for m in data.prompt:
        console.rule(f"[bold]{m.role}[/bold]")
        text = m.content if isinstance(m.content, str) else json.dumps(m.content)
        if m.tool_calls:
            text = (text or "") + "\n" + json.dumps([tc.to_openai() for tc in m.tool_calls])
        console.print(escape(text or ""), highlight=False)
    report = data.report
    console.rule()
    archived = report.identifiers_archived if report else 0
    identifiers = len(report.identifiers) if report else 0
    passed = report is not None and report.quality.passed
    fallback = report.quality.fallback if report else None
    console.print(
        f"tokens {data.tokens_before:,} → {data.tokens_after:,} (the prompt above); "
        f"identifiers {identifiers}"
        + (f" ({archived:,} archived for history_search)" if archived else "")
        + f"; quality: {'passed' if passed else 'see --json'}"
        + (f"; fallback {fallback}" if fallback else "")
    )
    notes = list(report.notes) if report else []
    for note in notes or ([data.note] if data.note else []):
        console.print(f"- {escape(note)}", highlight=False)


@app.command("explain")
def context_explain(
    key: Annotated[str, typer.Argument(help="Session key (see `gatehouse sessions list`)")],
    as_json: JsonFlag = False,
    offline: Annotated[
        bool, typer.Option("--offline", help="Don't ask the LLM server for model metadata")
    ] = False,
) -> None:
    """Explain every limit applied to a session, and where each one comes from. For a key no
    one has written to yet, a preview of what its first message would get."""
    from gateway.inbound.session_keys import SessionKeyError
    from gateway.operations import Explanation, explain_session

    facts = execute(
        lambda c: explain_session(c, key, fetch_metadata=not offline), quiet="ERROR",
        refusals=[(SessionKeyError, "bad session key", 2)],
    )
    show(facts, as_json, _print_explain, Explanation.to_json)


def _print_explain(e: Explanation) -> None:
    from gateway.operations import Explanation

    console.print(f"[bold]{escape(e.session)}[/bold] ({e.platform}, {e.chat_type})")
    if e.preview:
        console.print(
            "[yellow]preview: no messages yet[/yellow] — what the first message would get"
        )
    plan = e.plan
    if plan is not None:
        rows = [
            ("engine", plan.engine, ""),
            ("model", plan.model, ""),
            ("context window", f"{plan.window:,} tokens", plan.window_source),
            ("token counter", plan.counter, "exact" if plan.counter_exact else "estimate ×1.2"),
            ("usage calibration", e.calibration, "provider usage.prompt_tokens"),
            ("history limit", e.history_limit_text, plan.history_limit_source),
            ("", Explanation.HISTORY_LIMIT_ORDER, ""),
        ]
        facts = Table("setting", "value", "source", title="Resolved limits")
        for name, value, source in rows:
            facts.add_row(name, escape(str(value)), escape(str(source)))
        console.print(facts)
        if plan.window_warning:
            console.print(f"[yellow]warning:[/yellow] {escape(plan.window_warning)}")
    if e.window_too_small:
        console.print("[red]turns are refused: the window is below 16,000 tokens[/red]")
    if plan is not None:
        budget = Table("budget", "tokens", "why", title="Budget")
        for line in plan.budget:
            budget.add_row(line.name, f"{line.tokens:,}", escape(line.why))
        console.print(budget)
        tokens = plan.tokens
        now = Table("part", "tokens", title="Current prompt (next turn, before the new message)")
        parts = {"system": tokens.system, "tools": tokens.tools, "summary": tokens.summary,
                 "history": tokens.history, "prompt": tokens.prompt}
        for part, count in parts.items():
            now.add_row(part, f"{count or 0:,}")
        now.add_row("whole stored history (local count)", f"{tokens.local_total:,}")
        console.print(now)
    console.print(
        f"stored messages: {e.stored_messages:,}, in prompt: {e.messages_in_prompt:,}; "
        f"last provider-reported prompt tokens: {e.last_reported_prompt_tokens or '-'}"
    )
    if plan is not None:
        console.print(
            f"memory flush at {plan.flush_threshold:,} tokens ({plan.to_flush:,} to go); "
            f"compaction at {plan.compaction_threshold:,} tokens ({plan.to_compaction:,} to go); "
            f"overflow tier now: [bold]{plan.tier.value}[/bold]"
        )
    if e.limits:
        loop = Table("limit", "value", "source", title="A turn's tool loop")
        for limit in e.limits:
            loop.add_row(limit.name, limit.value, escape(limit.source))
        console.print(loop)
    console.print(f"automatic compaction: {escape(e.automatic_compaction)}")
    last = e.last_compaction
    if last:
        q = last.quality or {}
        console.print(
            f"last compaction #{last.id}: seq {last.first_seq}-{last.last_seq}, "
            f"{last.tokens_before:,} → {last.tokens_after:,} tokens; compression "
            f"{q.get('compression_ratio', 0):.2f}, identifier retention "
            f"{q.get('identifier_retention', 0):.0%}, sections {len(q.get('sections_present', []))}/5"
            + (f", fallback {q['fallback']}" if q.get("fallback") else "")
        )
    for note in e.notes:
        console.print(f"- {escape(note)}")
