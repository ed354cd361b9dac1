"""gateway/lazy.py: the packages whose names load on first use say the same names three
ways (their `_HOMES`, `__all__` and the `TYPE_CHECKING` imports mypy reads); each resolves to
the object its home module defines."""

from __future__ import annotations

import importlib
import pkgutil
import types

import pytest

LAZY_PACKAGES = ("gateway.store", "gateway.operations")


@pytest.mark.parametrize("name", LAZY_PACKAGES)
def test_every_lazy_name_resolves_from_its_home(name: str) -> None:
    package = importlib.import_module(name)
    homes: dict[str, str] = package._HOMES
    assert sorted(homes) == sorted(package.__all__)
    for exported, home in homes.items():
        module = importlib.import_module(f"{name}.{home}")
        assert getattr(package, exported) is getattr(module, exported)


@pytest.mark.parametrize("name", LAZY_PACKAGES)
def test_no_lazy_name_is_also_a_module_of_its_package(name: str) -> None:
    """Importing `pkg.explain` sets the package's `explain` to that module: a function of the
    same name would be shadowed (an eager `__init__` rebinds it; a lazy one cannot)."""
    package = importlib.import_module(name)
    modules = {info.name for info in pkgutil.iter_modules(package.__path__)}
    assert sorted(modules.intersection(package._HOMES)) == []


def test_an_unknown_name_is_an_attribute_error() -> None:
    store: types.ModuleType = importlib.import_module("gateway.store")
    with pytest.raises(AttributeError, match="has no attribute 'Stor'"):
        _ = store.Stor
