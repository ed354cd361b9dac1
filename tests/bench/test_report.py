"""bench/report.py runs every benchmark script: none is forgotten, each takes --quick and --json."""

from __future__ import annotations

import ast

from bench.report import NOT_RUN_DIRECTLY, SCRIPTS, unlisted_scripts


def _options(source: str) -> set[str]:
    return {
        node.args[0].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", None) == "add_argument"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }


def test_every_bench_script_is_in_the_report() -> None:
    assert unlisted_scripts() == []
    assert not {s.path.name for s in SCRIPTS} & set(NOT_RUN_DIRECTLY)


def test_every_script_has_a_quick_size_and_json_output() -> None:
    for script in SCRIPTS:
        options = _options(script.path.read_text(encoding="utf-8"))
        assert {"--quick", "--json"} <= options, f"{script.path.name}: {sorted(options)}"
