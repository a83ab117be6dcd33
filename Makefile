# The README's commands. `make setup` builds .venv with every dependency (torch included).
PYTHON ?= $(shell command -v python3.11 || command -v python3.12 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# A CPU torch wheel on this machine's disk (pip's find-links) saves a multi-GB CUDA download;
# on any other machine torch comes from PyPI as usual.
WHEELS ?= $(shell pip config get global.find-links 2>/dev/null)
LOCAL_TORCH := $(shell ls $(WHEELS)/torch-*.whl 2>/dev/null | head -n1 | sed -E 's/.*torch-([0-9.]+)[+-].*/\1/')
UV_EXTRA := $(if $(LOCAL_TORCH),--find-links $(WHEELS) torch==$(LOCAL_TORCH),)

.PHONY: setup test demo up down lint clean browser
PREFECT_PORT ?= 4200

setup: $(BIN)/rcpipe

$(BIN)/rcpipe: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade uv
	$(BIN)/uv pip install --python $(BIN)/python -e '.[dev]' $(UV_EXTRA)
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
	$(BIN)/python -m pytest

demo: setup
	$(BIN)/python -m flows.demo

# the embedded Prefect stack in the background: server (SQLite in .prefect/), work pool,
# worker, train-all/local; then `prefect deployment run train-all/local --watch`
up: setup
	$(BIN)/python -m flows.stack up --port $(PREFECT_PORT)

down:
	$(BIN)/python -m flows.stack down

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) data models predictions metrics .pytest_cache .prefect
