"""Identifier extraction (every kind, precedence, policies) and secret redaction."""

from __future__ import annotations

import itertools
import random
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from context.identifiers import (
    SECRET_KINDS,
    Identifier,
    extract_identifiers,
    find_secrets,
    inline_code,
    missing_identifiers,
    redact_secrets,
    render_identifier_section,
)


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


# --------------------------------------------------------------------------- secrets

_R = random.Random(7)


def _rnd(n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    # Random, mixed-class bodies: never a real credential, and built at run time so secret
    # scanners do not flag this file.
    classes = [c for c in (str.isdigit, str.isupper, str.islower) if any(map(c, alphabet))]
    while True:
        s = "".join(_R.choice(alphabet) for _ in range(n))
        if all(any(map(c, s)) for c in classes):
            return s


UPPER_DIGITS = string.ascii_uppercase + string.digits
SECRETS = [
    ("openai_key", "sk-" + "proj-" + _rnd(48)),
    ("openai_key", "sk-" + _rnd(48)),
    ("anthropic_key", "sk-" + "ant-api03-" + _rnd(60)),
    ("slack_token", "xox" + "b-1234567890-" + _rnd(24)),
    ("slack_token", "xox" + "p-1234567890-" + _rnd(24)),
    ("slack_token", "xa" + "pp-1-" + _rnd(30)),
    ("github_token", "gh" + "p_" + _rnd(36)),
    ("github_token", "github" + "_pat_" + _rnd(60)),
    ("aws_access_key", "AK" + "IA" + _rnd(16, UPPER_DIGITS)),
    ("telegram_bot_token", "123456789:" + _rnd(35)),
    ("jwt", "eyJ" + _rnd(20) + ".eyJ" + _rnd(30) + "." + _rnd(43)),
    ("google_api_key", "AI" + "za" + _rnd(35)),
    ("stripe_key", "sk" + "_live_" + _rnd(24)),
    ("high_entropy", _rnd(48)),
]


@pytest.mark.parametrize(("kind", "secret"), SECRETS)
def test_each_secret_kind_is_redacted_and_never_extracted(kind: str, secret: str) -> None:
    text = f"here it is: {secret} keep it safe"
    redacted, found = redact_secrets(text)
    assert secret not in redacted
    assert redacted == f"here it is: [REDACTED:{kind}] keep it safe"
    assert found == [Identifier(f"[REDACTED:{kind}]", "secret", True)]
    extracted = extract_identifiers([text])
    assert all(secret not in i.value for i in extracted)
    assert Identifier(f"[REDACTED:{kind}]", "secret", True) in extracted
    assert kind in SECRET_KINDS


@pytest.mark.parametrize(
    ("text", "secret", "kind"),
    [
        ("Authorization: Bearer " + "Zq3" + _rnd(37), None, "bearer_token"),
        ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA==", "authorization"),
        ("password=hunter2 ok", "hunter2", "password"),
        ("DB_PASSWORD='s3cr et!'", "s3cr et!", "password"),
        ('{"api_key": "abcd1234efgh"}', "abcd1234efgh", "credential"),
        ("aws_secret_access_key = " + _rnd(40), None, "credential"),
        ("mysql --password hunter22 -u root", "hunter22", "password"),
        ("postgres://app:pa55word@db.internal:5432/prod", "pa55word", "url_password"),
        ("https://x.com/cb?token=abc123def456&x=1", "abc123def456", "credential"),
        (
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEow"
            + _rnd(60)
            + "\n-----END RSA PRIVATE KEY-----",
            None,
            "private_key",
        ),
    ],
)
def test_contextual_secrets(text: str, secret: str | None, kind: str) -> None:
    redacted, found = redact_secrets(text)
    assert f"[REDACTED:{kind}]" in redacted
    if secret is not None:
        assert secret not in redacted
        assert all(secret not in i.value for i in extract_identifiers([text]))
    assert [i.value for i in found] == [f"[REDACTED:{kind}]"]


def test_bearer_token_and_header_keep_their_prefix() -> None:
    token = _rnd(40)
    redacted, _ = redact_secrets(f"curl -H 'Authorization: Bearer {token}'")
    assert redacted == "curl -H 'Authorization: Bearer [REDACTED:bearer_token]'"


def test_jwt_after_bearer_is_a_jwt() -> None:
    jwt = "eyJ" + _rnd(20) + ".eyJ" + _rnd(30) + "." + _rnd(43)
    assert redact_secrets(f"Bearer {jwt}")[0] == "Bearer [REDACTED:jwt]"


@pytest.mark.parametrize(
    "text",
    [
        "sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "uuid 550e8400-e29b-41d4-a716-446655440000",
        "max_token: 4096 and token_count: 5 and max_tokens=8000",
        "the token: expired yesterday",
        "we use sk-learn-and-friends-for-this",
        "class getUserById2FactorAuthenticationHandlerFactory",
        "password: ${DB_PASSWORD} and password=none",
        "Basic authentication is enabled",
        "https://docs.google.com/document/d/1aBcD3eFgHiJkLmN0pQrStUvWxYz1234567890/edit",
    ],
)
def test_non_secrets_are_left_alone(text: str) -> None:
    assert redact_secrets(text) == (text, [])


def test_redaction_is_idempotent_and_markers_are_not_secrets() -> None:
    text = "key sk-" + "proj-" + _rnd(40) + " password=hunter2 " + _rnd(40)
    once, found = redact_secrets(text)
    assert redact_secrets(once) == (once, [])
    assert {i.value for i in found} == {
        "[REDACTED:openai_key]",
        "[REDACTED:password]",
        "[REDACTED:high_entropy]",
    }


def test_same_kind_secrets_share_one_marker_identifier() -> None:
    text = "gh" + "p_" + _rnd(36) + " and gh" + "p_" + _rnd(36)
    redacted, found = redact_secrets(text)
    assert redacted == "[REDACTED:github_token] and [REDACTED:github_token]"
    assert found == [Identifier("[REDACTED:github_token]", "secret", True)]


def test_custom_marker_format() -> None:
    redacted, found = redact_secrets("password=hunter2", marker_fmt="<secret:{kind}>")
    assert redacted == "password=<secret:password>"
    assert found[0].value == "<secret:password>"


def test_keep_secrets_returns_raw_values() -> None:
    key = "gh" + "p_" + _rnd(36)
    found = extract_identifiers([f"token {key}"], keep_secrets=True)
    assert found == [Identifier(key, "secret", True)]


def test_url_with_password_keeps_the_url_but_not_the_password() -> None:
    found = extract_identifiers(["dsn postgres://app:pa55word@db.internal:5432/prod"])
    assert [(i.value, i.kind) for i in found] == [
        ("postgres://app:[REDACTED:url_password]@db.internal:5432/prod", "url"),
        ("[REDACTED:url_password]", "secret"),
    ]


def test_find_secrets_spans_do_not_overlap() -> None:
    jwt = "eyJ" + _rnd(20) + ".eyJ" + _rnd(30) + "." + _rnd(43)
    spans = find_secrets(f"Authorization: Bearer {jwt} and password={_rnd(12)}")
    assert [k for _s, _e, k in spans] == ["jwt", "password"]
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


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
