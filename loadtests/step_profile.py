"""Where one decode step's time goes: a per-op breakdown at B=1 and B=32.

Runs ``ModelRunner.execute`` on B decode tokens at a context of
``--context`` tokens, in each weight format asked for (default: ``auto``,
what ``bargein serve`` picks here, and exact fp32), and times every call the
step makes into the kernel ops and the linear layers by wrapping them
(the CPU runs them synchronously, so a wall-clock pair around each call is
its cost). Categories:

- GEMMs: ``qkv``, ``o_proj``, ``gate_up``, ``down`` (all layers), ``lm_head``;
- ``attention`` (paged decode attention), ``rms_norm`` (with the residual
  add), ``rotary``, ``silu_and_mul``, ``kv_write``;
- ``rest``: the step's wall time minus all of those (Python between the
  calls, input and metadata preparation, the embedding lookup, views).

The wrappers cost about a microsecond per call (``overhead`` row: the same
step unwrapped, measured alternately). Medians of ``--reps`` steps.

Usage: ``python loadtests/step_profile.py [--sizes 1,32] [--formats auto,float32]``
writes ``docs/perf/step-profile.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from bargein.engine.config import CacheConfig, ModelConfig  # noqa: E402
from bargein.engine.model_runner import ModelRunner, SeqInput  # noqa: E402

BLOCK_SIZE = 16
OPS = {
    "paged_attention_decode": "attention",
    "rms_norm": "rms_norm",
    "rotary_embedding": "rotary",
    "silu_and_mul": "silu_and_mul",
    "write_kv_cache": "kv_write",
}
LINEARS = ("qkv", "o_proj", "gate_up", "down")
ORDER = (
    "qkv",
    "o_proj",
    "gate_up",
    "down",
    "lm_head",
    "attention",
    "rms_norm",
    "rotary",
    "silu_and_mul",
    "kv_write",
    "rest",
)


class Timers:
    """Summed seconds per category during one step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start

        return timed


class _TimedLinear:
    """A linear layer whose calls are timed (forwards attributes to the layer)."""

    def __init__(self, inner: Any, timed: Callable[..., Any]) -> None:
        self._inner = inner
        self._timed = timed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._timed(x)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _TimedGatedLinear(_TimedLinear):
    """A down projection that does the SiLU-mul itself (``gated``): timed as
    the linear, SiLU-mul included."""

    def __init__(self, inner: Any, timed: Callable[..., Any], timed_gated: Callable[..., Any]) -> None:
        super().__init__(inner, timed)
        self.gated = timed_gated


def instrument(runner: ModelRunner, timers: Timers) -> Callable[[], None]:
    """Wrap the model's ops and linears; returns the undo."""
    model = runner.model
    undo: list[Callable[[], None]] = []
    ops = model.ops  # a frozen table: swapped for a timed copy
    timed = {op: timers.wrap(name, getattr(ops, op)) for op, name in OPS.items()}
    if ops.decode_attention is not None:  # built once per step: its per-layer calls are timed
        build = ops.decode_attention
        # fused with rotary and the KV write on decode-only CPU steps
        timed["decode_attention"] = lambda *args: timers.wrap("attention", build(*args))
    model.ops = dataclasses.replace(ops, **timed)
    undo.append(lambda: setattr(model, "ops", ops))
    for layer in model.layers:
        for attr in LINEARS:
            inner = getattr(layer, attr)
            wrapped = (
                _TimedGatedLinear(inner, timers.wrap(attr, inner), timers.wrap(attr, inner.gated))
                if hasattr(inner, "gated")
                else _TimedLinear(inner, timers.wrap(attr, inner))
            )
            object.__setattr__(layer, attr, wrapped)
            undo.append(lambda layer=layer, attr=attr, inner=inner: object.__setattr__(layer, attr, inner))
    head = model.lm_head
    model.lm_head = _TimedLinear(head, timers.wrap("lm_head", head))
    undo.append(lambda: setattr(model, "lm_head", head))

    def restore() -> None:
        for fn in reversed(undo):
            fn()

    return restore


def step_inputs(runner: ModelRunner, batch: int, context: int) -> list[SeqInput]:
    per = -(-(context + 1) // BLOCK_SIZE)
    return [
        SeqInput(
            token_ids=[i + 1], start_pos=context, block_table=list(range(i * per, (i + 1) * per)), sample=True
        )
        for i in range(batch)
    ]


def profile(fmt: str, batch: int, context: int, reps: int) -> dict[str, float]:
    """Median milliseconds per category of one step, plus ``step`` and ``overhead``."""
    quantization, linear_dtype = {
        "auto": ("auto", "auto"),
        "float32": ("none", "float32"),
        "bfloat16": ("none", "bfloat16"),
        "int8": ("int8", "float32"),
    }[fmt]
    per = -(-(context + 1) // BLOCK_SIZE)
    runner = ModelRunner(
        ModelConfig(device="cpu", dtype="float32", quantization=quantization, linear_dtype=linear_dtype),  # type: ignore[arg-type]
        CacheConfig(block_size=BLOCK_SIZE, num_blocks=batch * per),
        context + 1,
    )
    seqs = step_inputs(runner, batch, context)
    with torch.inference_mode():
        for _ in range(3):
            runner.execute(seqs)  # warm-up: oneDNN primitives, numba, the allocator
        plain, wrapped, parts = [], [], defaultdict(list)
        for _ in range(reps):
            start = time.perf_counter()
            runner.execute(seqs)
            plain.append(time.perf_counter() - start)
            timers = Timers()
            restore = instrument(runner, timers)
            start = time.perf_counter()
            runner.execute(seqs)
            total = time.perf_counter() - start
            restore()
            wrapped.append(total)
            for name in ORDER[:-1]:
                parts[name].append(timers.seconds.get(name, 0.0))
            parts["rest"].append(total - sum(timers.seconds.values()))
    ms = {name: 1e3 * statistics.median(v) for name, v in parts.items()}
    ms["step"] = 1e3 * statistics.median(plain)
    ms["overhead"] = 1e3 * (statistics.median(wrapped) - statistics.median(plain))
    ms["format"] = runner.linear_format  # type: ignore[assignment]
    return ms


def report(
    rows: list[tuple[str, int, dict[str, Any]]], args: argparse.Namespace, load: tuple[str, str]
) -> str:
    lines = [
        "# One decode step, op by op (CPU)",
        "",
        f"Written by `loadtests/step_profile.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"SmolLM2-135M-Instruct, context {args.context} tokens, {torch.get_num_threads()} threads, "
        f"medians of {args.reps} steps; load average {load[0]} at the start, {load[1]} at the end.",
        "",
        "Each op's share of `ModelRunner.execute` (one decode token for each of B sequences, "
        "logits of all B rows). *rest* is the step's wall time minus the timed calls: Python "
        "between them, input and metadata preparation, the embedding lookup.",
        "",
    ]
    header = "| format | B | step ms | " + " | ".join(ORDER) + " | timer overhead |"
    lines += [header, "|" + " --- |" * (len(ORDER) + 4)]
    for fmt, batch, ms in rows:
        cells = [f"{ms[name]:.2f} ({100 * ms[name] / max(ms['step'], 1e-9):.0f}%)" for name in ORDER]
        lines.append(
            f"| {fmt} ({ms['format']}) | {batch} | {ms['step']:.2f} | "
            + " | ".join(cells)
            + f" | {ms['overhead']:.2f} |"
        )
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,32")
    parser.add_argument("--formats", default="auto,float32")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--out", default="docs/perf/step-profile.md")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    load_start = " ".join(f"{x:.1f}" for x in os.getloadavg())
    rows = []
    for fmt in args.formats.split(","):
        for batch in (int(s) for s in args.sizes.split(",")):
            ms = profile(fmt, batch, args.context, args.reps)
            rows.append((fmt, batch, ms))
            print(
                fmt,
                batch,
                {k: (round(v, 2) if isinstance(v, float) else v) for k, v in ms.items()},
                flush=True,
            )
    load_end = " ".join(f"{x:.1f}" for x in os.getloadavg())
    text = report(rows, args, (load_start, load_end))
    print(text)
    Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
