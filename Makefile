# Developer entry points. `make test` works on a fresh machine with Python 3.11, Java 17+, Maven and the
# Postgres server binaries (.ci/run installs the last three when missing).

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PARTS := orchestrator outbox participants schemas infra cli client testing console authoring operations
# mypy and import-linter do not follow the editable install's import hook, so they read the package through a
# tree of links: build/typecheck/saga_orchestrator/<part> -> <part>.
TYPECHECK := build/typecheck
# What `make demo` runs: the example trip, named as a deployment names its app (no setting defaults to it).
DEMO_APP := saga_orchestrator.participants.trip:app

.PHONY: venv up test demo down status lint docs reference tree screenshots

# Reinstall only when pyproject.toml or constraints.txt changed since the last install.
venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt -e ".[test]"
	@touch $@

up: venv
	$(BIN)/saga infra up

# Two workers, each test file on one of them (its module fixtures, stacks and topics stay together).
test: up
	$(BIN)/pytest -q -n 2 --dist loadfile --durations=30

demo: up
	SAGA_APP=$(DEMO_APP) $(BIN)/saga demo

down: venv
	$(BIN)/saga infra down

status: venv
	$(BIN)/saga infra status

tree:
	@mkdir -p $(TYPECHECK)/saga_orchestrator
	@for part in $(PARTS); do ln -sfn ../../../$$part $(TYPECHECK)/saga_orchestrator/$$part; done

lint: venv tree
	$(BIN)/ruff check .
	MYPYPATH=$(TYPECHECK) $(BIN)/mypy --strict -p saga_orchestrator -p bench -p tests -p examples
	PYTHONPATH=$(TYPECHECK) $(BIN)/lint-imports

# The documentation site (docs/) in build/site; --strict: a broken link fails. docs/reference.md is written from
# the code (`make reference`); a test fails while it is out of date.
docs: venv reference
	$(BIN)/mkdocs build --strict --quiet

reference: venv
	$(BIN)/python -m tests.reference

# The console's pictures in docs/console/ (the README and docs/console.md show them): its browser tests, keeping a
# screenshot of each page they visit.
screenshots: up
	SAGA_SCREENSHOTS=docs/console $(BIN)/pytest -q tests/browser
