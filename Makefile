# Branchwater developer commands. Each target creates .venv from requirements.lock when missing.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
WHEELS := $(VENV)/wheelhouse
PYTEST_ARGS ?=
# Two pytest-xdist workers: the suite waits on JVMs, servers and Airflow as much as it computes.
TEST_WORKERS ?= 2

export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON ?= $(abspath $(BIN)/python)

.PHONY: install demo stack stack-down test test-fast coverage bench lint clean

install: $(STAMP)

# The lock's wheels are fetched by eight pip processes at once (one pip fetches one wheel after
# another, a second of index round trips each), then installed from the folder; the packaging
# test installs the built wheel offline from the same folder.
$(STAMP): requirements.lock pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "branchwater: $(PYTHON) is required but not on PATH" >&2; exit 1; }
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	grep -v '^#' requirements.lock | xargs -P 8 -n 32 $(BIN)/pip wheel --quiet \
		--disable-pip-version-check --no-deps -w $(WHEELS)
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-index \
		--find-links $(WHEELS) -r requirements.lock
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e .
	@scripts/install-browser
	@touch $(STAMP)

demo: $(STAMP)
	@scripts/check-env java
	$(BIN)/python -m branchwater.demo

stack: $(STAMP)
	@scripts/check-env java postgres
	$(BIN)/python -m branchwater.stack up

stack-down: $(STAMP)
	$(BIN)/python -m branchwater.stack down

test: $(STAMP)
	@scripts/check-env java postgres
	@scripts/install-browser
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not slow" $(PYTEST_ARGS)

# Statements the test processes run; code in Spark's Python workers, spark-submit and Airflow's
# own subprocesses is not measured.
coverage: $(STAMP)
	@scripts/check-env java postgres
	@scripts/install-browser
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --cov=engine --cov=plugin \
		--cov=spark_jobs --cov=stack --cov-report=term-missing:skip-covered $(PYTEST_ARGS)

bench: $(STAMP)
	@scripts/check-env java postgres
	$(BIN)/python -m tests.benchmarks $(if $(BACKEND),--backend $(BACKEND)) $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_layering.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .branchwater
