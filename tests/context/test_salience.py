"""Salience ranking of a span's identifiers: weights, bulk last, seqs, same set as extraction."""

from __future__ import annotations

import json
import random
import string
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from context.identifiers import IdentifierPolicy, extract_identifiers
from context.salience import RankedIdentifier, rank_identifiers
from context.types import Identifier, Message, ToolCall


def user(text: str, seq: int | None = None) -> Message:
    return Message(role="user", content=text, seq=seq)


def assistant(text: str | None, seq: int | None = None, *calls: ToolCall) -> Message:
    return Message(role="assistant", content=text, tool_calls=calls, seq=seq)


def tool(text: str, seq: int | None = None, *, failed: bool = False) -> Message:
    return Message(role="tool", content=text, tool_call_id="c", seq=seq, meta={"failed": failed})


def call(**arguments: str) -> ToolCall:
    return ToolCall(id="c", name="run", arguments=json.dumps(arguments))


def failed(message: Message) -> bool:
    return bool(message.meta.get("failed"))


def bulk_rows(rows: int = 300, start: int = 4_000_000) -> str:
    """A large tab-separated tool output: tickets, ids and 7-digit numbers on every row."""
    return "\n".join(
        f"INV-{n}\tcus{n}ab\t{start + n}\t{start * 2 + n}" for n in range(rows)
    )


def values(ranked: list[RankedIdentifier]) -> list[str]:
    return [r.value for r in ranked]


def by_value(ranked: list[RankedIdentifier]) -> dict[str, RankedIdentifier]:
    return {r.value: r for r in ranked}


def all_texts(messages: list[Message], summary: str | None = None) -> list[str]:
    """What compaction extracts from: the summary, the texts, the tool-call arguments."""
    texts = [m.text for m in messages] + [c.arguments for m in messages for c in m.tool_calls]
    return [summary, *texts] if summary else texts


# --------------------------------------------------------------------------- ordering


def test_user_said_identifier_outranks_a_bulk_number() -> None:
    big = bulk_rows()
    messages = [
        user("please look at ORD-1042", 1),
        *(tool(big, seq) for seq in range(2, 8)),  # repeated and recent, but bulk only
    ]
    ranked = rank_identifiers(messages)
    found = by_value(ranked)
    assert values(ranked)[0] == "ORD-1042"
    assert found["ORD-1042"].reasons[0] == "user prose"
    number = found["4000007"]
    assert number.identifier.kind == "number"
    assert "bulk tool output" in number.reasons
    assert number.seqs == tuple(range(2, 8))


def test_bulk_only_rank_last_and_their_numbers_last_of_all() -> None:
    messages = [tool(bulk_rows(), 1), assistant("the output mentions INV-5", 2)]
    ranked = rank_identifiers(messages)
    kinds = [(r.identifier.kind, "bulk tool output" in r.reasons) for r in ranked]
    assert ranked[0].value == "INV-5"
    assert kinds[0] == ("ticket", False)
    bulk = kinds[1:]
    assert all(is_bulk for _kind, is_bulk in bulk)
    first_number = next(i for i, (kind, _b) in enumerate(bulk) if kind == "number")
    assert all(kind != "number" for kind, _b in bulk[:first_number])
    assert all(kind == "number" for kind, _b in bulk[first_number:])


def test_tool_argument_outranks_a_bulk_only_identifier() -> None:
    messages = [
        assistant(None, 1, call(path="/srv/app/config.yaml")),
        tool(bulk_rows(), 2),
        tool(bulk_rows(), 3),
    ]
    ranked = rank_identifiers(messages)
    assert ranked[0].value == "/srv/app/config.yaml"
    assert ranked[0].reasons == ("tool arguments",)
    assert by_value(ranked)["INV-7"].reasons[-1] == "bulk tool output"


def test_an_identifier_also_said_outside_bulk_is_not_bulk() -> None:
    messages = [tool(bulk_rows(), 1), user("what is INV-12?", 2)]
    ranked = rank_identifiers(messages)
    assert ranked[0].value == "INV-12"
    assert ranked[0].seqs == (1, 2)
    assert "bulk tool output" not in ranked[0].reasons


def test_bulk_chars_is_a_strict_bound() -> None:
    text = "ORD-1042 " + "x" * 91  # 100 chars
    assert "bulk tool output" not in rank_identifiers([tool(text, 1)], bulk_chars=100)[0].reasons
    assert "bulk tool output" in rank_identifiers([tool(text, 1)], bulk_chars=99)[0].reasons


def test_prose_outranks_arguments_user_outranks_assistant() -> None:
    messages = [user("the order is ORD-1", 1), assistant("checking ORD-2", 2, call(order="ORD-3"))]
    assert values(rank_identifiers(messages)) == ["ORD-1", "ORD-2", "ORD-3"]


def test_failure_boosts() -> None:
    # The successful one is later (more recent); the failure still wins.
    messages = [tool("error: ORD-1111 not found", 1, failed=True), tool("ok: ORD-2222", 2)]
    ranked = rank_identifiers(messages, is_failure=failed)
    assert values(ranked) == ["ORD-1111", "ORD-2222"]
    assert ranked[0].reasons == ("tool output", "failure")
    assert "failure" not in rank_identifiers(messages)[1].reasons  # no predicate, no failure


def test_is_failure_is_asked_about_tool_messages_only() -> None:
    asked: list[str] = []

    def spy(message: Message) -> bool:
        asked.append(message.role)
        return True

    rank_identifiers([user("ORD-1", 1), tool("ORD-2", 2), assistant("ORD-3", 3)], is_failure=spy)
    assert asked == ["tool"]


def test_repetition_and_recency() -> None:
    messages = [
        assistant("ORD-1 and ORD-9", 1),
        assistant("ORD-2", 2),
        assistant("ORD-1 again", 3),
        assistant("ORD-3", 4),
        assistant("ORD-1, ORD-1", 5),
    ]
    ranked = by_value(rank_identifiers(messages))
    assert ranked["ORD-1"].reasons == ("assistant prose", "repeated x3", "recent")
    assert ranked["ORD-1"].seqs == (1, 3, 5)
    # repeated beats once; among the once-said, later beats earlier
    assert values(rank_identifiers(messages)) == ["ORD-1", "ORD-3", "ORD-2", "ORD-9"]
    assert ranked["ORD-9"].reasons == ("assistant prose",)


def test_repetition_has_diminishing_returns() -> None:
    one, two, four = (
        rank_identifiers([assistant("ORD-1", seq) for seq in range(1, n + 1)])[0].score
        for n in (1, 2, 4)
    )
    # the same boost per doubling: 4 messages are worth twice 2 messages' boost, not thrice
    assert four - two == pytest.approx(two - one)
    assert one < two < four


def test_ties_keep_first_appearance_order_and_are_deterministic() -> None:
    messages = [assistant("ORD-5 ORD-4 ORD-3", 1), assistant("ORD-2 ORD-1", 2)]
    ranked = rank_identifiers(messages)
    assert values(ranked) == ["ORD-2", "ORD-1", "ORD-5", "ORD-4", "ORD-3"]
    assert ranked == rank_identifiers(messages)


# --------------------------------------------------------------------------- seqs, summary


def test_seqs_are_the_sorted_unique_seqs_of_the_messages() -> None:
    messages = [
        user("ORD-1042", 7),
        assistant("nothing", 5),
        user("ORD-1042 ORD-1042", 3),
        user("ORD-1042 from the system prompt", None),
        assistant(None, 9, call(order="ORD-77")),
    ]
    ranked = by_value(rank_identifiers(messages))
    assert ranked["ORD-1042"].seqs == (3, 7)
    assert ranked["ORD-1042"].reasons[1] == "repeated x3"  # three messages, seq or not
    assert ranked["ORD-77"].seqs == (9,)


def test_previous_summary_identifiers() -> None:
    summary = (
        "## State\nMigrating billing, see JIRA-88.\n"
        "## Exact identifiers\n- `ORD-7`\n- `/etc/billing.conf`\n- `ORD-1042`\n"
    )
    messages = [user("carry on with ORD-1042", 4)]
    ranked = by_value(rank_identifiers(messages, previous_summary=summary))
    assert set(ranked) == {"JIRA-88", "ORD-7", "/etc/billing.conf", "ORD-1042"}
    assert ranked["ORD-7"].seqs == ()
    assert ranked["ORD-7"].reasons == ("earlier summary",)
    assert ranked["ORD-1042"].seqs == (4,)
    assert ranked["ORD-1042"].reasons == ("user prose", "recent", "earlier summary")
    # carried identifiers outrank bulk ones
    with_bulk = rank_identifiers([tool(bulk_rows(), 1)], previous_summary=summary)
    assert {r.value for r in with_bulk[:4]} == {"JIRA-88", "ORD-7", "/etc/billing.conf",
                                                "ORD-1042"}


def test_summary_only() -> None:
    ranked = rank_identifiers([], previous_summary="- `ORD-7`")
    expected = RankedIdentifier(Identifier("ORD-7", "ticket"), (), 2.5, ("earlier summary",))
    assert ranked == [expected]
    assert rank_identifiers([]) == []


# --------------------------------------------------------------------------- same set


_R = random.Random(11)


def _key() -> str:
    # Built at run time so that secret scanners do not flag this file.
    alphabet = string.ascii_letters + string.digits
    return "sk-" + "proj-" + "".join(_R.choice(alphabet) for _ in range(44))


def transcript() -> tuple[list[Message], str]:
    key = _key()
    messages = [
        user(f"deploy github.com/acme/infra-config from release/2026.12 with {key}", 1),
        assistant("on it: https://ci.example.com/runs/881234 and 10.0.0.12", 2,
                  call(cmd=f"deploy --token {key} --ref feature/ABC-123", host="db.internal:5432")),
        tool("Traceback: /srv/app/main.py line 42, commit 9f3c2ab7d1e", 3, failed=True),
        tool(bulk_rows(120), 4),
        user("and password=hunter22 for the db; ticket A-77-X", 5),
    ]
    summary = "## Exact identifiers\n- `ORD-7`\n- `550e8400-e29b-41d4-a716-446655440000`"
    return messages, summary


@pytest.mark.parametrize(
    ("policy", "customs"), [("strict", ()), ("strict", (r"A-\d+-X",)), ("custom", (r"A-\d+-X",))]
)
def test_same_identifiers_as_extract_identifiers(
    policy: IdentifierPolicy, customs: tuple[str, ...]
) -> None:
    messages, summary = transcript()
    ranked = rank_identifiers(
        messages, previous_summary=summary, policy=policy, custom_patterns=customs,
        is_failure=failed,
    )
    expected = extract_identifiers(
        all_texts(messages, summary), policy=policy, custom_patterns=customs
    )
    assert {r.identifier for r in ranked} == set(expected)  # values, kinds and secret flags
    assert len(ranked) == len(expected)


def test_secrets_appear_only_by_their_marker() -> None:
    messages, summary = transcript()
    key = messages[0].text.rsplit(" ", 1)[-1]
    ranked = rank_identifiers(messages, previous_summary=summary)
    secrets = {r.value: r for r in ranked if r.identifier.secret}
    assert set(secrets) == {"[REDACTED:openai_key]", "[REDACTED:password]"}
    assert all(r.identifier.kind == "secret" for r in secrets.values())
    assert secrets["[REDACTED:openai_key]"].seqs == (1, 2)
    dump = repr(ranked)
    assert key not in dump
    assert "hunter22" not in dump


def test_whole_identifiers_are_ranked_whole() -> None:
    messages, _summary = transcript()
    found = by_value(rank_identifiers(messages))
    assert found["github.com/acme/infra-config"].reasons[0] == "user prose"
    assert "release/2026.12" in found
    assert "feature/ABC-123" in found
    assert "github.com" not in found
    assert "2026.12" not in found


def test_policy_off_and_bad_arguments() -> None:
    messages, summary = transcript()
    assert rank_identifiers(messages, previous_summary=summary, policy="off") == []
    with pytest.raises(ValueError):
        rank_identifiers(messages, policy="loose")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        rank_identifiers([], policy="custom", custom_patterns=["(unclosed"])
    with pytest.raises(ValueError):
        rank_identifiers(messages, bulk_chars=-1)


def test_ranked_identifier_is_frozen() -> None:
    item = rank_identifiers([user("ORD-1", 1)])[0]
    assert item.value == "ORD-1" == item.identifier.value
    with pytest.raises(AttributeError):
        item.score = 0.0  # type: ignore[misc]


# --------------------------------------------------------------------------- property, size

_ROLES = st.sampled_from(["user", "assistant", "tool", "system"])
_PLANTED = st.sampled_from(
    ["ORD-1042", "INV-5", "/etc/hosts", "9f3c2ab7d1", "1234567", "10.0.0.1", "a.b.com/x/y",
     "hotfix/v2.4.1", "main.py", "and/or", "1/2"]
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(_ROLES, st.lists(_PLANTED, max_size=4), st.lists(_PLANTED, max_size=2),
                  st.booleans(), st.one_of(st.none(), st.integers(0, 50))),
        max_size=8,
    ),
    st.one_of(st.none(), st.lists(_PLANTED, max_size=3).map(" ".join)),
)
def test_property_same_set_bulk_last(
    specs: list[tuple[str, list[str], list[str], bool, int | None]], summary: str | None
) -> None:
    messages = [
        Message(
            role=role,  # type: ignore[arg-type]
            content=" ".join(words) + (" " + "pad " * 30 if big else ""),
            tool_calls=(call(x=" ".join(args)),) if role == "assistant" and args else (),
            seq=seq,
        )
        for role, words, args, big, seq in specs
    ]
    ranked = rank_identifiers(messages, previous_summary=summary, bulk_chars=100)
    expected = extract_identifiers(all_texts(messages, summary))
    assert {r.identifier for r in ranked} == set(expected)
    assert len(ranked) == len(expected)
    tiers = [
        0 if "bulk tool output" not in r.reasons else 2 if r.identifier.kind == "number" else 1
        for r in ranked
    ]
    assert tiers == sorted(tiers)
    for r in ranked:
        assert list(r.seqs) == sorted(set(r.seqs))
    assert ranked == rank_identifiers(messages, previous_summary=summary, bulk_chars=100)


def test_large_span_is_fast() -> None:
    """5 tool outputs of ~50 KB of rows, each full of ids and numbers: well under a second."""
    messages: list[Message] = []
    for i in range(5):
        messages.append(user(f"export batch {i} of ORD-1042 to /data/export_{i}.csv", 4 * i + 1))
        messages.append(assistant(None, 4 * i + 2, call(path=f"/data/export_{i}.csv")))
        messages.append(tool(bulk_rows(1_700, 10_000_000 * (2 * i + 1)), 4 * i + 3))
        messages.append(assistant("done, see ORD-1042", 4 * i + 4))
    assert all(len(m.text) > 45_000 for m in messages if m.role == "tool")
    started = time.process_time()
    ranked = rank_identifiers(messages)
    elapsed = time.process_time() - started
    assert ranked[0].value == "ORD-1042"
    assert len(ranked) > 18_000  # 1,700 tickets and 17,000 numbers
    assert elapsed < 3.0  # ~0.3 s on a 2-core machine; generous for loaded CI
