"""The real embedding model, loaded once for the whole test process (as the gateway does)."""

from __future__ import annotations

import pytest

from memory.embeddings import Encoder, shared_encoder


@pytest.fixture(scope="session")
def use() -> Encoder:
    encoder, reason = shared_encoder()
    if encoder is None:
        pytest.skip(reason)
    return encoder
