"""Operator commands as real subprocesses: doctor, sessions list/show/export/import,
compact --all, memory reindex."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fakes import FakeOpenAI, reply
from tests.helpers.cli import run_cli, write_config
from tests.helpers.llm_scripts import summarizer_and_echo


async def test_doctor_is_green_against_a_live_endpoint_and_red_when_it_is_down(
    tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    write_config(tmp_path, fake_llm)
    code, out, err = await run_cli("init", cwd=tmp_path)
    assert code == 0, err
    code, out, err = await run_cli("doctor", cwd=tmp_path)
    assert code == 0, out + err
    assert "ready to run" in out
    assert "fake-model" in out
    code, out, _ = await run_cli("doctor", "--json", cwd=tmp_path)
    report = json.loads(out)
    assert report["ready"] is True
    assert {c["name"] for c in report["checks"]} >= {"config", "database", "workspace", "llm"}

    await fake_llm.stop()
    code, out, _ = await run_cli("doctor", cwd=tmp_path)
    assert code == 1
    assert "problem" in out and "cannot connect" in out and "not ready" in out


async def test_list_show_export_import_and_compact_all(tmp_path: Path) -> None:
    async with FakeOpenAI(default=summarizer_and_echo) as fake:
        write_config(tmp_path, fake)
        fake.script(reply("pong"))
        code, _, err = await run_cli("chat", "-m", "ping ORD-7", "--user", "bob", cwd=tmp_path)
        assert code == 0, err
        key = "agent:main:console:direct:bob"

        code, out, err = await run_cli("sessions", "list", cwd=tmp_path)
        assert code == 0, err
        words = out.split()
        assert {"next", "trigger", "memory", "flush", "unlimited"} <= set(words), out
        code, out, _ = await run_cli("sessions", "list", "--json", cwd=tmp_path)
        (row,) = json.loads(out)
        assert row["key"] == key and row["prompt_tokens"] > 0
        assert row["history_limit_source"] == "[context] history_limit (default)"

        code, out, _ = await run_cli("sessions", "export", key, cwd=tmp_path)
        exported = [json.loads(line) for line in out.splitlines()]
        assert exported == [
            {"role": "user", "content": "ping ORD-7"}, {"role": "assistant", "content": "pong"},
        ]

        # A longer transcript comes in through import (with a progress bar on stderr) ...
        transcript = tmp_path / "history.jsonl"
        lines = [{"role": "system", "content": "old system prompt"}]
        notes = " ".join(f"note{j}" for j in range(300))  # big enough for a summary to pay
        for i in range(8):
            lines += [{"role": "user", "content": f"step {i}: close ticket ORD-100{i}. {notes}"},
                      {"role": "assistant", "content": f"closed ORD-100{i}"}]
        transcript.write_text("".join(json.dumps(m) + "\n" for m in lines), encoding="utf-8")
        code, out, err = await run_cli("sessions", "import", str(transcript), "--json",
                                       cwd=tmp_path)
        assert code == 0, err
        imported = json.loads(out)
        assert imported["session"] == "agent:main:import:direct:history"
        assert imported["imported"] == 16 and imported["skipped_system_messages"] == 1
        code, _, err = await run_cli("sessions", "import", str(transcript), cwd=tmp_path)
        assert code == 1 and "already has 16 messages" in err, "never appended twice"
        code, out, _ = await run_cli("sessions", "export", imported["session"], "--json",
                                     cwd=tmp_path)
        assert json.loads(out) == lines[1:], "export gives back what was imported"

        # ... and every session is compacted in one go.
        code, out, err = await run_cli("sessions", "compact", "--all", "--json", cwd=tmp_path)
        assert code == 0, out + err
        results = {r["session"]: r for r in json.loads(out)}
        assert results[imported["session"]]["committed"] is True
        assert results[key]["nothing_to_compact"] is True
        code, out, _ = await run_cli("sessions", "show", imported["session"], "--json",
                                     cwd=tmp_path)
        shown = json.loads(out)
        assert "ORD-1000" in shown["summary"], "identifiers survive"

        code, _, err = await run_cli("sessions", "compact", cwd=tmp_path)
        assert code == 2 and "KEY or --all" in err


async def test_bad_import_file_is_refused_with_the_line(tmp_path: Path) -> None:
    write_config(tmp_path, None)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"role": "user", "content": "hi"}\nnot json\n', encoding="utf-8")
    code, _, err = await run_cli("sessions", "import", str(bad), cwd=tmp_path)
    assert code == 2
    assert "bad.jsonl:2: not valid JSON" in " ".join(err.split())
    code, out, _ = await run_cli("sessions", "list", "--json", cwd=tmp_path)
    assert json.loads(out) == [], "nothing stored from a bad file"


async def test_memory_reindex_counts_files(tmp_path: Path) -> None:
    write_config(tmp_path, None)
    await run_cli("init", cwd=tmp_path)
    notes = tmp_path / "data" / "workspace" / "memory"
    for day in range(1, 4):
        (notes / f"2026-01-0{day}.md").write_text(f"- note {day}\n", encoding="utf-8")
    code, out, err = await run_cli("memory", "reindex", "--json", cwd=tmp_path)
    assert code == 0, err
    assert json.loads(out)["files_scanned"] == 5  # 3 notes, AGENTS.md, MEMORY.md
