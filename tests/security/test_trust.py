"""The people who share one agent stay apart: every trust-boundary attempt of
tests/security/trust.py is refused or gets nothing of Alice's, and nobody's own note is lost;
an owner sees what a guest may not (the same data, the other side of the boundary)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.security.trust import SECRETS, call, people, run_trust, trust_attacks


def test_there_are_at_least_forty_trust_boundary_attempts() -> None:
    kinds = {a.kind for a in trust_attacks()}
    assert len(trust_attacks()) >= 40
    assert {"memory_get", "memory_search", "memory_write", "history_search", "scheduling",
            "group", "strangers", "slack token"} <= kinds


async def test_no_attempt_leaks_loses_or_gets_through(tmp_path: Path) -> None:
    outcomes = await run_trust(tmp_path)
    bad = [f"{o.attack.kind}: {o.attack.name}: {o.answer[:160]!r}" for o in outcomes if not o.ok]
    assert bad == []


async def test_the_owner_and_alice_herself_see_what_bob_may_not(tmp_path: Path) -> None:
    async with people(tmp_path) as p:
        for person in (p.carol, p.alice):
            found = await call(p.gateway, "memory_search", {"query": "locker 4417"}, person.ctx)
            assert "locker 4417" in found
            note = await call(p.gateway, "memory_get", {"path": p.note_file}, person.ctx)
            assert "locker 4417" in note and "Rue des Lilas" in note
            got = await call(p.gateway, "memory_get", {"path": p.inbox_file}, person.ctx)
            assert "PASSPORT-X99" in got
        # Bob's view of the same note file: the lines are there, Alice's entries blank.
        seen = await call(p.gateway, "memory_get", {"path": p.note_file}, p.bob.ctx)
        assert "(a note of another conversation: not shown)" in seen
        assert not any(s in seen for s in SECRETS)
        # The flush quoted what Alice said, not the assistant's restatement.
        assert "Agreed, I will remember" not in await call(
            p.gateway, "memory_get", {"path": p.note_file}, p.carol.ctx
        )


async def test_through_live_turns_bob_never_finds_alices_note(make_config: Any) -> None:
    """The runner hands each turn its own caller: Alice's agent writes a note in her turn;
    in Bob's turn the same search finds nothing of it, and his own note is his."""
    from tests.conftest import started
    from tests.fakes import FakeOpenAI, reply, tool_call

    async with FakeOpenAI() as fake:
        async with started(make_config(fake)) as rg:
            fake.script(tool_call("memory_write", {"text": "Alice's locker is 4417."}),
                        reply("Saved."))
            assert await rg.ask("remember my locker is 4417", "alice") == ["Saved."]
            fake.script(tool_call("memory_search", {"query": "locker 4417"}), reply("Nothing."))
            assert await rg.ask("what is the locker number?", "bob") == ["Nothing."]
            result = fake.requests[-1]["messages"][-1]
            assert result["role"] == "tool" and "4417" not in result["content"]
            fake.script(tool_call("memory_search", {"query": "locker 4417"}), reply("Found."))
            assert await rg.ask("what is my locker number?", "alice") == ["Found."]
            assert "4417" in fake.requests[-1]["messages"][-1]["content"]
