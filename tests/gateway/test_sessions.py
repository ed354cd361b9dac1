from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channels.base import InboundMessage
from gateway.config import SessionsSection
from gateway.sessions import SessionKeyer

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
IDS = st.text(min_size=0, max_size=12)


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


@settings(max_examples=400, deadline=None)
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
    same = conversation(a, settings_) == conversation(b, settings_)
    assert (keyer.key_for(a) == keyer.key_for(b)) == same
