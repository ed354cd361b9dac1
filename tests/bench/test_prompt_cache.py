"""bench/prompt_cache.py's fake model: cached tokens by longest common prefix, as OpenAI counts
them (1,024 tokens at least, then steps of 128), and prefix breaks between chat calls."""

from __future__ import annotations

from typing import Any

from bench.prompt_cache import CachingModel, common_prefix, user_text

TOOLS = [{"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}]


def body(*contents: str, key: str = "k") -> dict[str, Any]:
    messages = [{"role": "system", "content": "Be brief."}]
    messages += [
        {"role": "user" if i % 2 == 0 else "assistant", "content": c}
        for i, c in enumerate(contents)
    ]
    return {"model": "m", "prompt_cache_key": key, "messages": messages, "tools": TOOLS}


def test_common_prefix() -> None:
    assert common_prefix("abcdef", "abcxyz") == 3
    assert common_prefix("", "abc") == 0
    assert common_prefix("same", "same") == 4


def test_an_extended_prompt_is_cached_up_to_the_old_one_in_128_token_steps() -> None:
    model = CachingModel()
    turns = [user_text(i) for i in range(12)]
    model(body(*turns[:6]))
    model(body(*turns[:8]))
    first, second = model.calls
    assert first["cached"] == 0 and first["broke"] is None
    assert second["broke"] is False
    assert second["cached"] % 128 == 0
    assert first["prompt"] - 128 < second["cached"] <= first["prompt"]


def test_a_changed_early_message_breaks_the_prefix() -> None:
    model = CachingModel()
    turns = [user_text(i) for i in range(8)]
    model(body(*turns))
    model(body(*turns[2:], user_text(99)))
    assert model.calls[1]["broke"] is True
    assert model.calls[1]["cached"] == 0, "system prompt and tools alone are under 1,024 tokens"


def test_each_session_has_its_own_cache() -> None:
    model = CachingModel()
    turns = [user_text(i) for i in range(8)]
    model(body(*turns, key="a"))
    model(body(*turns, user_text(50), key="b"))
    model(body(*turns, user_text(50), key="a"))
    assert [c["cached"] > 0 for c in model.calls] == [False, False, True]
