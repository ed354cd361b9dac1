# Two commands a newcomer needs: `make run` and `make test`. Both bootstrap .venv from pyproject.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev

CHROMIUM := /usr/bin/chromium

.PHONY: run test lint typecheck pytest bench clean venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,postgres]'
	touch $(STAMP)

venv: $(STAMP)

# The webchat page is tested in a real browser: Debian's Chromium, driven by Playwright
# (never `playwright install`, which downloads its own browser).
$(CHROMIUM):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

run: $(STAMP)
	@test -f gatehouse.toml || $(BIN)/gatehouse init --dir .
	$(BIN)/gatehouse run

lint: $(STAMP)
	$(BIN)/ruff check gateway channels context memory tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) $(CHROMIUM)
	$(BIN)/python -m pytest

test: lint typecheck pytest

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python bench/report.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
