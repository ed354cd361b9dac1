"""Package names loaded when first used (PEP 562), so that importing one module of a package
does not import all of them: `gatehouse --help` and the store-only commands start in a blink
because `gateway.store.faults` or `gateway.operations.sessions` no longer drag in every
sibling (and the SDKs behind them)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, homes: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], object]:
    """The package's `__getattr__`: each name in `homes` is imported from its module
    (`package.<home>`) on first use and kept in `namespace` (the package's globals), so later
    lookups are plain attributes. Pair it with the same names under `TYPE_CHECKING` and in
    `__all__`, for the type checker."""

    def __getattr__(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        namespace[name] = value
        return value

    return __getattr__
