# Newcomer entry points (Python 3.11+, no database needed: PostgreSQL is embedded).
#   make serve   install into .venv and start the API on http://127.0.0.1:8000
#   make test    install into .venv (with test extras) and run the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: serve test lint openapi bench ci

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

serve: $(VENV)/.installed
	$(BIN)/dpquant serve $(ARGS)

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest tests $(ARGS)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy app

openapi: $(VENV)/.installed
	$(BIN)/dpquant openapi

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/bench_service.py $(ARGS)

ci:
	bash .ci/run
