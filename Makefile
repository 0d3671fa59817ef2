# The project's commands. `make demo` and `make test` are all a newcomer needs.
# The first target that needs the virtual environment creates it (.venv, git-ignored)
# and installs the project with its dev extras; downloads are cached in .cache/ (ignored).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PIP_CACHE_DIR := $(CURDIR)/.cache/pip
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test test-unit lint bench stack-down clean
.PHONY: test-broker chaos cdc-recovery

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

## demo: the main job on the local stack (starts a private Postgres; `make stack-down` stops it)
demo: $(STAMP)
	$(BIN)/outbox demo

## test: the whole test suite against real services started by the suite itself, in
## TEST_WORKERS processes (2; each with services of its own under .stack/gw<N>/)
## (PYTEST_ARGS narrows it, e.g. `make test PYTEST_ARGS=tests/unit`)
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

## test-unit: only the tests that need no service (`-m "not integration"`: no PostgreSQL,
## broker or Connect is started; tests/conftest.py marks everything under tests/integration)
test-unit: $(STAMP)
	$(BIN)/pytest -m "not integration" $(PYTEST_ARGS)

## test-broker: the broker conformance suite, on the local Apache Kafka or on your own cluster:
## `make test-broker OUTBOX_KAFKA_BOOTSTRAP_SERVERS=host:port`
test-broker: $(STAMP)
	$(BIN)/pytest tests/broker $(PYTEST_ARGS)

## chaos: the whole pipeline under load while faults are injected, on a stack of its own,
## checked against its own ground truth and `outbox reconcile` (about 10 minutes; not part of
## `make test`). ARGS=--short: 3 to 4 minutes, as CI runs it; ARGS='--seed N' replays a run.
chaos: $(STAMP)
	$(BIN)/python -m chaos $(ARGS)

## cdc-recovery: does CDC come back by itself after the broker and Connect are killed together,
## or the broker paused? On a stack of its own, ARGS rounds (e.g. ARGS='--rounds 20 --pauses');
## each failed round keeps its evidence under .stack/cdc-recovery/evidence/ (not in `make test`)
cdc-recovery: $(STAMP)
	$(BIN)/python -m chaos.cdc_recovery $(ARGS)

## lint: ruff and mypy --strict on the package code
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy -p outbox -p outbox_cli -p outbox_connect -p outbox_console -p outbox_examples -p outbox_lake -p outbox_migrations -p outbox_reconcile -p outbox_relay -p outbox_stack -p chaos -p tools

## bench: every benchmark, then docs/benchmarks.md with plots and JSON results (ARGS=--quick: smoke sizes)
bench: $(STAMP)
	$(BIN)/python -m benchmarks.report $(ARGS)

stack-down: $(STAMP)
	$(BIN)/outbox stack down

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
