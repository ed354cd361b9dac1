"""The quality guard for compaction summaries (pure): audit, feedback for a retry, ranking.

A summary replaces history, so a bad one is silent amnesia. The audit checks the five
sections, every identifier of the whole span verbatim and the latest user ask reflected, and
adds two measured numbers it does not use to pass or fail: a lexical proxy for semantic retention, and the compression ratio. Failures come
back as plain sentences (`problems`) that the caller feeds to the model for a retry;
`score_for_ranking` lets it keep the best attempt when every retry fails.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from context.identifiers import inline_code
from context.secrets import find_secrets, redact_secrets
from context.types import Identifier

__all__ = [
    "IDEAL_COMPRESSION",
    "REQUIRED_SECTIONS",
    "SALIENT_TERMS",
    "QualityReport",
    "audit_summary",
    "find_sections",
    "keywords",
    "score_for_ranking",
    "semantic_retention",
]

REQUIRED_SECTIONS = (
    "## Decisions",
    "## Open TODOs",
    "## Constraints/Rules",
    "## Pending user asks",
    "## Exact identifiers",
)
#: tokens_after / tokens_before that the design seed calls ideal.
IDEAL_COMPRESSION = (0.1, 0.3)
#: How many salient source terms `semantic_retention` checks.
SALIENT_TERMS = 40
_ASK_QUOTE_CHARS = 200


# -- sections -------------------------------------------------------------------------------

_H2_RE = re.compile(r"^[ \t]{0,3}##(?!#)[ \t]*(.*?)[ \t#]*$")  # `##Decisions` tolerated
_H1_RE = re.compile(r"^[ \t]{0,3}#[ \t]+\S")  # a title needs its space: `#5429` is not one
_FENCE_RE = re.compile(r"^[ \t]{0,3}(```|~~~)")
_WORD_RE = re.compile(r"[a-z0-9]+")


def _heading_key(title: str) -> str:
    """`**Constraints / Rules:**`, `1. constraints and rules` → `constraintandrule`-like keys."""
    words = _WORD_RE.findall(title.lower())
    while words and words[0].isdigit():  # numbered headings: "## 2. Open TODOs"
        words.pop(0)
    return "".join(w[:-1] if len(w) > 3 and w.endswith("s") else w for w in words)


def _aliases() -> dict[str, str]:
    """Heading key → canonical required heading, with a few common rewordings."""
    extras = (
        ("keydecision",),
        ("todo", "opentask"),
        ("constraintandrule", "ruleconstraint", "ruleandconstraint"),
        ("pendingask", "pendinguserrequest", "openuserask"),
        ("identifier", "exactid"),
    )
    out: dict[str, str] = {}
    for heading, extra in zip(REQUIRED_SECTIONS, extras, strict=True):
        for key in (_heading_key(heading), *extra):
            out[key] = heading
    return out


_ALIASES = _aliases()


def find_sections(summary: str) -> dict[str, str]:
    """`## ` heading → body, in order. Required headings come back in their canonical spelling.

    Headings are matched at `##` level, case-insensitively, ignoring trailing spaces, colons,
    emphasis and numbering, and singular/plural (`## open todo:` is `## Open TODOs`). Text
    before the first heading (a short state/progress note) is allowed and not returned; `###`
    subheadings belong to the body; lines inside code fences are never headings. A heading that
    appears twice has its bodies joined.
    """
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    in_fence = False
    for line in summary.splitlines():
        if _FENCE_RE.match(line):
            in_fence = not in_fence
            if current is not None:
                current.append(line)
            continue
        if in_fence:
            if current is not None:
                current.append(line)
            continue
        heading = _H2_RE.match(line)
        if heading is not None:
            title = heading.group(1).rstrip(": \t")
            key = _ALIASES.get(_heading_key(title), f"## {title}")
            current = sections.setdefault(key, [])
            continue
        if _H1_RE.match(line):  # a `#` title ends the section before it
            current = None
            continue
        if current is not None:
            current.append(line)
    return {key: "\n".join(lines).strip() for key, lines in sections.items()}


# -- keywords -------------------------------------------------------------------------------

# Ideographs, kana, hangul: no spaces between words, so they are compared as character bigrams.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN_RE = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+")
_CJK_RE = re.compile(rf"[{_CJK}]")

_STOPWORDS = frozenset(
    """the and for are but not you all any can had her was one our out has have this that with
    from they will would there their what when where which who whom how why please could should
    into about just also then than them these those been being does did doing its let lets make
    need want get got some more most very can't don't won't isn't it's i'm i've you're we're
    we'll yes okay ok thanks thank hey hello sure now here your yours mine his she him over
    under again still only even much many such own same other each both few too may might must
    shall upon while after before because since until via per like well back way use used using
    new one two three know think see look going gonna wanna tell told say said ask asked""".split()
)
# Function characters: a bigram made only of these carries no meaning.
_CJK_STOP = frozenset(
    "的了是在和我你他她它们这那吗呢吧啊也就都而及与或个有不人把被给让到说要会能可以之其为"
    "のにはをがでとももたてしいるするですますこのそのあれこれそれ"
    "이가은는을를에의도와과하다"
)


def _stem(word: str) -> str:
    """Plural folding only ("orders" → "order"): cheap, symmetric, hard to get wrong."""
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def _iter_terms(text: str) -> Iterator[str]:
    for token in _TOKEN_RE.findall(text):
        if _CJK_RE.match(token):
            if len(token) == 1:
                if token not in _CJK_STOP:
                    yield token
                continue
            for i in range(len(token) - 1):
                pair = token[i : i + 2]
                if not (pair[0] in _CJK_STOP and pair[1] in _CJK_STOP):
                    yield pair
        else:
            word = token.lower()
            if len(word) >= 3 and word not in _STOPWORDS:
                yield _stem(word)


def keywords(text: str) -> set[str]:
    """Lower-cased words of 3+ chars minus stopwords (plurals folded), plus CJK bigrams."""
    return set(_iter_terms(text))


def _ask_reflected(ask: str | None, summary_terms: set[str]) -> bool:
    """≥ 2 shared keywords ; 1 suffices for an ask with fewer than 2."""
    if not ask:
        return True
    ask_terms = keywords(ask)
    if not ask_terms:
        return True
    need = 2 if len(ask_terms) >= 2 else 1
    return len(ask_terms & summary_terms) >= need


def semantic_retention(
    summary: str, source_texts: Sequence[str], *, top_k: int = SALIENT_TERMS
) -> float:
    """Salient-term recall: the share of the source's top-K terms that the summary contains.

    A lexical proxy for "did the summary keep the substance", cheap and deterministic (no model,
    no embeddings). Terms are `keywords` (stopwords out, CJK as bigrams); each is weighted
    tf·idf-style across the source messages, `(1 + ln tf) · (1 + ln((1 + N) / (1 + df)))`, so
    a term repeated in one message outranks filler spread over all of them. Ties go to the
    earlier term. 1.0 when the source has no terms.
    """
    top = salient_terms(tuple(source_texts), max(1, top_k))
    if not top:
        return 1.0
    have = keywords(summary)
    return sum(1 for t in top if t in have) / len(top)


@functools.lru_cache(maxsize=16)
def salient_terms(source_texts: tuple[str, ...], top_k: int) -> tuple[str, ...]:
    """The source's top-K terms by tf·idf weight. Cached: every attempt of one compaction is
    audited against the same source."""
    tf: Counter[str] = Counter()
    df: Counter[str] = Counter()
    first: dict[str, int] = {}
    for text in source_texts:
        terms = list(_iter_terms(text))
        tf.update(terms)
        df.update(set(terms))
        for term in terms:
            first.setdefault(term, len(first))
    n = len(source_texts)
    weight = {
        t: (1.0 + math.log(c)) * (1.0 + math.log((1 + n) / (1 + df[t]))) for t, c in tf.items()
    }
    return tuple(sorted(weight, key=lambda t: (-weight[t], first[t]))[:top_k])


# -- the report -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QualityReport:
    """The audit of one summary. `passed` iff all sections, all identifiers and the ask are in.

    `problems` holds one sentence per failure (empty iff passed), ready to be fed back to the
    model. The caller fills `retries_used` and `fallback` with `dataclasses.replace`.
    `tokens_saved` is negative when the summary is bigger than what it replaces.
    `secrets_in_summary` counts secrets found in the summary (it should be redacted text; this
    is reported, not failed, because a retry cannot fix a caller that forgot to redact).
    """

    sections_present: list[str]
    sections_missing: list[str]
    identifiers_total: int
    identifiers_missing: list[str]
    identifier_retention: float
    latest_ask_reflected: bool
    semantic_retention: float
    compression_ratio: float
    tokens_saved: int
    in_ideal_range: bool
    passed: bool
    problems: list[str] = field(default_factory=list)
    retries_used: int = 0
    fallback: str | None = None
    secrets_in_summary: int = 0
    identifiers_in_summary: int = 0
    """Identifiers verbatim in the summary (the final report; the rest are archived)."""
    identifiers_archived: int = 0
    """Identifiers not listed, found by one exact `history_search` lookup instead."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (floats rounded to 4 places)."""
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, float):
                out[key] = round(value, 4)
        return out


_MARKER_RE = re.compile(r"redacted", re.IGNORECASE)


def _display(ident: Identifier) -> str:
    """The value to show in a report: a secret only by its marker, never by its raw value."""
    if ident.secret and not _MARKER_RE.search(ident.value):
        return "[REDACTED:secret]"
    return ident.value


def _quote_ask(ask: str) -> str:
    text = " ".join(redact_secrets(ask)[0].split())
    return text if len(text) <= _ASK_QUOTE_CHARS else text[: _ASK_QUOTE_CHARS - 1] + "…"


def audit_summary(
    summary: str,
    *,
    identifiers: Sequence[Identifier],
    latest_ask: str | None,
    source_texts: Sequence[str],
    tokens_before: int,
    tokens_after: int,
) -> QualityReport:
    """Audit `summary` against what it replaces (see `QualityReport`)."""
    found = find_sections(summary)
    present = [h for h in REQUIRED_SECTIONS if h in found]
    missing_sections = [h for h in REQUIRED_SECTIONS if h not in found]

    missing_ids = [_display(i) for i in identifiers if i.value not in summary]
    total = len(identifiers)
    retention = (total - len(missing_ids)) / total if total else 1.0

    summary_terms = keywords(summary)
    reflected = _ask_reflected(latest_ask, summary_terms)

    ratio = tokens_after / tokens_before if tokens_before > 0 else 1.0
    low, high = IDEAL_COMPRESSION

    problems = [f"Missing section: {h}" for h in missing_sections]
    if missing_ids:
        problems.append(
            "Missing identifiers (copy exactly): " + ", ".join(inline_code(v) for v in missing_ids)
        )
    if not reflected and latest_ask:
        problems.append(f"The latest user ask is not reflected: '{_quote_ask(latest_ask)}'")

    return QualityReport(
        sections_present=present,
        sections_missing=missing_sections,
        identifiers_total=total,
        identifiers_missing=missing_ids,
        identifier_retention=retention,
        latest_ask_reflected=reflected,
        semantic_retention=semantic_retention(summary, source_texts),
        compression_ratio=ratio,
        tokens_saved=tokens_before - tokens_after,
        in_ideal_range=tokens_before > 0 and low <= ratio <= high,
        passed=not problems,
        problems=problems,
        secrets_in_summary=len(find_secrets(summary)),
    )


def score_for_ranking(report: QualityReport) -> tuple[bool, int, int, bool, float, bool, float]:
    """A sort key, higher is better: keep `max(attempts, key=score_for_ranking)`.

    Passed first, then fewer missing identifiers, fewer missing sections, the ask reflected,
    higher semantic retention, an ideal compression ratio, and finally the smaller summary.
    """
    return (
        report.passed,
        -len(report.identifiers_missing),
        -len(report.sections_missing),
        report.latest_ask_reflected,
        report.semantic_retention,
        report.in_ideal_range,
        -report.compression_ratio,
    )
