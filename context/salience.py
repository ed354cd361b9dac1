"""Which identifiers of a compacted span matter most (pure).

A summary's `## Exact identifiers` section is bounded, but a long span can hold thousands of
identifiers, most of them row ids and numbers inside large tool outputs. `rank_identifiers`
returns *every* identifier of the span (the runner archives them all, with the seq of each
message they appear in, for an exact lookup later), most salient first, so that the bounded
section keeps the ones the conversation was about.

Salience is a sum of weights, because several weak signals together should beat one:

============================  ======  ===========================================================
signal                        weight  why
============================  ======  ===========================================================
said in user prose            10      the user named it: it is what the task is about
said in assistant prose       6       the assistant chose to mention it: a finding or an answer
in tool-call arguments        4       the agent acted on it (the file read, the order fetched)
in a failed tool result       3       errors are what a resumed conversation must not repeat
in a small tool output        1       seen, not yet discussed
carried in the summary        2.5     an earlier compaction judged it salient (its section)
repetition                    1.5     per doubling of distinct messages (log2: 1 → 0, 2 → 1.5,
                                      4 → 3, 8 → 4.5): diminishing returns
recency                       0-2     position of the last message it appears in (2 = the last)
============================  ======  ===========================================================

Identifiers that appear *only* inside large tool outputs (a tool message whose text is longer
than `bulk_chars`) are bulk: CSV rows, logs, listings. They rank after every other identifier
whatever their score, and among them kind `number` comes last of all. Ties keep the order of
first appearance (the previous summary first, then the messages in order), so the ranking is
deterministic.

The identifiers are exactly those `extract_identifiers` finds over the previous summary, the
message texts and the tool-call arguments (a secret by its redaction marker, kind `secret`,
never by its value). Each text is scanned once; the rest is O(identifier occurrences).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from context.identifiers import IdentifierPolicy, extract_identifiers
from context.types import Identifier, Message

__all__ = ["BULK_CHARS", "RankedIdentifier", "rank_identifiers"]

#: A tool message whose text is longer than this is bulk output.
BULK_CHARS = 4_000

W_USER = 10.0
W_ASSISTANT = 6.0
W_TOOL_ARGS = 4.0
W_FAILURE = 3.0
W_TOOL_OUTPUT = 1.0
W_SUMMARY = 2.5
W_REPEAT = 1.5
"""Per doubling of the number of distinct messages an identifier appears in."""
W_RECENCY = 2.0
"""For an identifier in the span's last message; proportionally less for earlier ones."""
RECENT_SHARE = 0.25
"""An identifier whose last message is in this last share of the span is "recent"."""

# Source flags of one identifier.
_USER, _ASSISTANT, _TOOL_ARGS, _TOOL_OUTPUT, _FAILURE, _SUMMARY = 1, 2, 4, 8, 16, 32
_WEIGHTS = (
    (_USER, W_USER, "user prose"),
    (_ASSISTANT, W_ASSISTANT, "assistant prose"),
    (_TOOL_ARGS, W_TOOL_ARGS, "tool arguments"),
    (_TOOL_OUTPUT, W_TOOL_OUTPUT, "tool output"),
    (_FAILURE, W_FAILURE, "failure"),
)


@dataclass(frozen=True, slots=True)
class RankedIdentifier:
    """One identifier of a span, its salience and where it appears."""

    identifier: Identifier
    seqs: tuple[int, ...]
    """Sorted unique `Message.seq` of the messages it appears in (() if only in the summary)."""
    score: float
    reasons: tuple[str, ...]
    """Why it ranks where it does, in short words ("user prose", "repeated x3", …)."""

    @property
    def value(self) -> str:
        return self.identifier.value


class _Stats:
    """What is known about one identifier while the span is read."""

    __slots__ = ("count", "first", "flags", "ident", "last", "nonbulk", "seqs")

    def __init__(self, ident: Identifier, first: int) -> None:
        self.ident = ident
        self.first = first  # order of first appearance (ties)
        self.flags = 0
        self.count = 0  # distinct messages
        self.last = -1  # index of the last message it appears in
        self.nonbulk = False  # seen anywhere but inside a bulk tool output
        self.seqs: list[int] = []


def rank_identifiers(
    messages: Sequence[Message],
    *,
    previous_summary: str | None = None,
    policy: IdentifierPolicy = "strict",
    custom_patterns: Sequence[str] = (),
    is_failure: Callable[[Message], bool] | None = None,
    bulk_chars: int = BULK_CHARS,
) -> list[RankedIdentifier]:
    """Every identifier of the span, most salient first.

    `is_failure` is asked about tool messages only (e.g. `context.failures.tool_failure(m) is not
    None`); without it no result counts as failed. An identifier's `Identifier` (its kind) is the
    one `extract_identifiers` would report over [previous summary, message texts, tool-call
    arguments]. Raises ValueError for an unknown policy, an invalid custom pattern or a negative
    `bulk_chars`.
    """
    if bulk_chars < 0:
        raise ValueError("bulk_chars must be >= 0")
    extract_identifiers((), policy=policy, custom_patterns=custom_patterns)  # validates
    if policy == "off":
        return []

    seen: dict[str, list[Identifier]] = {}

    def scan(text: str) -> list[Identifier]:
        # Texts repeat (a reply's thousand "not run" results, a tool's identical outputs):
        # each distinct one is scanned once.
        if not text:
            return []
        found = seen.get(text)
        if found is None:
            found = seen[text] = extract_identifiers(
                [text], policy=policy, custom_patterns=custom_patterns
            )
        return found

    stats: dict[str, _Stats] = {}
    # extract_identifiers keeps the first Identifier of a value over [summary, texts, args]; a
    # value can (rarely) get another kind elsewhere, so a text's one replaces an args' one.
    from_args: set[str] = set()

    for ident in scan(previous_summary or ""):
        carried = stats[ident.value] = _Stats(ident, len(stats))
        carried.flags = _SUMMARY
        carried.nonbulk = True

    for index, message in enumerate(messages):
        role = message.role
        text = message.text
        bulk = role == "tool" and len(text) > bulk_chars
        if role == "user":
            flag = _USER
        elif role == "assistant":
            flag = _ASSISTANT
        elif role == "tool":
            flag = 0 if bulk else _TOOL_OUTPUT
            if text and is_failure is not None and is_failure(message):
                flag |= _FAILURE
        else:
            flag = 0
        seq = message.seq
        sources = [(scan(text), flag, not bulk, False)]
        sources.extend((scan(c.arguments), _TOOL_ARGS, True, True) for c in message.tool_calls)
        for found, source, nonbulk, is_args in sources:
            for ident in found:
                value = ident.value
                st = stats.get(value)
                if st is None:
                    st = stats[value] = _Stats(ident, len(stats))
                    if is_args:
                        from_args.add(value)
                elif not is_args and value in from_args:
                    st.ident = ident
                    from_args.discard(value)
                st.flags |= source
                if nonbulk:
                    st.nonbulk = True
                if st.last != index:
                    st.last = index
                    st.count += 1
                    if seq is not None:
                        st.seqs.append(seq)

    total = len(messages)
    recent_from = total - max(1, math.ceil(total * RECENT_SHARE))
    ranked: list[tuple[tuple[int, float, int], RankedIdentifier]] = []
    for st in stats.values():
        score = 0.0
        reasons: list[str] = []
        flags = st.flags
        if flags:
            for bit, weight, reason in _WEIGHTS:
                if flags & bit:
                    score += weight
                    reasons.append(reason)
        count = st.count
        if count >= 2:
            score += W_REPEAT * math.log2(count)
            reasons.append(f"repeated x{count}")
        if count:
            score += W_RECENCY * (st.last + 1) / total
            if st.last >= recent_from:
                reasons.append("recent")
        if flags & _SUMMARY:
            score += W_SUMMARY
            reasons.append("earlier summary")
        if st.nonbulk:
            tier = 0
        else:
            tier = 2 if st.ident.kind == "number" else 1
            reasons.append("bulk tool output")
        seqs = st.seqs
        score = round(score, 4)
        item = RankedIdentifier(
            st.ident,
            (seqs[0],) if len(seqs) == 1 else tuple(sorted(set(seqs))),
            score,
            tuple(reasons),
        )
        ranked.append(((tier, -score, st.first), item))
    ranked.sort(key=lambda pair: pair[0])
    return [item for _key, item in ranked]
