"""Opaque identifiers a summary must keep verbatim (pure).

A summary that turns `ORD-1042` into "the order" or `/etc/nginx/nginx.conf` into "the nginx
config" has lost information the agent cannot get back, so compaction extracts every identifier
from the *whole* compacted span (not only its last messages) and checks, then
guarantees, that each one survives.

Secrets are the opposite: they must never enter a summary (`context.secrets`). Extraction
finds them first and reports each one by its redaction marker, never by its value (unless the
caller passes `keep_secrets=True`), so the "exact identifiers" list cannot leak one.

Extraction runs each compiled pattern once over each text, in precedence order; a match that
overlaps one already taken is dropped, so a URL wins over the host and path inside it, an e-mail
over its domain, a path over the file name at its end. Heuristics, documented where they bite:

* hex hashes need 7+ hex digits (git's short SHA) with at least one digit and one letter a-f,
  in one case; all-letter runs count only from 12 chars, so words such as "deadbeef", "facade"
  or "acceded" are not hashes; all-digit runs are numbers.
* beyond URLs, paths, hashes and numbers, `host` (bare domains: `api.stripe.com`), `ticket` (`ORD-1042`,
  `INC0012345`, `CVE-2024-12345`, `#5429`; not `UTF-8`, `SHA-256`, `GPT-4`) and `id` (10+ chars
  of letters, digits, `_`, `-` with 2+ of each: `claude-3-5-sonnet-20241022`, `cus_N1x2Y3z4`).
* file names need a known extension (`main.py`, `report_v2.pdf`), which keeps out versions
  (`v3.11.2`), abbreviations (`e.g.`) and sentence ends; bare host names need a common TLD or an
  internal suffix (`.internal`, `.local`, `.lan`).
* paths: absolute ones need two segments, a dotted last segment or a trailing slash (so the bot
  command `/start` is not a path), relative ones a file extension or a trailing slash (so
  `and/or`, `1/2`, `TCP/IP` are not paths), or a branch-like shape: 2+ segments, one a word of
  3+ letters that is not all capitals, the last with a digit (`release/2026.12`,
  `feature/ABC-123`, `hotfix/v2.4.1`; not `HTTP/2`, `24/7`; the price: `cost/1000` is a path).
  A relative path led by a host name (`github.com/acme/infra-config`) is a URL without its
  scheme: kind `url`, kept whole rather than cut down to its host.
* numbers need 6+ digits, counted without `,` or `_` thousands separators (`1,234,567`).
* CJK text has no spaces, so a CJK character always ends an identifier (`订单ORD-1042的` yields
  `ORD-1042`); the price is that CJK directory and file names are not recognised.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from context.secrets import (
    _CJK,
    _URL_RE,
    _WIDE,
    DEFAULT_MARKER_FMT,
    _apply_markers,
    _has_digit,
    find_secrets,
)
from context.types import Identifier

__all__ = [
    "IDENTIFIER_KINDS",
    "IdentifierPolicy",
    "extract_identifiers",
    "inline_code",
    "missing_identifiers",
    "render_identifier_section",
]

IdentifierPolicy = Literal["strict", "off", "custom"]

#: Every `Identifier.kind` that extraction can produce.
IDENTIFIER_KINDS = (
    "uuid",
    "hex",
    "url",
    "path",
    "windows_path",
    "file",
    "host",
    "host_port",
    "ip",
    "email",
    "number",
    "ticket",
    "id",
    "custom",
    "secret",
)


# -- character classes ----------------------------------------------------------------------

# Word characters an identifier may contain: ASCII, Latin-1/Extended, Greek, Cyrillic.
_L = "A-Za-z0-9_\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u0370-\u03ff\u0400-\u04ff"
_END = rf"(?![{_L}-]|\.[{_L}])"  # not followed by more word, or by `.word` (a file extension)
_STRIP = ".,;:!?*'\""  # trailing punctuation that ends a sentence, not an identifier
_CLOSERS = {")": "(", "]": "[", "}": "{", ">": "<"}


def _strip_trailing(value: str) -> str:
    """Drop sentence punctuation and unbalanced closing brackets from the end of a match."""
    while value:
        last = value[-1]
        if last in _STRIP:
            value = value[:-1]
        elif last in _CLOSERS and value.count(_CLOSERS[last]) < value.count(last):
            value = value[:-1]
        else:
            break
    return value


# -- identifiers ----------------------------------------------------------------------------

# Known file extensions: a dotted word is a file name only if its extension is one of these
# (no single letters but C's `c`/`h`, nothing that reads as a TLD such as `org` or `ai`).
_FILE_EXTS = frozenset(
    """py pyi pyc pyx ipynb js mjs cjs ts mts cts tsx jsx json jsonl ndjson json5 yaml yml toml ini
    cfg conf config env properties txt md markdown rst adoc csv tsv log xml xsd xsl html htm
    xhtml css scss sass less sql db sqlite sqlite3 sh bash zsh fish ps1 psm1 bat cmd exe dll so
    dylib bin obj lib jar war class java kt kts scala groovy gradle go rs c h cc cpp cxx hpp hh
    hxx cs fs fsx vb swift mm rb erb php pl lua jl dart ex exs erl hrl hs elm clj cljs nim zig
    sv vhd vue svelte astro pdf doc docx xls xlsx xlsm ppt pptx odt ods odp rtf epub key png jpg
    jpeg gif bmp svg webp ico icns tif tiff heic avif psd sketch mp3 wav flac ogg oga opus m4a
    aac mp4 m4v mov avi mkv webm wmv zip tar gz tgz bz2 xz zst 7z rar lz4 whl egg deb rpm apk
    aab ipa dmg iso img msi pkg snap lock pem crt cer pub p12 pfx csr der gpg asc sig tf tfvars
    tfstate hcl proto graphql gql thrift avsc patch diff tmp bak swp orig service timer socket
    mount plist mk cmake nix spec vim sbt wasm parquet avro arrow feather npy npz pkl pickle pt
    pth onnx h5 hdf5 ckpt safetensors gguf ggml tflite ics vcf eml msg mbox tex bib sty cls srt
    vtt ttf otf woff woff2 eot jinja jinja2 j2 tmpl tpl hbs mustache ejs pug liquid eps gv puml
    drawio bicep cue rego dockerfile containerfile editorconfig gitignore sum mod""".split()
)
# Code idioms that look like file names.
_NOT_FILES = frozenset({"console.log", "process.env", "res.json", "req.json"})
_TLDS = frozenset(
    """com net org edu gov mil int io ai dev app co uk de fr jp cn ru nl eu ca au br es ch se fi dk
    cz kr tw hk sg nz za mx ar in info biz tv gg cloud tech site online xyz page pro shop store
    blog news wiki global local localhost internal lan corp home arpa test example invalid
    localdomain intranet""".split()
)
_DOTFILE_NAMES = frozenset(
    """env bashrc bash_profile zshrc zprofile profile gitignore gitattributes gitmodules gitconfig
    dockerignore npmrc nvmrc yarnrc editorconfig htaccess netrc pypirc prettierrc eslintrc
    babelrc vimrc tmux pre-commit-config python-version tool-versions flake8 pylintrc
    coveragerc""".split()
)
_TICKET_STOP = frozenset(
    "UTF SHA GPT AES RSA MD TLS SSL HTTP HTTPS COVID IPV MP DDR LTE USB PCI EC UTC GMT".split()
)
_HOST_PORT_STOP = frozenset(
    """line lines port page step error code status id no note version chapter verse ref pid uid
    gid row col column item issue pr ticket order phone tel fax room ext total count score time
    at from to rate ratio size width height length day days top bottom left right tab""".split()
)


def _has_ext(name: str) -> bool:
    stem, dot, ext = name.rpartition(".")
    return bool(dot) and bool(stem.strip(".")) and ext.lower() in _FILE_EXTS


_Judge = Callable[[str], tuple[str, str] | None]  # raw match → (value, kind), or None to reject


def _judge_url(raw: str) -> tuple[str, str] | None:
    value = _strip_trailing(raw)
    _scheme, sep, rest = value.partition("://")
    if sep and not rest.strip("/"):
        return None
    if not sep and value.count(".") < 2:  # `www.` needs a domain after it
        return None
    return value, "url"


def _judge_scp(raw: str) -> tuple[str, str] | None:
    return _strip_trailing(raw), "url"


def _judge_path(raw: str) -> tuple[str, str] | None:
    value = _strip_trailing(raw)
    segs = [s for s in value.split("/") if s]
    if not segs:
        return None
    if value.startswith(("~", "./", "../")):
        return (value, "path") if len(value) > 2 else None
    if value.startswith("/"):
        last = segs[-1]
        ok = len(segs) >= 2 or value.endswith("/") or ("." in last.strip("."))
        return (value, "path") if ok else None
    if len(segs) >= 2 and _is_host(segs[0]):
        # `github.com/acme/infra-config`: a URL without its scheme; an image reference keeps
        # its tag (`registry.acme.io/billing-api:2026.12.3`).
        return value, "url"
    if ":" in segs[-1]:  # a tag only belongs to an image reference: `src/app.py:42` is a path
        value = _strip_trailing(value[: value.rindex(":")])
        segs = [s for s in value.split("/") if s]
    if _has_ext(segs[-1]) or (value.endswith("/") and len(segs) >= 2):
        return value, "path"
    if len(segs) >= 2 and _has_digit(segs[-1]) and any(map(_is_branch_word, segs)):
        return value, "path"  # `release/2026.12`, `feature/ABC-123`, `hotfix/v2.4.1`
    return None


def _is_host(name: str) -> bool:
    """`github.com`, `gitlab.example.org`: 2+ host labels, a known TLD, a letter up front."""
    labels = name.split(".")
    return (
        len(labels) >= 2
        and labels[-1].lower() in _TLDS
        and any(c.isalpha() for c in labels[0])
        and all(_HOST_LABEL_RE.fullmatch(label) for label in labels)
    )


def _is_branch_word(seg: str) -> bool:
    """`release`, `feature`, `users`: 3+ ASCII letters, not all capitals (`HTTP/2`, `TCP/IPv6`
    are protocols, not paths)."""
    return len(seg) >= 3 and seg.isascii() and seg.isalpha() and not seg.isupper()


def _judge_windows(raw: str) -> tuple[str, str] | None:
    value = _strip_trailing(raw)
    return (value, "windows_path") if len(value) > 3 else None


def _judge_ipv6(raw: str) -> tuple[str, str] | None:
    value = _strip_trailing(raw)
    addr = value.split("%", 1)[0]
    if not _has_digit(addr):
        return None
    try:
        ipaddress.IPv6Address(addr)
    except ValueError:
        return None
    return value, "ip"


def _judge_host_port(raw: str) -> tuple[str, str] | None:
    value = _strip_trailing(raw)
    host, _, rest = value.partition(":")
    port = rest.split("/", 1)[0]
    if not port.isdigit() or not 0 < int(port) <= 65535:
        return None
    if not any(c.isalpha() for c in host):
        return None
    labels = host.split(".")
    if len(labels) == 1:
        if host.lower() in _HOST_PORT_STOP:
            return None
    elif labels[-1].lower() in _FILE_EXTS and labels[-1].lower() not in _TLDS:
        return value, "file"  # `main.py:42` is a file and a line
    return value, "host_port"


def _judge_ticket(raw: str) -> tuple[str, str] | None:
    prefix = raw.split("-", 1)[0] if "-" in raw else raw.rstrip("0123456789")
    return None if prefix in _TICKET_STOP else (raw, "ticket")


_JS_FRAMEWORK_RE = re.compile(r"[A-Z][a-z]+\.js")
_HOST_LABEL_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?")


def _judge_dotted(raw: str) -> tuple[str, str] | None:
    labels = raw.split(".")
    last = labels[-1].lower()
    if last in _FILE_EXTS and any(c.isalnum() for c in raw[: -len(last) - 1]):
        if _JS_FRAMEWORK_RE.fullmatch(raw) or raw in _NOT_FILES:  # Node.js, Vue.js: names
            return None
        return raw, "file"
    if _is_host(raw):
        return raw, "host"
    return None


def _judge_dotfile(raw: str) -> tuple[str, str] | None:
    value = _strip_trailing(raw)
    name = value[1:]
    if name.split(".")[0] in _DOTFILE_NAMES or name.endswith(("rc", "ignore")) or _has_ext(name):
        return value, "file"
    return None


def _judge_hex(raw: str) -> tuple[str, str] | None:
    digits = raw[2:] if raw[:2] in ("0x", "0X") else raw
    letters = [c for c in digits if c.isalpha()]
    if not letters:
        return None  # all digits: a number
    if not (all(c.islower() for c in letters) or all(c.isupper() for c in letters)):
        return None
    if not _has_digit(digits) and len(digits) < 12:
        return None  # "deadbeef", "acceded": words
    return raw, "hex"


def _judge_id(raw: str) -> tuple[str, str] | None:
    digits = sum(c.isdigit() for c in raw)
    letters = sum(c.isalpha() for c in raw)
    return (raw, "id") if digits >= 2 and letters >= 2 else None


def _judge_number(raw: str) -> tuple[str, str] | None:
    return (raw, "number") if sum(c.isdigit() for c in raw) >= 6 else None


def _kind(kind: str) -> _Judge:
    def judge(raw: str) -> tuple[str, str] | None:
        return raw, kind

    return judge


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = rf"{_LABEL}(?:\.{_LABEL})*"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_SEG = rf"[{_L}.@%+~-]+"  # no `=`: `-out=/tmp/plan.tfplan` is a flag, then a path
_WIN_SEG = rf"[^\\/:*?\"<>|\s`{_CJK}{_WIDE}]+"

_CUSTOM = _kind("custom")
_DIGIT_RE = re.compile(r"\d")


@dataclass(frozen=True, slots=True)
class _Rule:
    """One identifier pattern. A text is scanned only if it contains one of `hints` (any text
    when empty), a digit when `digit`, and a match of `pre` (a literal-first regex, which `re`
    finds far faster than the full pattern): most texts skip most rules this way."""

    rx: re.Pattern[str]
    judge: _Judge
    hints: tuple[str, ...] = ()
    digit: bool = False
    pre: re.Pattern[str] | None = None


#: Precedence order: a match that overlaps an earlier claim is dropped.
_RULES: tuple[_Rule, ...] = (
    _Rule(_URL_RE, _judge_url, ("://", "www.")),
    # scp-style git remotes: git@github.com:org/repo.git
    _Rule(
        re.compile(
            r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}:"
            r"[A-Za-z0-9_.~-][A-Za-z0-9_./~-]*"
        ),
        _judge_scp,
        ("@",),
    ),
    _Rule(
        re.compile(
            r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@" + _HOST + r"\.[A-Za-z]{2,24}"
            r"(?![A-Za-z0-9-])"
        ),
        _kind("email"),
        ("@",),
    ),
    _Rule(
        re.compile(
            rf"(?<=\")[A-Za-z]:\\[^\"\n]+(?=\")"
            rf"|(?<![A-Za-z0-9_])(?:[A-Za-z]:[\\/]|\\\\[A-Za-z0-9_.$-]+\\)"
            rf"{_WIN_SEG}(?:[\\/]{_WIN_SEG})*[\\/]?"
        ),
        _judge_windows,
        ("\\", ":/"),
    ),
    _Rule(
        re.compile(
            r"(?<![A-Za-z0-9_-])[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
            r"[0-9a-fA-F]{4}-[0-9a-fA-F]{12}(?![A-Za-z0-9_-])"
        ),
        _kind("uuid"),
        ("-",),
        pre=re.compile(r"-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"),
    ),
    _Rule(
        re.compile(
            rf"(?<![{_L}:/.~\\-])(?:(?:~[{_L}.-]*|\.\.?)?(?:/{_SEG})+/?"
            rf"|{_SEG}(?:/{_SEG})+(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?/?)"
        ),
        _judge_path,
        ("/",),
    ),
    _Rule(
        re.compile(
            r"(?<![A-Za-z0-9_:.])(?=[0-9A-Fa-f:.]*:[0-9A-Fa-f]*:)[0-9A-Fa-f:.]{2,45}"
            r"(?:%[A-Za-z0-9]+)?(?![A-Za-z0-9_:])"
        ),
        _judge_ipv6,
        (":",),
        digit=True,
        pre=re.compile(r":[0-9A-Fa-f]{0,4}:"),
    ),
    _Rule(
        re.compile(
            rf"(?=\d)(?<![A-Za-z0-9_.])(?:{_OCTET}\.){{3}}{_OCTET}(?:/(?:3[0-2]|[12]?\d))?"
            r"(?::\d{1,5})?(?![A-Za-z0-9_]|\.\d)"
        ),
        _kind("ip"),
        (".",),
        digit=True,
        pre=re.compile(r"\.\d{1,3}\.\d"),
    ),
    _Rule(
        re.compile(rf"(?<![{_L}.@:-]){_HOST}:\d{{2,5}}(?:/[{_L}.@%+=~/-]*)?(?![{_L}:-]|\.\d)"),
        _judge_host_port,
        (":",),
        digit=True,
        pre=re.compile(r":\d\d"),
    ),
    # A literal first char, then the lookbehind (re skips fast to candidate first chars).
    _Rule(
        re.compile(
            rf"[A-Z](?<![{_L}-][A-Z])(?:[A-Z0-9]{{1,9}}(?:-\d+)+|[A-Z]{{1,5}}\d{{5,}})"
            rf"{_END}|#(?<![{_L}&#]#)\d{{2,}}(?![{_L}])"
        ),
        _judge_ticket,
        digit=True,
    ),
    _Rule(re.compile(rf"(?<![{_L}@./\\-])[{_L}-]+(?:\.[{_L}-]+)+{_END}"), _judge_dotted, (".",)),
    _Rule(re.compile(rf"(?<![{_L}./\\-])\.[a-z][a-z0-9_.-]{{1,40}}{_END}"), _judge_dotfile, (".",)),
    _Rule(re.compile(rf"(?<![{_L}-])(?<![{_L}]\.)(?:0[xX])?[0-9a-fA-F]{{7,}}{_END}"), _judge_hex),
    _Rule(
        re.compile(rf"(?<![{_L}-])(?<![{_L}]\.)[A-Za-z0-9][A-Za-z0-9_-]{{8,}}[A-Za-z0-9]{_END}"),
        _judge_id,
        digit=True,
    ),
    _Rule(
        re.compile(
            rf"\d(?<![{_L}.,]\d)(?:\d{{0,2}}(?:,\d{{3}})+(?:\.\d+)?|\d{{0,2}}(?:_\d{{3}})+"
            rf"|\d*(?:\.\d+)?)(?![{_L}]|[.,]\d)"
        ),
        _judge_number,
        digit=True,
    ),
)

# Mask values: 0 free, 1 taken by an identifier, 2 inside a secret marker, 3 a marker's first
# character. An identifier may contain whole markers (a URL with `?token=[REDACTED:…]`) but not
# cut one, nor overlap another identifier.
_FREE, _TAKEN, _MARK, _MARK_START = 0, 1, 2, 3


def _can_take(mask: bytearray, start: int, end: int) -> bool:
    if mask.find(_TAKEN, start, end) != -1:
        return False
    if mask[start] == _MARK:
        return False
    return not (end < len(mask) and mask[end] == _MARK)


def _scan(
    text: str,
    *,
    builtin: bool,
    customs: Sequence[re.Pattern[str]],
    keep_secrets: bool,
    marker_fmt: str,
) -> list[tuple[int, int, Identifier]]:
    """All identifiers in one text as (position, precedence, identifier)."""
    hits: list[tuple[int, int, Identifier]] = []
    spans = find_secrets(text)
    if spans and not keep_secrets:
        text, marked = _apply_markers(text, spans, marker_fmt)
    else:
        marked = [(s, e, text[s:e]) for s, e, _k in spans]
    mask = bytearray(len(text))
    for start, end, value in marked:
        mask[start:end] = bytes((_MARK,)) * (end - start)
        mask[start] = _MARK_START
        hits.append((start, -1, Identifier(value, "secret", True)))

    rules: list[_Rule] = list(_RULES) if builtin else []
    rules.extend(_Rule(rx, _CUSTOM) for rx in customs)
    has_digit = _DIGIT_RE.search(text) is not None
    for order, rule in enumerate(rules):
        if (
            (rule.digit and not has_digit)
            or (rule.hints and not any(h in text for h in rule.hints))
            or (rule.pre is not None and rule.pre.search(text) is None)
        ):
            continue
        for m in rule.rx.finditer(text):
            start = m.start()
            judged = rule.judge(m.group(0))
            if judged is None or not judged[0]:
                continue
            value, kind = judged
            end = start + len(value)
            if not _can_take(mask, start, end):
                continue
            mask[start:end] = bytes((_TAKEN,)) * (end - start)
            hits.append((start, order, Identifier(value, kind)))
    hits.sort(key=lambda h: (h[0], h[1]))
    return hits


def extract_identifiers(
    texts: Iterable[str],
    *,
    policy: IdentifierPolicy = "strict",
    custom_patterns: Sequence[str] = (),
    max_items: int | None = None,
    keep_secrets: bool = False,
    marker_fmt: str = DEFAULT_MARKER_FMT,
) -> list[Identifier]:
    """Identifiers in `texts`, deduplicated, in order of first appearance.

    `strict` finds every built-in kind plus `custom_patterns`; `custom` only `custom_patterns`
    (each full regex match is one identifier of kind `custom`); `off` nothing at all. Under
    `strict` and `custom`, secrets are reported as `kind="secret"` with their marker as value
    (the raw secret only with `keep_secrets=True`). `max_items` keeps the first N.
    """
    if max_items is not None and max_items < 0:
        raise ValueError("max_items must be >= 0")
    if policy == "off" or max_items == 0:
        return []
    if policy not in ("strict", "custom"):
        raise ValueError(f"unknown identifier policy {policy!r}")
    try:
        customs = [re.compile(p) for p in custom_patterns]
    except re.error as exc:
        raise ValueError(f"invalid custom identifier pattern: {exc}") from exc
    seen: dict[str, Identifier] = {}
    for text in texts:
        if not text:
            continue
        for _pos, _order, ident in _scan(
            text,
            builtin=policy == "strict",
            customs=customs,
            keep_secrets=keep_secrets,
            marker_fmt=marker_fmt,
        ):
            if ident.value not in seen:
                seen[ident.value] = ident
                if max_items is not None and len(seen) >= max_items:
                    return list(seen.values())
    result = list(seen.values())
    return result if max_items is None else result[:max_items]


def missing_identifiers(summary: str, identifiers: Sequence[Identifier]) -> list[Identifier]:
    """The identifiers not found verbatim (exact substring) in `summary`; a secret by its marker."""
    return [ident for ident in identifiers if ident.value not in summary]


def inline_code(value: str) -> str:
    """Markdown inline code for `value`, with a longer fence when it contains backticks."""
    if "`" not in value:
        return f"`{value}`"
    fence = "`" * (max(len(run) for run in re.findall(r"`+", value)) + 1)
    return f"{fence} {value} {fence}"


def render_identifier_section(identifiers: Iterable[Identifier]) -> str:
    """The body of `## Exact identifiers`: one "- `value`" line each ("" when there are none)."""
    return "\n".join(f"- {inline_code(ident.value)}" for ident in identifiers)
