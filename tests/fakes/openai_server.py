"""A scriptable fake OpenAI-compatible chat-completions server, for tests and benchmarks.

The fake runs a real aiohttp server on ``127.0.0.1`` with a random port, so the code under test
talks to it through the genuine ``openai`` SDK (and its HTTP stack) exactly as it would talk to
OpenAI, vLLM or llama.cpp::

    async with FakeOpenAI(models=["m"], model_meta={"m": {"max_model_len": 8192}}) as fake:
        fake.script(reply("hi"), tool_call("get_time", {"tz": "UTC"}), rate_limited(10), "ok")
        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="x")
        ...
        bodies = await fake.wait_for_requests(3)

Each ``POST /v1/chat/completions`` consumes one *step* from the script queue (in arrival order);
when the queue is empty the ``default`` callable decides (echo of the last user message unless
configured otherwise). A step is one of the frozen dataclasses below, best built with the factory
functions:

- ``reply(text, usage=None)`` -- normal assistant message (``finish_reason="stop"``);
- ``tool_call(name, arguments, id=None)`` -- one tool call, content ``None``, finish
  ``"tool_calls"``; ``tool_calls(*calls)`` -- several (parallel) tool calls in one message;
- ``error(status, body=None, headers=None)`` -- HTTP error, OpenAI-shaped body by default;
  ``rate_limited(retry_after_ms=10)`` -- 429 with ``retry-after-ms``;
  ``context_overflow(limit, tokens)`` -- 400 ``context_length_exceeded``;
- ``hang()`` -- never responds until the server stops;
- ``stall_stream(after_chunks=1)`` -- (stream requests) send some SSE chunks, then stall;
- ``malformed(body=...)`` -- 200 whose body is not valid JSON;
- ``fn(callable)`` -- compute the step from the request body (sync or async callable);
- a plain ``str`` -- shorthand for ``reply(str)``.

Streaming requests (``"stream": true``) get Server-Sent Events made of ``chat.completion.chunk``
objects: text is split into several content deltas, tool calls are split the way OpenAI does
(first chunk per call carries ``id``/``type``/``name``, later chunks carry ``arguments``
fragments), a usage-only chunk (``choices: []``) is sent when
``stream_options.include_usage`` is true, and the stream ends with ``data: [DONE]``.

``GET /v1/models`` lists ``models`` (plus any id only present in ``model_meta``); each entry is
merged with ``model_meta[id]``, e.g. ``{"max_model_len": 8192}`` like vLLM reports.

``stop()`` releases every hanging or stalled handler at once: a hung request is answered with a
503 carrying ``x-should-retry: false`` (so the SDK does not retry against a dead server) and a
stalled stream is simply ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import math
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from aiohttp import web

from tests.fakes.loopback import LoopbackServer

__all__ = [
    "DEFAULT_MODEL",
    "Error",
    "FakeOpenAI",
    "Fn",
    "Hang",
    "Malformed",
    "Reply",
    "StallStream",
    "Step",
    "StepFn",
    "StepLike",
    "ToolCall",
    "ToolCalls",
    "context_overflow",
    "echo",
    "error",
    "estimate_prompt_tokens",
    "estimate_tokens",
    "fn",
    "hang",
    "last_user_text",
    "malformed",
    "rate_limited",
    "reply",
    "stall_stream",
    "tool_call",
    "tool_calls",
]

JSON: TypeAlias = dict[str, Any]

DEFAULT_MODEL = "fake-model"
_ARGUMENT_FRAGMENT = 8  # characters of tool-call arguments per streamed chunk
_MAX_FN_DEPTH = 16
_TRUNCATED_JSON = '{"id": "chatcmpl-broken", "object": "chat.completion", "choices": [{'


# --------------------------------------------------------------------------------------------
# Steps
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reply:
    """A normal assistant message.

    ``usage`` overrides (some of) ``prompt_tokens`` / ``completion_tokens`` / ``total_tokens``
    and may add fields (``prompt_tokens_details``...); missing values are estimated from the
    request and the reply (about 4 characters a token).
    """

    text: str
    usage: Mapping[str, Any] | None = None
    finish_reason: str = "stop"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call; ``arguments`` is the JSON text the model produced."""

    name: str
    arguments: str = "{}"
    id: str | None = None  # assigned ("call_fake_<n>") when the step is served


@dataclass(frozen=True, slots=True)
class ToolCalls:
    """An assistant message carrying tool calls (``finish_reason="tool_calls"``).

    ``content`` is ``None`` like OpenAI sends it; set it for models that talk and call tools.
    """

    calls: tuple[ToolCall, ...]
    content: str | None = None
    usage: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Error:
    """An HTTP error response.

    ``body``: a dict/list is sent as JSON; a str is sent verbatim (``text/plain``); ``None`` means
    an OpenAI-shaped ``{"error": {...}}`` body chosen from the status code.
    """

    status: int
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Hang:
    """Never respond (until the server stops). For client timeouts."""


@dataclass(frozen=True, slots=True)
class StallStream:
    """For ``stream=True`` requests: send ``after_chunks`` content chunks, then stall forever.

    The first chunk carries ``role: "assistant"``; contents are the words of ``text`` (empty
    strings once the words run out). A non-stream request served this step hangs instead.
    """

    after_chunks: int = 1
    text: str = "partial answer that never ends"


@dataclass(frozen=True, slots=True)
class Malformed:
    """A response that is not a valid completion.

    Non-stream: ``status`` with ``body`` verbatim under ``content_type``. Stream: a 200 SSE stream
    with a single ``data: <body>`` event (no ``[DONE]``). The default body is truncated JSON.
    """

    body: str = _TRUNCATED_JSON
    status: int = 200
    content_type: str = "application/json"


@dataclass(frozen=True, slots=True)
class Fn:
    """Compute the step from the request body; ``func`` may be sync or async.

    ``func`` may return any :data:`StepLike` (including another ``Fn`` or a plain string).
    """

    func: StepFn


Step: TypeAlias = Reply | ToolCalls | Error | Hang | StallStream | Malformed | Fn
StepLike: TypeAlias = Step | str
StepFn: TypeAlias = Callable[[JSON], "StepLike | Awaitable[StepLike]"]

_STEP_TYPES = (Reply, ToolCalls, Error, Hang, StallStream, Malformed, Fn)


def reply(
    text: str, usage: Mapping[str, Any] | None = None, *, finish_reason: str = "stop"
) -> Reply:
    """A normal assistant reply (``finish_reason="length"`` simulates a truncated answer)."""
    return Reply(text=text, usage=usage, finish_reason=finish_reason)


def _arguments_text(arguments: Mapping[str, Any] | str | None) -> str:
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False)


def tool_call(
    name: str,
    arguments: Mapping[str, Any] | str | None = None,
    id: str | None = None,
    *,
    content: str | None = None,
    usage: Mapping[str, Any] | None = None,
) -> ToolCalls:
    """An assistant message with a single tool call; dict arguments are JSON-encoded."""
    return ToolCalls(
        calls=(ToolCall(name=name, arguments=_arguments_text(arguments), id=id),),
        content=content,
        usage=usage,
    )


def tool_calls(
    *calls: ToolCall | ToolCalls | tuple[str, Mapping[str, Any] | str],
    content: str | None = None,
    usage: Mapping[str, Any] | None = None,
) -> ToolCalls:
    """An assistant message with several tool calls (parallel tool calling).

    Each item is a ``ToolCall``, the result of ``tool_call(...)`` or a ``(name, arguments)`` pair.
    """
    flat: list[ToolCall] = []
    for item in calls:
        if isinstance(item, ToolCalls):
            flat.extend(item.calls)
        elif isinstance(item, ToolCall):
            flat.append(item)
        else:
            name, arguments = item
            flat.append(ToolCall(name=name, arguments=_arguments_text(arguments)))
    if not flat:
        raise ValueError("tool_calls() needs at least one call")
    return ToolCalls(calls=tuple(flat), content=content, usage=usage)


_DEFAULT_ERRORS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("invalid_request_error", None, "You are not allowed to do this."),
    404: ("invalid_request_error", "model_not_found", "The model does not exist."),
    408: ("server_error", None, "Request timed out."),
    409: ("server_error", None, "Conflict."),
    422: ("invalid_request_error", None, "Unprocessable entity."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached. Please try again later."),
    500: ("server_error", None, "The server had an error while processing your request."),
    502: ("server_error", None, "Bad gateway."),
    503: ("server_error", None, "The server is overloaded or not ready yet."),
    504: ("server_error", None, "Gateway timeout."),
}


def _error_body(status: int, message: str | None = None) -> JSON:
    err_type, code, default_message = _DEFAULT_ERRORS.get(
        status, ("server_error" if status >= 500 else "invalid_request_error", None, "Error.")
    )
    return {
        "error": {
            "message": message or default_message,
            "type": err_type,
            "param": None,
            "code": code,
        }
    }


def error(status: int, body: Any = None, headers: Mapping[str, str] | None = None) -> Error:
    """An HTTP error; ``body=None`` gives an OpenAI-shaped body matching ``status``."""
    return Error(status=status, body=body, headers=dict(headers or {}))


def rate_limited(retry_after_ms: int | None = 10, body: Any = None) -> Error:
    """A 429 with ``retry-after-ms`` (the SDK honours it, so retries are fast)."""
    headers = {} if retry_after_ms is None else {"retry-after-ms": str(retry_after_ms)}
    return error(429, body, headers)


def context_overflow(limit: int = 8192, tokens: int = 9000) -> Error:
    """OpenAI's context-window error: 400, type ``invalid_request_error``.

    The error ``code`` is ``context_length_exceeded``; the message names ``limit`` and ``tokens``.
    """
    return error(
        400,
        {
            "error": {
                "message": (
                    f"This model's maximum context length is {limit} tokens. "
                    f"However, your messages resulted in {tokens} tokens. "
                    "Please reduce the length of the messages."
                ),
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
    )


def hang() -> Hang:
    """Never respond until the server stops."""
    return Hang()


def stall_stream(
    after_chunks: int = 1, text: str = "partial answer that never ends"
) -> StallStream:
    """For stream requests: send ``after_chunks`` chunks then stall forever."""
    if after_chunks < 0:
        raise ValueError("after_chunks must be >= 0")
    return StallStream(after_chunks=after_chunks, text=text)


def malformed(
    body: str = _TRUNCATED_JSON,
    *,
    status: int = 200,
    content_type: str = "application/json",
) -> Malformed:
    """A 200 (by default) whose body is not valid JSON."""
    return Malformed(body=body, status=status, content_type=content_type)


def fn(func: StepFn) -> Fn:
    """A step computed from the request body by ``func`` (sync or async)."""
    return Fn(func=func)


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def estimate_tokens(text: str) -> int:
    """Rough token count: about four characters a token (0 for empty text)."""
    return math.ceil(len(text) / 4) if text else 0


def _content_text(content: Any) -> str:
    """Text of a message ``content`` (a string or a list of content parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, Mapping):
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return str(content)


def estimate_prompt_tokens(body: Mapping[str, Any]) -> int:
    """Rough prompt token count of a chat-completions request body."""
    total = 3
    for message in body.get("messages") or []:
        if not isinstance(message, Mapping):
            continue
        total += 4 + estimate_tokens(_content_text(message.get("content")))
        if message.get("tool_calls"):
            total += estimate_tokens(json.dumps(message["tool_calls"]))
    if body.get("tools"):
        total += estimate_tokens(json.dumps(body["tools"]))
    return total


def last_user_text(body: Mapping[str, Any]) -> str:
    """Text of the last ``role == "user"`` message ('' if none)."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, Mapping) and message.get("role") == "user":
            return _content_text(message.get("content"))
    return ""


def echo(body: JSON) -> Reply:
    """The default behaviour: reply ``"echo: <text of the last user message>"``."""
    return Reply(f"echo: {last_user_text(body)}")


_WORDS = re.compile(r"\s*\S+|\s+\Z")


def _split_text(text: str) -> list[str]:
    """Split text into word-sized deltas whose concatenation is ``text``."""
    return _WORDS.findall(text)


def _usage(
    body: Mapping[str, Any], completion_text: str, override: Mapping[str, Any] | None
) -> JSON:
    usage: JSON = {
        "prompt_tokens": estimate_prompt_tokens(body),
        "completion_tokens": estimate_tokens(completion_text),
    }
    if override:
        usage.update(override)
    usage.setdefault("total_tokens", usage["prompt_tokens"] + usage["completion_tokens"])
    return usage


def _sse(payload: JSON | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


# --------------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------------


class FakeOpenAI(LoopbackServer):
    """Scriptable fake OpenAI chat-completions server (see the module docstring).

    Attributes you may set at any time: ``default`` (step for unscripted requests),
    ``latency`` (seconds before every chat response), ``chunk_delay`` (seconds between streamed
    chunks), ``models`` and ``model_meta`` (for ``GET /v1/models``).
    """

    def __init__(
        self,
        *,
        models: Sequence[str] = (DEFAULT_MODEL,),
        model_meta: Mapping[str, Mapping[str, Any]] | None = None,
        default: StepFn = echo,
        latency: float = 0.0,
        chunk_delay: float = 0.0,
        host: str = "127.0.0.1",
    ) -> None:
        self.models: list[str] = list(models)
        self.model_meta: dict[str, dict[str, Any]] = {
            k: dict(v) for k, v in (model_meta or {}).items()
        }
        self.default: StepFn = default
        self.latency = latency
        self.chunk_delay = chunk_delay
        self.host = host
        self.requests: list[JSON] = []
        """Every JSON body received on ``/v1/chat/completions``, in arrival order."""
        self.request_headers: list[dict[str, str]] = []
        """Headers of those requests (same order, lower-cased names)."""
        self.model_list_requests = 0
        self.handler_errors: list[BaseException] = []
        """Exceptions raised by ``fn``/``default`` callables (answered with a 500)."""
        self._script: deque[StepLike] = deque()
        self._cond = asyncio.Condition()
        self._stopping = asyncio.Event()
        self._ids = itertools.count(1)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        self._stopping = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle_chat)
        app.router.add_get("/v1/models", self._handle_models)
        # shutdown_timeout only matters for handlers that ignore ``_stopping`` (e.g. a slow
        # user ``fn``); our own hanging/stalled handlers return as soon as stop() is called.
        await self._listen(app)

    async def stop(self) -> None:
        """Stop the server, releasing hanging/stalled handlers immediately. Idempotent."""
        self._stopping.set()
        await self._close()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1`` — pass it to ``openai.AsyncOpenAI(base_url=...)``."""
        return f"http://{self.host}:{self.port}/v1"

    # -- scripting ----------------------------------------------------------------------------

    def script(self, *steps: StepLike) -> None:
        """Queue steps, consumed one per chat request; plain strings mean ``reply(text)``."""
        for step in steps:
            if not isinstance(step, (str, *_STEP_TYPES)):
                raise TypeError(f"not a step: {step!r}")
        self._script.extend(steps)

    @property
    def pending(self) -> int:
        """Number of scripted steps not consumed yet."""
        return len(self._script)

    def clear(self) -> None:
        """Forget recorded requests and pending scripted steps."""
        self._script.clear()
        self.requests.clear()
        self.request_headers.clear()
        self.handler_errors.clear()
        self.model_list_requests = 0

    async def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[JSON]:  # noqa: ASYNC109
        """Wait until at least ``n`` chat requests arrived; return the first ``n`` bodies.

        Raises ``TimeoutError`` (with the count received so far) after ``timeout`` seconds.
        """
        try:
            async with asyncio.timeout(timeout), self._cond:
                await self._cond.wait_for(lambda: len(self.requests) >= n)
        except TimeoutError:
            raise TimeoutError(
                f"expected {n} chat request(s) within {timeout}s, got {len(self.requests)}"
            ) from None
        return self.requests[:n]

    # -- handlers -----------------------------------------------------------------------------

    async def _handle_models(self, request: web.Request) -> web.Response:
        self.model_list_requests += 1
        created = int(time.time())
        ids = list(dict.fromkeys([*self.models, *self.model_meta]))
        data = [
            {
                "id": model_id,
                "object": "model",
                "created": created,
                "owned_by": "gatehouse-fake",
                **self.model_meta.get(model_id, {}),
            }
            for model_id in ids
        ]
        return web.json_response({"object": "list", "data": data})

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except ValueError:
            body = None
        except ConnectionError:  # the client went away (killed) before sending its body
            return web.Response(status=499)
        if not isinstance(body, dict):
            return web.json_response(
                _error_body(400, "We could not parse the JSON body of your request."), status=400
            )
        async with self._cond:
            self.requests.append(body)
            self.request_headers.append({k.lower(): v for k, v in request.headers.items()})
            # Taken under the lock so the n-th recorded request always gets the n-th step.
            raw: StepLike = self._script.popleft() if self._script else Fn(self.default)
            self._cond.notify_all()

        try:
            step = await self._resolve(raw, body)
        except Exception as exc:
            self.handler_errors.append(exc)
            return web.json_response(
                _error_body(500, f"fake server step failed: {exc!r}"), status=500
            )

        if self.latency > 0:
            await self._sleep(self.latency)

        stream = bool(body.get("stream"))
        match step:
            case Error():
                return self._error_response(step)
            case Hang():
                return await self._hang()
            case Malformed():
                if stream:
                    return await self._stream(request, [_sse(step.body)], done=False)
                return web.Response(
                    status=step.status,
                    body=step.body.encode(),
                    headers={"Content-Type": step.content_type},
                )
            case StallStream():
                if not stream:
                    return await self._hang()
                return await self._stall(request, body, step)
            case Reply() | ToolCalls():
                if stream:
                    return await self._stream(request, self._stream_events(body, step))
                return web.json_response(self._completion(body, step), headers=self._headers())
        raise AssertionError(f"unhandled step {step!r}")  # pragma: no cover

    async def _resolve(self, step: StepLike | Awaitable[StepLike], body: JSON) -> Step:
        current: StepLike | Awaitable[StepLike] = step
        for _ in range(_MAX_FN_DEPTH):
            if inspect.isawaitable(current):
                current = await current
            if isinstance(current, str):
                return Reply(current)
            if isinstance(current, Fn):
                current = current.func(body)
                continue
            if isinstance(current, _STEP_TYPES):
                return current
            raise TypeError(f"step callable returned {current!r}, not a step")
        raise RecursionError("fn() steps nested too deeply")

    async def _sleep(self, delay: float) -> None:
        """Sleep ``delay`` seconds, or less if the server is stopping."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._stopping.wait()

    async def _hang(self) -> web.Response:
        await self._stopping.wait()
        body = _error_body(503, "fake server stopped")
        return web.json_response(body, status=503, headers={"x-should-retry": "false"})

    def _headers(self) -> dict[str, str]:
        return {"x-request-id": f"req_fake_{next(self._ids)}"}

    def _error_response(self, step: Error) -> web.Response:
        headers = {**self._headers(), **step.headers}
        body = _error_body(step.status) if step.body is None else step.body
        if isinstance(body, str | bytes):
            raw = body.encode() if isinstance(body, str) else body
            headers.setdefault("Content-Type", "text/plain")
            return web.Response(status=step.status, body=raw, headers=headers)
        return web.json_response(body, status=step.status, headers=headers)

    # -- payload builders ---------------------------------------------------------------------

    def _call_id(self, call: ToolCall) -> str:
        return call.id or f"call_fake_{next(self._ids)}"

    def _completion(self, body: JSON, step: Reply | ToolCalls) -> JSON:
        message: JSON = {"role": "assistant", "refusal": None}
        if isinstance(step, Reply):
            message["content"] = step.text
            finish_reason = step.finish_reason
            completion_text = step.text
        else:
            message["content"] = step.content
            message["tool_calls"] = [
                {
                    "id": self._call_id(call),
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in step.calls
            ]
            finish_reason = "tool_calls"
            completion_text = (step.content or "") + json.dumps(message["tool_calls"])
        return {
            "id": f"chatcmpl-fake-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or DEFAULT_MODEL,
            "system_fingerprint": "fp_fake",
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
            ],
            "usage": _usage(body, completion_text, step.usage),
        }

    def _chunk_factory(self, body: JSON) -> tuple[Callable[..., JSON], bool]:
        """A chunk builder sharing id/created/model, and whether usage was requested."""
        completion_id = f"chatcmpl-fake-{next(self._ids)}"
        created = int(time.time())
        model = body.get("model") or DEFAULT_MODEL
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: JSON, finish_reason: str | None = None) -> JSON:
            payload: JSON = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": "fp_fake",
                "choices": [
                    {
                        "index": 0,
                        "delta": delta,
                        "logprobs": None,
                        "finish_reason": finish_reason,
                    }
                ],
            }
            if include_usage:
                payload["usage"] = None
            return payload

        return chunk, include_usage

    def _stream_events(self, body: JSON, step: Reply | ToolCalls) -> list[bytes]:
        chunk, include_usage = self._chunk_factory(body)
        events: list[JSON] = []
        content = step.text if isinstance(step, Reply) else step.content
        if isinstance(step, Reply) or content:
            events.append(chunk({"role": "assistant", "content": "", "refusal": None}))
            events.extend(chunk({"content": piece}) for piece in _split_text(content or ""))
        if isinstance(step, Reply):
            finish_reason = step.finish_reason
            completion_text = step.text
        else:
            finish_reason = "tool_calls"
            completion_text = content or ""
            for index, call in enumerate(step.calls):
                head: JSON = {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": self._call_id(call),
                            "type": "function",
                            "function": {"name": call.name, "arguments": ""},
                        }
                    ]
                }
                if not events:
                    head = {"role": "assistant", "content": None, "refusal": None, **head}
                events.append(chunk(head))
                args = call.arguments
                for start in range(0, len(args), _ARGUMENT_FRAGMENT):
                    fragment = args[start : start + _ARGUMENT_FRAGMENT]
                    events.append(
                        chunk(
                            {"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}
                        )
                    )
                completion_text += call.name + args
        events.append(chunk({}, finish_reason))
        if include_usage:
            final = chunk({})
            final["choices"] = []
            final["usage"] = _usage(body, completion_text, step.usage)
            events.append(final)
        return [_sse(event) for event in events]

    # -- streaming ----------------------------------------------------------------------------

    async def _open_stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                **self._headers(),
            },
        )
        await response.prepare(request)
        return response

    async def _stream(
        self, request: web.Request, events: Iterable[bytes], *, done: bool = True
    ) -> web.StreamResponse:
        response = await self._open_stream(request)
        try:
            for i, event in enumerate(events):
                if i and self.chunk_delay > 0:
                    await self._sleep(self.chunk_delay)
                await response.write(event)
            if done:
                await response.write(_sse("[DONE]"))
        except ConnectionError:
            pass  # the client went away mid-stream
        return response

    async def _stall(
        self, request: web.Request, body: JSON, step: StallStream
    ) -> web.StreamResponse:
        chunk, _ = self._chunk_factory(body)
        pieces = _split_text(step.text)
        response = await self._open_stream(request)
        try:
            for i in range(step.after_chunks):
                delta: JSON = {"content": pieces[i] if i < len(pieces) else ""}
                if i == 0:
                    delta = {"role": "assistant", **delta, "refusal": None}
                await response.write(_sse(chunk(delta)))
        except ConnectionError:
            return response
        await self._stopping.wait()
        return response
