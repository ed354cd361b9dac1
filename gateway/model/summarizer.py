"""The summarizer call used by compaction: the configured summary model, or the chat model.

`[context] summary_model`, `summary_base_url` and `summary_api_key` let a cheaper or local model
write summaries; each call is bounded by `summary_timeout`, and any failure is raised so that
compaction records it and falls back instead of committing a bad summary.
"""

from __future__ import annotations

import asyncio

from context.compaction import SummaryCall
from context.types import Message
from gateway.config import Config
from gateway.model.llm import LLMProvider


def summary_provider(config: Config, chat: LLMProvider) -> LLMProvider:
    c = config.context
    if not (c.summary_base_url or c.summary_api_key or c.summary_model):
        return chat
    settings = config.llm.model_copy(
        update={
            "base_url": c.summary_base_url or config.llm.base_url,
            "api_key": c.summary_api_key or config.llm.api_key,
            "model": c.summary_model or config.llm.model,
            "timeout": c.summary_timeout,
            "stream": False,
        }
    )
    return LLMProvider(settings)


def make_summary_call(config: Config, provider: LLMProvider) -> SummaryCall:
    timeout = config.context.summary_timeout

    async def summarize(prompt: list[Message]) -> str:
        completion = await asyncio.wait_for(
            provider.complete(prompt, (), stream=False), timeout=timeout
        )
        return completion.message.text

    return summarize
