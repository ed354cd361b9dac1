"""What every CLI-side operation starts with: a gateway opened from a config."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from gateway.app import Gateway
from gateway.config import Config


@contextlib.asynccontextmanager
async def opened(config: Config, *, fetch_metadata: bool = False) -> AsyncIterator[Gateway]:
    """A gateway with its store and workspace open, for one CLI command."""
    gateway = Gateway(config)
    await gateway.open(fetch_metadata=fetch_metadata)
    try:
        yield gateway
    finally:
        await gateway.close()
