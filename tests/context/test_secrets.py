"""Secret detection and redaction: every kind, context-dependent secrets, what is left alone."""

from __future__ import annotations

import itertools
import random
import string

import pytest

from context.identifiers import extract_identifiers
from context.secrets import SECRET_KINDS, find_secrets, redact_secrets
from context.types import Identifier

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


def test_find_secrets_spans_do_not_overlap() -> None:
    jwt = "eyJ" + _rnd(20) + ".eyJ" + _rnd(30) + "." + _rnd(43)
    spans = find_secrets(f"Authorization: Bearer {jwt} and password={_rnd(12)}")
    assert [k for _s, _e, k in spans] == ["jwt", "password"]
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
