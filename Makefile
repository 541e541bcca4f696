# Newcomer entry points (Python 3.11+, no database needed: PostgreSQL is embedded).
#   make serve   install into .venv and start the API on http://127.0.0.1:8000
#   make test    install into .venv (with test extras) and run the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=
# pytest-xdist workers: two for the database-backed groups, the rest for the pure suites
JOBS ?= $(shell $(PYTHON) -c 'import os; print(max(3, os.cpu_count() or 1))')

.PHONY: serve test lint openapi bench ci chromium

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# PORT=8080 serves on another port (the same as ARGS="--port 8080")
PORT ?=
serve: $(VENV)/.installed
	$(BIN)/dpquant serve $(if $(PORT),--port $(PORT)) $(ARGS)

# The browser tests drive Debian's Chromium: installed here when we may (root + apt-get).
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
	  && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	  || echo "note: chromium is not installed; tests/ui will be skipped (apt-get install chromium)"

test: $(VENV)/.installed-test chromium
	$(BIN)/python -m pytest tests -n $(JOBS) --dist loadgroup $(ARGS)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy app
	$(BIN)/lint-imports

openapi: $(VENV)/.installed
	$(BIN)/dpquant openapi

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/bench_service.py $(ARGS)

ci:
	bash .ci/run
