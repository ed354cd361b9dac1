"""Lossless LLM compaction (pure): chunked summaries in parallel, a merge, a quality guard, a
bounded identifier section backed by an exact-lookup archive, and a deterministic fallback that
always fits.

Nothing here deletes anything: the result is a summary and the seq range it covers; the runner
stores it next to the untouched originals, archives every identifier of the range with the seqs
it appears in (the `history_search` tool finds them), and the prompt becomes "summary + messages
after the range". A summary that fails, comes back empty or times out is never used: the
extractive fallback is built from the messages themselves, with the same sections.

Pipeline:
1. Keep the last `recent_turns` user turns verbatim; the span before them is compacted.
2. Leave out messages over half the window, with a note (`[Large <role> (~NK tokens) omitted]`).
3. Redact secrets; rank the span's identifiers by salience (`context.salience`).
4. Split the span into `parts` chunks by token share (adaptive chunk ratio), at message
   boundaries, never between a tool call and its result.
5. Summarize the chunks concurrently, then merge them (with the previous summary, which is
   re-distilled, never stacked) into the five sections.
6. Audit (quality guard); feed failures back and retry; keep the best attempt.
7. Carry over, quoted, any decision, TODO, constraint or ask the model dropped.
8. Fit the summary to its token budget: the other sections first, then as many identifiers as
   fit (never more than `identifier_share` of the budget), then a line saying how many more are
   archived. A model summary whose body alone cannot fit gives way to the extractive summary,
   shrunk section by section (identifiers and bulk first, asks and red lines last).

The guarantee: every identifier of the span is verbatim in the summary or one exact
`history_search` lookup away.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from context.failures import READ_TOOLS, tool_failure
from context.history import split_turns
from context.identifiers import inline_code
from context.quality import (
    REQUIRED_SECTIONS,
    QualityReport,
    audit_summary,
    find_sections,
    keywords,
    score_for_ranking,
)
from context.salience import RankedIdentifier, rank_identifiers
from context.secrets import redact_secrets
from context.tokens import TokenCounter
from context.types import Identifier, Message

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
TOOL_FAILURE_CHARS = 320
FILES_LIST_CHARS = 900
RECENT_TURN_CHARS = 600
RULES_CHARS = 2_000
ARCHIVE_TOOL = "history_search"
IDENTIFIER_SHARE = 0.4
"""The most of the summary budget the identifier section may take: the other sections first."""
FAILURE_SHARE = 0.25
"""The most of the summary budget the tool-failures section may take (its newest failures)."""
MODEL_IDENTIFIERS = 300
"""At most this many (most salient) identifiers are named to the summarizer as must-keep."""
COVERED_SHARE = 0.7
"""A decision/TODO/constraint counts as kept when the summary has this share of its keywords."""


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
    """Largest acceptable summary (tokens); the summary is fitted to it or refused."""
    identifier_share: float = IDENTIFIER_SHARE
    archive_tool: str = ARCHIVE_TOOL
    """The lookup tool the summary names for the identifiers it does not list."""


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
    """Share of the salient identifiers the model kept by itself (code adds the rest)."""
    ranked_identifiers: tuple[RankedIdentifier, ...] = ()
    """Every identifier of the span, most salient first, with the seqs it appears in: the
    runner archives them all, so the ones the summary does not list are one lookup away."""
    identifiers_in_summary: int = 0
    prompt: tuple[Message, ...] = ()
    """The next live prompt after this compaction (set by the engine), as the model gets it."""
    pinned_seqs: tuple[int, ...] = ()
    """Kept messages whose seq falls inside the covered range: the ask of the turn the range
    cuts into. The runner stores them with the summary, and they are sent after it."""

    @property
    def committed(self) -> bool:
        """Whether the runner should store this summary (not when even the fallback failed)."""
        return self.fallback != "none" and bool(self.summary.strip())


@dataclass(frozen=True, slots=True)
class Span:
    """What a compaction summarizes and what stays verbatim after it. `kept` is the newest
    messages, plus (before them) the ask of a turn the span cuts into, pinned: its seq falls
    inside the summarized range, yet it is sent as it is."""

    compacted: list[Message]
    kept: list[Message]


# -- splitting ------------------------------------------------------------------------------


def split_recent(messages: Sequence[Message], recent_turns: int) -> Span:
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
    return Span(compacted, kept)


def chunk_ratio(messages: Sequence[Message], window: int) -> float:
    """Adaptive chunk ratio: smaller chunks when messages are large for the window."""
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
    repeats = 0  # tool results with the same text as the one before (a reply's "not run"s)
    for i, m in enumerate(messages):
        tokens = m.tokens or 0
        if window and tokens > window // 2:
            note = f"[Large {m.role} (~{max(1, round(tokens / 1000))}K tokens) omitted]"
            omitted.append(note)
            lines.append(note)
            continue
        same = m.role == "tool" and i > 0 and messages[i - 1].role == "tool" and (
            messages[i - 1].text == m.text
        )
        repeats = repeats + 1 if same else 0
        if repeats >= 2:
            if i + 1 == len(messages) or not (
                messages[i + 1].role == "tool" and messages[i + 1].text == m.text
            ):
                lines.append(f"[{repeats - 1:,} more tool results with the same text]")
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


def length_line(tokens: int | None) -> str:
    """What the summarizer is told of the room its summary gets (none when unbounded)."""
    if tokens is None:
        return ""
    return (
        f"\n\nLength: the summary gets at most {tokens:,} tokens (about {tokens * 3 // 4:,} "
        "words) before its identifier section, which is added after it; keep it within that "
        "by dropping what matters least, never by cutting the latest ask."
    )


def chunk_prompt(
    transcript: str, index: int, total: int, identifiers: Sequence[Identifier], instructions: str,
    length: int | None = None,
) -> list[Message]:
    ids = ", ".join(f"`{i.value}`" for i in identifiers) or "none"
    user = (
        f"Conversation part {index} of {total}:\n\n<conversation>\n{transcript}\n</conversation>"
        f"\n\nIdentifiers that must appear verbatim if they occur in this part: {ids}"
    ) + length_line(length)
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
    length: int | None = None,
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
    user += length_line(length)
    if instructions:
        user += f"\n\nAdditional instructions from the user: {instructions}"
    if problems:
        user += "\n\nYour previous attempt had these problems; fix all of them:\n" + "\n".join(
            f"- {p}" for p in problems
        )
    return [Message(role="system", content=MERGE_SYSTEM), Message(role="user", content=user)]


# -- augmentation ---------------------------------------------------------------------------

_WRITE_TOOLS = ("write", "edit", "patch", "save", "create", "delete", "remove", "move", "append")


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def tool_failures(messages: Sequence[Message]) -> list[str]:
    """The last failed tool results (from the tool's own flag, exit codes, then text), each
    with its call, status and error line."""
    calls = {c.id: c for m in messages for c in m.tool_calls}
    out: list[str] = []
    for m in messages:
        if m.role != "tool":
            continue
        failure = tool_failure(m, calls.get(m.tool_call_id or ""))
        if failure is None:
            continue
        status = f"exit code {failure.exit_code}" if failure.exit_code is not None else "error"
        args = _clip(failure.arguments, 160)
        where = f" (seq {failure.seq})" if failure.seq is not None else ""
        out.append(
            _clip(f"{failure.tool}({args}) failed [{status}]{where}: {failure.detail}",
                  TOOL_FAILURE_CHARS)
        )
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
                read if any(r in name for r in READ_TOOLS) else None
            )
            if target is None:
                continue
            for p in paths:
                if p not in target:
                    target.append(p)
    return read, modified


Suffix = tuple[str, str]
"""(name, Markdown section) appended after the body: "failures", "files", "recent", "rules"."""

#: Which suffix sections go first when a summary must shrink: the recent turns are verbatim in
#: the prompt anyway, and the red lines are in every system prompt, but they go last.
SUFFIX_DROP_ORDER = ("recent", "files", "failures", "rules")


FAILURES_HEADING = "## Tool failures"


def earlier_failures(previous_summary: str | None) -> list[str]:
    """The failure lines of the previous summary's `## Tool failures` section: a long loop
    compacts many times, and each summary carries the newest failures of all its spans."""
    if not previous_summary:
        return []
    section = find_sections(previous_summary).get(FAILURES_HEADING)
    if section is None:
        match = re.search(rf"^{FAILURES_HEADING}\s*\n(.*?)(?=^##\s|\Z)", previous_summary,
                          re.MULTILINE | re.DOTALL)
        section = match.group(1) if match else ""
    return [line[2:].strip() for line in section.splitlines() if line.startswith("- ")]


def augmentation(
    compacted: Sequence[Message], kept: Sequence[Message], critical_rules: str,
    previous_summary: str | None = None, failure_tokens: int | None = None,
    counter: TokenCounter | None = None,
) -> list[Suffix]:
    """Suffix sections that code guarantees, whatever the model wrote. The failures are the
    newest of this span and the previous summary's, at most `MAX_TOOL_FAILURES`, and at most
    `failure_tokens` (counted by `counter`): the rest are one `history_search` away."""
    sections: list[Suffix] = []
    failures = list(dict.fromkeys([*earlier_failures(previous_summary), *tool_failures(compacted)]))
    failures = failures[-MAX_TOOL_FAILURES:]
    if failure_tokens is not None and counter is not None:
        kept_failures: list[str] = []
        room = failure_tokens
        for line in reversed(failures):
            room -= counter.count_text(line) + 2
            if room < 0:
                break
            kept_failures.insert(0, line)
        failures = kept_failures
    if failures:
        sections.append(("failures", f"{FAILURES_HEADING}\n" + "\n".join(f"- {f}" for f in failures)))
    read, modified = file_activity(compacted)
    if read or modified:
        lines = ["## Files"]
        if read:
            lines.append("- read: " + _clip(", ".join(read), FILES_LIST_CHARS))
        if modified:
            lines.append("- modified: " + _clip(", ".join(modified), FILES_LIST_CHARS))
        sections.append(("files", "\n".join(lines)))
    recent = [m for m in kept if m.role in ("user", "assistant") and m.text]
    if recent:
        sections.append((
            "recent",
            "## Recent turns (kept verbatim after this summary)\n"
            + "\n".join(f"- {m.role}: {_clip(m.text, RECENT_TURN_CHARS)}" for m in recent),
        ))
    if critical_rules.strip():
        sections.append(
            ("rules", "## Critical rules (AGENTS.md)\n" + _clip_block(critical_rules, RULES_CHARS))
        )
    return sections


def _clip_block(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- fitting the final summary --------------------------------------------------------------

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


def archive_line(count: int, tool: str) -> str:
    """What the summary says about the identifiers it does not list."""
    return (
        f"- {count:,} more identifiers from these messages are archived, not listed here: call "
        f"`{tool}` with an exact identifier (or a few words) to get the messages it appears in, "
        "with their seq and time."
    )


def framing_tokens(ranked_count: int, archive_tool: str, counter: TokenCounter) -> int:
    """What a summary costs besides its body and suffix: the reference header, the identifier
    heading and a worst-case archive line (`fit_summary` counts the same)."""
    return counter.count_text(
        "\n\n".join((REFERENCE_HEADER, IDENTIFIERS_HEADING, archive_line(max(1, ranked_count),
                                                                        archive_tool)))
    )


def body_room(
    budget: int, suffix: Sequence[Suffix], ranked_count: int, counter: TokenCounter,
    identifier_share: float = IDENTIFIER_SHARE, archive_tool: str = ARCHIVE_TOOL,
) -> int:
    """The tokens a summary's body may take: the budget less its framing, the suffix sections
    that survive a tight budget (failures and rules) and the identifier section's share."""
    kept = [text for name, text in suffix if name in ("failures", "rules")]
    rest = framing_tokens(ranked_count, archive_tool, counter)
    rest += sum(counter.count_text(t) for t in kept)
    return max(0, int(budget * (1 - max(0.0, min(identifier_share, 1.0)))) - rest)


def shrink_body(body: str, tokens: int, counter: TokenCounter) -> str | None:
    """`body` cut to `tokens`: whole bullet lines from the end of each section, the largest
    sections first, the `## Pending user asks` section last (its latest ask is whole); None
    when even the headings with one line each do not fit."""
    if counter.count_text(body) <= tokens:
        return body
    matches = list(_HEADING_RE.finditer(body))
    if not matches:
        return None
    sections: list[tuple[str, list[str]]] = []
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(body)
        lines = [x for x in body[match.end() : end].strip().splitlines() if x.strip()]
        sections.append((match.group(0).strip(), lines))
    sections = [(h, ls) for h, ls in sections if _canonical(h.lstrip("# ")) != "## State"] or sections

    def render() -> str:
        return "\n\n".join(h + ("\n" + "\n".join(ls) if ls else "") for h, ls in sections)

    text = render()
    while counter.count_text(text) > tokens:
        candidates = [
            (len(ls) - (1 if "Pending user asks" in h else 0), -i)
            for i, (h, ls) in enumerate(sections) if len(ls) > 1
        ]
        if not candidates:
            return None
        _n, neg = max(candidates)
        heading, lines = sections[-neg]
        # Asks: the oldest goes first (the latest is the last line); elsewhere the last line.
        lines.pop(0 if "Pending user asks" in heading else -1)
        text = render()
    return text


@dataclass(frozen=True, slots=True)
class Fitted:
    text: str
    listed: tuple[Identifier, ...]
    """Identifiers verbatim in the text (in the body, a suffix, or the identifier section)."""
    dropped: tuple[str, ...] = ()
    """Suffix sections left out to fit."""


def fit_summary(
    body: str,
    ranked: Sequence[RankedIdentifier],
    suffix: Sequence[Suffix],
    *,
    budget_tokens: int | None,
    max_chars: int,
    counter: TokenCounter,
    identifier_share: float = IDENTIFIER_SHARE,
    archive_tool: str = ARCHIVE_TOOL,
    policy: IdentifierPolicy = "strict",
) -> Fitted | None:
    """Reference header + body + `## Exact identifiers` + suffix, within the budget.

    The identifier section gets what the other sections leave, filled in salience order; a
    closing line counts the identifiers it had no room for and names the lookup tool. Suffix
    sections are dropped in `SUFFIX_DROP_ORDER` when the body and suffix alone do not fit.
    None when the body alone cannot fit (`body_room` says how large it may be).
    """
    budget = budget_tokens if budget_tokens is not None else 1 << 40
    sections = list(suffix)
    dropped: list[str] = []

    def render(id_lines: Sequence[str], secs: Sequence[Suffix]) -> str:
        id_section = IDENTIFIERS_HEADING + "\n" + ("\n".join(id_lines) if id_lines else "- none")
        parts = (REFERENCE_HEADER, body, id_section, *(s for _n, s in secs))
        return "\n\n".join(p for p in parts if p.strip())

    def size(text: str) -> int:
        return counter.count_text(text)

    def over(text: str, tokens: int) -> bool:
        return tokens > budget or len(text) > max_chars

    # The room the rest needs, with a worst-case archive line in the identifier section.
    worst_line = archive_line(max(1, len(ranked)), archive_tool)
    base = render([worst_line], sections)
    base_tokens = size(base)
    for name in SUFFIX_DROP_ORDER:
        if not over(base, base_tokens):
            break
        kept = [s for s in sections if s[0] != name]
        if len(kept) != len(sections):
            sections, base = kept, render([worst_line], kept)
            base_tokens = size(base)
            dropped.append(name)
    if over(base, base_tokens):
        return None

    fixed_text = "\n".join([body, *(s for _n, s in sections)])
    listed = [r.identifier for r in ranked if r.value in fixed_text] if policy != "off" else []
    present = {i.value for i in listed}
    # Whatever the body kept, the identifier section fills what the rest leaves, most
    # salient first (`identifier_share` is the room the body leaves it: `body_room`).
    room = budget - base_tokens
    room_chars = max_chars - len(base)
    id_lines: list[str] = []
    if policy != "off":
        for r in ranked:
            if r.value in present:
                continue
            line = f"- {inline_code(r.value)}"
            cost = size(line) + 1
            if cost > room or len(line) + 1 > room_chars:
                if room < 8:
                    break
                continue  # a shorter identifier further down may still fit
            room -= cost
            room_chars -= len(line) + 1
            id_lines.append(line)
            listed.append(r.identifier)
            present.add(r.value)
    missing = sum(1 for r in ranked if r.value not in present) if policy != "off" else 0
    if missing:
        id_lines.append(archive_line(missing, archive_tool))
    text = render(id_lines, sections)
    # The archive line was costed at its worst; a shorter count can only be smaller.
    return Fitted(text, tuple(listed), tuple(dropped))


# -- decisions, TODOs, constraints and asks -------------------------------------------------

_DECISION_RE = re.compile(
    r"\b(decid\w*|agreed|we'?ll go with|let'?s go with|chose|chosen|settled on|approved)\b"
    r"|决定|选定|采用|定了",
    re.IGNORECASE,
)
_TODO_RE = re.compile(
    r"(\bTODO\b|- \[ \]|\bnext step|\bneed to\b|\bstill have to\b|\bremaining\b|\bpending\b"
    r"|待办|还需要|需要跟进)",
    re.IGNORECASE,
)
_RULE_RE = re.compile(
    r"\b(must|never|always|don'?t|do not|only|required?)\b|不要|不能|必须|禁止|务必|只能",
    re.IGNORECASE,
)
# After `.!?` only before a space (`2026.12.3` is one word); after CJK punctuation always.
_SENTENCE_RE = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])\s*|\n+")
ITEM_CHARS = 300


def _sentences(messages: Sequence[Message], roles: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for m in messages:
        if m.role in roles and m.text:
            out.extend(s.strip() for s in _SENTENCE_RE.split(m.text) if s and s.strip())
    return out


def _pick(sentences: Sequence[str], pattern: re.Pattern[str], limit: int | None) -> list[str]:
    """Matching sentences, newest `limit` (all when None), in conversation order, deduplicated."""
    seen: list[str] = []
    for s in reversed(sentences):
        if pattern.search(s):
            clipped = _clip(s, ITEM_CHARS)
            if clipped not in seen:
                seen.append(clipped)
        if limit is not None and len(seen) >= limit:
            break
    return list(reversed(seen))


@dataclass(frozen=True, slots=True)
class Salient:
    """Sentences the summary must carry: quoted from the span, newest last."""

    decisions: tuple[str, ...]
    todos: tuple[str, ...]
    constraints: tuple[str, ...]
    asks: tuple[str, ...]


def salient_sentences(compacted: Sequence[Message], latest_ask: str | None) -> Salient:
    said = _sentences(compacted, ("user", "assistant"))
    user_said = _sentences(compacted, ("user",))
    asks = [_clip(m.text, ITEM_CHARS) for m in compacted if m.role == "user" and m.text][-3:]
    if latest_ask and _clip(latest_ask, ITEM_CHARS) not in asks:
        asks.append(_clip(latest_ask, ITEM_CHARS))
    return Salient(
        decisions=tuple(_pick(said, _DECISION_RE, None)),
        todos=tuple(_pick(said, _TODO_RE, None)),
        constraints=tuple(_pick(user_said, _RULE_RE, None)),
        asks=tuple(asks),
    )


_NUMBER_RE = re.compile(r"\d+(?:[.,:/-]\d+)*")


def _covered(sentence: str, lines: Sequence[tuple[set[str], set[str]]]) -> bool:
    """The summary keeps `sentence`, in its own words or not: one line of it has every number
    of the sentence and most of its keywords (`lines` holds each line's keywords and numbers).
    One line, so "plan 5" is not kept by "plan 4" on one line and "step 5" on another."""
    terms = keywords(sentence)
    numbers = set(_NUMBER_RE.findall(sentence))
    need = max(1, int(len(terms) * COVERED_SHARE + 0.999)) if terms else 0
    for line_terms, line_numbers in lines:
        if numbers <= line_numbers and len(terms & line_terms) >= need:
            return True
    return False


def _line_index(summary: str) -> list[tuple[set[str], set[str]]]:
    return [
        (keywords(line), set(_NUMBER_RE.findall(line)))
        for line in summary.splitlines()
        if line.strip()
    ]


_SECTION_OF = {
    "decisions": "## Decisions",
    "todos": "## Open TODOs",
    "constraints": "## Constraints/Rules",
}


def carry_over(summary: str, salient: Salient) -> tuple[str, int]:
    """Append to each section, quoted, the decisions, TODOs and constraints the model dropped.

    Returns the summary and how many items were carried over. A model that keeps what it is
    shown needs none; a lossy one loses none.
    """
    lines = _line_index(summary)
    carried = 0
    text = summary
    for attr, heading in _SECTION_OF.items():
        missing = [s for s in getattr(salient, attr) if not _covered(s, lines)]
        if not missing:
            continue
        carried += len(missing)
        text = _append_to_section(text, heading, [f"- (quoted) {s}" for s in missing])
    return text, carried


def _canonical(title: str) -> str:
    """The required heading a title stands for (`## open todo` -> `## Open TODOs`)."""
    found = find_sections(f"## {title}\n")
    return next(iter(found), f"## {title}")


def _append_to_section(summary: str, heading: str, lines: Sequence[str]) -> str:
    """Add `lines` at the end of section `heading` (replacing a lone "none"), or add it."""
    matches = list(_HEADING_RE.finditer(summary))
    for i, match in enumerate(matches):
        if _canonical(match.group(1).strip()) != heading:
            continue
        end = matches[i + 1].start() if i + 1 < len(matches) else len(summary)
        section = summary[match.end() : end].strip()
        if section.lower().lstrip("- ").strip().rstrip(".") in ("none", ""):
            section = ""
        new = "\n".join(x for x in (section, *lines) if x)
        rest = summary[end:].lstrip("\n")
        return summary[: match.end()] + "\n" + new + ("\n\n" + rest if rest else "")
    return summary.rstrip() + f"\n\n{heading}\n" + "\n".join(lines)


# -- extractive fallback --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Limits:
    items: int | None = None
    """Newest items kept per section (None: all)."""
    item_chars: int = ITEM_CHARS
    asks: int = 4
    earlier_chars: int = 4_000
    state: bool = True


#: Shrinking steps for the extractive summary, least loss first.
_SHRINK_STEPS = (
    _Limits(),
    _Limits(earlier_chars=1_500),
    _Limits(items=12, earlier_chars=800),
    _Limits(items=8, item_chars=200, earlier_chars=400, asks=3),
    _Limits(items=5, item_chars=160, earlier_chars=0, asks=2, state=False),
    _Limits(items=3, item_chars=120, earlier_chars=0, asks=1, state=False),
    _Limits(items=2, item_chars=90, earlier_chars=0, asks=1, state=False),
    _Limits(items=1, item_chars=70, earlier_chars=0, asks=1, state=False),
)


def extractive_summary(
    compacted: Sequence[Message],
    previous_summary: str | None,
    latest_ask: str | None,
    limits: _Limits | None = None,
    salient: Salient | None = None,
) -> str:
    """A deterministic summary with the same sections, quoted from the messages themselves."""
    lim = limits or _Limits()
    found = salient or salient_sentences(compacted, latest_ask)

    def items(values: Sequence[str]) -> list[str]:
        chosen = list(values) if lim.items is None else list(values)[-lim.items :]
        return [_clip(v, lim.item_chars) for v in chosen]

    def section(title: str, values: Sequence[str]) -> str:
        return f"## {title}\n" + ("\n".join(f"- {i}" for i in values) if values else "- none")

    asks = list(found.asks)[-lim.asks :]
    # The latest ask is whole: it is the one the next turn answers.
    asks = [a if a == asks[-1] else _clip(a, lim.item_chars) for a in asks]
    parts = []
    if lim.state:
        parts.append(
            "## State\n- Extractive summary (the summarizer model was unavailable or its summary "
            "did not fit); sentences are quoted from the conversation."
        )
    parts += [
        section("Decisions", items(found.decisions)),
        section("Open TODOs", items(found.todos)),
        section("Constraints/Rules", items(found.constraints)),
        section("Pending user asks", asks),
    ]
    if previous_summary and lim.earlier_chars > 0:
        body, _ids = _split_identifier_section(previous_summary.replace(REFERENCE_HEADER, ""))
        parts.append("## Earlier summary\n" + _clip_block(body, lim.earlier_chars))
    return "\n\n".join(parts)


# -- the pipeline ---------------------------------------------------------------------------


def _latest_ask(messages: Sequence[Message]) -> str | None:
    for m in reversed(messages):
        if m.role == "user" and m.text.strip():
            return m.text.strip()
    return None


def redact_messages(messages: Sequence[Message]) -> list[Message]:
    """`messages` with every secret in their text and tool-call arguments replaced by its
    marker: what a summarizer, a memory flush or an archive may see."""
    out: list[Message] = []
    done: dict[str, tuple[str, list[Any]]] = {}  # texts repeat (a reply's "not run" results)
    for m in messages:
        if m.text and m.text not in done:
            done[m.text] = redact_secrets(m.text)
        text, found = done[m.text] if m.text else (m.text, [])
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
        log.errors.append(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        return None
    if not text or not text.strip():
        log.errors.append("empty summary")
        return None
    return text.strip()


def _is_failure(message: Message) -> bool:
    return message.role == "tool" and tool_failure(message) is not None


async def compact(
    messages: Sequence[Message],
    *,
    previous_summary: str | None,
    previous_first_seq: int | None,
    counter: TokenCounter,
    settings: CompactionSettings,
    summarize: SummaryCall,
    span: Span | None = None,
) -> CompactionResult | None:
    """Compact `messages` (the history after the previous summary's range): `span` when the
    caller chose what stays verbatim (the engine does, by the budget), else everything but
    the last `recent_turns` user turns.

    Returns None when there is nothing to compact (everything is within the recent turns).
    """
    messages = counter.ensure_counted(messages)
    if span is None:
        span = split_recent(messages, settings.recent_turns)
    else:
        span = Span(counter.ensure_counted(span.compacted), counter.ensure_counted(span.kept))
    if not span.compacted:
        return None
    # Everything that can reach the summarizer or the summary is redacted first: the span, the
    # recent turns quoted in the augmentation, the latest ask and `/compact` instructions.
    compacted = redact_messages(span.compacted)
    kept_redacted = redact_messages(span.kept)
    latest_ask = _latest_ask([*compacted, *kept_redacted])
    if settings.instructions:  # `/compact <instructions>` is user text too
        settings = replace(settings, instructions=redact_secrets(settings.instructions)[0])
    previous_tokens = counter.count_text(previous_summary) if previous_summary else 0
    tokens_before = previous_tokens + sum(m.tokens or 0 for m in messages)

    ranked = rank_identifiers(
        span.compacted,
        previous_summary=previous_summary,
        policy=settings.identifier_policy,
        custom_patterns=settings.custom_patterns,
        is_failure=_is_failure,
    )
    budget = settings.summary_budget_tokens
    # The identifiers named to the model as must-keep: the most salient ones, about as many as
    # the identifier section could hold.
    named = MODEL_IDENTIFIERS
    if budget is not None:
        named = max(10, min(MODEL_IDENTIFIERS, int(budget * settings.identifier_share) // 8))
    must_keep = [r.identifier for r in ranked[:named]]

    suffix = augmentation(
        compacted, kept_redacted, settings.critical_rules, previous_summary,
        None if budget is None else int(budget * FAILURE_SHARE), counter,
    )
    length = None
    if budget is not None:
        length = body_room(
            budget, suffix, len(ranked), counter, settings.identifier_share, settings.archive_tool
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
                    [ident for ident in must_keep if ident.value in text],
                    settings.instructions,
                    length if single else None,
                ),
                log,
            )
            for i, (text, _omitted) in enumerate(transcripts, 1)
        )
    )
    partials = [p for p in partial_results if p]
    source_texts = [m.text for m in compacted if m.text]
    kept_tokens = sum(m.tokens or 0 for m in span.kept)
    salient = salient_sentences(compacted, latest_ask)

    def audit(text: str, after: int, idents: Sequence[Identifier]) -> QualityReport:
        return audit_summary(
            text,
            identifiers=idents,
            latest_ask=latest_ask,
            source_texts=source_texts,
            tokens_before=tokens_before,
            tokens_after=after,
        )

    def judge(model_text: str, fallback: str | None, retries: int) -> QualityReport:
        """The audit of what the *model* wrote (what the guard judges) against the salient
        identifiers it was asked to keep."""
        report = audit(model_text, counter.count_text(model_text) + kept_tokens, must_keep)
        return replace(report, retries_used=retries, fallback=fallback)

    best: tuple[QualityReport, str] | None = None
    if len(partials) == len(chunks):
        candidate: str | None = partials[0] if single else None
        problems: list[str] = []
        max_tries = 1 + (max(0, min(settings.quality_retries, 3)) if settings.quality_guard else 0)
        for attempt in range(max_tries):
            if candidate is None or attempt > 0:
                prompt = merge_prompt(
                    partials, previous_summary, must_keep, latest_ask,
                    settings.instructions, problems, length,
                )
                candidate = await _call(summarize, prompt, log)
            label: str | None = None
            if candidate is None and attempt == 0:
                # The merge failed but every part was summarized: keep the parts as they are.
                candidate, label = "\n\n".join(partials), "unmerged"
                notes.append("merge call failed; kept the part summaries unmerged")
            if candidate is None:
                break
            report = judge(candidate, label, attempt)
            if best is None or score_for_ranking(report) > score_for_ranking(best[0]):
                best = (report, candidate)
            if not settings.quality_guard or report.passed or label is not None:
                break
            problems = list(report.problems)
            candidate = None
    else:
        notes.append(f"{len(chunks) - len(partials)} of {len(chunks)} chunk summaries failed")

    def fit(body: str) -> Fitted | None:
        return fit_summary(
            body, ranked, suffix,
            budget_tokens=budget, max_chars=settings.summary_max_chars, counter=counter,
            identifier_share=settings.identifier_share, archive_tool=settings.archive_tool,
            policy=settings.identifier_policy,
        )

    fitted: Fitted | None = None
    model_report: QualityReport | None = None
    fallback: str | None = None
    if best is not None:
        model_report, model_text = best
        fallback = model_report.fallback
        body, _model_ids = _split_identifier_section(model_text)
        body, carried = carry_over(body, salient)
        if carried:
            notes.append(f"carried over {carried} decisions/TODOs/constraints the model dropped")
        fitted = fit(body)
        if fitted is None and budget is not None and length is not None:
            # Longer than asked for: cut to its room at whole lines (least needed first).
            shrunk = shrink_body(body, length, counter)
            fitted = fit(shrunk) if shrunk is not None else None
            wanted = counter.count_text(body) + framing_tokens(
                len(ranked), settings.archive_tool, counter
            )
            if fitted is not None:
                notes.append(
                    f"the model's summary with its header needs {wanted:,} tokens, more than "
                    f"the {budget:,} available; cut to {length:,} tokens at whole lines"
                )
            else:
                notes.append(
                    f"the model's summary with its header needs {wanted:,} tokens, more than "
                    f"the {budget:,} available, and cannot be cut to its {length:,}-token "
                    "room; used the extractive summary"
                )
    if fitted is None:
        if best is None:
            notes.append(
                "summarizer failed; used the extractive fallback: " + "; ".join(log.errors)
            )
        fallback = "extractive"
        for step in _SHRINK_STEPS:
            fitted = fit(extractive_summary(compacted, previous_summary, latest_ask, step, salient))
            if fitted is not None:
                if step is not _SHRINK_STEPS[0]:
                    notes.append("the extractive summary was shrunk to fit its budget")
                break

    model_retention = model_report.identifier_retention if model_report is not None else 0.0
    if fitted is None:
        notes.append(
            f"even the shortest summary needs more than the {budget or 0:,} tokens available; "
            "history kept, not compacted"
        )
        report = audit("", tokens_before, must_keep)
        return CompactionResult(
            summary="",
            first_seq=None,
            last_seq=None,
            kept=list(messages),
            tokens_before=tokens_before,
            tokens_after=tokens_before,
            identifiers=[r.identifier for r in ranked],
            quality=replace(report, fallback="none"),
            fallback="none",
            model_identifier_retention=model_retention,
            attempts=log.calls,
            errors=tuple(log.errors),
            notes=tuple(notes),
            ranked_identifiers=tuple(ranked),
        )
    if fitted.dropped:
        notes.append("left out to fit: " + ", ".join(fitted.dropped) + " section(s)")
    final = fitted.text
    summary_tokens = counter.count_text(final)
    tokens_after = summary_tokens + kept_tokens
    # What is stored: the audit of the final text against the identifiers it lists, plus how
    # many the model itself kept and how many are archived instead.
    report = replace(
        audit(final, tokens_after, fitted.listed),
        identifiers_total=len(ranked),
        identifiers_in_summary=len(fitted.listed),
        identifiers_archived=len(ranked) - len(fitted.listed),
        retries_used=model_report.retries_used if model_report is not None else 0,
        fallback=fallback,
    )
    seqs = [m.seq for m in span.compacted if m.seq is not None]
    first = previous_first_seq if previous_first_seq is not None else (min(seqs) if seqs else None)
    last = max(seqs) if seqs else None
    pinned = tuple(
        m.seq for m in span.kept if m.seq is not None and last is not None and m.seq <= last
    )
    return CompactionResult(
        summary=final,
        first_seq=first,
        last_seq=last,
        pinned_seqs=pinned,
        kept=span.kept,
        tokens_before=tokens_before,
        tokens_after=tokens_after,
        identifiers=[r.identifier for r in ranked],
        quality=report,
        fallback=fallback,
        model_identifier_retention=model_retention,
        attempts=log.calls,
        errors=tuple(log.errors),
        notes=tuple(notes),
        ranked_identifiers=tuple(ranked),
        identifiers_in_summary=len(fitted.listed),
    )


__all__ = [
    "ARCHIVE_TOOL",
    "IDENTIFIERS_HEADING",
    "REFERENCE_HEADER",
    "REQUIRED_SECTIONS",
    "CompactionResult",
    "CompactionSettings",
    "Fitted",
    "Salient",
    "Span",
    "SummaryCall",
    "archive_line",
    "augmentation",
    "body_room",
    "carry_over",
    "chunk_prompt",
    "chunk_ratio",
    "compact",
    "extractive_summary",
    "fit_summary",
    "merge_prompt",
    "redact_messages",
    "render_transcript",
    "salient_sentences",
    "shrink_body",
    "split_chunks",
    "split_recent",
    "tool_failures",
]
