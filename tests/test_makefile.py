"""The two commands of the README, read through `make -nB` (every recipe printed, none run):
`make test` never builds llama-cpp-python (CI runs it on a fresh machine), and `make run` says
before its long build what it is doing, how long it takes, and that it happens once."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def dry_run(target: str) -> str:
    return subprocess.run(
        ["make", "-nB", target], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def test_make_test_never_builds_llama_cpp_python() -> None:
    recipes = dry_run("test")
    assert "pytest" in recipes
    assert "llama" not in recipes.lower() and "local]" not in recipes


def test_make_run_announces_the_one_time_build_and_shows_its_progress() -> None:
    recipes = dry_run("run")
    announce = recipes.index("Building llama-cpp-python for the bundled offline model")
    assert "about 10 minutes on 2 cores" in recipes and "once; later runs start in seconds" in recipes
    local = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["local"]
    [spec] = local
    build = recipes.index(f"'{spec}'")  # the same requirement as the `local` extra
    assert announce < build < recipes.index("gatehouse run")
    step = recipes[recipes.rindex("pip install", 0, build):build]
    assert "--quiet" not in step, "pip shows its progress for the long step"
    assert "GGML_NATIVE=OFF" in recipes[announce:build]
