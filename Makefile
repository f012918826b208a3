# fleetgate: `make run` starts the controller on the built-in simulator; `make test` runs the tests.
# The first interpreter that runs and is 3.11 or 3.12 (durable_rules does not build on 3.13).
PYTHON ?= $(shell for p in python3.11 python3.12 python3; do \
	$$p -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 13))' 2>/dev/null \
	&& { echo $$p; break; }; done)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test check lint typecheck clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,chart]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/fleetgate run

# The Alertmanager integration test runs Debian's prometheus-alertmanager.
ALERTMANAGER := /usr/bin/prometheus-alertmanager

$(ALERTMANAGER):
	@if [ "$$(id -u)" = 0 ]; then \
		(apt-get install -y -qq prometheus-alertmanager >/dev/null 2>&1 \
		 || (apt-get update -qq && apt-get install -y -qq prometheus-alertmanager)) >/dev/null; \
	else \
		echo "the tests need prometheus-alertmanager: sudo apt-get install prometheus-alertmanager"; \
		exit 1; \
	fi

# tests/test_metrics.py checks the scrape and the shipped alert rules with promtool (Debian's
# prometheus package).
PROMTOOL := /usr/bin/promtool

$(PROMTOOL):
	@if [ "$$(id -u)" = 0 ]; then \
		(apt-get install -y -qq prometheus >/dev/null 2>&1 \
		 || (apt-get update -qq && apt-get install -y -qq prometheus)) >/dev/null; \
	else \
		echo "the tests need promtool: sudo apt-get install prometheus"; \
		exit 1; \
	fi

test: $(STAMP) $(ALERTMANAGER) $(PROMTOOL)
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check controller escalation tests
	$(BIN)/ruff format --check controller escalation tests

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
