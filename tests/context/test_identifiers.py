"""Identifier extraction (every kind, precedence, policies; secrets reported by their marker)."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from context.identifiers import (
    extract_identifiers,
    inline_code,
    missing_identifiers,
    render_identifier_section,
)
from context.types import Identifier


def values(text: str, **kwargs: object) -> list[str]:
    return [i.value for i in extract_identifiers([text], **kwargs)]  # type: ignore[arg-type]


def kinds(text: str) -> dict[str, str]:
    return {i.value: i.kind for i in extract_identifiers([text])}


# --------------------------------------------------------------------------- positive table

POSITIVE = [
    # URLs: trailing punctuation and unbalanced brackets are not part of them
    ("See https://example.com/a/b?x=1.", "https://example.com/a/b?x=1", "url"),
    (
        "(docs: https://en.wikipedia.org/wiki/Foo_(bar))",
        "https://en.wikipedia.org/wiki/Foo_(bar)",
        "url",
    ),
    ("[link](https://x.io/d), then", "https://x.io/d", "url"),
    ("ws at wss://chat.example.org:8443/socket;", "wss://chat.example.org:8443/socket", "url"),
    ("ftp://files.example.net/pub/a.tgz!", "ftp://files.example.net/pub/a.tgz", "url"),
    ("clone git@github.com:org/repo.git now", "git@github.com:org/repo.git", "url"),
    ("go to www.example.com/help.", "www.example.com/help", "url"),
    # unix paths
    ("Edit /etc/nginx/nginx.conf.", "/etc/nginx/nginx.conf", "path"),
    ("in ~/projects/x", "~/projects/x", "path"),
    ("run ./a/b", "./a/b", "path"),
    ("see ../up/z.txt;", "../up/z.txt", "path"),
    ("open src/context/identifiers.py", "src/context/identifiers.py", "path"),
    ("the /var/log/ directory", "/var/log/", "path"),
    ("node_modules/@types/node/index.d.ts", "node_modules/@types/node/index.d.ts", "path"),
    # branch-like relative paths: a word segment and a last segment with a digit
    ("on branch release/2026.12.", "release/2026.12", "path"),
    ("push feature/ABC-123 now", "feature/ABC-123", "path"),
    ("merge hotfix/v2.4.1, then", "hotfix/v2.4.1", "path"),
    ("GET v1/users/42", "v1/users/42", "path"),
    # host-led relative paths are URLs without a scheme, kept whole (not cut to the host)
    ("repo github.com/acme/infra-config.", "github.com/acme/infra-config", "url"),
    ("see gitlab.example.org/group/sub/project", "gitlab.example.org/group/sub/project", "url"),
    ("(github.com/acme/infra-config/README.md)", "github.com/acme/infra-config/README.md", "url"),
    # windows paths
    (r"file C:\Users\x\file.txt.", r"C:\Users\x\file.txt", "windows_path"),
    (r'"C:\Program Files\App\app.exe"', r"C:\Program Files\App\app.exe", "windows_path"),
    (r"share \\fileserver\team\q3.xlsx", r"\\fileserver\team\q3.xlsx", "windows_path"),
    # file names
    ("attach report_v2.pdf, please", "report_v2.pdf", "file"),
    ("in main.py.", "main.py", "file"),
    ("backup_2024_01.tar.gz done", "backup_2024_01.tar.gz", "file"),
    ("copy .env.example and .gitignore", ".gitignore", "file"),
    ("error at main.py:42", "main.py:42", "file"),
    # hosts and ports
    ("connect db.internal:5432", "db.internal:5432", "host_port"),
    ("open localhost:8080/admin.", "localhost:8080/admin", "host_port"),
    ("redis:6379 is up", "redis:6379", "host_port"),
    ("call api.stripe.com now", "api.stripe.com", "host"),
    ("svc my-svc.prod.svc.cluster.local", "my-svc.prod.svc.cluster.local", "host"),
    # IPs
    ("ping 10.0.0.1.", "10.0.0.1", "ip"),
    ("bind 192.168.1.10:443", "192.168.1.10:443", "ip"),
    ("subnet 10.20.0.0/16", "10.20.0.0/16", "ip"),
    ("v6 2001:db8::8a2e:370:7334 ok", "2001:db8::8a2e:370:7334", "ip"),
    ("loopback ::1.", "::1", "ip"),
    # e-mail
    ("mail alice.smith+tag@example.co.uk now.", "alice.smith+tag@example.co.uk", "email"),
    # UUIDs, hashes, numbers, tickets, ids
    ("id 550e8400-e29b-41d4-a716-446655440000", "550e8400-e29b-41d4-a716-446655440000", "uuid"),
    ("ID 550E8400-E29B-41D4-A716-446655440000.", "550E8400-E29B-41D4-A716-446655440000", "uuid"),
    (
        "commit 9fceb02d0ae598e95dc970b74767f19372d61af8",
        "9fceb02d0ae598e95dc970b74767f19372d61af8",
        "hex",
    ),
    ("short sha 3f2a9c1 merged", "3f2a9c1", "hex"),
    ("sha256 E3B0C44298FC1C149AFBF4C8996FB924", "E3B0C44298FC1C149AFBF4C8996FB924", "hex"),
    ("addr 0x7ffd4a2b10", "0x7ffd4a2b10", "hex"),
    ("order 1234567 shipped", "1234567", "number"),
    ("total 1,234,567.89 EUR", "1,234,567.89", "number"),
    ("ts 1714000000.", "1714000000", "number"),
    ("ticket ORD-1042.", "ORD-1042", "ticket"),
    ("see JIRA-123", "JIRA-123", "ticket"),
    ("incident INC0012345", "INC0012345", "ticket"),
    ("CVE-2024-12345 patched", "CVE-2024-12345", "ticket"),
    ("fixed in #5429", "#5429", "ticket"),
    ("model claude-3-5-sonnet-20241022", "claude-3-5-sonnet-20241022", "id"),
    # CJK text has no spaces: the CJK character ends the identifier
    ("订单ORD-1042的地址", "ORD-1042", "ticket"),
    ("配置在/srv/app/config.yaml。", "/srv/app/config.yaml", "path"),
    ("请访问https://example.cn/x。谢谢", "https://example.cn/x", "url"),
]


@pytest.mark.parametrize(("text", "value", "kind"), POSITIVE)
def test_positive_examples(text: str, value: str, kind: str) -> None:
    found = kinds(text)
    assert found.get(value) == kind, found


NEGATIVE = [
    ("a fraction 1/2 of it", ["1/2", "/2"]),
    ("and/or TCP/IP km/h w/o", ["and/or", "TCP/IP", "km/h", "w/o", "/or", "/IP"]),
    ("run /start then /help", ["/start", "/help"]),
    ("Python v3.11.2 and 3.11", ["v3.11.2", "3.11.2", "3.11"]),
    ("e.g. this, i.e. that. The end.Next", ["e.g", "i.e", "end.Next"]),
    ("Node.js and os.path.join", ["Node.js", "os.path.join"]),
    ("meet at 10:30 on 2024-05-01", ["10:30", "2024-05-01"]),
    ("words deadbeef acceded facade", ["deadbeef", "acceded", "facade"]),
    ("UTF-8 and SHA-256 and GPT-4", ["UTF-8", "SHA-256", "GPT-4"]),
    ("short 12345 and 1,234", ["12345", "1,234"]),
    ("see line:42 and step:10", ["line:42", "step:10"]),
    ("CamelCase getUserById2Handler", ["getUserById2Handler"]),
    ("HTTP/2, HTTP/1.1, TCP/IPv6, IPv4/IPv6 and 24/7", ["HTTP/2", "HTTP/1.1", "TCP/IPv6", "24/7"]),
    ("ratio abc/def and x/y2 and q/10", ["abc/def", "x/y2", "q/10"]),
    ("just github.com/ here", ["github.com/"]),
]


@pytest.mark.parametrize(("text", "absent"), NEGATIVE)
def test_negative_examples(text: str, absent: list[str]) -> None:
    found = values(text)
    for value in absent:
        assert value not in found, (value, found)


# --------------------------------------------------------------------------- precedence


def test_url_wins_over_its_host_path_and_file() -> None:
    text = "fetch https://db.internal:5432/files/report_v2.pdf?id=1234567 now"
    assert values(text) == ["https://db.internal:5432/files/report_v2.pdf?id=1234567"]


def test_email_wins_over_its_domain() -> None:
    assert values("write to ops@example.com") == ["ops@example.com"]


def test_path_wins_over_its_file_and_ids() -> None:
    text = "see /orders/ORD-1042/invoice.pdf"
    assert values(text) == ["/orders/ORD-1042/invoice.pdf"]


def test_host_led_path_is_whole_not_its_host() -> None:
    assert values("clone github.com/acme/infra-config today") == ["github.com/acme/infra-config"]


def test_branch_is_whole_not_its_number_or_ticket() -> None:
    assert values("rebase release/2026.12 onto feature/ABC-123") == [
        "release/2026.12",
        "feature/ABC-123",
    ]


def test_uuid_not_also_hex() -> None:
    assert values("550e8400-e29b-41d4-a716-446655440000") == [
        "550e8400-e29b-41d4-a716-446655440000"
    ]


# --------------------------------------------------------------------------- order, dedupe


def test_order_of_first_appearance_and_dedupe_across_texts() -> None:
    texts = [
        "first ORD-1042 then /etc/hosts",
        "again ORD-1042 and https://x.io/a",
        "",
        "/etc/hosts and 10.0.0.1",
    ]
    assert values_of(texts) == ["ORD-1042", "/etc/hosts", "https://x.io/a", "10.0.0.1"]


def values_of(texts: list[str], **kwargs: object) -> list[str]:
    return [i.value for i in extract_identifiers(texts, **kwargs)]  # type: ignore[arg-type]


def test_accepts_any_iterable() -> None:
    gen = (t for t in ["ORD-1042", "JIRA-7"])
    assert [i.value for i in extract_identifiers(gen)] == ["ORD-1042", "JIRA-7"]


def test_max_items_keeps_the_first() -> None:
    texts = [f"ORD-{n}" for n in range(1000, 1020)]
    assert values_of(texts, max_items=3) == ["ORD-1000", "ORD-1001", "ORD-1002"]
    assert values_of(texts, max_items=0) == []
    with pytest.raises(ValueError):
        extract_identifiers(texts, max_items=-1)


def test_identifier_is_frozen_and_hashable() -> None:
    ident = Identifier("ORD-1042", "ticket")
    assert ident.secret is False
    assert {ident, Identifier("ORD-1042", "ticket")} == {ident}
    with pytest.raises(AttributeError):
        ident.value = "x"  # type: ignore[misc]


# --------------------------------------------------------------------------- policies


def test_off_policy_finds_nothing() -> None:
    key = "sk-" + "proj-" + "Ab1" * 12
    assert extract_identifiers([f"ORD-1042 {key}"], policy="off") == []


def test_custom_policy_only_custom_patterns_plus_secrets() -> None:
    key = "sk-" + "proj-" + "Ab1" * 12
    text = f"order A-77-X and ORD-1042 at /etc/hosts with {key}"
    found = extract_identifiers([text], policy="custom", custom_patterns=[r"A-\d+-X"])
    assert [(i.value, i.kind) for i in found] == [
        ("A-77-X", "custom"),
        ("[REDACTED:openai_key]", "secret"),
    ]


def test_strict_policy_also_applies_custom_patterns() -> None:
    found = kinds("code zz9-plural-z and ORD-1042")
    assert "zz9-plural-z" not in found
    strict = extract_identifiers(["code zz9-plural-z and ORD-1042"], custom_patterns=[r"zz9-\S+"])
    assert {i.value: i.kind for i in strict} == {"zz9-plural-z": "custom", "ORD-1042": "ticket"}


def test_custom_pattern_never_cuts_a_builtin_match() -> None:
    found = extract_identifiers(
        ["https://shop.example.com/o/ORD-1042"], custom_patterns=["ORD-\\d+"]
    )
    assert [i.value for i in found] == ["https://shop.example.com/o/ORD-1042"]


def test_invalid_custom_pattern_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="custom identifier pattern"):
        extract_identifiers(["x"], policy="custom", custom_patterns=["(unclosed"])


# --------------------------------------------------------------------------- secrets in extraction


def test_keep_secrets_returns_raw_values() -> None:
    key = "gh" + "p_" + "aB3" * 12  # built at run time so secret scanners do not flag this file
    found = extract_identifiers([f"token {key}"], keep_secrets=True)
    assert found == [Identifier(key, "secret", True)]


def test_url_with_password_keeps_the_url_but_not_the_password() -> None:
    found = extract_identifiers(["dsn postgres://app:pa55word@db.internal:5432/prod"])
    assert [(i.value, i.kind) for i in found] == [
        ("postgres://app:[REDACTED:url_password]@db.internal:5432/prod", "url"),
        ("[REDACTED:url_password]", "secret"),
    ]


# --------------------------------------------------------------------------- checks, rendering


def test_missing_identifiers_exact_substring_and_marker() -> None:
    ids = [
        Identifier("ORD-1042", "ticket"),
        Identifier("/etc/x.conf", "path"),
        Identifier("[REDACTED:openai_key]", "secret", True),
    ]
    summary = "Order ord-1042 uses /etc/x.conf; key [REDACTED:openai_key]."
    assert missing_identifiers(summary, ids) == [ids[0]]
    assert missing_identifiers("", []) == []


def test_render_identifier_section() -> None:
    ids = [Identifier("ORD-1042", "ticket"), Identifier("a`b", "custom")]
    assert render_identifier_section(ids) == "- `ORD-1042`\n- `` a`b ``"
    assert render_identifier_section([]) == ""
    assert inline_code("x") == "`x`"


# --------------------------------------------------------------------------- property

WORDS = st.one_of(
    # "bearer <uuid>" is a credential, rightly redacted rather than kept as an identifier.
    st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=9).filter(
        lambda w: w != "bearer"
    ),
    st.sampled_from(
        ["and/or", "1/2", "v3.11.2", "e.g.", "UTF-8", "Node.js", "10:30", "the", "订单", "是的"]
    ),
)
_LABEL = st.text(alphabet=string.ascii_lowercase, min_size=2, max_size=8)
_DOMAIN = st.builds(
    lambda a, b, tld: f"{a}.{b}.{tld}", _LABEL, _LABEL, st.sampled_from(["com", "io", "org"])
)
_HEX = (
    st.binary(min_size=4, max_size=32)
    .map(bytes.hex)
    .filter(lambda h: any(c.isdigit() for c in h) and any(c.isalpha() for c in h))
)
PLANTED = st.one_of(
    st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    _HEX,
    st.builds(
        lambda p, n: f"{p}-{n}",
        st.sampled_from(["ORD", "JIRA", "PROJ", "INC", "OPS2"]),
        st.integers(1, 999_999),
    ),
    st.integers(100_000, 10**12).map(str),
    st.builds(lambda u, d: f"{u}@{d}", _LABEL, _DOMAIN),
    st.builds(
        lambda d, segs: f"https://{d}/" + "/".join(segs),
        _DOMAIN,
        st.lists(_LABEL, min_size=0, max_size=3),
    ),
    st.builds(
        lambda segs, ext: "/" + "/".join(segs) + f".{ext}",
        st.lists(_LABEL, min_size=2, max_size=4),
        st.sampled_from(["conf", "py", "log"]),
    ),
    st.ip_addresses(v=4).map(str),
    st.builds(
        lambda ip, port: f"{ip}:{port}", st.ip_addresses(v=4).map(str), st.integers(1, 65535)
    ),
    st.builds(lambda d, port: f"{d}:{port}", _DOMAIN, st.integers(10, 65535)),
    st.builds(lambda n, ext: f"{n}.{ext}", _LABEL, st.sampled_from(["pdf", "py", "yaml"])),
)


@st.composite
def planted_texts(draw: st.DrawFn) -> tuple[str, list[str]]:
    words = draw(st.lists(WORDS, max_size=30))
    planted = draw(st.lists(PLANTED, min_size=1, max_size=8))
    tails = draw(
        st.lists(
            st.sampled_from(["", ".", ",", ";", ")"]), min_size=len(planted), max_size=len(planted)
        )
    )
    tokens = words + [p + t for p, t in zip(planted, tails, strict=True)]
    order = draw(st.permutations(tokens))
    sep = draw(st.sampled_from([" ", "\n", "  "]))
    return sep.join(order), planted


@settings(max_examples=300, deadline=None)
@given(planted_texts())
def test_every_planted_identifier_is_extracted(case: tuple[str, list[str]]) -> None:
    text, planted = case
    found = values(text)
    for value in planted:
        assert value in found, (value, text, found)
