"""Secrets in text: finding them, and replacing them with markers (pure).

A key copied into a summary is copied into every later prompt, the store and the logs, so the
policy is that **secrets never enter a summary or a log**: `redact_secrets` replaces each one with
a marker such as `[REDACTED:openai_key]` before the text reaches the summarizer, a log line or a
memory note. It is its own module because the logger and the memory tool need redaction without
identifier extraction, and `context.identifiers` builds on it (a secret is reported by its
marker, never by its value).

Finders run in precedence order; a span that overlaps one already claimed is dropped (a JWT
after `Bearer` is a `jwt`). Each finder first looks for cheap lower-case hints, so a text with
none of them costs a few substring tests.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence

from context.types import Identifier

__all__ = ["DEFAULT_MARKER_FMT", "SECRET_KINDS", "find_secrets", "redact_secrets"]

#: The marker that replaces a secret; `{kind}` is one of `SECRET_KINDS`.
DEFAULT_MARKER_FMT = "[REDACTED:{kind}]"

#: The kinds named in redaction markers.
SECRET_KINDS = (
    "private_key",
    "jwt",
    "anthropic_key",
    "openai_key",
    "stripe_key",
    "slack_token",
    "github_token",
    "aws_access_key",
    "google_api_key",
    "telegram_bot_token",
    "url_password",
    "bearer_token",
    "authorization",
    "password",
    "credential",
    "high_entropy",
)

# Ideographs, kana and hangul: written without spaces, so they end a URL (and an identifier).
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
# CJK punctuation and full-width forms (`。`, `，`, `）`).
_WIDE = "\u3000-\u303f\uff00-\uffef"

# A finder gets the text and its lower-cased copy (for cheap case-insensitive pre-checks).
_Finder = Callable[[str, str], Iterator[tuple[int, int, str]]]

# Placeholders, not secrets: `password: none`, `token: "..."`.
_NOT_SECRET_VALUES = frozenset(
    "none null nil true false empty required optional unset changeme undefined redacted xxx "
    "**** ... …".split()
)


def _has_digit(s: str) -> bool:
    return any(c.isdigit() for c in s)


def _simple(
    kind: str,
    pattern: str,
    hints: tuple[str, ...] = (),
    flags: int = 0,
    check: Callable[[str], bool] | None = None,
) -> _Finder:
    """A finder whose whole match (or group `v`, if present) is the secret.

    `hints` are lower-case substrings one of which any match contains: a text without them is
    skipped without running the regex, which is what keeps hundreds of messages cheap.
    """
    rx = re.compile(pattern, flags)
    group = "v" if "v" in rx.groupindex else 0

    def find(text: str, lower: str) -> Iterator[tuple[int, int, str]]:
        if hints and not any(h in lower for h in hints):
            return
        for m in rx.finditer(text):
            start, end = m.span(group)
            if check is None or check(text[start:end]):
                yield start, end, kind

    return find


# The name only has to *end* with the keyword (`DB_PASSWORD`, `aws_secret_access_key`), so the
# pattern starts at the keyword. Both run case-sensitively on the lower-cased text (cheaper
# than IGNORECASE); the value is then read from the original at the same offsets.
_ASSIGN_SRC = (
    r"(?P<name>password|passwd|passphrase|pwd|secret|token"
    r"|api[_-]?key|apikey|access[_-]?key|private[_-]?key|auth[_-]?key|signature)"
    r"[\"']?[ \t]*(?:=|:(?!//))[ \t]*(?!\[redacted)"
    r"(?:\"(?P<v1>[^\"\n]{1,256})\"|'(?P<v2>[^'\n]{1,256})'"
    r"|(?P<v3>[^\s\"'`,;&<>()\[\]{}]{1,256}))"
)
_FLAG_SRC = (
    r"(?<![a-z0-9_-])--?(?P<name>password|passwd|pass|token|api-key|apikey|secret"
    r"|auth-token|access-token)(?:=|[ \t]+)(?!-)(?!\[redacted)(?P<v3>[^\s\"'`]{3,256})"
)
_ASSIGN_RES = (re.compile(_ASSIGN_SRC), re.compile(_FLAG_SRC))
# For the rare text whose lower-casing changes its length (offsets would not line up).
_ASSIGN_RES_I = (re.compile(_ASSIGN_SRC, re.IGNORECASE), re.compile(_FLAG_SRC, re.IGNORECASE))


_ASSIGN_HINTS = ("pass", "pwd", "secret", "token", "key", "signature")


def _find_assignments(text: str, lower: str) -> Iterator[tuple[int, int, str]]:
    """`password=…`, `"api_key": "…"`, `DB_PASSWORD=…`, `--token …`: the value is the secret.

    A password-like name makes any value of 3+ chars a secret; other names (token, key, secret)
    need 8+ chars without spaces and a digit, or 20+ chars, so that `max_token: 4096` or "the
    token: expired" stay readable.
    """
    if not any(h in lower for h in _ASSIGN_HINTS):
        return
    aligned = len(lower) == len(text)
    for rx in _ASSIGN_RES if aligned else _ASSIGN_RES_I:
        for m in rx.finditer(lower if aligned else text):
            group = next(g for g in ("v1", "v2", "v3") if g in rx.groupindex and m.group(g))
            start, end = m.span(group)
            value = text[start:end]
            if value.lower() in _NOT_SECRET_VALUES or value.startswith("$"):
                continue
            name = m.group("name").lower()
            if "pass" in name or "pwd" in name:
                if len(value) < 3:
                    continue
                kind = "password"
            else:
                if " " in value or value.isdigit():
                    continue
                if not ((len(value) >= 8 and _has_digit(value)) or len(value) >= 20):
                    continue
                if _glued_to_a_word(text, m.start("name")):
                    continue  # `tiktoken:cl100k_base` is not a token
                kind = "credential"
            yield start, end, kind


def _glued_to_a_word(text: str, start: int) -> bool:
    """The keyword at `start` ends a lower-case word (`tiktoken`), rather than a name made of
    parts (`DB_TOKEN`, `auth-token`, `accessToken`, `APITOKEN`)."""
    return start > 0 and text[start - 1].isalpha() and text[start - 1].islower() and (
        text[start].islower()
    )


_HIGH_ENTROPY_RE = re.compile(
    r"(?<![A-Za-z0-9+/=_.-])[A-Za-z0-9+_-]{32,}={0,2}(?![A-Za-z0-9+/=_-])"
)
_WORDY_RE = re.compile(r"[a-z]{4,}")
_URL_RE = re.compile(
    rf"(?<![A-Za-z0-9+.-])(?:[A-Za-z][A-Za-z0-9+.-]{{1,15}}://|www\.)"
    rf"[^\s<>\"'`{{}}|\\^{_CJK}{_WIDE}]+"
)


def _looks_random(s: str) -> bool:
    """Upper, lower and digits, and few lowercase runs of 4+ letters.

    A random base62 string of 32+ chars keeps under 45% of its length in such runs (99.9% of
    the time); CamelCase or snake_case names with digits are mostly runs of words (55%+).
    Single-case hex (SHA-256) has no upper/lower mix, so it stays an identifier.
    """
    core = s.rstrip("=")
    if not (any(c.isupper() for c in core) and any(c.islower() for c in core) and _has_digit(core)):
        return False
    wordy = sum(len(w) for w in _WORDY_RE.findall(core))
    return wordy / len(core) < 0.45


def _find_high_entropy(text: str, lower: str) -> Iterator[tuple[int, int, str]]:
    """Long random-looking tokens; not inside URLs, whose long path parts are usually ids."""
    if len(text) < 32:
        return
    url_spans = [m.span() for m in _URL_RE.finditer(text)] if "://" in text else []
    for m in _HIGH_ENTROPY_RE.finditer(text):
        start, end = m.span()
        if any(s <= start < e for s, e in url_spans):
            continue
        if _looks_random(m.group(0)):
            yield start, end, "high_entropy"


def _mixed_key(s: str) -> bool:
    """Real keys mix digits and letters; `sk-learn-is-a-python-library` does not."""
    return _has_digit(s) and any(c.isalpha() for c in s)


def _bearer_ok(s: str) -> bool:
    return _has_digit(s) or any(c.isupper() for c in s)


# Order matters: the first finder to claim a span wins (a JWT after `Bearer` is a jwt).
_SECRET_FINDERS: tuple[_Finder, ...] = (
    _simple(
        "private_key",
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?"
        r"(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|(?=\n[ \t]*\n)|\Z)",
        hints=("private key-----",),
    ),
    _simple(
        "jwt",
        r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*",
        hints=("eyj",),
    ),
    _simple("anthropic_key", r"(?<![A-Za-z0-9_-])sk-ant-[A-Za-z0-9_-]{20,}", hints=("sk-ant-",)),
    _simple(
        "openai_key",
        r"(?<![A-Za-z0-9_-])sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}",
        hints=("sk-",),
        check=_mixed_key,
    ),
    _simple(
        "stripe_key",
        r"(?<![A-Za-z0-9_-])(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}",
        hints=("k_live_", "k_test_"),
    ),
    _simple(
        "slack_token",
        r"(?<![A-Za-z0-9_-])(?:xox[abposr]-[A-Za-z0-9-]{10,}|xapp-\d-[A-Za-z0-9-]{10,})",
        hints=("xox", "xapp-"),
    ),
    _simple(
        "github_token",
        r"(?<![A-Za-z0-9_-])(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})",
        hints=("gh", "github_pat_"),
    ),
    _simple(
        "aws_access_key",
        r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Za-z0-9])",
        hints=("akia", "asia"),
    ),
    _simple(
        "google_api_key",
        r"(?<![A-Za-z0-9_-])AIza[0-9A-Za-z_-]{35}(?![A-Za-z0-9_-])",
        hints=("aiza",),
    ),
    _simple(
        "telegram_bot_token",
        r"(?<![A-Za-z0-9_:])\d{8,10}:[A-Za-z0-9_-]{35}(?![A-Za-z0-9_-])",
        hints=(":",),
    ),
    _simple("url_password", r"(?<=://)[^\s/@:]*:(?!\[REDACTED)(?P<v>[^\s/@]+)@", hints=("://",)),
    _simple(
        "bearer_token",
        r"\bbearer[ \t]+(?P<v>[A-Za-z0-9._~+/-]{16,}=*)",
        hints=("bearer",),
        flags=re.IGNORECASE,
        check=_bearer_ok,
    ),
    _simple(
        "authorization",
        r"\bauthorization[\"']?[ \t]*[:=][ \t]*[\"']?(?:basic|token|digest)[ \t]+"
        r"(?P<v>[A-Za-z0-9._~+/-]{8,}=*)",
        hints=("authorization",),
        flags=re.IGNORECASE,
    ),
    _find_assignments,
    _find_high_entropy,
)


def find_secrets(text: str) -> list[tuple[int, int, str]]:
    """Non-overlapping `(start, end, kind)` spans of the secrets in `text`, in text order."""
    taken = bytearray(len(text))
    found: list[tuple[int, int, str]] = []
    lower = text.lower()
    for finder in _SECRET_FINDERS:
        for start, end, kind in finder(text, lower):
            if end > start and taken.find(1, start, end) == -1:
                taken[start:end] = b"\x01" * (end - start)
                found.append((start, end, kind))
    found.sort()
    return found


def _marker(marker_fmt: str, kind: str) -> str:
    return marker_fmt.format(kind=kind)


def _apply_markers(
    text: str, spans: Sequence[tuple[int, int, str]], marker_fmt: str
) -> tuple[str, list[tuple[int, int, str]]]:
    """`text` with each secret span replaced by its marker, and the markers' new spans."""
    parts: list[str] = []
    marked: list[tuple[int, int, str]] = []
    pos = length = 0
    for start, end, kind in spans:
        marker = _marker(marker_fmt, kind)
        parts.append(text[pos:start])
        length += start - pos
        parts.append(marker)
        marked.append((length, length + len(marker), marker))
        length += len(marker)
        pos = end
    parts.append(text[pos:])
    return "".join(parts), marked


def redact_secrets(text: str, marker_fmt: str = DEFAULT_MARKER_FMT) -> tuple[str, list[Identifier]]:
    """Replace every secret with a marker; return the text and the markers as identifiers.

    This is the default for everything that reaches a summarizer, a summary or a log. The
    identifiers are deduplicated, in order, with `kind="secret"` and the marker as `value`.
    Redacting already-redacted text changes nothing.
    """
    spans = find_secrets(text)
    if not spans:
        return text, []
    redacted, marked = _apply_markers(text, spans, marker_fmt)
    seen = {marker: Identifier(marker, "secret", True) for _s, _e, marker in marked}
    return redacted, list(seen.values())
