"""The model request as it leaves the gateway: body, headers, and the per-message JSON cache."""

from __future__ import annotations

import json
import socket

import pytest

from context.types import Message, ToolCall
from gateway.config import LLMSection
from gateway.model.llm import LLMError, LLMProvider, RequestEncoder
from tests.fakes import FakeOpenAI

TOOLS = [{"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}]


def _history() -> list[Message]:
    return [
        Message(role="system", content="Be brief. «ünïcode» 数据"),
        Message(role="user", content="hi", seq=1),
        Message(
            role="assistant",
            content=None,
            tool_calls=(ToolCall(id="c1", name="t", arguments='{"a": 1}'),),
            seq=2,
        ),
        Message(role="tool", content="result", tool_call_id="c1", name="t", seq=3),
    ]


def test_body_is_the_request_as_json() -> None:
    messages = _history()
    body = RequestEncoder().encode({"model": "m", "temperature": 0.5}, messages, TOOLS)
    assert json.loads(body) == {
        "model": "m",
        "temperature": 0.5,
        "messages": [m.to_openai() for m in messages],
        "tools": TOOLS,
    }
    assert "«ünïcode» 数据".encode() in body  # UTF-8, like the SDK's own encoder


def test_known_messages_are_not_encoded_again() -> None:
    encoder = RequestEncoder(capacity=3)
    messages = _history()
    first = encoder.encode({"model": "m"}, messages)
    calls: list[Message] = []

    class Counting(Message):
        def to_openai(self) -> dict[str, object]:
            calls.append(self)
            return super().to_openai()

    newer = Counting(role="user", content="and now?", seq=4)
    second = encoder.encode({"model": "m"}, [*messages, newer])
    assert calls == [newer]
    assert json.loads(second)["messages"][:4] == json.loads(first)["messages"]
    assert len(encoder._messages) == 3  # the oldest fell out: the cache stays bounded
    # The system prompt is built anew each turn: encoded, never kept.
    assert all(kept.seq is not None for kept, _json in encoder._messages.values())


async def test_the_sdk_sends_it_as_json() -> None:
    async with FakeOpenAI() as fake:
        llm = LLMProvider(
            LLMSection(base_url=fake.base_url, api_key="k", model="fake-model", stream=False)
        )
        try:
            completion = await llm.complete(_history()[:2], TOOLS)
            streamed = await llm.complete(_history()[:2], stream=True)
        finally:
            await llm.close()
    assert completion.message.content == "echo: hi" and streamed.message.content == "echo: hi"
    plain, stream = fake.requests
    assert plain["tools"] == TOOLS and "stream" not in plain
    assert stream["stream"] is True and stream["stream_options"] == {"include_usage": True}
    for headers in fake.request_headers:
        assert headers["content-type"] == "application/json"
        assert headers["authorization"] == "Bearer k"


async def test_a_stopped_server_is_unreachable_not_slow() -> None:
    # The SDK's aiohttp transport reports "connection refused" as a connect timeout.
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    llm = LLMProvider(
        LLMSection(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
    )
    try:
        with pytest.raises(LLMError) as caught:
            await llm.complete(_history()[:2])
    finally:
        await llm.close()
    assert caught.value.kind == "connection"
    assert "can't reach the model endpoint" in caught.value.user_message
