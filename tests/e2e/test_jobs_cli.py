"""`gatehouse jobs`: jobs the agent made in `gatehouse chat` (a subprocess) are listed and
cancelled offline, straight from the database's job store."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fakes import FakeOpenAI, reply, tool_call
from tests.helpers.cli import in_process, run_cli, write_config


async def test_jobs_made_in_chat_are_listed_and_cancelled_offline(
    tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    config = write_config(tmp_path, fake_llm, '[scheduler]\ndaily_reset = "04:00"\n')
    fake_llm.script(
        tool_call("reminder_create", {"text": "water the plants", "delay": "3 hours"}),
        reply("I'll remind you."),
    )
    code, out, err = await run_cli("--config", str(config), "chat", "-m", "remind me",
                                   cwd=tmp_path)
    assert code == 0, err
    assert out.strip() == "I'll remind you."
    assert "Reminder " in fake_llm.requests[1]["messages"][-1]["content"]

    code, out, err = await run_cli("--config", str(config), "jobs", "list", "--json", cwd=tmp_path)
    assert code == 0, err
    jobs = json.loads(out)
    [reminder] = [j for j in jobs if j["kind"] == "reminder"]
    assert reminder["text"] == "water the plants"
    assert reminder["session"].startswith("agent:main:console:direct:")
    assert reminder["next_run"] is not None
    maintenance = {j["id"] for j in jobs if j["kind"] == "maintenance"}
    assert "maintenance:daily-reset" in maintenance

    code, out, err = await in_process(config, "jobs", "list")
    assert code == 0, err
    assert reminder["id"] in out and "maintenance:daily-reset" in out and "water the" in out

    code, out, err = await run_cli("--config", str(config), "jobs", "cancel", reminder["id"],
                                   cwd=tmp_path)
    assert code == 0, err
    assert f"cancelled reminder {reminder['id']}" in out

    code, out, err = await in_process(config, "jobs", "cancel", reminder["id"])
    assert code == 1 and "no job" in err
    code, out, err = await in_process(config, "jobs", "cancel", "maintenance:daily-reset")
    assert code == 1 and "turn it off in [scheduler]" in err
    code, out, err = await in_process(config, "jobs", "list", "--json")
    assert [j["kind"] for j in json.loads(out)] == ["maintenance"] * 5
