"""`gatehouse run` as a subprocess with a platform enabled: the real SDK against a fake server."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from tests.fakes import FakeOpenAI, reply
from tests.fakes.telegram_server import FakeTelegram
from tests.helpers.cli import GATEHOUSE, env


async def test_telegram_pairing_then_answer_through_gatehouse_run(
    tmp_path: Path, fake_llm: FakeOpenAI
) -> None:
    async with FakeTelegram() as tg:
        config = tmp_path / "gatehouse.toml"
        config.write_text(
            f'[gateway]\ndata_dir = "data"\n[web]\nport = 0\n'
            "[memory]\nembeddings = false\n"
            f'[llm]\nbase_url = "{fake_llm.base_url}"\napi_key = "x"\nmodel = "fake-model"\n'
            f'[channels.telegram]\nenabled = true\ntoken = "{tg.token}"\n'
            f'base_url = "{tg.base_url}"\n',
            encoding="utf-8",
        )
        proc = await asyncio.create_subprocess_exec(
            GATEHOUSE, "--config", str(config), "run", cwd=tmp_path, env=env(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None
            await asyncio.wait_for(proc.stdout.readline(), timeout=30)  # listening
            tg.private_message(1001, "hello bot")
            [sent] = await tg.wait_for_call("sendMessage", timeout=20)
            assert "pairing code is" in sent["text"]
            code = sent["text"].split("pairing code is ")[1][:8]
            approve = await asyncio.create_subprocess_exec(
                GATEHOUSE, "--config", str(config), "pairing", "approve", code,
                cwd=tmp_path, env=env(),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )
            _out, err = await asyncio.wait_for(approve.communicate(), timeout=60)
            assert approve.returncode == 0, err.decode()
            fake_llm.script(reply("hi, paired friend"))
            tg.private_message(1001, "now?")
            calls = await tg.wait_for_call("sendMessage", n=2, timeout=20)
            assert calls[1]["text"] == "hi, paired friend"
            assert fake_llm.requests[-1]["messages"][-1]["content"] == "now?"
        finally:
            proc.send_signal(signal.SIGTERM)
            _out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
        assert proc.returncode == 0, err.decode()
