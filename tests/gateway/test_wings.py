"""The layout ARCHITECTURE.md promises: each wing of gateway/ imports only the wings below it.

A newcomer finds the room for a change from the tree; that only holds while dependencies point
one way. Type-only imports count too: an upward `TYPE_CHECKING` import is still a loop in the
design, and it is what lets internals leak upward.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Higher may import lower; a module may always import its own wing.
RANKS: dict[str, int] = {
    "gateway.app": 6,
    "gateway.operations": 6,
    "gateway.cli": 6,
    "gateway.web": 6,
    "gateway.doctor": 6,
    "gateway.metrics": 6,
    "gateway.adapters": 6,
    "gateway.turn": 5,
    "gateway.tools": 4,
    "gateway.jobs": 3,
    "gateway.inbound": 2,
    "gateway.model": 2,
    "gateway.store": 1,
    "gateway.config": 0,
    "gateway.reload": 1,
    "gateway.logging_setup": 6,
    "gateway.lazy": -1,  # PEP 562 exports; imports nothing of the gateway, any wing may use it
    # The pure packages sit under every wing: they import nothing from gateway/.
    "context": -1,
    "memory": -1,
    "channels": -1,
}


def wing_of(module: str) -> str | None:
    """The longest RANKS prefix of a dotted module name."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in RANKS:
            return prefix
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.AST, package: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            found.add(stem)
            found.update(f"{stem}.{alias.name}" for alias in node.names)
    return found


def sources() -> list[Path]:
    files: list[Path] = []
    for top in ("gateway", "context", "memory", "channels"):
        files += [p for p in (ROOT / top).rglob("*.py") if "migrations" not in p.parts]
    files.remove(ROOT / "gateway" / "__init__.py")  # the package marker, in no wing
    return sorted(files)


def upward_imports() -> list[str]:
    problems: list[str] = []
    for path in sources():
        name = module_name(path)
        own = wing_of(name)
        assert own is not None, f"{name} belongs to no wing: add it to RANKS"
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target in sorted(imported_modules(ast.parse(path.read_text()), package)):
            other = wing_of(target)
            if other is None or other == own:
                continue
            if RANKS[other] >= RANKS[own] and not (RANKS[own] == 6 and RANKS[other] == 6):
                problems.append(f"{name} ({own}) imports {target} ({other})")
    return problems


def test_every_wing_imports_only_wings_below_it() -> None:
    assert upward_imports() == []


@pytest.mark.parametrize("package", ["context", "memory", "channels"])
def test_pure_packages_import_nothing_from_the_gateway(package: str) -> None:
    offenders = [
        f"{module_name(p)} imports {t}"
        for p in (ROOT / package).rglob("*.py")
        for t in imported_modules(ast.parse(p.read_text()), package)
        if t == "gateway" or t.startswith("gateway.")
    ]
    assert offenders == []


def test_the_rule_catches_an_upward_import(tmp_path: Path) -> None:
    """The check itself works: a jobs module importing the app is reported."""
    tree = ast.parse("from gateway.app import Gateway\n")
    targets = imported_modules(tree, "gateway.jobs")
    assert "gateway.app.Gateway" in targets
    assert RANKS[wing_of("gateway.app.Gateway") or ""] > RANKS["gateway.jobs"]
