"""Tests for the fake OpenAI server, driven through the real ``openai.AsyncOpenAI`` client."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from typing import Any

import openai
import pytest
from openai.types.chat import (
    ChatCompletionChunk,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
)

from .openai_server import (
    DEFAULT_MODEL,
    FakeOpenAI,
    ToolCall,
    context_overflow,
    error,
    fn,
    hang,
    last_user_text,
    malformed,
    rate_limited,
    reply,
    stall_stream,
    tool_call,
    tool_calls,
)

MakeClient = Callable[..., openai.AsyncOpenAI]
USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(
        models=["fake-model", "other"], model_meta={"fake-model": {"max_model_len": 8192}}
    ) as server:
        yield server


@pytest.fixture
async def make_client(fake: FakeOpenAI) -> AsyncIterator[MakeClient]:
    """Build real SDK clients pointed at the fake (closed after the test)."""
    async with AsyncExitStack() as stack:

        def make(*, max_retries: int = 0, timeout: float = 2.0) -> openai.AsyncOpenAI:
            client = openai.AsyncOpenAI(
                base_url=fake.base_url, api_key="x", max_retries=max_retries, timeout=timeout
            )
            stack.push_async_callback(client.close)
            return client

        yield make


async def collect(stream: openai.AsyncStream[ChatCompletionChunk]) -> list[ChatCompletionChunk]:
    return [chunk async for chunk in stream]


# -- plain completions ------------------------------------------------------------------------


async def test_default_echo_reply(fake: FakeOpenAI, make_client: MakeClient) -> None:
    client = make_client()
    completion = await client.chat.completions.create(model="fake-model", messages=USER)

    assert completion.object == "chat.completion"
    assert completion.model == "fake-model"
    assert completion.id.startswith("chatcmpl-")
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert choice.message.content == "echo: hello there"
    assert choice.message.tool_calls is None
    assert completion.usage is not None
    assert completion.usage.prompt_tokens > 0
    assert completion.usage.completion_tokens > 0
    assert completion.usage.total_tokens == (
        completion.usage.prompt_tokens + completion.usage.completion_tokens
    )
    assert fake.requests == [{"model": "fake-model", "messages": USER}]
    assert fake.request_headers[0]["authorization"] == "Bearer x"


async def test_scripted_replies_consumed_in_order(
    fake: FakeOpenAI, make_client: MakeClient
) -> None:
    client = make_client()
    fake.script(reply("first", usage={"prompt_tokens": 11, "completion_tokens": 2}), "second")
    assert fake.pending == 2

    texts = []
    for _ in range(3):
        completion = await client.chat.completions.create(model="m", messages=USER)
        texts.append(completion.choices[0].message.content)
        if len(texts) == 1:
            assert completion.usage is not None
            assert completion.usage.model_dump(include={"prompt_tokens", "total_tokens"}) == {
                "prompt_tokens": 11,
                "total_tokens": 13,
            }

    assert texts == ["first", "second", "echo: hello there"]  # then the default behaviour
    assert fake.pending == 0


async def test_reply_with_length_finish_reason(fake: FakeOpenAI, make_client: MakeClient) -> None:
    fake.script(reply("cut sho", finish_reason="length"))
    completion = await make_client().chat.completions.create(model="m", messages=USER)
    assert completion.choices[0].finish_reason == "length"


async def test_non_stream_tool_calls(fake: FakeOpenAI, make_client: MakeClient) -> None:
    fake.script(
        tool_call("get_time", {"tz": "UTC"}, id="call_abc"),
        tool_calls(tool_call("a", {"x": 1}), ("b", '{"y": 2}'), ToolCall("c")),
    )
    client = make_client()

    first = await client.chat.completions.create(model="m", messages=USER)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.tool_calls is not None
    [call] = choice.message.tool_calls
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert call.type == "function"
    assert call.id == "call_abc"
    assert call.function.name == "get_time"
    assert json.loads(call.function.arguments) == {"tz": "UTC"}

    second = await client.chat.completions.create(model="m", messages=USER)
    calls = second.choices[0].message.tool_calls
    assert calls is not None
    assert all(isinstance(c, ChatCompletionMessageFunctionToolCall) for c in calls)
    fcalls = [c for c in calls if isinstance(c, ChatCompletionMessageFunctionToolCall)]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in fcalls] == [
        ("a", {"x": 1}),
        ("b", {"y": 2}),
        ("c", {}),
    ]
    assert len({c.id for c in calls}) == 3  # generated ids are unique


# -- streaming --------------------------------------------------------------------------------


async def test_stream_text_with_usage_chunk(fake: FakeOpenAI, make_client: MakeClient) -> None:
    text = "The quick  brown fox\njumps over the lazy dog. "
    fake.script(reply(text))
    stream = await make_client().chat.completions.create(
        model="fake-model",
        messages=USER,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = await collect(stream)

    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) > 3  # split into several deltas
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text

    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "stop"
    assert all(f is None for f in finish[:-1])

    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])
    assert fake.requests[0]["stream"] is True


async def test_stream_without_usage_option(fake: FakeOpenAI, make_client: MakeClient) -> None:
    stream = await make_client().chat.completions.create(model="m", messages=USER, stream=True)
    chunks = await collect(stream)
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "echo: hello there"


async def test_stream_tool_call_deltas_reassembled(
    fake: FakeOpenAI, make_client: MakeClient
) -> None:
    args_a = {"city": "Amsterdam", "units": "metric", "days": [1, 2, 3]}
    fake.script(tool_calls(tool_call("weather", args_a, id="call_w"), ("clock", {})))
    stream = await make_client().chat.completions.create(
        model="m", messages=USER, stream=True, stream_options={"include_usage": True}
    )
    chunks = await collect(stream)

    calls: dict[int, dict[str, Any]] = {}
    fragments_per_call: dict[int, int] = {}
    for chunk in chunks:
        if not chunk.choices:
            continue
        for delta in chunk.choices[0].delta.tool_calls or []:
            if delta.index not in calls:
                # OpenAI style: the first delta of a call carries id, type and name.
                assert delta.id is not None
                assert delta.type == "function"
                assert delta.function is not None
                assert delta.function.name is not None
                calls[delta.index] = {"id": delta.id, "name": delta.function.name, "args": ""}
            else:
                assert delta.id is None
                assert delta.function is not None
                assert delta.function.name is None
            calls[delta.index]["args"] += delta.function.arguments or ""
            fragments_per_call[delta.index] = fragments_per_call.get(delta.index, 0) + 1

    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content is None
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None
    assert calls[0]["id"] == "call_w"
    assert calls[0]["name"] == "weather"
    assert json.loads(calls[0]["args"]) == args_a
    assert fragments_per_call[0] > 3  # arguments really were split across chunks
    assert calls[1]["name"] == "clock"
    assert json.loads(calls[1]["args"]) == {}


# -- errors and retries -----------------------------------------------------------------------


async def test_429_with_retry_after_ms_is_retried(
    fake: FakeOpenAI, make_client: MakeClient
) -> None:
    fake.script(rate_limited(retry_after_ms=10), rate_limited(retry_after_ms=10), reply("finally"))
    started = time.monotonic()
    completion = await make_client(max_retries=2).chat.completions.create(model="m", messages=USER)
    elapsed = time.monotonic() - started

    assert completion.choices[0].message.content == "finally"
    assert len(await fake.wait_for_requests(3)) == 3
    assert elapsed < 0.5  # retry-after-ms was honoured instead of exponential back-off


async def test_429_without_retries_raises_rate_limit_error(
    fake: FakeOpenAI, make_client: MakeClient
) -> None:
    fake.script(rate_limited())
    with pytest.raises(openai.RateLimitError) as excinfo:
        await make_client().chat.completions.create(model="m", messages=USER)
    assert excinfo.value.status_code == 429
    assert excinfo.value.code == "rate_limit_exceeded"
    assert excinfo.value.response.headers["retry-after-ms"] == "10"


@pytest.mark.parametrize(
    ("status", "exc_type"),
    [(500, openai.InternalServerError), (503, openai.InternalServerError)],
)
async def test_server_errors(
    fake: FakeOpenAI, make_client: MakeClient, status: int, exc_type: type[Exception]
) -> None:
    fake.script(error(status))
    with pytest.raises(exc_type) as excinfo:
        await make_client().chat.completions.create(model="m", messages=USER)
    assert isinstance(excinfo.value, openai.APIStatusError)
    assert excinfo.value.status_code == status


async def test_error_with_custom_body_and_headers(
    fake: FakeOpenAI, make_client: MakeClient
) -> None:
    fake.script(
        error(503, {"error": {"message": "warming up"}}, {"retry-after-ms": "5"}),
        reply("warm"),
    )
    completion = await make_client(max_retries=1).chat.completions.create(model="m", messages=USER)
    assert completion.choices[0].message.content == "warm"
    assert len(fake.requests) == 2


async def test_context_overflow_is_bad_request(fake: FakeOpenAI, make_client: MakeClient) -> None:
    fake.script(context_overflow(8192, 9000))
    with pytest.raises(openai.BadRequestError) as excinfo:
        await make_client(max_retries=2).chat.completions.create(model="m", messages=USER)
    err = excinfo.value
    assert err.status_code == 400
    assert err.code == "context_length_exceeded"
    assert err.type == "invalid_request_error"
    assert "maximum context length is 8192 tokens" in err.message
    assert "resulted in 9000 tokens" in err.message
    assert len(fake.requests) == 1  # 400s are not retried


async def test_hang_times_out(fake: FakeOpenAI, make_client: MakeClient) -> None:
    fake.script(hang())
    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        await make_client(timeout=0.2).chat.completions.create(model="m", messages=USER)
    assert time.monotonic() - started < 0.8


async def test_stalled_stream_times_out_while_reading(
    fake: FakeOpenAI, make_client: MakeClient
) -> None:
    fake.script(stall_stream(after_chunks=2, text="partial words here"))
    client = make_client(timeout=0.2, max_retries=2)
    stream = await client.chat.completions.create(model="m", messages=USER, stream=True)
    received: list[str] = []
    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received) == "partial words"
    assert time.monotonic() - started < 0.8
    assert len(fake.requests) == 1  # a stalled stream is not retried by the SDK


async def test_malformed_body_raises(fake: FakeOpenAI, make_client: MakeClient) -> None:
    fake.script(malformed())
    # openai 3.x surfaces a bad JSON body as a bare json.JSONDecodeError (a ValueError), not
    # as an openai.APIError; accept both so the test survives an SDK change.
    with pytest.raises((openai.APIError, json.JSONDecodeError)):
        await make_client().chat.completions.create(model="m", messages=USER)


async def test_malformed_stream_raises(fake: FakeOpenAI, make_client: MakeClient) -> None:
    fake.script(malformed())
    stream = await make_client().chat.completions.create(model="m", messages=USER, stream=True)
    with pytest.raises((openai.APIError, json.JSONDecodeError)):
        await collect(stream)


# -- fn steps, default, latency ---------------------------------------------------------------


async def test_fn_steps_sync_and_async(fake: FakeOpenAI, make_client: MakeClient) -> None:
    async def summarize(body: dict[str, Any]) -> str:
        await asyncio.sleep(0)
        return f"summary of {len(body['messages'])} messages"

    fake.script(
        fn(lambda body: reply(last_user_text(body).upper())),
        fn(summarize),
        fn(lambda body: fn(lambda _: context_overflow(100, 200))),
    )
    client = make_client()
    first = await client.chat.completions.create(model="m", messages=USER)
    second = await client.chat.completions.create(model="m", messages=USER * 3)
    assert first.choices[0].message.content == "HELLO THERE"
    assert second.choices[0].message.content == "summary of 3 messages"
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model="m", messages=USER)


async def test_custom_default_and_failing_fn(fake: FakeOpenAI, make_client: MakeClient) -> None:
    def broken(body: dict[str, Any]) -> str:
        raise ValueError("boom")

    fake.default = lambda body: tool_call("lookup", {"q": last_user_text(body)})
    fake.script(fn(broken))
    client = make_client()

    with pytest.raises(openai.InternalServerError, match="boom"):
        await client.chat.completions.create(model="m", messages=USER)
    assert [type(e) for e in fake.handler_errors] == [ValueError]

    completion = await client.chat.completions.create(model="m", messages=USER)
    calls = completion.choices[0].message.tool_calls
    assert calls is not None
    assert isinstance(calls[0], ChatCompletionMessageFunctionToolCall)
    assert json.loads(calls[0].function.arguments) == {"q": "hello there"}


async def test_latency_is_applied(fake: FakeOpenAI, make_client: MakeClient) -> None:
    fake.latency = 0.1
    started = time.monotonic()
    await make_client().chat.completions.create(model="m", messages=USER)
    assert 0.1 <= time.monotonic() - started < 0.6


async def test_model_is_echoed_or_defaulted(fake: FakeOpenAI, make_client: MakeClient) -> None:
    completion = await make_client().chat.completions.create(model="qwen-7b", messages=USER)
    assert completion.model == "qwen-7b"
    assert DEFAULT_MODEL == "fake-model"


# -- models, waiting, lifecycle ---------------------------------------------------------------


async def test_models_list_with_meta(fake: FakeOpenAI, make_client: MakeClient) -> None:
    page = await make_client().models.list()
    models = {m.id: m for m in page.data}
    assert list(models) == ["fake-model", "other"]
    assert (models["fake-model"].model_extra or {})["max_model_len"] == 8192
    assert "max_model_len" not in (models["other"].model_extra or {})
    assert fake.model_list_requests == 1
    assert fake.requests == []  # model listing is not a chat request


async def test_wait_for_requests(fake: FakeOpenAI, make_client: MakeClient) -> None:
    client = make_client()
    waiter = asyncio.create_task(fake.wait_for_requests(2, timeout=2))
    await asyncio.sleep(0)
    assert not waiter.done()
    for i in range(3):
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"msg {i}"}]
        )
    bodies = await waiter
    assert [last_user_text(b) for b in bodies] == ["msg 0", "msg 1"]

    with pytest.raises(TimeoutError, match="got 3"):
        await fake.wait_for_requests(4, timeout=0.05)


async def test_stop_releases_hanging_and_stalled_requests() -> None:
    server = FakeOpenAI()
    await server.start()
    server.script(hang(), stall_stream(after_chunks=1))
    async with openai.AsyncOpenAI(
        base_url=server.base_url, api_key="x", max_retries=3, timeout=30
    ) as client:
        hung = asyncio.create_task(client.chat.completions.create(model="m", messages=USER))
        await server.wait_for_requests(1)  # so the hang() step goes to the non-stream request
        stream = await client.chat.completions.create(model="m", messages=USER, stream=True)
        stalled = asyncio.create_task(collect(stream))
        await server.wait_for_requests(2)

        started = time.monotonic()
        await server.stop()
        assert time.monotonic() - started < 0.2

        with pytest.raises(openai.APIError):  # 503 "fake server stopped", not retried
            await asyncio.wait_for(hung, 1)
        chunks = await asyncio.wait_for(stalled, 1)  # the stalled stream just ends
        assert len(chunks) == 1
    assert len(server.requests) == 2
    await server.stop()  # idempotent


async def test_not_started_has_no_base_url() -> None:
    server = FakeOpenAI()
    with pytest.raises(RuntimeError):
        _ = server.base_url
    with pytest.raises(TypeError):
        server.script(42)  # type: ignore[arg-type]
