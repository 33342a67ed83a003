# The two set-up commands of README.md. Both create .venv when it is missing and re-install only
# when pyproject.toml or uv.lock changed (the stamp file below records the last install).
SHELL := /bin/bash
UV_VERSION := 0.13.8
# uv from PATH when the machine has it, else a private copy installed from PyPI into .tools/.
UV ?= $(or $(shell command -v uv 2>/dev/null),$(CURDIR)/.tools/bin/uv)
VENV := $(CURDIR)/.venv
STAMP := $(VENV)/.c2lip-installed

# No network beyond the package registries: never wait on the model hub, never phone home.
# Each can still be overridden from the environment, e.g. `HF_HUB_OFFLINE=0 make run`.
export HF_HUB_OFFLINE ?= 1
export DVC_NO_ANALYTICS ?= 1
export MLFLOW_DISABLE_TELEMETRY ?= true
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
# Prefect gives its ephemeral API server 20 s to start, which a busy 2-core machine exceeds (a first
# `make run` and the flow tests failed on it): wait up to 10 minutes instead; a server that cannot start
# still fails, with Prefect's own message.
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 600
export DO_NOT_TRACK ?= 1
# MkDocs 1.x plugins print a banner about a future MkDocs 2 on every build; the site builds with 1.x as pinned.
export NO_MKDOCS_2_WARNING ?= 1
export DISABLE_MKDOCS_2_WARNING ?= true
# uv must use this machine's Python 3.11, never try to download one.
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(VENV)
export PATH := $(VENV)/bin:$(PATH)
# Prefect keeps its local state (the ephemeral server's database, settings) inside the project.
export PREFECT_HOME ?= $(CURDIR)/.prefect

# DVC remotes besides S3 (installed with the project), on request: `make install REMOTES="gs azure"` (Google Cloud
# Storage, Azure Blob). The set is recorded in .venv, so a later install (a changed uv.lock) keeps it; asking for
# another set installs again.
REMOTES_FILE := $(VENV)/.c2lip-remotes
INSTALLED_REMOTES := $(strip $(shell cat $(REMOTES_FILE) 2>/dev/null))
REMOTES ?= $(INSTALLED_REMOTES)
# another set than the installed one: the stamp below depends on a phony target, so the install runs again
REMOTES_CHANGED := $(if $(filter-out $(INSTALLED_REMOTES),$(REMOTES))$(filter-out $(REMOTES),$(INSTALLED_REMOTES)),remotes-changed)

.PHONY: run test install serve compare clean-data example-run lint docs docs-serve params-reference

# The Prefect flow c2lip (deployment "full") once, locally: every DVC stage, DVC push, registration. A workspace another
# run holds is refused at once; `make run WAIT=600` queues behind it for up to 600 s (the same for `make compare`).
WAIT ?= 0
run: $(STAMP)
	python -m flows.c2lip full --wait $(WAIT)

# The comparison of methods (params/compare.yaml) as the Prefect flow c2lip/compare, once, locally:
# reports/compare.md and reports/compare.png (README "Comparing methods").
compare: $(STAMP)
	python -m flows.c2lip compare --wait $(WAIT)

# A local Prefect server on 127.0.0.1 serving the deployments c2lip/full, c2lip/evaluate, c2lip/promote, c2lip/compare,
# the reports and the MLflow UI; ports from PREFECT_PORT (4200), C2LIP_REPORTS_PORT (4201), C2LIP_MLFLOW_PORT (5000).
serve: $(STAMP)
	infra/serve.sh

# The suite runs on up to 4 pytest-xdist workers (2 on a 2-core machine), a test file per worker at a time
# (--dist loadfile: tests/test_end_to_end.py's tests share one reproduced clone), in the order tests/conftest.py gives
# them, the longest files first (--no-loadscope-reorder: pytest-xdist would start the files with the most tests first,
# leaving the long end-to-end files, which hold few tests, for last). `python -m pytest` runs it serially.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 4 ? n : 4 )))
test: $(STAMP)
	python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

install: $(STAMP)

# ruff with the rules of pyproject.toml ([tool.ruff]); CI runs it before the tests (seconds).
lint: $(STAMP)
	ruff check .

# The documentation site (MkDocs Material, mkdocs.yml) built into site/ (git-ignored); --strict: a broken link fails.
docs: $(STAMP)
	mkdocs build --strict

# The site served on 127.0.0.1 while you edit docs/: `make docs-serve DOCS_PORT=8001` for another port.
DOCS_PORT ?= 8000
docs-serve: $(STAMP)
	mkdocs serve --dev-addr 127.0.0.1:$(DOCS_PORT)

# docs/params.md, the params reference, written from the pydantic schema (a test fails when it is stale).
params-reference: $(STAMP)
	python docs/tools/params_reference.py > docs/params.md

# --compile-bytecode: Python's .pyc files written at install time. Machines that set PYTHONDONTWRITEBYTECODE
# (ours do) otherwise compile torch, DeepSpeed and MLflow from source in every new process: ~45 s of each
# stage subprocess, and most of `make test`'s time (a tiny train run: 85 s without, 26 s with; +70 s install).
.PHONY: remotes-changed
remotes-changed: ;

# uv prints nothing while it compiles the bytecode (minutes on a loaded 2-core machine): a line every 20 s says it works.
$(STAMP): pyproject.toml uv.lock $(REMOTES_CHANGED) | $(UV)
	@echo "install: the packages of uv.lock into .venv, then their bytecode compiled once (a few minutes on 2 cores)"
	@start=$$(date +%s); ( while sleep 20; do echo "install: still installing or compiling bytecode, $$(( $$(date +%s) - start )) s"; done ) & beat=$$!; \
	$(UV) sync --frozen --python 3.11 --compile-bytecode $(foreach remote,$(REMOTES),--extra $(remote)); status=$$?; \
	kill $$beat 2>/dev/null; exit $$status
	echo "$(REMOTES)" > $(REMOTES_FILE)
	touch $@

$(CURDIR)/.tools/bin/uv:
	python3 -m venv $(CURDIR)/.tools
	$(CURDIR)/.tools/bin/pip install --quiet uv==$(UV_VERSION)

# The generated data, metrics and reports (infra/clean_data.py): only the files a stage's record lists unchanged, never a
# committed one; data/sources (your tables and shards), your own files anywhere and the MLflow store stay, named.
clean-data:
	python3 infra/clean_data.py

# The latest run's report (reports/benchmarks.md, .png, metrics.json, intervals.json, plots/) kept as the shipped
# example run that the README and the docs show (reports/example-run/, committed): built in a fresh folder with its
# record of what it wrote and swapped in whole (infra/example_run.py); a file of yours there stops it, named.
example-run:
	python3 infra/example_run.py
