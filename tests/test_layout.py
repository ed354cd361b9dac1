"""The layout of the test tree itself. A test module that imports another couples the two: moving,
renaming or deleting one breaks the other, and the import runs the other module's setup. What
tests share belongs in `tests/helpers/`, `tests/fakes/` or `tests/conftest.py` instead."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def module_name(path: Path) -> str:
    """`<root>/tests/e2e/test_cli.py` -> `tests.e2e.test_cli`."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def enclosing_test_module(name: str) -> str | None:
    """The test module `name` is or lies in (`tests.x.test_y` of `tests.x.test_y.helper`)."""
    parts = name.split(".")
    if parts[0] != "tests":
        return None
    for i, part in enumerate(parts[1:], start=1):
        if part.startswith("test_"):
            return ".".join(parts[: i + 1])
    return None


def imported_test_modules(source: str, module: str) -> list[str]:
    """The test modules `source` (the text of `module`) imports, anywhere in the file (inside
    functions too), spelled any way: `import a.test_b`, `from a.test_b import x`,
    `from a import test_b`, and relative imports resolved against `module`'s package."""
    package = module.split(".")[:-1]
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            parent = ".".join([*base, *([node.module] if node.module else [])])
            names = [parent] if enclosing_test_module(parent) else [
                f"{parent}.{alias.name}" for alias in node.names
            ]
        else:
            continue
        found.extend(m for m in map(enclosing_test_module, names) if m is not None)
    return found


def test_the_check_sees_every_spelling_of_an_import() -> None:
    source = (
        "import os\n"
        "import tests.gateway.test_a\n"
        "from tests.e2e import test_b, helpers\n"
        "from .test_c import helper\n"
        "from tests.helpers.cli import run_cli\n"
        "from tests.fakes import FakeOpenAI\n"
        "def f():\n    from ..gateway.test_d import x, test_y\n"
    )
    assert imported_test_modules(source, "tests.e2e.test_probe") == [
        "tests.gateway.test_a", "tests.e2e.test_b", "tests.e2e.test_c", "tests.gateway.test_d",
    ]


def test_no_module_under_tests_imports_a_test_module() -> None:
    offenders: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        module = module_name(path)
        imported = imported_test_modules(path.read_text(encoding="utf-8"), module)
        if imported := sorted(set(imported) - {module}):
            offenders[str(path.relative_to(ROOT))] = imported
    assert offenders == {}, (
        "these modules import test modules; move what they share into tests/helpers/: "
        + "; ".join(f"{path} imports {', '.join(mods)}" for path, mods in offenders.items())
    )
