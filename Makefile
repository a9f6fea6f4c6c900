# offsetlake: `make demo` runs the pipeline end to end on the embedded stack; `make test` runs the tests.
# Everything installs into .venv from requirements.txt; nothing is installed by hand.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
DEMO   := .offsetlake
export OFFSETLAKE_HOME := $(CURDIR)
export SPARK_LOCAL_IP := 127.0.0.1
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: install test test-pyspark-low test-unit demo demo-cli screenshots down bench soak chaos chaos-tests chaos-harness clean prerequisites test-prerequisites jvm-archive jars docs lint

install: $(STAMP)

prerequisites:
	@.ci/system-packages.sh
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required")'

# What only the tests need beyond the demo's (a browser, network namespaces, Redis, promtool): never asked of
# `make install` or `make demo`.
test-prerequisites:
	@.ci/system-packages.sh tests

# uv installs the pinned requirements from PyPI as pip would, downloading in parallel: on a new machine 26 s
# where pip took 86 s (2026-11-26), minutes a fresh CI machine no longer spends before `make test` starts.
# Bytecode is written once here, for the packages and for offsetlake: uv leaves it to the first import,
# and where PYTHONDONTWRITEBYTECODE is set (as on this project's machines) no import ever writes it, so
# every process (each Spark driver and worker daemon, CLI run and Airflow task) would compile them again.
UV_VERSION := 0.13.9
UV := $(BIN)/python -m uv pip install --python $(BIN)/python --quiet

$(STAMP): requirements.txt pyproject.toml | prerequisites
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet uv==$(UV_VERSION)
	$(UV) --compile-bytecode -r requirements.txt
	$(UV) --no-deps -e .
	$(BIN)/python -m compileall -q src
	-$(BIN)/python -m offsetlake.read.native
	-$(BIN)/python -m offsetlake.formats.native
	touch $(STAMP)

# The JVM stacks' jars (the Apache Kafka broker; delta-spark for the tests; Kafka Connect with Debezium for change
# data capture), resolved from Maven Central by the POMs in
# src/offsetlake_local/poms/ into ~/.cache/offsetlake/jvm: once per machine, then a no-op. No jar is committed.
jars: $(STAMP)
	$(BIN)/python -m offsetlake_local.jars

# Spark's driver classes in one archive (JDK AppCDS): sessions start ~2 s sooner. Once per machine
# (about 20 s; kept in ~/.cache/offsetlake), then a no-op; if it fails, Spark just starts slower.
# See src/offsetlake/spark/jvm_archive.py.
jvm-archive: $(STAMP)
	-$(BIN)/python -m offsetlake.spark.jvm_archive

# The tests start their own Apache Kafka brokers (session fixtures, stopped by PID) and Spark.
test: test-prerequisites $(STAMP) jars jvm-archive
	$(BIN)/python -m pytest

# The low end of pyproject's pyspark range (>=4.0): a venv of its own with pyspark 4.0 (and delta-spark_4.0_2.13,
# poms/delta-spark-4.0.xml), running the suites that touch Spark and Delta. Not part of `make test` (its own venv
# takes minutes to install); its latest figures are in docs/development/tests.md.
LOW_VENV := .venv-pyspark-4.0
LOW_PYSPARK := 4.0.4
test-pyspark-low: $(STAMP) jars
	test -x $(LOW_VENV)/bin/python || $(PYTHON) -m venv $(LOW_VENV)
	sed '/^pyspark/d' requirements.txt > $(LOW_VENV)/requirements.txt  # the pins but pyspark's
	$(LOW_VENV)/bin/python -m pip install --quiet -r $(LOW_VENV)/requirements.txt \
		pyspark==$(LOW_PYSPARK) pyspark-client==$(LOW_PYSPARK)
	$(LOW_VENV)/bin/python -m pip install --quiet --no-deps -e .
	PATH=$(CURDIR)/$(LOW_VENV)/bin:$(PATH) $(LOW_VENV)/bin/python -m pytest -p no:cacheprovider \
		tests/integration/test_spark_session.py tests/integration/test_ingest.py tests/integration/test_delta_spark.py

test-unit: test-prerequisites $(STAMP)
	$(BIN)/python -m pytest tests/unit

# Fix what ruff can (lint and format); then what the checks in `make test` still find (ruff, mypy).
lint: $(STAMP)
	$(BIN)/ruff check --fix src tests docs dags plugins jobs
	$(BIN)/ruff format src tests docs dags plugins jobs
	$(BIN)/mypy

# The docs site (MkDocs, Material theme) in site/: the reference pages are regenerated from the code first
# (docs/generate.py), Mermaid fetched from npm to be served with it (docs/assets.py). `make test` builds it
# with --strict, fails on a stale generated page, and opens it offline in Chromium.
docs: $(STAMP)
	@.ci/system-packages.sh docs
	$(BIN)/python docs/generate.py
	$(BIN)/python docs/assets.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Broker, demo producer, Airflow (UI on 127.0.0.1:8080) with the demo DAGs unpaused and a first ingest run.
demo: $(STAMP) jars jvm-archive
	$(BIN)/python -m offsetlake_local.demo up

# Throughput next to the raw Kafka read rate, in one run; then the object-storage lines (an S3 table next to
# a local one, and HTTP requests per batch on a new and a 1,000-commit S3 table), the upsert lines and the
# change-data-capture line (PostgreSQL -> Debezium -> Kafka -> Delta: events/s and delay), and the two commit engines
# side by side (delta-rs, delta-spark, Spark's own Kafka source). Not part of make test.
bench: $(STAMP) jars jvm-archive
	$(BIN)/python tests/benchmarks/bench_ingest.py $(BENCH_ARGS)
	$(BIN)/python tests/benchmarks/bench_object_storage.py $(BENCH_S3_ARGS)
	$(BIN)/python tests/benchmarks/bench_upsert.py $(BENCH_UPSERT_ARGS)
	$(BIN)/python tests/benchmarks/bench_cdc.py $(BENCH_CDC_ARGS)
	$(BIN)/python tests/benchmarks/bench_engines.py $(BENCH_ENGINES_ARGS)

# 20,000 small commits: is a batch on a year-old table as cheap as on a new one? (not part of make test)
soak: $(STAMP) jars jvm-archive
	$(BIN)/python tests/benchmarks/bench_soak.py $(SOAK_ARGS)

# The docs' pictures of the Airflow UI (docs/images/), taken in Chromium from the running `make demo`.
screenshots: test-prerequisites $(STAMP)
	$(BIN)/python -m offsetlake_local.screenshots

# Stops everything `make demo` started, by pid file.
down:
	-test -x $(BIN)/python && $(BIN)/python -m offsetlake_local.demo down

# The pipeline without Airflow: broker, demo events, ingest, status and history.
demo-cli: $(STAMP) jars jvm-archive
	$(BIN)/offsetlake broker start --data-dir $(DEMO)/broker --pid-file $(DEMO)/broker.pid
	$(BIN)/offsetlake produce --pipeline demo_events --count 20000 --abort-share 0.2 --bad-share 0.002
	$(BIN)/offsetlake ingest --pipeline demo_events
	$(BIN)/offsetlake status --pipeline demo_events
	$(BIN)/offsetlake history --pipeline demo_events

clean: down
	rm -rf $(DEMO)

# The tests marked `long` (faults the short chaos run injects too, tried at length: not in `make test`), then
# hundreds of injected crashes and a row-by-row audit (CHAOS_ARGS="--faults 200 --seed N"). Each half alone:
# `make chaos-tests`, `make chaos-harness`.
chaos: chaos-tests chaos-harness

chaos-tests: test-prerequisites $(STAMP) jars jvm-archive
	$(BIN)/python -m pytest -m long

chaos-harness: $(STAMP) jars jvm-archive
	$(BIN)/python tests/chaos/harness.py $(CHAOS_ARGS)
