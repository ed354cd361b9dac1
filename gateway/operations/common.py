"""What every CLI-side operation starts with: a gateway opened from a config, or, for the
operations that only read the database, the store and the context resolver alone."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.app import Gateway
    from gateway.config import Config
    from gateway.model.sizing import ContextResolver
    from gateway.store import Store


@contextlib.asynccontextmanager
async def opened(config: Config, *, fetch_metadata: bool = False) -> AsyncIterator[Gateway]:
    """A gateway with its store and workspace open, for one CLI command."""
    from gateway.app import Gateway

    gateway = Gateway(config)
    await gateway.open(fetch_metadata=fetch_metadata)
    try:
        yield gateway
    finally:
        await gateway.close()


@dataclass(frozen=True, slots=True)
class StoreView:
    """What a read-only operation needs of a gateway: its config, its database and how it
    sizes prompts (the window, the budget, the history limits). A `Gateway` has the same
    three attributes, so the admin UI passes the live one."""

    config: Config
    store: Store
    resolver: ContextResolver


@contextlib.asynccontextmanager
async def opened_store(config: Config) -> AsyncIterator[StoreView]:
    """The database and the context resolver without the rest of a gateway (no model
    client, no channels, no memory index): `sessions list` answers in a blink."""
    from gateway.model.llm import LLMProvider
    from gateway.model.sizing import ContextResolver
    from gateway.store import Store

    store = Store(config.database_url)
    await store.init()
    try:
        yield StoreView(config, store, ContextResolver(config, LLMProvider(config.llm)))
    finally:
        await store.close()
