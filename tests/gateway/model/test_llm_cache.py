"""Prompt-cache figures and hints on the model call: cached tokens as OpenAI, vLLM, DeepSeek and
llama.cpp's server report them (plain and streamed), and the per-session `prompt_cache_key`."""

from __future__ import annotations

from typing import Any

import pytest

from context.types import Message
from gateway.config import LLMSection
from gateway.model.llm import LLMProvider, cached_tokens, prompt_cache_key
from tests.fakes import FakeOpenAI, error, reply


@pytest.mark.parametrize(
    ("usage", "body", "expected"),
    [
        ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 7}}, {}, 7),  # OpenAI
        ({"prompt_tokens_details": {"cached_tokens": 0}}, {}, 0),  # vLLM, nothing cached
        ({"prompt_cache_hit_tokens": 5, "prompt_cache_miss_tokens": 3}, {}, 5),  # DeepSeek
        ({"prompt_tokens": 9}, {"timings": {"cache_n": 4, "prompt_n": 5}}, 4),  # llama.cpp
        ({}, {"tokens_cached": 3}, 3),  # llama.cpp /completion
        ({"prompt_tokens": 9}, {}, None),  # llama-cpp-python: no cache figures
        ({"prompt_tokens_details": {"cached_tokens": None}}, {}, None),
        ({"prompt_tokens_details": None}, {"timings": "x"}, None),
    ],
)
def test_cached_tokens_where_each_server_reports_them(
    usage: dict[str, Any], body: dict[str, Any], expected: int | None
) -> None:
    assert cached_tokens(usage, body) == expected


def test_the_cache_key_is_a_stable_hash_per_agent_and_session() -> None:
    key = prompt_cache_key("main", "agent:main:telegram:direct:42")
    assert key == prompt_cache_key("main", "agent:main:telegram:direct:42")
    assert key != prompt_cache_key("main", "agent:main:telegram:direct:43")
    assert key != prompt_cache_key("ops", "agent:main:telegram:direct:42")
    assert key.startswith("gatehouse-") and "telegram" not in key and len(key) <= 64


def usage_with_cache(body: dict[str, Any]) -> Any:
    return reply("ok", usage={"prompt_tokens": 50, "prompt_tokens_details": {"cached_tokens": 32}})


@pytest.mark.parametrize("stream", [False, True])
async def test_cached_tokens_are_read_plain_and_streamed(stream: bool) -> None:
    async with FakeOpenAI(default=usage_with_cache) as fake:
        llm = LLMProvider(
            LLMSection(base_url=fake.base_url, api_key="x", model="fake-model", max_retries=0)
        )
        try:
            done = await llm.complete(
                [Message(role="user", content="hi")], stream=stream, cache_key="gatehouse-k"
            )
        finally:
            await llm.close()
    assert (done.usage.prompt_tokens, done.usage.cached_tokens) == (50, 32)
    assert fake.requests[0]["prompt_cache_key"] == "gatehouse-k"


async def test_a_422_naming_the_key_stops_it_too() -> None:
    async with FakeOpenAI() as fake:
        fake.script(
            error(422, body={"detail": [{"loc": ["body", "prompt_cache_key"],
                                         "msg": "Extra inputs are not permitted"}]})
        )
        llm = LLMProvider(
            LLMSection(base_url=fake.base_url, api_key="x", model="fake-model", max_retries=0)
        )
        try:
            done = await llm.complete([Message(role="user", content="hi")], cache_key="k")
            again = await llm.complete([Message(role="user", content="hi")], cache_key="k")
        finally:
            await llm.close()
    assert done.message.text == again.message.text == "echo: hi"
    assert not llm.sends_cache_key
    assert ["prompt_cache_key" in b for b in fake.requests] == [True, False, False]
