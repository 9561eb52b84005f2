# The two commands a fresh machine needs are `make demo` and `make test` (see README).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck layers unit venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# The daemon repairing a bad table on the emulator, live (no GPU, no Prometheus; ~1 minute,
# after building .venv the first time).
demo: $(STAMP)
	$(BIN)/tabletune demo

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

layers: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest -m "not gpu"

test: lint typecheck layers unit

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
