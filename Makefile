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
	$(BIN)/pip install --quiet -e '.[dev,simulate]'
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

# tests/dash/test_browser.py drives Debian's chromium through the dashboard (playwright, from
# the dev extra, is pointed at it and never downloads a browser).
CHROMIUM := /usr/bin/chromium

$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ]; then \
		(apt-get install -y -qq chromium >/dev/null 2>&1 \
		 || (apt-get update -qq && apt-get install -y -qq chromium)) >/dev/null; \
	else \
		echo "the tests need chromium: sudo apt-get install chromium"; \
		exit 1; \
	fi

# The tests' PostgreSQL: the one at $$FLEETGATE_TEST_PG_DSN (default 127.0.0.1:5432) when it
# answers, else tests/pg/with_postgres.py starts a throwaway one (Debian's server: initdb in a
# temporary directory, a free loopback port) and stops it when pytest ends.
PG_INITDB = $(firstword $(wildcard /usr/lib/postgresql/*/bin/initdb))

.PHONY: pg-server
pg-server: $(STAMP)
	@if [ -z "$(PG_INITDB)" ] && ! $(BIN)/python tests/pg/with_postgres.py --answers; then \
		if [ "$$(id -u)" = 0 ]; then \
			(apt-get install -y -qq postgresql >/dev/null 2>&1 \
			 || (apt-get update -qq && apt-get install -y -qq postgresql)) >/dev/null; \
		else \
			echo "no PostgreSQL answers and none is installed: sudo apt-get install postgresql"; \
			exit 1; \
		fi; \
	fi

test: $(STAMP) $(ALERTMANAGER) $(PROMTOOL) $(CHROMIUM) pg-server
	$(BIN)/python tests/pg/with_postgres.py -- $(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check controller escalation tests
	$(BIN)/ruff format --check controller escalation tests

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
