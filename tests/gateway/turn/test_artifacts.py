"""Tool outputs over the engine's cap: saved whole in the workspace, sent cut with a pointer."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from context.engine import DefaultContextEngine, default_settings
from context.pruning import artifact_path
from gateway.turn.artifacts import cap_tool_output
from memory.workspace import conversation_folder

ENGINE = DefaultContextEngine()
KEY = "agent:main:telegram:direct:42"
SETTINGS = replace(default_settings(16_000), tool_result_share=0.1)  # 6,400 chars


async def test_an_output_under_the_cap_is_kept_and_not_saved(tmp_path: Path) -> None:
    text = "ok\n" * 100
    assert await cap_tool_output(ENGINE, SETTINGS, tmp_path, text, "shell", "c1", KEY) == text
    assert not (tmp_path / "artifacts").exists()


async def test_a_large_output_is_saved_whole_and_sent_cut(tmp_path: Path) -> None:
    text = "".join(f"line {i}\n" for i in range(5_000))
    sent = await cap_tool_output(ENGINE, SETTINGS, tmp_path, text, "shell/run", "call 7", KEY)
    assert len(sent) <= ENGINE.tool_result_limit(SETTINGS)
    folder = conversation_folder(KEY)
    [saved] = (tmp_path / "artifacts" / folder).iterdir()
    assert saved.read_text() == text
    assert saved.name.endswith("-shell_run-call_7.txt"), "a safe file name"
    relative = f"artifacts/{folder}/{saved.name}"
    assert f"full output saved to {relative}" in sent, "in the conversation's own folder"
    assert artifact_path(sent) == relative


async def test_an_unwritable_workspace_still_caps(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    sent = await cap_tool_output(ENGINE, SETTINGS, blocked, "x" * 50_000, "shell", "c1", KEY)
    assert "full output not saved" in sent and len(sent) <= ENGINE.tool_result_limit(SETTINGS)
