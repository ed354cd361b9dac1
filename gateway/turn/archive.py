"""The archive of messages leaving the prompt, so `history_search` finds each one again.

Secrets are redacted as in summaries: a hit goes back into a prompt, and the archive is a copy
(the messages themselves stay whole in the database); a secret is never an identifier here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

from context.failures import tool_failure
from context.salience import RankedIdentifier
from context.secrets import redact_secrets
from context.types import Identifier, Message
from memory.index import ArchivedMessage
from memory.text import outcome_tag

Archive = Callable[
    [str, Sequence[ArchivedMessage], Sequence[tuple[str, str, Sequence[int]]]], Awaitable[None]
]
"""(session key, the messages leaving the prompt with secrets redacted, their identifiers as
(value, kind, seqs)): keeps every compacted message one lookup away (`history_search`)."""

Identifiers = Callable[[str], Sequence[Identifier]]
"""The identifiers a text is found again by (the context engine's)."""


FullText = Callable[[Message], str | None]
"""The whole output of a tool result that was capped when it arrived (its artifact), or None."""


def archive_entries(
    covered: Sequence[Message],
    last_seq: int,
    ranked: Sequence[RankedIdentifier],
    identifiers: Identifiers,
    full_text: FullText | None = None,
) -> tuple[list[ArchivedMessage], list[tuple[str, str, list[int]]]]:
    """The archived form of `covered` (stored messages up to `last_seq`) and their identifiers.

    `ranked` is a compaction's `ranked_identifiers`; without it (a reset) the identifiers are
    taken from the archived texts. A tool result capped when it arrived is archived with its
    whole output (`full_text`), and the identifiers of the part the cap left out too: the
    archive finds what the prompt never held.
    """
    archived: list[ArchivedMessage] = []
    # Each call and its result carry the outcome, so the excerpt that matches the command (or
    # the output) says how it ended.
    calls = {c.id: c for m in covered for c in m.tool_calls}
    outcome: dict[str, str] = {}
    for m in covered:
        if m.role == "tool" and m.tool_call_id:
            failure = tool_failure(m, calls.get(m.tool_call_id))
            if failure is not None:
                outcome[m.tool_call_id] = outcome_tag(failure.exit_code)
    expanded: list[tuple[int, str]] = []
    for m in covered:
        assert m.seq is not None
        text = m.text
        whole = full_text(m) if full_text is not None and m.role == "tool" else None
        if whole is not None:
            text = whole
            expanded.append((m.seq, whole))
        if m.role == "tool" and m.tool_call_id in outcome:
            text = f"{outcome[m.tool_call_id]} {text}"
        body = "\n".join(
            [text, *(
                f"→ {c.name}({c.arguments}) {outcome.get(c.id, '')}".rstrip()
                for c in m.tool_calls
            )]
        ).strip()
        created = m.meta.get("created_at")
        if isinstance(created, datetime):
            created = created.isoformat(timespec="seconds")
        archived.append(
            ArchivedMessage(
                m.seq, m.role, redact_secrets(body)[0],
                created if isinstance(created, str) else None, m.name,
            )
        )
    found: dict[tuple[str, str], set[int]] = {}
    for item in ranked:
        ident = item.identifier
        if ident.secret:
            continue
        seqs = {s for s in item.seqs if s <= last_seq}
        if seqs:
            found.setdefault((ident.value, ident.kind), set()).update(seqs)
    texts = [(a.seq, a.text) for a in archived] if not ranked else expanded
    for seq, text in texts:
        for ident in identifiers(redact_secrets(text)[0]):
            if not ident.secret:
                found.setdefault((ident.value, ident.kind), set()).add(seq)
    return archived, [(v, k, sorted(seqs)) for (v, k), seqs in found.items()]
