# The README's commands. `make setup` builds .venv with every dependency (torch included).
PYTHON ?= $(shell command -v python3.11 || command -v python3.12 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# uv.lock pins every package (`uv lock` writes it, this uv reads it): setup installs rcpipe
# with the lock's versions as constraints, so each package is the locked one.
UV_VERSION := 0.13.9
# A CPU wheel of the locked torch on this machine's disk (pip's find-links) saves the
# multi-GB CUDA download: `torch==2.13.0` in the lock is satisfied by 2.13.0+cpu (PEP 440).
# Anywhere else, or for another Python, torch comes from PyPI as locked.
WHEELS ?= $(shell pip config get global.find-links 2>/dev/null)
LOCKED_TORCH := $(shell sed -n '/^name = "torch"$$/{n;s/^version = "\(.*\)"$$/\1/p;}' uv.lock)
PY_TAG := $(shell $(PYTHON) -c 'import sys; print("cp%d%d" % sys.version_info[:2])' 2>/dev/null)
LOCAL_TORCH := $(firstword $(wildcard $(WHEELS)/torch-$(LOCKED_TORCH)+cpu-$(PY_TAG)-*.whl))

.PHONY: setup test test-fast demo dvc-demo up down lint clean browser gpu-kit docs
PREFECT_PORT ?= 4200
# pytest workers for make test (pytest-xdist): the suite waits much of its time on Ray,
# Prefect and dvc start-ups, so two workers on 2 cores took 666-679 s on clean clones against
# 992 s on one (790-821 s since the searches through a Jobs API and with a GPU joined).
# --dist loadfile: a file's tests stay on one worker, in order, so its module fixtures (a
# dvc repro, a Prefect stack) run once; --no-loadscope-reorder: files in the order
# tests/conftest.py gives them, the long ones first, so no worker ends alone on one.
# TEST_WORKERS=0: one process, no xdist.
TEST_WORKERS ?= 2
# make test-fast: the tests that start no Ray, Prefect or S3 server and train no model
# (pyproject.toml's markers; docs/dev/testing.md), under the marker audit
# (tests/marker_audit/): one of them that starts such a thing fails instead
FAST_TESTS := not integration and not trains and not slow

setup: $(BIN)/rcpipe

$(BIN)/rcpipe: pyproject.toml uv.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet uv==$(UV_VERSION)
	@# --locked: a pyproject.toml changed without `uv lock` stops here rather than drift
	$(BIN)/uv export --locked --quiet --python $(BIN)/python --no-hashes --no-emit-project \
	  --extra dev --output-file $(VENV)/locked.txt
	$(BIN)/uv pip install --python $(BIN)/python -e '.[dev]' -c $(VENV)/locked.txt $(LOCAL_TORCH)
	@# this machine sets PYTHONDONTWRITEBYTECODE: without .pyc files every import recompiles
	@# (spaCy alone: 8 s per process), so compile once here
	$(BIN)/python -m compileall -q -j0 $(VENV)/lib > /dev/null || true
	@touch $@

# Debian's headless Chromium and its WebDriver, for the web page's test (tests/serve/)
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y \
	    -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core > /dev/null; \
	fi
	@/usr/bin/chromium --version

test: setup
	$(BIN)/ruff check .
	@# the project's own modules too (PYTHONDONTWRITEBYTECODE, above): every Ray worker,
	@# `rcpipe` and flow process of the suite imports them (~0.2 s a process saved)
	$(BIN)/python -m compileall -q -j0 rcpipe flows bench tests > /dev/null
	@# one torch/OpenMP thread a process: two workers with two threads each on two cores
	@# spin against each other (25 min instead of 12)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile \
	  --no-loadscope-reorder

test-fast: setup
	$(BIN)/ruff check .
	$(BIN)/python -m compileall -q -j0 rcpipe flows bench tests > /dev/null
	RCPIPE_MARKER_AUDIT=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) \
	  --dist loadfile --no-loadscope-reorder -m "$(FAST_TESTS)"

demo: setup
	$(BIN)/python -m flows.demo

# `dvc repro` on the demo preset in one step: params.yaml becomes the demo's with every key
# (`rcpipe config`: DVC reads each key dvc.yaml lists from the file itself), the synthetic
# SQuAD files are written, then `dvc repro $(DVC_TARGETS)` (all by default). A params.yaml
# with changes of yours is refused, not overwritten; `git restore params.yaml` puts the
# papers' one back. Again: what changed runs, the same table as make demo.
dvc-demo: setup
	@$(BIN)/rcpipe config --params params.demo.yaml > .params.demo.tmp
	@if ! cmp -s .params.demo.tmp params.yaml && ! git diff --quiet -- params.yaml; then \
	  rm -f .params.demo.tmp; echo "error: params.yaml: has changes of yours; commit or move \
	them, then make dvc-demo again (git restore params.yaml undoes them)" >&2; exit 2; fi
	@mv .params.demo.tmp params.yaml
	$(BIN)/rcpipe synth
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro $(DVC_TARGETS)

# the documentation site into site/ (ignored): MkDocs + Material, strict (mkdocs.yml), so a
# broken link or anchor, or a page under docs/ missing from the nav, fails; the reference
# pages are generated first (python -m rcpipe.docs_reference: the CLI and the params)
docs: setup
	$(BIN)/python -m rcpipe.docs_reference
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --site-dir site

# the embedded Prefect stack in the background: server (SQLite in .prefect/), work pool,
# worker, train-all/local; then `prefect deployment run train-all/local --watch`
up: setup
	$(BIN)/python -m flows.stack up --port $(PREFECT_PORT)

down:
	$(BIN)/python -m flows.stack down

# gpu-kit/ (ignored): what a bare GPU box lacks, carried into device calls (bench/gpu/README.md).
# It needs the registry and ../shared/data/squad-split, so no test or CI target runs it
gpu-kit: setup
	$(BIN)/python bench/gpu/build.py

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) data models predictions metrics .pytest_cache .prefect site
