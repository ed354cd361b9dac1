"""Lossless LLM compaction (pure): chunked summaries in parallel, a merge, a quality guard,
code-guaranteed identifiers, an augmentation suffix, and a deterministic fallback.

Nothing here deletes anything: the result is a summary and the seq range it covers; the runner
stores it next to the untouched originals, and the prompt becomes "summary + messages after the
range". A summary that fails, comes back empty or times out is never used: the extractive
fallback is built from the messages themselves, with the same sections.

Pipeline (OpenClaw's, with the gaps its users hit closed):
1. Keep the last `recent_turns` user turns verbatim; the span before them is compacted.
2. Leave out messages over half the window, with a note (`[Large <role> (~NK tokens) omitted]`).
3. Redact secrets; extract identifiers from the *whole* span (and the previous summary).
4. Split the span into `parts` chunks by token share (adaptive chunk ratio), at message
   boundaries, never between a tool call and its result.
5. Summarize the chunks concurrently, then merge them (with the previous summary, which is
   re-distilled, never stacked) into the five sections.
6. Audit (quality guard); feed failures back and retry; keep the best attempt.
7. Append any identifier the model dropped; add the augmentation suffix; cap the size, cutting
   the body first.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from context.history import split_turns
from context.identifiers import (
    Identifier,
    extract_identifiers,
    missing_identifiers,
    redact_secrets,
    render_identifier_section,
)
from context.pruning import looks_like_error
from context.quality import REQUIRED_SECTIONS, QualityReport, audit_summary, score_for_ranking
from context.tokens import TokenCounter
from context.types import Message

SummaryCall = Callable[[list[Message]], Awaitable[str]]
"""Sends a prompt (system + user messages) to the summarizer model; returns its text."""

IdentifierPolicy = Literal["strict", "off", "custom"]

REFERENCE_HEADER = (
    "[Summary of earlier conversation — reference only. Tasks listed here were already "
    "handled or are pending as described; do not re-run them unless the user asks again. "
    "Answer the latest user message.]"
)
IDENTIFIERS_HEADING = "## Exact identifiers"
SUMMARY_MAX_CHARS = 16_000
MAX_TOOL_FAILURES = 8
TOOL_FAILURE_CHARS = 240
FILES_LIST_CHARS = 900
RECENT_TURN_CHARS = 600
RULES_CHARS = 2_000


@dataclass(frozen=True, slots=True)
class CompactionSettings:
    window: int
    recent_turns: int = 3
    parts: int = 2
    identifier_policy: IdentifierPolicy = "strict"
    custom_patterns: tuple[str, ...] = ()
    quality_guard: bool = True
    quality_retries: int = 1
    summary_max_chars: int = SUMMARY_MAX_CHARS
    critical_rules: str = ""
    """AGENTS.md's critical rules ("Red Lines"), read by the runner."""
    instructions: str = ""
    """Extra instructions from `/compact <instructions>`."""
    summary_budget_tokens: int | None = None
    """Largest acceptable summary (tokens); above it the summary cannot fit and is refused."""


@dataclass(frozen=True, slots=True)
class CompactionResult:
    summary: str
    first_seq: int | None
    last_seq: int | None
    """The stored range the summary covers (from the previous summary's start, if any)."""
    kept: list[Message]
    tokens_before: int
    tokens_after: int
    identifiers: list[Identifier]
    quality: QualityReport
    fallback: str | None = None
    """None, "extractive" (every model attempt failed), or "none" (nothing could fit)."""
    attempts: int = 0
    errors: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    model_identifier_retention: float = 1.0
    """Share of identifiers the model kept by itself (code appends the rest under strict)."""

    @property
    def committed(self) -> bool:
        """Whether the runner should store this summary (not when even the fallback failed)."""
        return self.fallback != "none" and bool(self.summary.strip())


@dataclass(frozen=True, slots=True)
class _Span:
    compacted: list[Message]
    kept: list[Message]


# -- splitting ------------------------------------------------------------------------------


def split_recent(messages: Sequence[Message], recent_turns: int) -> _Span:
    """Keep the last `recent_turns` user turns (at most 12) verbatim; the rest is compacted."""
    recent_turns = max(0, min(recent_turns, 12))
    turns = split_turns(messages)
    user_turns = [i for i, t in enumerate(turns) if t.user_message is not None]
    if recent_turns == 0 or not user_turns:
        cut = len(turns)
    elif len(user_turns) <= recent_turns:
        cut = user_turns[0]
    else:
        cut = user_turns[-recent_turns]
    compacted = [m for t in turns[:cut] for m in t.messages]
    kept = [m for t in turns[cut:] for m in t.messages]
    return _Span(compacted, kept)


def chunk_ratio(messages: Sequence[Message], window: int) -> float:
    """OpenClaw's adaptive chunk ratio: smaller chunks when messages are large for the window."""
    if not messages or window <= 0:
        return 0.4
    avg = sum(m.tokens or 0 for m in messages) / len(messages) * 1.2 / window
    if avg > 0.1:
        return max(0.15, 0.4 - min(2 * avg, 0.25))
    return 0.4


def _safe_cuts(messages: Sequence[Message]) -> list[int]:
    """Indices i where a chunk may start: no tool call is waiting for its result before i."""
    open_calls: set[str] = set()
    cuts: list[int] = []
    for i, m in enumerate(messages):
        if i > 0 and not open_calls:
            cuts.append(i)
        if m.role == "assistant":
            open_calls.update(c.id for c in m.tool_calls)
        elif m.role == "tool" and m.tool_call_id:
            open_calls.discard(m.tool_call_id)
    return cuts


def split_chunks(
    messages: Sequence[Message], parts: int, max_chunk_tokens: int, min_messages: int = 4
) -> list[list[Message]]:
    """Split into `parts` chunks of about equal tokens at safe boundaries; more chunks when a
    part would exceed `max_chunk_tokens`. Chunks keep at least `min_messages` messages."""
    total = sum(m.tokens or 0 for m in messages)
    if not messages:
        return []
    parts = max(1, parts)
    if max_chunk_tokens > 0:
        parts = max(parts, -(-total // max_chunk_tokens))
    parts = min(parts, max(1, len(messages) // max(min_messages, 1)))
    if parts == 1:
        return [list(messages)]
    cuts = _safe_cuts(messages)
    chunks: list[list[Message]] = []
    start = 0
    acc = 0
    target = total / parts
    prefix = [0]
    for m in messages:
        prefix.append(prefix[-1] + (m.tokens or 0))
    for cut in cuts:
        if len(chunks) == parts - 1:
            break
        acc = prefix[cut] - prefix[start]
        if cut - start >= min_messages and acc >= target and len(messages) - cut >= min_messages:
            chunks.append(list(messages[start:cut]))
            start = cut
    chunks.append(list(messages[start:]))
    return chunks


# -- rendering ------------------------------------------------------------------------------


def render_transcript(messages: Sequence[Message], window: int) -> tuple[str, list[str]]:
    """Messages as plain text for the summarizer; oversized ones replaced by a note."""
    lines: list[str] = []
    omitted: list[str] = []
    for m in messages:
        tokens = m.tokens or 0
        if window and tokens > window // 2:
            note = f"[Large {m.role} (~{max(1, round(tokens / 1000))}K tokens) omitted]"
            omitted.append(note)
            lines.append(note)
            continue
        lines.append(_render_message(m))
    return "\n\n".join(lines), omitted


def _render_message(m: Message) -> str:
    who = m.role.upper()
    if m.role == "tool":
        who = f"TOOL RESULT ({m.name or 'tool'}, call {m.tool_call_id})"
    parts = [f"{who}: {m.text}" if m.text else f"{who}:"]
    for call in m.tool_calls:
        parts.append(f"  -> calls {call.name}({call.arguments}) [call {call.id}]")
    return "\n".join(parts)


SECTION_GUIDE = (
    "Write the summary in Markdown with exactly these sections, in this order:\n"
    "## Decisions — what was decided, with the reason.\n"
    "## Open TODOs — unfinished work, with progress such as 5/17.\n"
    "## Constraints/Rules — constraints, preferences and commitments that still apply.\n"
    "## Pending user asks — what the user asked that is not done yet; quote the latest ask.\n"
    "## Exact identifiers — every ID, hash, URL, path, file name, host:port, IP, e-mail, "
    "number and ticket id, copied exactly, one per line.\n"
    "You may start with a short '## State' section (what was being done). Prioritise recent "
    "context. Never invent anything; write 'none' in an empty section."
)

CHUNK_SYSTEM = (
    "You compress part of a conversation between a user and an AI agent into notes the agent "
    "will rely on after the original messages leave its context. Preserve active tasks and "
    "their progress, the last user request, decisions with their rationale, TODOs, "
    "constraints, commitments, failed tool calls with their errors, and every identifier "
    "verbatim.\n\n" + SECTION_GUIDE
)

MERGE_SYSTEM = (
    "You merge partial summaries of one conversation (and, if given, the previous summary) "
    "into one coherent summary. Re-distill: keep what still matters, drop what was resolved, "
    "never repeat the previous summary as a block. Preserve active tasks, batch progress, the "
    "last user request, decisions with rationale, TODOs, constraints and every identifier "
    "verbatim.\n\n" + SECTION_GUIDE
)


def chunk_prompt(
    transcript: str, index: int, total: int, identifiers: Sequence[Identifier], instructions: str
) -> list[Message]:
    ids = ", ".join(f"`{i.value}`" for i in identifiers) or "none"
    user = (
        f"Conversation part {index} of {total}:\n\n<conversation>\n{transcript}\n</conversation>"
        f"\n\nIdentifiers that must appear verbatim if they occur in this part: {ids}"
    )
    if instructions:
        user += f"\n\nAdditional instructions from the user: {instructions}"
    return [Message(role="system", content=CHUNK_SYSTEM), Message(role="user", content=user)]


def merge_prompt(
    partials: Sequence[str],
    previous_summary: str | None,
    identifiers: Sequence[Identifier],
    latest_ask: str | None,
    instructions: str,
    problems: Sequence[str] = (),
) -> list[Message]:
    blocks = []
    if previous_summary:
        blocks.append(f"<previous-summary>\n{previous_summary}\n</previous-summary>")
    for i, text in enumerate(partials, 1):
        blocks.append(f'<part n="{i}">\n{text}\n</part>')
    ids = "\n".join(f"- `{i.value}`" for i in identifiers) or "none"
    user = "\n\n".join(blocks) + f"\n\nIdentifiers that must appear verbatim:\n{ids}"
    if latest_ask:
        user += f"\n\nThe latest user ask (quote it under ## Pending user asks): {latest_ask}"
    if instructions:
        user += f"\n\nAdditional instructions from the user: {instructions}"
    if problems:
        user += "\n\nYour previous attempt had these problems; fix all of them:\n" + "\n".join(
            f"- {p}" for p in problems
        )
    return [Message(role="system", content=MERGE_SYSTEM), Message(role="user", content=user)]


# -- augmentation ---------------------------------------------------------------------------

_EXIT_RE = re.compile(r"exit(?:ed with)? (?:code|status)\W{0,3}(-?\d+)", re.IGNORECASE)
_READ_TOOLS = ("read", "cat", "open", "view", "get", "load", "fetch", "search", "list", "grep")
_WRITE_TOOLS = ("write", "edit", "patch", "save", "create", "delete", "remove", "move", "append")


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def tool_failures(messages: Sequence[Message]) -> list[str]:
    """The last failed tool results, with status and exit code."""
    calls = {c.id: c for m in messages for c in m.tool_calls}
    out: list[str] = []
    for m in messages:
        if m.role != "tool" or not looks_like_error(m.text):
            continue
        call = calls.get(m.tool_call_id or "")
        name = m.name or (call.name if call else "tool")
        code = _EXIT_RE.search(m.text)
        status = f"exit code {code.group(1)}" if code else "error"
        args = _clip(call.arguments, 80) if call else ""
        out.append(_clip(f"{name}({args}) failed [{status}]: {m.text}", TOOL_FAILURE_CHARS))
    return out[-MAX_TOOL_FAILURES:]


def _paths_in(arguments: str) -> list[str]:
    try:
        data = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return []
    found: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            if isinstance(value, str) and (
                "path" in key.lower() or "file" in key.lower() or key.lower() in ("src", "dst")
            ):
                found.append(value)
    return found


def file_activity(messages: Sequence[Message]) -> tuple[list[str], list[str]]:
    """Files read and modified, from the tool calls' arguments."""
    read: list[str] = []
    modified: list[str] = []
    for m in messages:
        for call in m.tool_calls:
            paths = _paths_in(call.arguments)
            name = call.name.lower()
            target = modified if any(w in name for w in _WRITE_TOOLS) else (
                read if any(r in name for r in _READ_TOOLS) else None
            )
            if target is None:
                continue
            for p in paths:
                if p not in target:
                    target.append(p)
    return read, modified


def augmentation(
    compacted: Sequence[Message], kept: Sequence[Message], critical_rules: str
) -> list[str]:
    """Suffix sections that survive truncation of the body."""
    sections: list[str] = []
    failures = tool_failures(compacted)
    if failures:
        sections.append("## Tool failures\n" + "\n".join(f"- {f}" for f in failures))
    read, modified = file_activity(compacted)
    if read or modified:
        lines = ["## Files"]
        if read:
            lines.append("- read: " + _clip(", ".join(read), FILES_LIST_CHARS))
        if modified:
            lines.append("- modified: " + _clip(", ".join(modified), FILES_LIST_CHARS))
        sections.append("\n".join(lines))
    recent = [m for m in kept if m.role in ("user", "assistant") and m.text]
    if recent:
        sections.append(
            "## Recent turns (kept verbatim after this summary)\n"
            + "\n".join(f"- {m.role}: {_clip(m.text, RECENT_TURN_CHARS)}" for m in recent)
        )
    if critical_rules.strip():
        sections.append("## Critical rules (AGENTS.md)\n" + _clip_block(critical_rules, RULES_CHARS))
    return sections


def _clip_block(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- assembling the final summary -----------------------------------------------------------

_HEADING_RE = re.compile(r"^##\s+(.+?)\s*:?\s*$", re.MULTILINE)


def _split_identifier_section(summary: str) -> tuple[str, str]:
    """(body without the identifiers section, the section's lines)."""
    matches = list(_HEADING_RE.finditer(summary))
    for i, match in enumerate(matches):
        if match.group(1).strip().lower() == "exact identifiers":
            end = matches[i + 1].start() if i + 1 < len(matches) else len(summary)
            body = summary[: match.start()] + summary[end:]
            return body.strip(), summary[match.end() : end].strip()
    return summary.strip(), ""


def finalize(
    model_summary: str,
    identifiers: Sequence[Identifier],
    suffix_sections: Sequence[str],
    max_chars: int,
    policy: IdentifierPolicy,
) -> tuple[str, list[Identifier]]:
    """Reference header + body + `## Exact identifiers` (completed by code) + suffix, capped.

    The cap cuts the body first, then the suffix; the identifier section is never cut, so the
    strict policy's guarantee holds whatever the size.
    """
    body, id_lines = _split_identifier_section(model_summary)
    appended = missing_identifiers(model_summary, identifiers) if policy != "off" else []
    id_section = IDENTIFIERS_HEADING + "\n" + "\n".join(
        x for x in (id_lines, render_identifier_section(appended)) if x.strip()
    )
    if id_section.strip() == IDENTIFIERS_HEADING:
        id_section += "\nnone"
    suffix = "\n\n".join(suffix_sections)
    fixed = len(REFERENCE_HEADER) + len(id_section) + len(suffix) + 8
    room = max_chars - fixed
    if room < len(body):
        if room >= 200:
            body = body[: room - 60].rstrip() + "\n[… summary body cut to fit the size cap …]"
        else:
            body = "[summary body cut to fit the size cap]"
            room_suffix = max_chars - len(REFERENCE_HEADER) - len(id_section) - len(body) - 8
            suffix = suffix[: max(0, room_suffix)]
    text = "\n\n".join(x for x in (REFERENCE_HEADER, body, id_section, suffix) if x.strip())
    return text, appended


# -- extractive fallback --------------------------------------------------------------------

_DECISION_RE = re.compile(
    r"\b(decid\w*|agreed|we'?ll go with|let'?s go with|chose|chosen|settled on|approved)\b",
    re.IGNORECASE,
)
_TODO_RE = re.compile(
    r"(\bTODO\b|- \[ \]|\bnext step|\bneed to\b|\bstill have to\b|\bremaining\b|\bpending\b)",
    re.IGNORECASE,
)
_RULE_RE = re.compile(r"\b(must|never|always|don'?t|do not|only|required?)\b", re.IGNORECASE)
_SENTENCE_RE = re.compile(r"(?<=[.!?。！？])\s+|\n+")


def _sentences(messages: Sequence[Message], roles: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for m in messages:
        if m.role in roles and m.text:
            out.extend(s.strip() for s in _SENTENCE_RE.split(m.text) if s.strip())
    return out


def _pick(sentences: Sequence[str], pattern: re.Pattern[str], limit: int) -> list[str]:
    seen: list[str] = []
    for s in reversed(sentences):
        if pattern.search(s):
            clipped = _clip(s, 300)
            if clipped not in seen:
                seen.append(clipped)
        if len(seen) >= limit:
            break
    return list(reversed(seen))


def extractive_summary(
    compacted: Sequence[Message], previous_summary: str | None, latest_ask: str | None
) -> str:
    """A deterministic summary with the same sections, filled from the messages themselves."""
    said = _sentences(compacted, ("user", "assistant"))
    user_said = _sentences(compacted, ("user",))

    def section(title: str, items: Sequence[str]) -> str:
        return f"## {title}\n" + ("\n".join(f"- {i}" for i in items) if items else "- none")

    asks = [_clip(m.text, 300) for m in compacted if m.role == "user" and m.text][-3:]
    if latest_ask and _clip(latest_ask, 300) not in asks:
        asks.append(_clip(latest_ask, 300))
    parts = [
        "## State\n- Extractive summary (the summarizer model was unavailable); sentences are "
        "quoted from the conversation.",
        section("Decisions", _pick(said, _DECISION_RE, 12)),
        section("Open TODOs", _pick(said, _TODO_RE, 12)),
        section("Constraints/Rules", _pick(user_said, _RULE_RE, 12)),
        section("Pending user asks", asks),
    ]
    if previous_summary:
        body, _ids = _split_identifier_section(previous_summary.replace(REFERENCE_HEADER, ""))
        parts.append("## Earlier summary\n" + _clip_block(body, 4_000))
    return "\n\n".join(parts)


# -- the pipeline ---------------------------------------------------------------------------


def _latest_ask(messages: Sequence[Message]) -> str | None:
    for m in reversed(messages):
        if m.role == "user" and m.text.strip():
            return m.text.strip()
    return None


def _redacted(messages: Sequence[Message]) -> list[Message]:
    out: list[Message] = []
    for m in messages:
        text, found = redact_secrets(m.text) if m.text else (m.text, [])
        calls = m.tool_calls
        if calls:
            calls = tuple(replace(c, arguments=redact_secrets(c.arguments)[0]) for c in calls)
        if found or calls != m.tool_calls:
            m = replace(m, content=text, tool_calls=calls)
        out.append(m)
    return out


@dataclass
class _Attempts:
    errors: list[str] = field(default_factory=list)
    calls: int = 0


async def _call(call: SummaryCall, prompt: list[Message], log: _Attempts) -> str | None:
    log.calls += 1
    try:
        text = await call(prompt)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a failed summary is recorded, never committed
        log.errors.append(f"{type(exc).__name__}: {exc}")
        return None
    if not text or not text.strip():
        log.errors.append("empty summary")
        return None
    return text.strip()


async def compact(
    messages: Sequence[Message],
    *,
    previous_summary: str | None,
    previous_first_seq: int | None,
    counter: TokenCounter,
    settings: CompactionSettings,
    summarize: SummaryCall,
) -> CompactionResult | None:
    """Compact `messages` (the history after the previous summary's range).

    Returns None when there is nothing to compact (everything is within the recent turns).
    """
    messages = counter.ensure_counted(messages)
    span = split_recent(messages, settings.recent_turns)
    if not span.compacted:
        return None
    # Everything that can reach the summarizer or the summary is redacted first: the span, the
    # recent turns quoted in the augmentation, the latest ask and `/compact` instructions.
    compacted = _redacted(span.compacted)
    kept_redacted = _redacted(span.kept)
    latest_ask = _latest_ask([*compacted, *kept_redacted])
    if settings.instructions:  # `/compact <instructions>` is user text too
        settings = replace(settings, instructions=redact_secrets(settings.instructions)[0])
    previous_tokens = counter.count_text(previous_summary) if previous_summary else 0
    tokens_before = previous_tokens + sum(m.tokens or 0 for m in messages)

    texts = [m.text for m in span.compacted] + [
        c.arguments for m in span.compacted for c in m.tool_calls
    ]
    if previous_summary:
        texts.insert(0, previous_summary)
    identifiers = extract_identifiers(
        texts, policy=settings.identifier_policy, custom_patterns=settings.custom_patterns
    )

    window = settings.window
    ratio = chunk_ratio(compacted, window)
    max_chunk = max(1_024, int(window * ratio) - 4_096)
    chunks = split_chunks(compacted, settings.parts, max_chunk)
    log = _Attempts()
    notes: list[str] = []

    transcripts = [render_transcript(c, window) for c in chunks]
    for _text, omitted in transcripts:
        notes.extend(omitted)
    single = len(chunks) == 1 and not previous_summary
    partial_results = await asyncio.gather(
        *(
            _call(
                summarize,
                chunk_prompt(
                    text,
                    i,
                    len(chunks),
                    [ident for ident in identifiers if ident.value in text],
                    settings.instructions,
                ),
                log,
            )
            for i, (text, _omitted) in enumerate(transcripts, 1)
        )
    )
    partials = [p for p in partial_results if p]
    suffix = augmentation(compacted, kept_redacted, settings.critical_rules)
    source_texts = [m.text for m in compacted if m.text]
    kept_tokens = sum(m.tokens or 0 for m in span.kept)

    def audit(text: str, after: int) -> QualityReport:
        return audit_summary(
            text,
            identifiers=identifiers,
            latest_ask=latest_ask,
            source_texts=source_texts,
            tokens_before=tokens_before,
            tokens_after=after,
        )

    def build(model_text: str, fallback: str | None, retries: int) -> tuple[str, QualityReport]:
        """The final summary, and the audit of what the *model* wrote (what the guard judges)."""
        final, _appended = finalize(
            model_text, identifiers, suffix, settings.summary_max_chars,
            settings.identifier_policy,
        )
        report = audit(model_text, counter.count_text(final) + kept_tokens)
        return final, replace(report, retries_used=retries, fallback=fallback)

    best: tuple[str, QualityReport, str] | None = None
    if len(partials) == len(chunks):
        candidate: str | None = partials[0] if single else None
        problems: list[str] = []
        max_tries = 1 + (max(0, min(settings.quality_retries, 3)) if settings.quality_guard else 0)
        for attempt in range(max_tries):
            if candidate is None or attempt > 0:
                prompt = merge_prompt(
                    partials, previous_summary, identifiers, latest_ask,
                    settings.instructions, problems,
                )
                candidate = await _call(summarize, prompt, log)
            label: str | None = None
            if candidate is None and attempt == 0:
                # The merge failed but every part was summarized: keep the parts as they are.
                candidate, label = "\n\n".join(partials), "unmerged"
                notes.append("merge call failed; kept the part summaries unmerged")
            if candidate is None:
                break
            final, report = build(candidate, label, attempt)
            if best is None or score_for_ranking(report) > score_for_ranking(best[1]):
                best = (final, report, candidate)
            if not settings.quality_guard or report.passed or label is not None:
                break
            problems = list(report.problems)
            candidate = None
    else:
        notes.append(f"{len(chunks) - len(partials)} of {len(chunks)} chunk summaries failed")

    fallback: str | None = None
    if best is None:
        fallback = "extractive"
        model_text = extractive_summary(compacted, previous_summary, latest_ask)
        final, report = build(model_text, fallback, 0)
        best = (final, report, model_text)
        notes.append("summarizer failed; used the extractive fallback: " + "; ".join(log.errors))

    final, model_report, _raw = best
    fallback = model_report.fallback
    summary_tokens = counter.count_text(final)
    tokens_after = summary_tokens + kept_tokens
    # What is stored: the audit of the final text (identifiers completed by code), plus how many
    # identifiers the model itself kept.
    report = replace(
        audit(final, tokens_after),
        retries_used=model_report.retries_used,
        fallback=model_report.fallback,
    )
    model_retention = model_report.identifier_retention
    budget = settings.summary_budget_tokens
    if budget is not None and summary_tokens > budget:
        notes.append(
            f"summary needs {summary_tokens:,} tokens, more than the {budget:,} available; "
            "history kept, not compacted"
        )
        return CompactionResult(
            summary="",
            first_seq=None,
            last_seq=None,
            kept=list(messages),
            tokens_before=tokens_before,
            tokens_after=tokens_before,
            identifiers=identifiers,
            quality=replace(report, fallback="none"),
            fallback="none",
            model_identifier_retention=model_retention,
            attempts=log.calls,
            errors=tuple(log.errors),
            notes=tuple(notes),
        )
    seqs = [m.seq for m in span.compacted if m.seq is not None]
    first = previous_first_seq if previous_first_seq is not None else (min(seqs) if seqs else None)
    return CompactionResult(
        summary=final,
        first_seq=first,
        last_seq=max(seqs) if seqs else None,
        kept=span.kept,
        tokens_before=tokens_before,
        tokens_after=tokens_after,
        identifiers=identifiers,
        quality=report,
        fallback=fallback,
        model_identifier_retention=model_retention,
        attempts=log.calls,
        errors=tuple(log.errors),
        notes=tuple(notes),
    )


__all__ = [
    "IDENTIFIERS_HEADING",
    "REFERENCE_HEADER",
    "REQUIRED_SECTIONS",
    "CompactionResult",
    "CompactionSettings",
    "SummaryCall",
    "augmentation",
    "chunk_prompt",
    "chunk_ratio",
    "compact",
    "extractive_summary",
    "finalize",
    "merge_prompt",
    "render_transcript",
    "split_chunks",
    "split_recent",
]
