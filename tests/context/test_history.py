"""Turns, history-limit resolution (with sources), applying a limit, turn importance."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import count

import pytest
from hypothesis import given
from hypothesis import strategies as st

from context.engine import drop_orphaned_tool_messages
from context.history import (
    SYSTEM_SOURCE,
    HistoryLimits,
    LimitResolution,
    PlatformLimits,
    Turn,
    apply_history_limit,
    choose_turns_to_drop,
    importance,
    resolve_history_limit,
    score_turns,
    split_turns,
    turn_importance,
)
from context.tokens import estimate_counter
from context.types import Message, ToolCall


def user(text: str = "hi", tokens: int | None = 10, seq: int | None = None) -> Message:
    return Message(role="user", content=text, tokens=tokens, seq=seq)


def reply(text: str = "ok", tokens: int | None = 10) -> Message:
    return Message(role="assistant", content=text, tokens=tokens)


def call(*ids: str, tokens: int | None = 10) -> Message:
    return Message(
        role="assistant", tool_calls=tuple(ToolCall(i, "shell") for i in ids), tokens=tokens
    )


def result(call_id: str, text: str = "done", tokens: int | None = 10) -> Message:
    return Message(role="tool", content=text, tool_call_id=call_id, tokens=tokens)


# ----------------------------------------------------------------------------- split_turns


def test_split_turns_leading_turn_and_properties() -> None:
    summary = Message(role="system", content="Summary of earlier talk", seq=1, tokens=50)
    msgs = [
        summary,
        user("list files", seq=2),
        call("c1"),
        result("c1", "Traceback (most recent call last):\nOSError: nope"),
        reply("it failed"),
        user("thanks", seq=7),
        reply("welcome"),
    ]
    turns = split_turns(msgs)
    assert [len(t.messages) for t in turns] == [1, 4, 2]
    lead, work, chat = turns
    assert lead.user_message is None and lead.tokens == 50
    assert work.user_message is msgs[1]
    assert work.has_tool_calls and work.has_error
    assert not chat.has_tool_calls and not chat.has_error
    assert (lead.first_seq, lead.last_seq) == (1, 1)
    assert (work.first_seq, work.last_seq) == (2, 2)
    assert chat.first_seq == 7
    assert Turn(()).first_seq is None and Turn(()).user_message is None
    assert [m for t in turns for m in t.messages] == msgs
    assert split_turns([]) == []


def test_turn_tokens_cached_or_counted() -> None:
    turn = Turn((user(tokens=None), reply(tokens=7)))
    assert turn.tokens == 7
    counter = estimate_counter()
    assert turn.count_tokens(counter) == counter.count_message(turn.messages[0]) + 7


def test_user_message_arriving_mid_tool_loop_stays_in_the_open_turn() -> None:
    # Persist-first: a message that arrives while a tool runs is stored between call and result.
    msgs = [user("run it"), call("c1"), user("also this"), result("c1"), reply(), user("next")]
    turns = split_turns(msgs)
    assert [len(t.messages) for t in turns] == [5, 1]


def test_unanswered_call_does_not_hold_the_turn_open() -> None:
    msgs = [user("a"), call("lost"), user("b"), reply()]
    assert [len(t.messages) for t in split_turns(msgs)] == [2, 2]


# -------------------------------------------------------------------------- limit resolution

LIMITS = HistoryLimits(
    system_default=30,
    platforms={
        "telegram": PlatformLimits(
            dm_default=50,
            group_default=20,
            dms={"42": 100, "7": None, "0u": 0},
            groups={"-1001": 10, "-1002": None},
        ),
        "slack": PlatformLimits(group_default=25, channels={"C01": 15}, groups={"G01": 5}),
        "discord": PlatformLimits(channels={"123": 0, "456": 8}, groups={"456": 3}),
        "webchat": PlatformLimits(),
    },
)


@pytest.mark.parametrize(
    ("platform", "chat_type", "chat_id", "user_id", "limit", "source"),
    [
        # DM: per-user → platform dm default → system default
        ("telegram", "direct", "42", "42", 100, '[channels.telegram.dms."42"] history_limit'),
        ("telegram", "direct", "99", "99", 50, "[channels.telegram] dm_history_limit"),
        ("telegram", "direct", "7", "7", 50, "[channels.telegram] dm_history_limit"),  # None
        ("telegram", "dm", "42", "42", 100, '[channels.telegram.dms."42"] history_limit'),
        ("slack", "direct", "D1", "U1", 30, SYSTEM_SOURCE),
        # DM limits are per user, never per group chat id
        ("telegram", "group", "42", "42", 20, "[channels.telegram] history_limit"),
        # group: per-chat → platform default → system default
        ("telegram", "group", "-1001", "5", 10, '[channels.telegram.groups."-1001"] history_limit'),
        ("telegram", "group", "-1002", "5", 20, "[channels.telegram] history_limit"),
        (
            "telegram",
            "thread",
            "-1001",
            "5",
            10,
            '[channels.telegram.groups."-1001"] history_limit',
        ),
        ("discord", "group", "999", "5", 30, SYSTEM_SOURCE),
        # Slack / Discord `channels` map, checked before `groups`
        ("slack", "channel", "C01", "U1", 15, '[channels.slack.channels."C01"] history_limit'),
        ("slack", "group", "G01", "U1", 5, '[channels.slack.groups."G01"] history_limit'),
        ("slack", "channel", "C99", "U1", 25, "[channels.slack] history_limit"),
        ("discord", "thread", "456", "5", 8, '[channels.discord.channels."456"] history_limit'),
        # 0 = unlimited, and it wins at the level that sets it
        ("discord", "channel", "123", "5", 0, '[channels.discord.channels."123"] history_limit'),
        ("telegram", "direct", "0u", "0u", 0, '[channels.telegram.dms."0u"] history_limit'),
        # a known platform with nothing set, and an unknown platform
        ("webchat", "direct", "w", "w", 30, SYSTEM_SOURCE),
        ("matrix", "direct", "m", "m", 30, SYSTEM_SOURCE),
        ("matrix", "group", "g", "m", 30, SYSTEM_SOURCE),
        # missing ids fall through
        ("telegram", "direct", None, None, 50, "[channels.telegram] dm_history_limit"),
        ("telegram", "group", None, "42", 20, "[channels.telegram] history_limit"),
    ],
)
def test_resolution_paths(
    platform: str,
    chat_type: str,
    chat_id: str | None,
    user_id: str | None,
    limit: int,
    source: str,
) -> None:
    res = resolve_history_limit(LIMITS, platform, chat_type, chat_id, user_id)
    assert (res.limit, res.source) == (limit, source)


def test_system_default_zero_is_unlimited() -> None:
    res = resolve_history_limit(HistoryLimits(), "telegram", "direct", "1", "1")
    assert res == LimitResolution(0, SYSTEM_SOURCE)
    assert res.unlimited
    assert res.describe() == "unlimited (from [context] history_limit (default))"
    assert LimitResolution(20, "[channels.slack] history_limit").describe() == (
        "last 20 user turns (from [channels.slack] history_limit)"
    )


def test_ids_are_quoted_as_toml_strings() -> None:
    limits = HistoryLimits(platforms={"x": PlatformLimits(dms={'a"b': 3})})
    res = resolve_history_limit(limits, "x", "direct", None, 'a"b')
    assert res.source == '[channels.x.dms."a\\"b"] history_limit'


# --------------------------------------------------------------------- apply_history_limit


def chat(n: int) -> list[Message]:
    seq = count(1)
    out: list[Message] = []
    for i in range(n):
        out += [user(f"u{i}", seq=next(seq)), call(f"c{i}"), result(f"c{i}"), reply(f"a{i}")]
    return out


@pytest.mark.parametrize(("turns", "limit", "kept_users"), [(5, 3, 3), (5, 5, 5), (2, 4, 2)])
def test_keeps_exactly_n_user_turns(turns: int, limit: int, kept_users: int) -> None:
    history = chat(turns)
    cut = apply_history_limit(history, limit)
    assert [m.text for m in cut.kept if m.role == "user"] == [
        f"u{i}" for i in range(turns - kept_users, turns)
    ]
    assert cut.dropped + cut.kept == history
    assert cut.kept[0].role == "user"
    assert cut.kept_turns == kept_users and cut.dropped_turns == turns - kept_users


def test_limit_zero_keeps_everything() -> None:
    history = [Message(role="system", content="summary"), *chat(40)]
    cut = apply_history_limit(history, 0)
    assert cut.kept == history and cut.dropped == []


def test_leading_turn_kept_when_it_fits_and_dropped_with_the_oldest_turns() -> None:
    summary = Message(role="system", content="summary")
    history = [summary, *chat(3)]
    assert apply_history_limit(history, 3).kept == history
    cut = apply_history_limit(history, 2)
    assert summary not in cut.kept and cut.dropped[0] is summary
    assert sum(m.role == "user" for m in cut.kept) == 2


def test_negative_limit_rejected() -> None:
    with pytest.raises(ValueError):
        apply_history_limit(chat(1), -1)


def test_cut_never_splits_a_call_that_a_late_user_message_interrupted() -> None:
    history = [user("a"), call("c1"), user("b"), result("c1"), reply(), user("c"), reply()]
    cut = apply_history_limit(history, 1)
    assert [m.text for m in cut.kept] == ["c", "ok"]
    cut = apply_history_limit([*history, user("d")], 2)
    assert cut.kept[0].text == "c"


@st.composite
def transcripts(draw: st.DrawFn) -> list[Message]:
    """Random histories: optional leading notes, user turns with tool loops (several calls
    per step, results in any order, sometimes a user message stored mid loop, sometimes a
    call left unanswered), plain replies."""
    ids = count()
    out: list[Message] = []
    for _ in range(draw(st.integers(0, 2))):
        out.append(Message(role="system", content="note"))
    for _ in range(draw(st.integers(0, 8))):
        out.append(user())
        for _ in range(draw(st.integers(0, 3))):
            calls = [f"c{next(ids)}" for _ in range(draw(st.integers(1, 3)))]
            out.append(call(*calls))
            answered = [result(c) for c in calls if draw(st.integers(0, 9)) != 0]
            results: list[Message] = draw(st.permutations(answered))
            interrupted = draw(st.integers(0, 3)) == 0
            if results and interrupted:
                results = [results[0], user("meanwhile"), *results[1:]]
            out.extend(results)
        if draw(st.booleans()):
            out.append(reply())
    return out


def user_turns(messages: Sequence[Message]) -> int:
    return sum(t.user_message is not None for t in split_turns(messages))


@given(transcripts(), st.integers(0, 10))
def test_cut_keeps_tool_pairs_and_n_turns(history: list[Message], limit: int) -> None:
    cut = apply_history_limit(history, limit)
    assert cut.dropped + cut.kept == history
    kept_calls = {c.id for m in cut.kept for c in m.tool_calls}
    kept_results = {m.tool_call_id for m in cut.kept if m.role == "tool"}
    all_results = {m.tool_call_id for m in history if m.role == "tool"}
    # every kept result has its call, every kept call that was ever answered has its result
    assert kept_results <= kept_calls
    assert kept_calls & all_results <= kept_results
    # a history without orphans stays without orphans
    if drop_orphaned_tool_messages(history) == history:
        assert drop_orphaned_tool_messages(cut.kept) == cut.kept
    total = user_turns(history)
    expected = total if limit == 0 else min(limit, total)
    assert user_turns(cut.kept) == expected


# ------------------------------------------------------------------------------ importance


def test_message_importance_ordering() -> None:
    u, a = user("please deploy"), reply("sure")
    t_ok, t_err = result("c", "all good"), result("c", "make: *** Error 2\nexit code 2")
    assert importance(u, 5, 10) > importance(a, 5, 10)
    assert importance(a, 9, 10) > importance(a, 0, 10)
    assert importance(t_err, 5, 10) > importance(t_ok, 5, 10)
    assert importance(call("c"), 5, 10) > importance(a, 5, 10)
    # recency 0.3 + type 0.4 (a user ask) + length 0.2 * (1 - 10/2000), not referenced
    assert importance(u, 0, 1) == pytest.approx(0.3 + 0.4 + 0.2 * (1 - 10 / 2000))
    assert importance(u, 0, 1, referenced=True) == pytest.approx(importance(u, 0, 1) + 0.1)
    assert importance(user("x", tokens=5_000), 5, 10) < importance(user("x"), 5, 10)
    top = Message(role="assistant", content="Traceback", tool_calls=(ToolCall("x", "f"),))
    assert 0.0 <= importance(top, 0, 1) <= 1.0


def test_turn_importance_favours_asks_errors_and_recency() -> None:
    plain = Turn((user(), reply()))
    failing = Turn((user(), call("c"), result("c", "FAILED tests/test_x.py::test_y"), reply()))
    working = Turn((user(), call("c"), result("c", "3 passed"), reply()))
    no_ask = Turn((reply("unprompted"),))
    assert turn_importance(failing, 0, 5) > turn_importance(working, 0, 5)
    assert turn_importance(working, 0, 5) > turn_importance(plain, 0, 5)
    assert turn_importance(plain, 0, 5) > turn_importance(no_ask, 0, 5)
    assert turn_importance(plain, 4, 5) > turn_importance(plain, 0, 5)
    # a failing turn: recency 0.3 + type 0.4 + length 0.2 * (1 - 40/2000) (+ 0.1 if referenced)
    assert turn_importance(failing, 4, 5) == pytest.approx(0.3 + 0.4 + 0.2 * (1 - 40 / 2000))
    assert turn_importance(failing, 4, 5, referenced=True) == pytest.approx(
        turn_importance(failing, 4, 5) + 0.1
    )


def test_a_turn_referred_to_later_scores_higher() -> None:
    turns = [
        Turn((user("deploy ORD-88123 please"), reply())),
        Turn((user("what time is it"), reply())),
        Turn((user("did ORD-88123 go out?"), reply())),
    ]
    scores = score_turns(turns)
    assert "referenced later" in scores[0].reasons
    assert "referenced later" not in scores[1].reasons


@given(st.integers(0, 50), st.integers(1, 50))
def test_importance_in_unit_range(index: int, total: int) -> None:
    index = min(index, total - 1)
    for m in (user("error"), reply(), result("c", "Traceback"), call("c")):
        assert 0.0 <= importance(m, index, total) <= 1.0


def test_choose_turns_to_drop_least_important_first_and_protects_recent() -> None:
    turns = [
        Turn((user(tokens=100), call("c1"), result("c1", "exit code 1", tokens=1_500))),  # error
        Turn((user(tokens=100), reply(tokens=100))),  # plain
        Turn((user(tokens=100), reply(tokens=100))),  # plain, newer
        Turn((user(tokens=100), reply(tokens=100))),  # protected
    ]
    # importance: 0 = 0.4 + 0.2*0.2 = 0.44 (a failure, but 1,610 tokens of bulk);
    # 1 = 0.1 + 0.24 + 0.18 = 0.52; 2 = 0.2 + 0.24 + 0.18 = 0.62
    assert choose_turns_to_drop(turns, 1_000, protect_last=1) == [0]
    assert choose_turns_to_drop(turns, 1_700, protect_last=1) == [0, 1]
    assert choose_turns_to_drop(turns, 10_000, protect_last=1) == [0, 1, 2]
    assert choose_turns_to_drop(turns, 10_000, protect_last=4) == []
    assert choose_turns_to_drop(turns, 0, protect_last=0) == []


def test_choose_turns_ties_break_oldest_first() -> None:
    plain = Turn((user(tokens=10), reply(tokens=10)))
    failed = Turn((user(tokens=10), reply("it failed", tokens=10)))
    # 0.4 * (0.6 + 0.2 error) at index 0 == 0.4 * 0.6 + recency 0.3 * 4/15 at index 4 of 16
    turns = [failed, *([plain] * 15)]
    scores = score_turns(turns)
    assert scores[0].importance == pytest.approx(scores[4].importance)
    order = choose_turns_to_drop(turns, 10_000, protect_last=0)
    assert order.index(0) == order.index(4) - 1


def test_choose_turns_counts_uncached_with_counter() -> None:
    turns = [Turn((user("x" * 400, tokens=None),)), Turn((user(),))]
    assert choose_turns_to_drop(turns, 50, protect_last=0) == [0, 1]  # uncached counts as 0
    counter = estimate_counter()
    assert choose_turns_to_drop(turns, 50, protect_last=0, counter=counter) == [0]


def test_turn_score_describe_says_which_and_why() -> None:
    turn = Turn((user(seq=10), call("c"), result("c", "error: nope"), user(seq=14)))
    (score,) = score_turns([turn])
    assert score.describe() == (
        "turn 0 (seq 10–14, 40 tokens, importance 0.90: user ask, tool calls, error)"
    )
    lead = score_turns([Turn((Message(role="system", content="s"),))])[0]
    assert lead.describe() == "turn 0 (0 tokens, importance 0.74: no user message)"
