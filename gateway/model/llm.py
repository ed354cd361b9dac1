"""The LLM provider: the openai SDK against any OpenAI-compatible endpoint.

The SDK already retries 429/5xx with backoff and honours retry-after; the gateway adds what the
SDK leaves out: a bounded retry for timeouts and stalled streams, validation of what comes back,
and one user-facing sentence for each way a call can fail.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from channels.base import storable
from context.types import Message, ToolCall
from gateway.config import LLMSection
from gateway.model.images import WorkspaceImages, names_workspace_images

if TYPE_CHECKING:
    # The SDK is imported when the first call needs its client: the CLI's store-only commands
    # build a provider (for the model's name and window) and never load it.
    import openai

log = logging.getLogger(__name__)

NOT_CONFIGURED = (
    "No LLM endpoint is configured, so I can't answer yet. Set [llm] base_url, api_key and model "
    "in gatehouse.toml (any OpenAI-compatible server: OpenAI, Ollama, vLLM, llama.cpp), then "
    "restart the gateway."
)


REPORTED_WINDOW_FIELDS = ("max_model_len", "context_length", "context_window", "max_context_length")
"""Fields OpenAI-compatible servers use for a model's window (vLLM, OpenRouter, LM Studio...)."""


# The SDK's generic request method, with our already-plain JSON body: `chat.completions.create`
# re-walks every message through its TypedDict transformer on every call, which dominates a
# turn's CPU in a long session. Transport, retries, errors and response
# parsing are the SDK's as before.
_AUTH: Any = {"security": {"bearer_auth": True}}


class LLMError(Exception):
    """A failed model call, with a message that can be shown to the user as it is."""

    def __init__(self, user_message: str, *, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail or user_message}")
        self.user_message = user_message
        self.kind = kind
        self.detail = detail


class _StreamStalledError(Exception):
    """A stream that started and then went quiet for longer than the timeout."""


class ContextOverflowError(LLMError):
    """The provider said the prompt is larger than the model's window."""


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    """Of `prompt_tokens`, what the provider read from its prompt cache (None: not reported)."""


CACHE_KEY_PARAMETER = "prompt_cache_key"


def prompt_cache_key(agent: str, session_key: str) -> str:
    """A session's stable `prompt_cache_key`: a hash, so no user or chat id leaves the gateway
    in it, and each session (of each agent) gets its own."""
    digest = hashlib.sha256(f"{agent}\n{session_key}".encode()).hexdigest()
    return f"gatehouse-{digest[:32]}"


@dataclass(frozen=True, slots=True)
class Completion:
    message: Message
    usage: Usage
    finish_reason: str | None = None


class LLMProvider:
    def __init__(self, settings: LLMSection) -> None:
        self.settings = settings
        self.model = settings.model
        self._client: openai.AsyncOpenAI | None = None
        self._body = RequestEncoder()
        self.sends_cache_key = settings.prompt_cache_key
        """Whether `complete` sends a `prompt_cache_key` given one: off by `[llm]
        prompt_cache_key = false`, or once the endpoint rejected the parameter."""

    @property
    def configured(self) -> bool:
        return self.settings.configured

    def _sdk(self) -> openai.AsyncOpenAI:
        """The SDK's client, made on first use (an unconfigured provider never makes one)."""
        if self._client is None:
            import openai

            # The SDK's aiohttp transport (openai[aiohttp]): same API, about a quarter less CPU
            # per call than its default transport, and aiohttp is already in the process.
            settings = self.settings
            self._client = openai.AsyncOpenAI(
                base_url=settings.base_url,
                api_key=settings.api_key or "not-needed",
                timeout=settings.timeout,
                max_retries=settings.max_retries,
                http_client=openai.DefaultAioHttpClient(timeout=settings.timeout),
            )
        return self._client

    def show_workspace_images(self, workspace: Path) -> None:
        """Send the workspace images stored messages name (photos people sent) to the model
        when ``[llm] vision`` is on; without this call, or with it off, they are left out."""
        self._body.images = WorkspaceImages(workspace, self.settings.vision)

    async def reported_window(self, wait: float = 5.0) -> tuple[int, str] | None:
        """The context length the server reports for our model (vLLM `max_model_len`, ...)."""
        if not self.configured:
            return None
        import openai

        try:
            page = await self._sdk().with_options(timeout=wait, max_retries=0).models.list()
        except (openai.OpenAIError, ValueError) as exc:
            log.info("model metadata unavailable from %s: %s", self.settings.base_url, exc)
            return None
        for model in page.data:
            if model.id != self.model:
                continue
            extra = model.model_extra or {}
            for field_name in REPORTED_WINDOW_FIELDS:
                value = extra.get(field_name)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value, field_name
        return None

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] = (),
        *,
        stream: bool | None = None,
        model: str | None = None,
        on_text: Callable[[str], None] | None = None,
        cache_key: str | None = None,
    ) -> Completion:
        """One model call. ``on_text`` gets the reply so far (the accumulated text, not the
        delta) as it streams; passing it streams the call even when ``[llm] stream`` is off, since
        a preview is what asked for it. It must not block: it runs between two chunks.
        ``cache_key`` (`prompt_cache_key`) is sent as the request's ``prompt_cache_key`` unless
        that is turned off or the endpoint refused it (then the call is made again without it)."""
        if not self.configured:
            raise LLMError(NOT_CONFIGURED, kind="not_configured")
        import openai

        stream = self.settings.stream if stream is None else stream
        stream = stream or on_text is not None
        kwargs: dict[str, Any] = {"model": model or self.model}
        if cache_key is not None and self.sends_cache_key:
            kwargs[CACHE_KEY_PARAMETER] = cache_key
        if self.settings.temperature is not None:
            kwargs["temperature"] = self.settings.temperature
        if self.settings.max_tokens is not None:
            kwargs["max_tokens"] = self.settings.max_tokens
        # The SDK retries 429/5xx/timeouts of the request itself; a stream that stalls after it
        # started, and a malformed body, are ours to retry.
        attempts = self.settings.max_retries + 1
        for attempt in range(1, attempts + 1):
            try:
                if stream:
                    streamed = {**kwargs, "stream": True, "stream_options": {"include_usage": True}}
                    return await self._stream(self._body.encode(streamed, messages, tools), on_text)
                return await self._plain(self._body.encode(kwargs, messages, tools))
            except _StreamStalledError as exc:
                log.warning("LLM stream stalled (attempt %d/%d)", attempt, attempts)
                if attempt == attempts:
                    raise LLMError(
                        f"The model stopped answering for {self.settings.timeout:g} s "
                        f"({attempts} attempts). Please try again in a moment.",
                        kind="timeout",
                    ) from exc
            except openai.APITimeoutError as exc:
                if _never_connected(exc):
                    raise _unreachable(exc, self.settings.managed_by) from exc
                raise LLMError(
                    f"The model did not answer within {self.settings.timeout:g} s "
                    f"({attempts} attempts). Please try again in a moment.",
                    kind="timeout",
                ) from exc
            except openai.APIStatusError as exc:
                if CACHE_KEY_PARAMETER in kwargs and _rejects_cache_key(exc):
                    self.sends_cache_key = False
                    log.warning(
                        "the model endpoint %s rejects %s (%s); not sending it any more",
                        self.settings.base_url, CACHE_KEY_PARAMETER, exc.status_code,
                    )
                    return await self.complete(
                        messages, tools, stream=stream, model=model, on_text=on_text
                    )
                raise _refusal(exc) from exc
            except openai.APIConnectionError as exc:
                raise _unreachable(exc, self.settings.managed_by) from exc
            except (openai.APIResponseValidationError, json.JSONDecodeError, ValueError) as exc:
                if attempt == attempts:
                    raise LLMError(
                        "The model endpoint sent a malformed response. Please try again.",
                        kind="malformed",
                        detail=str(exc),
                    ) from exc
                log.warning("malformed LLM response (attempt %d/%d): %s", attempt, attempts, exc)
        raise AssertionError("unreachable")

    async def _plain(self, body: bytes) -> Completion:
        # The response as JSON (cast_to=object): building the SDK's typed ChatCompletion cost
        # about a third of each call, and we read five fields of it.
        response = await self._sdk().post(
            "/chat/completions", content=body, cast_to=object, options=_AUTH
        )
        return _completion(response)

    async def _stream(
        self, body: bytes, on_text: Callable[[str], None] | None = None
    ) -> Completion:
        import openai
        from openai.types.chat import ChatCompletion, ChatCompletionChunk

        stream = await self._sdk().post(
            "/chat/completions",
            content=body,
            cast_to=ChatCompletion,
            options=_AUTH,
            stream=True,
            stream_cls=openai.AsyncStream[ChatCompletionChunk],
        )
        text: list[str] = []
        so_far = ""
        calls: dict[int, dict[str, str]] = {}
        usage = Usage()
        finish: str | None = None
        iterator = stream.__aiter__()
        try:
            while True:
                try:
                    chunk = await asyncio.wait_for(
                        iterator.__anext__(), timeout=self.settings.timeout
                    )
                except StopAsyncIteration:
                    break
                except (TimeoutError, openai.APITimeoutError) as exc:
                    raise _StreamStalledError() from exc
                if chunk.usage is not None:
                    details = chunk.usage.prompt_tokens_details
                    cached = details.cached_tokens if details is not None else None
                    usage = Usage(
                        chunk.usage.prompt_tokens, chunk.usage.completion_tokens,
                        cached if cached is not None else cached_tokens(
                            chunk.usage.model_extra or {}, chunk.model_extra or {}
                        ),
                    )
                elif usage.cached_tokens is None and chunk.model_extra:
                    usage = replace(usage, cached_tokens=cached_tokens({}, chunk.model_extra))
                for choice in chunk.choices or ():
                    delta = choice.delta
                    if delta.content:
                        text.append(delta.content)
                        if on_text is not None:
                            so_far += delta.content
                            on_text = _tell(on_text, so_far)
                    for tc in delta.tool_calls or ():
                        slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                        if tc.id:
                            slot["id"] = tc.id
                        if tc.function is not None:
                            slot["name"] += tc.function.name or ""
                            slot["arguments"] += tc.function.arguments or ""
                    if choice.finish_reason:
                        finish = choice.finish_reason
        finally:
            await stream.close()
        tool_calls = tuple(
            ToolCall(id=c["id"], name=c["name"], arguments=c["arguments"] or "{}")
            for _, c in sorted(calls.items())
        )
        content = "".join(text) if text or not tool_calls else None
        return Completion(
            message=_reply(content, tool_calls),
            usage=usage,
            finish_reason=finish,
        )


def _refusals() -> tuple[tuple[type[openai.APIStatusError], str, str], ...]:
    """What a person reads for each refusal the SDK names by its own type; any other status
    is a server failure."""
    import openai

    return (
        (
            openai.BadRequestError,
            "bad_request",
            "The model endpoint rejected the request (400). The details are in the gateway log.",
        ),
        (
            openai.RateLimitError,
            "rate_limited",
            "The model is rate-limited right now. Please try again in a minute.",
        ),
        (
            openai.AuthenticationError,
            "auth",
            "The model endpoint refused the API key. Check [llm] api_key.",
        ),
    )


def _refusal(exc: openai.APIStatusError) -> LLMError:
    """The user-facing error for an HTTP status the endpoint answered with."""
    import openai

    if isinstance(exc, openai.BadRequestError) and _is_context_overflow(exc):
        return ContextOverflowError(
            "The conversation is larger than the model's context window.",
            kind="context_overflow",
            detail=str(exc),
        )
    for kind_of, kind, text in _refusals():
        if isinstance(exc, kind_of):
            return LLMError(text, kind=kind, detail=str(exc))
    return LLMError(
        f"The model endpoint failed ({exc.status_code}). Please try again shortly.",
        kind="server_error",
        detail=str(exc),
    )


class RequestEncoder:
    """Chat-completion request bodies, each message's JSON kept from one call to the next.

    A session sends mostly the same messages turn after turn (its history), and encoding them
    all again is wasted work that grows with the history. A stored message (one
    with a `seq`) is known by identity (the runner's history cache hands the same objects back
    each turn; `Message` is frozen), and the cache holds it, so its id cannot be reused while it
    is there. Messages built for one turn (the system prompt, notices) are encoded, not kept:
    they would only fill the cache.
    """

    def __init__(self, capacity: int = 20_000) -> None:
        self.capacity = capacity
        self._messages: OrderedDict[int, tuple[Message, bytes]] = OrderedDict()
        self._tools: tuple[Sequence[dict[str, Any]], bytes] | None = None
        self.images = WorkspaceImages()
        """How image parts naming workspace files are sent (gateway/model/images.py)."""

    def encode(
        self,
        fields: dict[str, Any],
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] = (),
    ) -> bytes:
        """`fields` (model, temperature, …) plus `messages` and `tools`, as UTF-8 JSON."""
        cache = self._messages
        parts: list[bytes] = []
        for message in messages:
            if names_workspace_images(message):  # read each time, never kept: megabytes
                parts.append(_dumps(self.images.to_openai(message)))
                continue
            if message.seq is None:
                parts.append(_dumps(message.to_openai()))
                continue
            hit = cache.get(id(message))
            if hit is None:
                hit = cache[id(message)] = (message, _dumps(message.to_openai()))
            else:
                cache.move_to_end(id(message))
            parts.append(hit[1])
        while len(cache) > self.capacity:
            cache.popitem(last=False)
        body = _dumps(fields)[:-1] + b',"messages":[' + b",".join(parts) + b"]"
        if tools:
            if self._tools is None or self._tools[0] is not tools:
                self._tools = (tools, _dumps(list(tools)))
            body += b',"tools":' + self._tools[1]
        return body + b"}"


def _dumps(value: Any) -> bytes:
    """JSON as the openai SDK writes it (UTF-8, compact, no NaN)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _never_connected(exc: openai.APITimeoutError) -> bool:
    """The SDK's aiohttp transport reports a refused connection (a stopped server) as a connect
    *timeout*; it never reached the server, so "did not answer within 60 s" would mislead."""
    return type(exc.__cause__).__name__ == "ConnectTimeout"


def _unreachable(exc: Exception, managed_by: str | None = None) -> LLMError:
    hint = (
        f"{managed_by} is not answering; the gateway restarts it, so try again in a moment."
        if managed_by
        else "Is it running? Check [llm] base_url."
    )
    return LLMError(
        f"I can't reach the model endpoint. {hint}",
        kind="connection",
        detail=str(exc.__cause__ or exc),
    )


def _tell(on_text: Callable[[str], None], text: str) -> Callable[[str], None] | None:
    """Pass the text so far to a listener; one that raises is dropped (logged), never the call."""
    try:
        on_text(text)
    except Exception:
        log.exception("a streamed-text listener failed; the reply continues without it")
        return None
    return on_text


def _completion(body: object) -> Completion:
    """A chat-completion response body, checked field by field (ValueError: malformed)."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("response has no choices")
    choice = choices[0]
    raw = choice.get("message")
    if not isinstance(raw, dict):
        raise ValueError("choice has no message")
    content = raw.get("content")
    if content is not None and not isinstance(content, str):
        raise ValueError("message content is not text")
    calls: list[ToolCall] = []
    for tc in raw.get("tool_calls") or ():
        function = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        arguments = function.get("arguments")
        calls.append(
            ToolCall(
                id=str(tc.get("id") or ""),
                name=function["name"],
                arguments=arguments if isinstance(arguments, str) and arguments else "{}",
            )
        )
    usage = body.get("usage") if isinstance(body, dict) else None
    usage = usage if isinstance(usage, dict) else {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    finish = choice.get("finish_reason")
    return Completion(
        message=_reply(content, tuple(calls)),
        usage=Usage(
            prompt if isinstance(prompt, int) else None,
            completion if isinstance(completion, int) else None,
            cached_tokens(usage, body if isinstance(body, dict) else {}),
        ),
        finish_reason=finish if isinstance(finish, str) else None,
    )


def cached_tokens(usage: Mapping[str, Any], body: Mapping[str, Any]) -> int | None:
    """The prompt tokens read from the provider's cache, where it reports them: OpenAI and
    vLLM (`usage.prompt_tokens_details.cached_tokens`), DeepSeek
    (`usage.prompt_cache_hit_tokens`), llama.cpp's server (`timings.cache_n`, or
    `tokens_cached`). None when it says nothing (llama-cpp-python, the bundled model's server,
    reports no cache figures)."""
    details = usage.get("prompt_tokens_details")
    timings = body.get("timings")
    for value in (
        details.get("cached_tokens") if isinstance(details, dict) else None,
        usage.get("prompt_cache_hit_tokens"),
        timings.get("cache_n") if isinstance(timings, dict) else None,
        body.get("tokens_cached"),
    ):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _rejects_cache_key(exc: openai.APIStatusError) -> bool:
    """A 400 (or 422) that names `prompt_cache_key`: the endpoint does not take it."""
    return exc.status_code in (400, 422) and CACHE_KEY_PARAMETER in f"{exc} {exc.body}"


def _is_context_overflow(exc: openai.BadRequestError) -> bool:
    code = getattr(exc, "code", None)
    if code == "context_length_exceeded":
        return True
    text = str(exc).lower()
    return "maximum context length" in text or "context window" in text or "too many tokens" in text


def _reply(content: str | None, calls: tuple[ToolCall, ...]) -> Message:
    """The model's message as the store and the platforms can hold it: a reply is text from
    outside, and a NUL or an unpaired surrogate in it would fail the turn's end (`storable`)."""
    return Message(
        role="assistant",
        content=None if content is None else storable(content),
        tool_calls=tuple(
            ToolCall(id=storable(c.id), name=storable(c.name), arguments=storable(c.arguments))
            for c in calls
        ),
    )
