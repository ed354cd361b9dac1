"""The summary call compaction uses: which model writes summaries, bounded, failing loudly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from context.types import Message
from gateway.config import Config, parse_config
from gateway.model.llm import LLMError, LLMProvider
from gateway.model.summarizer import make_summary_call, summary_provider
from tests.fakes import FakeOpenAI, error, hang, reply

PROMPT = [
    Message(role="system", content="Summarize the conversation."),
    Message(role="user", content="we moved db01 to the new rack"),
]


def config(tmp_path: Path, fake: FakeOpenAI, **context: Any) -> Config:
    return parse_config(
        {
            "gateway": {"data_dir": str(tmp_path / "data")},
            "llm": {
                "base_url": fake.base_url, "api_key": "chat-key", "model": "chat-model",
                "max_retries": 0, "timeout": 5, "stream": True,
            },
            "context": context,
        },
        "test",
    )


async def test_without_summary_settings_the_chat_model_writes_summaries(tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        c = config(tmp_path, fake)
        chat = LLMProvider(c.llm)
        try:
            assert summary_provider(c, chat) is chat
            fake.script(reply("## Decisions\n- db01 moved"))
            text = await make_summary_call(c, chat)(PROMPT)
        finally:
            await chat.close()
    assert text == "## Decisions\n- db01 moved"
    [body] = fake.requests
    assert body["model"] == "chat-model"
    assert "stream" not in body and "tools" not in body, "one plain call, no tools"
    assert body["messages"] == [m.to_openai() for m in PROMPT]


async def test_a_summary_model_gets_its_own_provider(tmp_path: Path) -> None:
    async with FakeOpenAI() as fake, FakeOpenAI() as summaries:
        c = config(
            tmp_path, fake, summary_model="small-model", summary_base_url=summaries.base_url,
            summary_api_key="summary-key", summary_timeout=7,
        )
        chat = LLMProvider(c.llm)
        provider = summary_provider(c, chat)
        try:
            assert provider is not chat
            assert provider.model == "small-model"
            assert provider.settings.timeout == 7 and provider.settings.stream is False
            summaries.script(reply("summary"))
            assert await make_summary_call(c, provider)(PROMPT) == "summary"
        finally:
            await provider.close()
            await chat.close()
    assert fake.requests == []
    [body] = summaries.requests
    assert body["model"] == "small-model"
    assert summaries.request_headers[0]["authorization"] == "Bearer summary-key"


async def test_only_a_summary_model_keeps_the_chat_endpoint(tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        c = config(tmp_path, fake, summary_model="small-model")
        provider = summary_provider(c, LLMProvider(c.llm))
        try:
            fake.script(reply("summary"))
            await make_summary_call(c, provider)(PROMPT)
        finally:
            await provider.close()
    assert fake.requests[0]["model"] == "small-model"
    assert fake.request_headers[0]["authorization"] == "Bearer chat-key"


async def test_a_slow_summary_is_cut_off_at_the_timeout(tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        c = config(tmp_path, fake, summary_timeout=0.2)
        chat = LLMProvider(c.llm)
        try:
            fake.script(hang())
            with pytest.raises(TimeoutError):
                await make_summary_call(c, chat)(PROMPT)
        finally:
            await chat.close()


async def test_a_failed_summary_is_raised_for_compaction_to_fall_back(tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        c = config(tmp_path, fake)
        chat = LLMProvider(c.llm)
        try:
            fake.script(error(500))
            with pytest.raises(LLMError):
                await make_summary_call(c, chat)(PROMPT)
        finally:
            await chat.close()
