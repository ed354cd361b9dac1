"""Effective context window resolution (pure).

Precedence: per-model config → server-reported metadata (vLLM `max_model_len`, OpenRouter
`context_length` …) → the built-in table → the default (200k); then the agent cap
(`[agent] max_context_tokens`) can only lower it. Every answer says where it came from, so no
limit is ever silently clamped: below 32,000 tokens a warning names the source, below 16,000
the run is refused (`check_window`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase

__all__ = [
    "DEFAULT_WINDOW_TOKENS",
    "MIN_WINDOW_TOKENS",
    "MODEL_CONTEXT_WINDOWS",
    "WARN_WINDOW_TOKENS",
    "WindowResolution",
    "WindowTooSmallError",
    "check_window",
    "lookup_window",
    "model_id_candidates",
    "resolve_window",
]

DEFAULT_WINDOW_TOKENS = 200_000
#: Below this the run is refused.
MIN_WINDOW_TOKENS = 16_000
#: Below this a warning naming the source is emitted.
WARN_WINDOW_TOKENS = 32_000

_K = 1_024

#: Context windows (input + output tokens) of common models, by lower-case id or family prefix.
#: A key matches an id equal to it or starting with it followed by a separator (`-`, `_`, `:`,
#: `@`, `.` + non-digit); `*` is a glob. The longest (most specific) matching key wins, so
#: `gpt-4o-mini-2024-07-18` → `gpt-4o-mini`, `gpt-4-0613` → `gpt-4`, but `gpt-4.1` is its own
#: family. Values are what the model serves natively; a server that reports its own limit wins.
MODEL_CONTEXT_WINDOWS: dict[str, int] = {
    # --- OpenAI
    "gpt-3.5-turbo": 16_385,
    "gpt-3.5-turbo-instruct": 4_096,
    "gpt-35-turbo": 16_385,  # Azure deployment spelling
    "gpt-4": 8_192,
    "gpt-4-32k": 32_768,
    "gpt-4-turbo": 128_000,
    "gpt-4-1106": 128_000,
    "gpt-4-0125": 128_000,
    "gpt-4-vision": 128_000,
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "chatgpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.1-mini": 1_047_576,
    "gpt-4.1-nano": 1_047_576,
    "gpt-4.5": 128_000,
    "gpt-5": 400_000,
    "gpt-5-mini": 400_000,
    "gpt-5-nano": 400_000,
    "gpt-5-codex": 400_000,
    "gpt-5-chat": 128_000,
    "gpt-5.1": 400_000,
    "gpt-5.1-chat": 128_000,
    "gpt-5.2": 400_000,
    "o1": 200_000,
    "o1-mini": 128_000,
    "o1-preview": 128_000,
    "o3": 200_000,
    "o3-mini": 200_000,
    "o4-mini": 200_000,
    "gpt-oss": 131_072,
    # --- Anthropic (every Claude 3 / 3.5 / 3.7 / 4 model; 1M is an opt-in beta)
    "claude": 200_000,
    "claude-3": 200_000,
    "claude-3-5": 200_000,
    "claude-3.5": 200_000,
    "claude-3-7": 200_000,
    "claude-3.7": 200_000,
    "claude-4": 200_000,
    "claude-sonnet-4": 200_000,
    "claude-opus-4": 200_000,
    "claude-haiku-4": 200_000,
    "claude-2": 100_000,
    "claude-2.1": 200_000,
    "claude-instant": 100_000,
    # --- Google
    "gemini": 1_048_576,
    "gemini-1.5-pro": 2_097_152,
    "gemini-1.0-pro": 32_760,
    "gemini-pro": 32_760,
    "gemma": 8_192,
    "gemma-2": 8_192,
    "gemma2": 8_192,
    "gemma-3": 131_072,
    "gemma3": 131_072,
    "gemma-3-1b": 32_768,
    "gemma3-1b": 32_768,
    "gemma-3n": 32_768,
    "gemma3n": 32_768,
    # --- Qwen (2.5: 0.5B–3B serve 32k; 7B+ 131,072 per the model cards, via YaRN)
    "qwen2": 32_768,
    "qwen2.5": 32_768,
    "qwen-2.5": 32_768,
    "qwen2.5-7b": 131_072,
    "qwen2.5-14b": 131_072,
    "qwen2.5-32b": 131_072,
    "qwen2.5-72b": 131_072,
    "qwen-2.5-7b": 131_072,
    "qwen-2.5-14b": 131_072,
    "qwen-2.5-32b": 131_072,
    "qwen-2.5-72b": 131_072,
    "qwen2.5-coder": 32_768,
    "qwen2.5-coder-7b": 131_072,
    "qwen2.5-coder-14b": 131_072,
    "qwen2.5-coder-32b": 131_072,
    "qwen-2.5-coder-32b": 131_072,
    "qwen2.5-vl": 128_000,
    "qwen2.5-*-1m": 1_010_000,
    "qwen2.5-turbo": 1_000_000,
    "qwq": 131_072,
    "qwen3": 32_768,
    "qwen3-*-2507": 262_144,
    "qwen3-coder": 262_144,
    "qwen3-next": 262_144,
    "qwen3-max": 262_144,
    "qwen3-vl": 262_144,
    # --- Meta Llama (Llama 3 base 8k; 3.1 and later 128k)
    "llama3": 8_192,
    "llama-3": 8_192,
    "llama3.1": 131_072,
    "llama-3.1": 131_072,
    "llama3.2": 131_072,
    "llama-3.2": 131_072,
    "llama3.3": 131_072,
    "llama-3.3": 131_072,
    "llama2": 4_096,
    "llama-2": 4_096,
    # --- Mistral
    "mistral": 32_768,
    "mistral-tiny": 32_768,
    "mistral-small": 32_768,
    "mistral-small-3.1": 131_072,
    "mistral-small-3.2": 131_072,
    "mistral-small-2503": 131_072,
    "mistral-small-2506": 131_072,
    "mistral-medium": 131_072,
    "mistral-large": 131_072,
    "mistral-nemo": 131_072,
    "open-mistral-nemo": 131_072,
    "ministral": 131_072,
    "open-mistral-7b": 32_768,
    "mixtral": 32_768,
    "mixtral-8x7b": 32_768,
    "open-mixtral-8x7b": 32_768,
    "mixtral-8x22b": 65_536,
    "open-mixtral-8x22b": 65_536,
    "codestral": 262_144,
    "codestral-22b": 32_768,
    "devstral": 131_072,
    "magistral": 40_000,
    # --- DeepSeek
    "deepseek-chat": 131_072,
    "deepseek-reasoner": 131_072,
    "deepseek-v2": 131_072,
    "deepseek-v2.5": 131_072,
    "deepseek-v3": 131_072,
    "deepseek-v3.1": 131_072,
    "deepseek-v3.2": 131_072,
    "deepseek-r1": 131_072,
    "deepseek-coder": 16_384,
    "deepseek-coder-v2": 131_072,
    # --- Hugging Face SmolLM
    "smollm": 2_048,
    "smollm2": 8_192,
    "smollm3": 65_536,
}

# Hosting prefixes in "vendor.model" ids (AWS Bedrock, with optional cross-region prefix).
_DOTTED_VENDOR_RE = re.compile(
    r"^(?:(?:us|eu|apac|global|us-gov)\.)?"
    r"(?:anthropic|meta|mistral|amazon|cohere|ai21|deepseek|qwen|openai|google)\."
)
_SEPARATORS = "-_:@/ "


def model_id_candidates(model: str) -> list[str]:
    """Normalized forms of a model id to look up, most specific first.

    Lower-cases; strips provider paths (`openai/`, `openrouter/anthropic/`, `Qwen/`), Bedrock
    vendor prefixes (`us.anthropic.`), fine-tune wrappers (`ft:gpt-4o:org::id`), a leading
    `meta-` (`Meta-Llama-3-8B`), `.gguf`, and Ollama tags: `:latest` is dropped, other tags
    become a suffix (`gemma3:1b` → `gemma3-1b`, then `gemma3`).
    """
    mid = model.strip().lower()
    if mid.startswith("ft:"):
        mid = mid[3:].split(":", 1)[0]
    mid = mid.rsplit("/", 1)[-1]
    mid = _DOTTED_VENDOR_RE.sub("", mid)
    mid = mid.removesuffix(".gguf")
    if mid.startswith("meta-llama"):
        mid = mid.removeprefix("meta-")
    out: list[str] = []
    base, sep, tag = mid.partition(":")
    if sep and tag and tag != "latest":
        out.append(f"{base}-{tag.replace(':', '-')}")
    out.append(base if sep else mid)
    return [c for c in out if c]


def _matches(key: str, mid: str) -> bool:
    if "*" in key:
        return fnmatchcase(mid, key) or any(fnmatchcase(mid, key + s + "*") for s in _SEPARATORS)
    if mid == key:
        return True
    if not mid.startswith(key):
        return False
    nxt = mid[len(key)]
    if nxt in _SEPARATORS:
        return True
    # "gpt-4" must not match "gpt-4.1", nor "llama3" "llama3.1"; "gpt-4o" may match "gpt-4o.x"
    return nxt == "." and not mid[len(key) + 1 : len(key) + 2].isdigit()


def lookup_window(model: str, table: dict[str, int] | None = None) -> tuple[str, int] | None:
    """The built-in (or given) table's entry for `model` as ``(matched key, tokens)``, or None."""
    entries = MODEL_CONTEXT_WINDOWS if table is None else table
    for mid in model_id_candidates(model):
        if mid in entries:
            return mid, entries[mid]
        best: str | None = None
        for key in entries:
            if _matches(key, mid) and (best is None or _specificity(key) > _specificity(best)):
                best = key
        if best is not None:
            return best, entries[best]
    return None


def _specificity(key: str) -> tuple[int, bool]:
    # literal length, then a glob beats a plain prefix of the same length ("qwen2.5-*-1m")
    return len(key.replace("*", "")), "*" in key


@dataclass(frozen=True, slots=True)
class WindowResolution:
    """The effective context window and where it came from.

    `source` is human-readable (``config [models."gpt-4o"].context_window``,
    ``server-reported max_model_len``, ``built-in table (gpt-4o)``, ``default``, each possibly
    followed by ``capped by [agent] max_context_tokens``). `warning` is set below 32,000
    tokens; `too_small` below 16,000 (then `check_window` raises).
    """

    tokens: int
    source: str
    warning: str | None = None
    too_small: bool = False
    model: str = ""
    uncapped_tokens: int | None = None


class WindowTooSmallError(ValueError):
    """The effective window is below the 16,000-token floor: the run is refused."""

    def __init__(self, tokens: int, model: str, source: str) -> None:
        self.tokens = tokens
        self.model = model
        self.source = source
        super().__init__(
            f"context window of {tokens:,} tokens for model {model!r} is below the minimum of "
            f"{MIN_WINDOW_TOKENS:,} (from {source}); refusing to run. Use a model with a larger "
            f'window or raise [models."{model}"].context_window / [agent] max_context_tokens.'
        )


def _positive(value: int | None, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return value


def resolve_window(
    model: str,
    configured: int | None,
    reported: int | None,
    agent_cap: int | None,
    default: int = DEFAULT_WINDOW_TOKENS,
    *,
    reported_field: str = "max_model_len",
    configured_source: str | None = None,
) -> WindowResolution:
    """Resolve the effective context window for `model`.

    `configured` is `[models."<model>"].context_window`; `reported` the server's own limit
    (`reported_field` names it in the source, e.g. ``"context_length"`` for OpenRouter; a
    non-positive report is ignored as absent); `agent_cap` is `[agent] max_context_tokens`,
    which can lower the window but never raise it. Configured values must be positive;
    `configured_source` names where `configured` came from when not the config file.
    """
    _positive(configured, f'[models."{model}"].context_window')
    _positive(agent_cap, "[agent] max_context_tokens")
    _positive(default, "default context window")
    if reported is not None and (isinstance(reported, bool) or reported <= 0):
        reported = None

    tokens: int
    source: str
    if configured is not None:
        tokens = configured
        source = configured_source or f'config [models."{model}"].context_window'
    elif reported is not None:
        tokens, source = reported, f"server-reported {reported_field}"
    elif (hit := lookup_window(model)) is not None:
        key, tokens = hit
        source = f"built-in table ({key})"
    else:
        tokens, source = default, "default"

    uncapped: int | None = None
    if agent_cap is not None and agent_cap < tokens:
        uncapped = tokens
        tokens = agent_cap
        source = f"{source} capped by [agent] max_context_tokens"

    warning: str | None = None
    if tokens < WARN_WINDOW_TOKENS:
        warning = (
            f"context window for model {model!r} is only {tokens:,} tokens (from {source}); "
            f"below {WARN_WINDOW_TOKENS:,} compaction runs often and little history fits"
        )
    return WindowResolution(
        tokens=tokens,
        source=source,
        warning=warning,
        too_small=tokens < MIN_WINDOW_TOKENS,
        model=model,
        uncapped_tokens=uncapped,
    )


def check_window(res: WindowResolution) -> None:
    """Raise `WindowTooSmallError` when the resolution is below the 16,000-token floor."""
    if res.too_small:
        raise WindowTooSmallError(res.tokens, res.model, res.source)
