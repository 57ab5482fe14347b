# Developer entry points. `make test` works on a fresh machine with Python 3.11, Java 17+, Maven and the
# Postgres server binaries (.ci/run installs the last three when missing).

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PACKAGES := orchestrator outbox participants schemas infra cli client

.PHONY: venv up test demo down status lint

# Reinstall only when pyproject.toml changed since the last install.
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e ".[test]"
	@touch $@

up: venv
	$(BIN)/saga infra up

test: up
	$(BIN)/pytest -q

demo: up
	$(BIN)/saga demo

down: venv
	$(BIN)/saga infra down

status: venv
	$(BIN)/saga infra status

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy --strict $(PACKAGES) bench tests
