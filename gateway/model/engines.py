"""Context engines by name, through the `gatehouse.context_engines` entry points.

The built-in engines are published as entry points too (pyproject.toml), and kept here as well
so a source checkout that was never installed still finds them.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

from context.engine import ContextEngine, DefaultContextEngine, FullHistoryEngine

GROUP = "gatehouse.context_engines"
_BUILTIN: dict[str, Callable[[], ContextEngine]] = {
    "default": DefaultContextEngine,
    "full-history": FullHistoryEngine,
}


def available_engines() -> list[str]:
    return sorted({*_BUILTIN, *(ep.name for ep in entry_points(group=GROUP))})


def load_engine(name: str) -> ContextEngine:
    """A new engine of that name: an installed entry point first, then a built-in one."""
    engine: object
    for ep in entry_points(group=GROUP):
        if ep.name == name:
            engine = ep.load()()
            break
    else:
        if name not in _BUILTIN:
            raise ValueError(
                f"[context] engine = {name!r} is not installed; available: "
                + ", ".join(available_engines())
            )
        engine = _BUILTIN[name]()
    if not isinstance(engine, ContextEngine):
        raise TypeError(f"context engine {name!r} does not implement the ContextEngine protocol")
    return engine
