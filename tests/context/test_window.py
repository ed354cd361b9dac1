"""Effective context window: precedence, cap, floor, warning, model-id matching."""

from __future__ import annotations

import pytest

from context.window import (
    DEFAULT_WINDOW_TOKENS,
    MODEL_CONTEXT_WINDOWS,
    WindowResolution,
    WindowTooSmallError,
    check_window,
    lookup_window,
    model_id_candidates,
    resolve_window,
)

CAP = "capped by [agent] max_context_tokens"


@pytest.mark.parametrize(
    ("model", "configured", "reported", "cap", "tokens", "source"),
    [
        # per-model config wins over everything
        ("gpt-4o", 64_000, 100_000, None, 64_000, 'config [models."gpt-4o"].context_window'),
        ("gpt-4o", 300_000, None, None, 300_000, 'config [models."gpt-4o"].context_window'),
        # server-reported metadata beats the table
        ("gpt-4o", None, 65_536, None, 65_536, "server-reported max_model_len"),
        ("Qwen/Qwen2.5-7B-Instruct", None, 40_000, None, 40_000, "server-reported max_model_len"),
        # a junk report (0) is treated as absent
        ("gpt-4o", None, 0, None, 128_000, "built-in table (gpt-4o)"),
        # built-in table
        ("gpt-4o", None, None, None, 128_000, "built-in table (gpt-4o)"),
        ("gpt-4.1", None, None, None, 1_047_576, "built-in table (gpt-4.1)"),
        ("claude-3-5-sonnet-20241022", None, None, None, 200_000, "built-in table (claude-3-5)"),
        # default
        ("my-own-finetune", None, None, None, 200_000, "default"),
        # the cap lowers ...
        ("gpt-4o", None, None, 100_000, 100_000, f"built-in table (gpt-4o) {CAP}"),
        ("gpt-4o", 90_000, None, 50_000, 50_000, f'config [models."gpt-4o"].context_window {CAP}'),
        ("x", None, 64_000, 40_000, 40_000, f"server-reported max_model_len {CAP}"),
        ("unknown", None, None, 150_000, 150_000, f"default {CAP}"),
        # ... but never raises
        ("gpt-4o", None, None, 500_000, 128_000, "built-in table (gpt-4o)"),
        ("gpt-4o", 64_000, None, 64_000, 64_000, 'config [models."gpt-4o"].context_window'),
    ],
)
def test_resolution_paths(
    model: str,
    configured: int | None,
    reported: int | None,
    cap: int | None,
    tokens: int,
    source: str,
) -> None:
    res = resolve_window(model, configured, reported, cap)
    assert (res.tokens, res.source) == (tokens, source)
    assert res.model == model
    assert res.warning is None
    assert not res.too_small
    check_window(res)  # does not raise


def test_cap_records_uncapped_value() -> None:
    res = resolve_window("gpt-4o", None, None, 100_000)
    assert res.uncapped_tokens == 128_000
    assert resolve_window("gpt-4o", None, None, None).uncapped_tokens is None


def test_custom_default_and_reported_field() -> None:
    assert resolve_window("nope", None, None, None, default=64_000) == WindowResolution(
        tokens=64_000, source="default", model="nope"
    )
    res = resolve_window("m", None, 32_768, None, reported_field="context_length")
    assert res.source == "server-reported context_length"


@pytest.mark.parametrize(
    ("model", "configured", "reported", "cap", "source"),
    [
        ("gpt-4", None, None, None, "built-in table (gpt-4)"),
        ("m", 12_000, None, None, 'config [models."m"].context_window'),
        ("m", None, 4_096, None, "server-reported max_model_len"),
        ("gpt-4o", None, None, 15_999, f"built-in table (gpt-4o) {CAP}"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", None, None, None, "built-in table (smollm2)"),
    ],
)
def test_below_16k_is_refused(
    model: str, configured: int | None, reported: int | None, cap: int | None, source: str
) -> None:
    res = resolve_window(model, configured, reported, cap)
    assert res.too_small
    assert res.source == source
    assert res.warning is not None and source in res.warning
    with pytest.raises(WindowTooSmallError) as err:
        check_window(res)
    msg = str(err.value)
    assert f"{res.tokens:,}" in msg
    assert repr(model) in msg
    assert source in msg
    assert "16,000" in msg
    assert (err.value.tokens, err.value.model, err.value.source) == (res.tokens, model, source)
    assert isinstance(err.value, ValueError)


def test_exactly_16k_is_allowed_with_warning() -> None:
    res = resolve_window("m", 16_000, None, None)
    assert not res.too_small
    assert res.warning is not None
    check_window(res)


@pytest.mark.parametrize(
    ("model", "configured", "reported", "cap", "source"),
    [
        ("gpt-3.5-turbo-0125", None, None, None, "built-in table (gpt-3.5-turbo)"),
        ("m", 20_000, None, None, 'config [models."m"].context_window'),
        ("m", None, 24_576, None, "server-reported max_model_len"),
        ("claude-3-haiku", None, None, 30_000, f"built-in table (claude-3) {CAP}"),
    ],
)
def test_below_32k_warns_naming_source(
    model: str, configured: int | None, reported: int | None, cap: int | None, source: str
) -> None:
    res = resolve_window(model, configured, reported, cap)
    assert not res.too_small
    assert res.warning is not None
    assert source in res.warning
    assert f"{res.tokens:,}" in res.warning
    assert repr(model) in res.warning
    assert "32,000" in res.warning


def test_32k_exactly_has_no_warning() -> None:
    assert resolve_window("m", 32_000, None, None).warning is None
    assert resolve_window("m", 31_999, None, None).warning is not None


@pytest.mark.parametrize(
    ("configured", "cap", "what"),
    [
        (0, None, "context_window"),
        (-5, None, "context_window"),
        (None, 0, "max_context_tokens"),
    ],
)
def test_non_positive_settings_are_rejected_not_clamped(
    configured: int | None, cap: int | None, what: str
) -> None:
    with pytest.raises(ValueError, match=what):
        resolve_window("gpt-4o", configured, None, cap)


@pytest.mark.parametrize(
    ("model", "key", "tokens"),
    [
        # exact ids
        ("gpt-4o", "gpt-4o", 128_000),
        ("gpt-4o-mini", "gpt-4o-mini", 128_000),
        ("gpt-3.5-turbo", "gpt-3.5-turbo", 16_385),
        ("gpt-4", "gpt-4", 8_192),
        ("gpt-4-turbo", "gpt-4-turbo", 128_000),
        ("o1", "o1", 200_000),
        ("o3-mini", "o3-mini", 200_000),
        ("gpt-5", "gpt-5", 400_000),
        # dated snapshots: longest family prefix
        ("gpt-4o-2024-08-06", "gpt-4o", 128_000),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini", 128_000),
        ("gpt-4-0613", "gpt-4", 8_192),
        ("gpt-4-turbo-2024-04-09", "gpt-4-turbo", 128_000),
        ("gpt-4.1-mini-2025-04-14", "gpt-4.1-mini", 1_047_576),
        ("o4-mini-2025-04-16", "o4-mini", 200_000),
        ("gpt-5-nano-2025-08-07", "gpt-5-nano", 400_000),
        # provider prefixes, tags, casing
        ("openai/gpt-4o", "gpt-4o", 128_000),
        ("openrouter/openai/gpt-4o-mini", "gpt-4o-mini", 128_000),
        ("anthropic/claude-3.5-sonnet", "claude-3.5", 200_000),
        ("anthropic/claude-sonnet-4", "claude-sonnet-4", 200_000),
        ("us.anthropic.claude-3-7-sonnet-20250219-v1:0", "claude-3-7", 200_000),
        ("claude-3-5-sonnet@20240620", "claude-3-5", 200_000),
        ("GPT-4o", "gpt-4o", 128_000),
        ("gpt-4o:latest", "gpt-4o", 128_000),
        ("ft:gpt-4o-mini-2024-07-18:acme::abc123", "gpt-4o-mini", 128_000),
        # open models, Hugging Face and Ollama spellings
        ("llama3:latest", "llama3", 8_192),
        ("llama3:8b", "llama3", 8_192),
        ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3", 8_192),
        ("llama3.1:8b", "llama3.1", 131_072),
        ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.3", 131_072),
        ("llama3.2:3b", "llama3.2", 131_072),
        ("qwen2.5:0.5b", "qwen2.5", 32_768),
        ("qwen2.5:7b", "qwen2.5-7b", 131_072),
        ("Qwen/Qwen2.5-72B-Instruct", "qwen2.5-72b", 131_072),
        ("Qwen/Qwen2.5-7B-Instruct-1M", "qwen2.5-*-1m", 1_010_000),
        ("qwen3:8b", "qwen3", 32_768),
        ("Qwen/Qwen3-235B-A22B-Instruct-2507", "qwen3-*-2507", 262_144),
        ("mistral:latest", "mistral", 32_768),
        ("mistral-large-latest", "mistral-large", 131_072),
        ("mixtral:8x22b", "mixtral-8x22b", 65_536),
        ("deepseek-r1:14b", "deepseek-r1", 131_072),
        ("deepseek/deepseek-chat", "deepseek-chat", 131_072),
        ("gemma3:1b", "gemma3-1b", 32_768),
        ("gemma3:27b", "gemma3", 131_072),
        ("google/gemma-2-9b-it", "gemma-2", 8_192),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2", 8_192),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2", 8_192),
    ],
)
def test_table_lookup(model: str, key: str, tokens: int) -> None:
    assert lookup_window(model) == (key, tokens)
    res = resolve_window(model, None, None, None)
    assert res.tokens == tokens
    assert res.source == f"built-in table ({key})"


@pytest.mark.parametrize(
    "model",
    ["", "totally-unknown", "gpt-40", "llama", "o2", "my-gpt-4o"],
)
def test_unknown_models_fall_to_default(model: str) -> None:
    assert lookup_window(model) is None
    res = resolve_window(model, None, None, None)
    assert (res.tokens, res.source) == (DEFAULT_WINDOW_TOKENS, "default")


def test_family_prefix_does_not_cross_version_dots() -> None:
    # "gpt-4" (8k) must not claim gpt-4.1 / gpt-4.5, nor "llama3" claim llama3.1
    table = {"gpt-4": 8_192, "llama3": 8_192}
    assert lookup_window("gpt-4.1", table) is None
    assert lookup_window("llama3.1:8b", table) is None
    assert lookup_window("gpt-4-32k-0613") == ("gpt-4-32k", 32_768)
    assert lookup_window("gpt-4.5-preview") == ("gpt-4.5", 128_000)


def test_candidates_normalization() -> None:
    assert model_id_candidates("gemma3:1b") == ["gemma3-1b", "gemma3"]
    assert model_id_candidates("llama3:latest") == ["llama3"]
    assert model_id_candidates("openai/GPT-4o") == ["gpt-4o"]
    assert model_id_candidates("eu.anthropic.claude-3-haiku-20240307-v1:0")[-1] == (
        "claude-3-haiku-20240307-v1"
    )


def test_table_values_are_sane() -> None:
    for key, tokens in MODEL_CONTEXT_WINDOWS.items():
        assert key == key.lower(), key
        assert 2_048 <= tokens <= 10_000_000, key
    assert MODEL_CONTEXT_WINDOWS["gpt-4.1"] == 1_047_576
    assert MODEL_CONTEXT_WINDOWS["gpt-3.5-turbo"] == 16_385
    assert MODEL_CONTEXT_WINDOWS["smollm2"] == 8_192
