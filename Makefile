# Two commands a newcomer needs: `make run` and `make test`. Both bootstrap .venv from pyproject.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev

.PHONY: run test lint typecheck pytest bench clean venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,postgres]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	@test -f gatehouse.toml || $(BIN)/gatehouse init --dir .
	$(BIN)/gatehouse run

lint: $(STAMP)
	$(BIN)/ruff check gateway channels context memory tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest

test: lint typecheck pytest

bench: $(STAMP)
	$(BIN)/python bench/pipeline.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
