"""Step time of the fixed-order CPU attention against the kernels it replaced, same run.

Issue 37's attention part: every CPU attention path now reads the KV in
tiles of ``cpu_attention.TILE_TOKENS`` merged in order (bit for bit the
same output on every path). This measures what that costs. One
``ModelRunner`` (default flags: the format ``bargein serve`` picks here)
runs decode steps of B sequences at a context of ``--context`` tokens and a
prefill of ``--prefill`` tokens, with the model's attention ops swapped
step by step between the current kernels and the baseline's
(``engine/kernels/cpu_fused.py`` and ``cpu_attention.py`` as of
``--baseline``, loaded from git into this process): the same weights, the
same linear layers, alternating A B B A so load drifts hit both alike.
Medians of ``--reps``. Writes ``docs/perf/attention-order.md``.

Usage: ``python loadtests/attention_order_bench.py [--sizes 1,8,32] [--context 128]
[--prefill 512] [--reps 20] [--baseline REV]``
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout

from bargein.engine.config import CacheConfig, ModelConfig  # noqa: E402
from bargein.engine.kernels import Ops  # noqa: E402
from bargein.engine.model_runner import ModelRunner, SeqInput  # noqa: E402

BLOCK = 16


def _load_baseline(rev: str, folder: Path) -> tuple[ModuleType, ModuleType]:
    """``(cpu_attention, cpu_fused)`` as of ``rev``, imported under other names
    (their numba caches go beside the copies, in ``folder``)."""
    modules = []
    for name in ("cpu_attention", "cpu_fused"):
        source = subprocess.run(
            ["git", "show", f"{rev}:engine/kernels/{name}.py"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        path = folder / f"baseline_{name}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(f"baseline_{name}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules.append(module)
    return modules[0], modules[1]


def _ops(base: Ops, attention: ModuleType, fused: ModuleType) -> Ops:
    return dataclasses.replace(
        base,
        paged_attention_decode=attention.paged_attention_decode_cpu,
        paged_attention_prefill=attention.paged_attention_prefill_cpu,
        decode_attention=fused.DecodeAttention,
    )


def _time(
    runner: ModelRunner, ops: dict[str, Ops], seqs: list[SeqInput], reps: int
) -> dict[str, list[float]]:
    """ms of ``runner.execute(seqs)`` per ops variant, A B B A."""
    times: dict[str, list[float]] = {name: [] for name in ops}
    names = list(ops)
    for name in names:  # warm-up: compiles, caches
        runner.model.ops = ops[name]
        runner.execute(seqs)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else reversed(names):
            runner.model.ops = ops[name]
            t = time.perf_counter()
            runner.execute(seqs)
            times[name].append((time.perf_counter() - t) * 1e3)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1,8,32")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--baseline", default="1ce555f^", help="git revision of the kernels to compare against")
    p.add_argument("--out", default=str(ROOT / "docs" / "perf" / "attention-order.md"))
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    per_seq = math.ceil((max(args.context, args.prefill) + 1) / BLOCK)
    load_before = os.getloadavg()
    runner = ModelRunner(
        ModelConfig(device="cpu"),
        CacheConfig(num_blocks=max(sizes) * per_seq, block_size=BLOCK),
        max(args.context, args.prefill) + 16,
    )
    from bargein.engine.kernels import cpu_attention, cpu_fused

    with tempfile.TemporaryDirectory() as folder:
        old_attention, old_fused = _load_baseline(args.baseline, Path(folder))
        ops = {
            "baseline": _ops(runner.model.ops, old_attention, old_fused),
            "fixed order": _ops(runner.model.ops, cpu_attention, cpu_fused),
        }
        rows = []
        for b in sizes:
            seqs = [
                SeqInput(
                    token_ids=[100 + j],
                    start_pos=args.context,
                    block_table=list(range(j * per_seq, (j + 1) * per_seq)),
                    sample=True,
                )
                for j in range(b)
            ]
            rows.append((f"decode B={b}, context {args.context}", _time(runner, ops, seqs, args.reps)))
            print(
                rows[-1][0], {n: round(statistics.median(t), 2) for n, t in rows[-1][1].items()}, flush=True
            )
        prompt = SeqInput(
            token_ids=[(7 * i) % 1000 + 10 for i in range(args.prefill)],
            start_pos=0,
            block_table=list(range(per_seq)),
            sample=True,
        )
        rows.append(
            (f"prefill of {args.prefill} tokens", _time(runner, ops, [prompt], max(4, args.reps // 4)))
        )
        print(rows[-1][0], {n: round(statistics.median(t), 2) for n, t in rows[-1][1].items()}, flush=True)
    lines = [
        "# Fixed-order CPU attention: step time against the kernels it replaced",
        "",
        f"`python loadtests/attention_order_bench.py --sizes {args.sizes} --context {args.context} "
        f"--prefill {args.prefill} --reps {args.reps} --baseline {args.baseline}` "
        f"({time.strftime('%Y-%m-%d %H:%M')}, torch {torch.__version__}, {platform.machine()}, "
        f"{os.cpu_count()} cores, {torch.get_num_threads()} threads, linear format {runner.linear_format}, "
        f"KV cache {str(runner.kv_caches.dtype).removeprefix('torch.')}; load average "
        f"{' '.join(f'{x:.1f}' for x in load_before)} at the start, "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end).",
        "",
        "One `ModelRunner`, its attention ops swapped step by step (A B B A) between the baseline's "
        "kernels and the fixed-order ones; everything else is the same code. Median ms "
        "(prefill: of a quarter as many reps); decode tok/s is B / step time.",
        "",
        "| step | baseline ms | fixed order ms | fixed / baseline |",
        "|---|---:|---:|---:|",
    ]
    for label, times in rows:
        old, new = statistics.median(times["baseline"]), statistics.median(times["fixed order"])
        lines.append(f"| {label} | {old:.2f} | {new:.2f} | {new / old:.3f} |")
    lines.append("")
    Path(args.out).write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
