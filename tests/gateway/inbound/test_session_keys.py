from __future__ import annotations

from dataclasses import replace
from urllib.parse import unquote

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from channels.base import InboundMessage, is_blank
from gateway.config import SessionsSection
from gateway.inbound.session_keys import SessionKeyer, SessionKeyError, encode_part, parse_key
from gateway.inbound.text import inbound_problem

DM = InboundMessage(
    platform="telegram", chat_type="direct", chat_id="42", sender_id="42", text="hi"
)
GROUP = InboundMessage(
    platform="slack", chat_type="channel", chat_id="C1", sender_id="U7", text="hi"
)


@pytest.mark.parametrize(
    ("scope", "expected"),
    [
        ("per-channel-peer", "agent:main:telegram:direct:42"),
        ("per-peer", "agent:main:direct:telegram+42"),
        ("main", "agent:main:main"),
        ("per-account-channel-peer", "agent:main:telegram:default:direct:42"),
    ],
)
def test_dm_scopes(scope: str, expected: str) -> None:
    keyer = SessionKeyer(SessionsSection(dm_scope=scope))  # type: ignore[arg-type]
    assert keyer.key_for(DM) == expected


def test_groups_threads_and_per_user() -> None:
    keyer = SessionKeyer(SessionsSection())
    assert keyer.key_for(GROUP) == "agent:main:slack:channel:C1"
    group = replace(GROUP, platform="telegram", chat_type="group", chat_id="-100", thread_id="7")
    assert keyer.key_for(group) == "agent:main:telegram:group:-100:thread:7"
    per_user = SessionKeyer(SessionsSection(per_user_in_groups=True))
    assert per_user.key_for(GROUP) == "agent:main:slack:channel:C1:user:U7"


def test_identity_links_join_platforms_under_per_peer() -> None:
    links = {"alice": ["telegram:42", "slack:U7"]}
    keyer = SessionKeyer(SessionsSection(dm_scope="per-peer", identity_links=links))
    slack_dm = InboundMessage(
        platform="slack", chat_type="direct", chat_id="D1", sender_id="U7", text="hi"
    )
    assert keyer.key_for(DM) == keyer.key_for(slack_dm) == "agent:main:direct:alice"
    # per-channel-peer keeps platforms apart even for linked people.
    split = SessionKeyer(SessionsSection(identity_links=links))
    assert split.key_for(DM) != split.key_for(slack_dm)


def test_separators_in_ids_cannot_forge_keys() -> None:
    keyer = SessionKeyer(SessionsSection())
    evil = replace(GROUP, chat_id="C1:thread:9")
    threaded = replace(GROUP, thread_id="9")
    assert keyer.key_for(evil) != keyer.key_for(threaded)


PLATFORMS = st.sampled_from(["telegram", "slack", "discord", "webchat", "console"])
LOOK_ALIKES = [
    "\x00", "\\x00", "\\", "x00", "\ud800", "\udfff", "\\ud800", "\\udfff", "%", "%00",
    "%25", "%5C", ":", "::", "+", "\u200b", " ",
]
"""NUL and lone surrogates (which the store cannot hold) next to what escaping them used to
produce (a backslash, x, 0, 0), percent signs and separators."""
IDS = st.text(min_size=0, max_size=12) | st.lists(
    st.sampled_from(LOOK_ALIKES) | st.characters(categories=["Cs"]) | st.characters(),
    max_size=5,
).map("".join)


@st.composite
def inbound(draw: st.DrawFn) -> InboundMessage:
    chat_type = draw(st.sampled_from(["direct", "group", "channel", "thread"]))
    sender = draw(IDS)
    return InboundMessage(
        platform=draw(PLATFORMS),
        chat_type=chat_type,
        chat_id=sender if chat_type == "direct" else draw(IDS),
        sender_id=sender,
        account=draw(st.sampled_from(["default", "work", "a:b"])),
        thread_id=None if chat_type == "direct" else draw(st.none() | IDS),
        text="x",
    )


def conversation(msg: InboundMessage, s: SessionsSection) -> tuple[object, ...]:
    """Which conversation a message belongs to, by the rules ARCHITECTURE.md states."""
    if msg.chat_type == "direct":
        if s.dm_scope == "main":
            return ("main",)
        if s.dm_scope == "per-peer":
            return ("dm", msg.platform, msg.sender_id)
        if s.dm_scope == "per-channel-peer":
            return ("dm", msg.platform, msg.sender_id)
        return ("dm", msg.platform, msg.account, msg.sender_id)
    kind = "channel" if msg.chat_type == "channel" else "group"
    user = msg.sender_id if s.per_user_in_groups else None
    return ("group", msg.platform, kind, msg.chat_id, msg.thread_id, user)


def gateway_key(keyer: SessionKeyer, msg: InboundMessage) -> str | None:
    """The session the gateway files a message under (`Gateway.handle_inbound`): None when it
    refuses the message, which it must do exactly for ids it cannot store as they are (a NUL,
    an unpaired surrogate) and for a blank sender or chat."""
    problem = inbound_problem(msg)
    ids = [msg.chat_id, msg.sender_id, msg.account, msg.thread_id]
    unstorable = any(
        i is not None and ("\x00" in i or any("\ud800" <= c <= "\udfff" for c in i)) for i in ids
    )
    assert (problem is not None) == (unstorable or is_blank(msg.chat_id) or is_blank(msg.sender_id))
    return None if problem is not None else keyer.key_for(msg)


EVIL = InboundMessage(platform="webchat", chat_type="direct", chat_id="ev\x00il",
                      sender_id="ev\x00il", text="x")
PLAIN = replace(EVIL, chat_id="ev\\x00il", sender_id="ev\\x00il")


@settings(max_examples=400, deadline=None)
@example(a=EVIL, b=PLAIN, scope="per-channel-peer", per_user=False)
@example(a=replace(EVIL, chat_id="U\ud800", sender_id="U\ud800"),
         b=replace(EVIL, chat_id="U\\ud800", sender_id="U\\ud800"),
         scope="per-peer", per_user=False)
@example(a=replace(GROUP, thread_id="\x00"), b=replace(GROUP, thread_id=""),
         scope="main", per_user=False)
@example(a=replace(GROUP, chat_id="C1%3A2"), b=replace(GROUP, chat_id="C1:2"),
         scope="main", per_user=True)
@given(
    a=inbound(),
    b=inbound(),
    scope=st.sampled_from(["main", "per-peer", "per-channel-peer", "per-account-channel-peer"]),
    per_user=st.booleans(),
)
def test_keys_collide_exactly_when_conversations_are_the_same(
    a: InboundMessage, b: InboundMessage, scope: str, per_user: bool
) -> None:
    settings_ = SessionsSection(dm_scope=scope, per_user_in_groups=per_user)  # type: ignore[arg-type]
    keyer = SessionKeyer(settings_)
    key_a, key_b = gateway_key(keyer, a), gateway_key(keyer, b)
    if key_a is None or key_b is None:
        return  # refused: never filed under anyone's session
    same = conversation(a, settings_) == conversation(b, settings_)
    assert (key_a == key_b) == same


@settings(max_examples=200, deadline=None)
@given(value=IDS)
def test_a_key_part_is_its_id_percent_encoded_or_an_error(value: str) -> None:
    """Storable ids encode reversibly ("%00", which only a NUL could decode to, marks the empty
    one); an id the store cannot hold is an error, never an escape that another id spells."""
    if "\x00" in value or any("\ud800" <= c <= "\udfff" for c in value):
        with pytest.raises(ValueError, match="session key"):
            encode_part(value)
        return
    encoded = encode_part(value)
    assert ":" not in encoded and "+" not in encoded
    assert unquote(encoded, errors="strict") == (value or "\x00")


@settings(max_examples=300, deadline=None)
@given(
    msg=inbound(),
    scope=st.sampled_from(["main", "per-peer", "per-channel-peer", "per-account-channel-peer"]),
    per_user=st.booleans(),
)
def test_a_key_parses_back_into_its_conversation(
    msg: InboundMessage, scope: str, per_user: bool
) -> None:
    """`parse_key` is `key_for` read backwards: what `context explain` previews a new session
    by (platform, chat, thread, user), and which shape built it."""
    settings_ = SessionsSection(dm_scope=scope, per_user_in_groups=per_user)  # type: ignore[arg-type]
    key = gateway_key(SessionKeyer(settings_), msg)
    if key is None:
        return
    parts = parse_key(key)
    assert parts.agent == "main"
    if msg.chat_type == "direct":
        assert parts.scope == scope and parts.chat_type == "direct"
        if scope != "main":
            assert (parts.platform, parts.user_id) == (msg.platform, msg.sender_id)
        assert parts.account == (msg.account if scope == "per-account-channel-peer" else None)
        return
    assert parts.scope == "group" and parts.platform == msg.platform
    assert parts.chat_type == ("channel" if msg.chat_type == "channel" else "group")
    assert (parts.chat_id, parts.thread_id) == (msg.chat_id, msg.thread_id)
    assert parts.user_id == (msg.sender_id if per_user else None)


def test_a_linked_person_and_strings_that_are_no_key() -> None:
    links = {"alice": ["telegram:42", "slack:U7"]}
    keyer = SessionKeyer(SessionsSection(dm_scope="per-peer", identity_links=links))
    parts = parse_key(keyer.key_for(DM))
    assert (parts.person, parts.platform) == ("alice", None)
    assert keyer.linked_ids("alice") == [("telegram", "42"), ("slack", "U7")]
    for bad in [
        "", "agent", "agent:main", "session:main:main", "agent:main:slack:direct",
        "agent:main:slack:group:C1:thread", "agent:main:slack:group:C1:user:U1:thread:2",
        "agent:main:slack:group:C1:extra:x", "agent:main:telegram:direct:4 2",
        "agent:main:telegram:direct:%zz", "agent:main:telegram:direct:", "agent::main",
        "agent:main:telegram:direct:%ff",
    ]:
        with pytest.raises(SessionKeyError):
            parse_key(bad)
