"""`gatehouse run` as a real subprocess, with a model that keeps calling a tool for 300 rounds
in one turn at a 16k window: the turn finishes, and every chat request the model received fits
the window, carries the ask verbatim and the red lines, and has no orphaned tool message."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import aiohttp

from context.budget import BudgetSettings, make_budget
from gateway.model.tokenizer import load_counter
from tests.fakes import FakeOpenAI, reply, tool_call
from tests.fakes.tool_loops import agent_run, agent_summary, prompt_problems
from tests.fakes.transcripts import AGENTS_MD, RED_LINES, is_flush_request, is_summary_request
from tests.helpers.cli import GATEHOUSE, env, run_cli, write_config

ROUNDS = 300
WINDOW = 16_000
DONE = "Done: every log read."


def model(paths: list[str]) -> Any:
    """Chat requests: read the next log (a missing one now and then: a failing call), then
    `DONE`; summaries from what the prompt shows; the memory flush NO_REPLY."""
    served = [0]

    def answer(body: dict[str, Any]) -> Any:
        if is_flush_request(body):
            return reply("NO_REPLY")
        if is_summary_request(body):
            text = "\n".join(str(m.get("content") or "") for m in body["messages"])
            return reply(agent_summary(text))
        if served[0] >= len(paths):
            return reply(DONE)
        path = paths[served[0]]
        served[0] += 1
        return tool_call("memory_get", {"path": path, "count": 400})

    return answer


async def test_a_300_round_turn_through_gatehouse_run(tmp_path: Path) -> None:
    run = agent_run(ROUNDS)
    workspace = tmp_path / "data" / "workspace"
    # Under memory/: notes and logs there are readable from any conversation (a web visitor is
    # never an owner, and other workspace files are the owners').
    (workspace / "memory" / "logs").mkdir(parents=True)
    (workspace / "AGENTS.md").write_text(AGENTS_MD, encoding="utf-8")
    paths = []
    for r in range(ROUNDS):
        name = f"memory/logs/round-{r:03d}.log"
        if r % 9 == 4:
            name = f"memory/logs/missing-{r:03d}.log"  # memory_get fails: a tool error
        else:
            (workspace / name).write_text(run.round_messages(r)[1].text, encoding="utf-8")
        paths.append(name)
    async with FakeOpenAI(default=model(paths)) as fake:
        config = write_config(
            tmp_path, fake,
            f'[models."fake-model"]\ncontext_window = {WINDOW}\n'
            "[context]\nsummary_timeout = 30\n",
        )
        text = config.read_text().replace(
            'model = "fake-model"\n', 'model = "fake-model"\nmax_tool_rounds = 1000\nstream = false\n'
        )
        config.write_text(text)
        proc = await asyncio.create_subprocess_exec(
            GATEHOUSE, "--config", str(config), "run", cwd=tmp_path, env=env(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None
            line = (await asyncio.wait_for(proc.stdout.readline(), timeout=60)).decode()
            assert line.startswith("gatehouse listening on "), line
            url = line.split(" on ", 1)[1].strip()
            timeout = aiohttp.ClientTimeout(total=300)
            async with aiohttp.ClientSession(timeout=timeout) as http:
                async with http.post(
                    f"{url}/api/messages", json={"user_id": "builder", "text": run.ask}
                ) as resp:
                    assert resp.status == 200, await resp.text()
                    body = await resp.json()
        finally:
            proc.send_signal(signal.SIGTERM)
            _out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode == 0, err.decode()[-3000:]
        chats = [r for r in fake.requests if not is_summary_request(r) and not is_flush_request(r)]
    assert body["replies"] == [DONE]
    assert len(chats) == ROUNDS + 1
    problems = prompt_problems(
        chats, run.ask, make_budget(WINDOW, BudgetSettings()).usable,
        load_counter("fake-model"),  # the gateway's token authority for this model
        RED_LINES.splitlines()[0],
    )
    assert problems == []
    last = chats[-1]["messages"]
    assert last[1]["content"].startswith("[Summary of earlier conversation")
    assert "history_search" in json.dumps(chats[-1].get("tools") or [])
    code, out, err = await run_cli(
        "sessions", "show", "agent:main:webchat:direct:builder", "--json", cwd=tmp_path
    )
    assert code == 0, err
    shown = json.loads(out)
    assert len(shown["compactions"]) >= 5, "the turn compacted as it went"
    assert all(c.get("quality", {}).get("pinned_seqs") for c in shown["compactions"]), (
        "each summary pins the ask"
    )
