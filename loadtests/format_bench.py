"""Decode step time per linear-layer format on the bundled model, same run.

For each format (fp32 exact, bf16, int8 W8A8 smoothed with its head and edge layers in bf16,
int4: the checkpoint's 4-bit weights and an int8 head at a few rows, fp32 above) a
``ModelRunner`` runs one decode step of B sequences at a context of
``--context`` tokens (``ModelRunner.execute``: inputs prepared, paged
attention, logits of all B rows). Formats alternate rep by rep, so load
drifts hit all alike; medians of ``--reps``. Writes ``docs/perf/formats.md``.

Usage: ``python loadtests/format_bench.py [--sizes 1,8,32] [--context 128] [--reps 20] [--formats fp32,int4]``
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from bargein.engine.config import CacheConfig, ModelConfig  # noqa: E402
from bargein.engine.model.linear import choose_linear_format, make_linear  # noqa: E402
from bargein.engine.model_runner import ModelRunner, SeqInput  # noqa: E402

BLOCK = 16
# int8 is smoothed, with its head and edge layers in bf16 (engine/model/smooth.py)
FORMATS = {
    "fp32": ("none", "float32", None),
    "bf16": ("none", "bfloat16", None),
    "int8": ("int8", "auto", None),
    "int4": ("int4", "auto", None),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1,8,32")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--formats", default=",".join(FORMATS), help="comma list of " + ", ".join(FORMATS))
    p.add_argument(
        "--out", default=str(Path(__file__).resolve().parent.parent / "docs" / "perf" / "formats.md")
    )
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    per_seq = math.ceil((args.context + 1) / BLOCK)
    runners = {}
    names = [n.strip() for n in args.formats.split(",")]
    if names[0] != "fp32":
        names.insert(0, "fp32")  # the baseline of every ratio
    for name in names:
        q, ld, head = FORMATS[name]
        r = ModelRunner(
            ModelConfig(device="cpu", quantization=q, linear_dtype=ld),
            CacheConfig(num_blocks=max(sizes) * per_seq, block_size=BLOCK),
            args.context + 16,
        )
        if head is not None:
            r.model.lm_head = make_linear(r.model.embed, None, head)  # type: ignore[arg-type]
        runners[name] = r
    times: dict[tuple[str, int], list[float]] = {}
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
        for r in runners.values():
            for _ in range(5):
                r.execute(seqs)
        for _ in range(args.reps):
            for name, r in runners.items():
                t = time.perf_counter()
                r.execute(seqs)
                times.setdefault((name, b), []).append((time.perf_counter() - t) * 1e3)
        line = "  ".join(f"{n} {statistics.median(times[(n, b)]):.1f}" for n in runners)
        print(f"B={b}: {line} ms", flush=True)
    auto, why = choose_linear_format("auto", "auto", device_type="cpu", dtype="float32")
    lines = [
        "# Decode step time per linear-layer format",
        "",
        f"`python loadtests/format_bench.py --sizes {args.sizes} --context {args.context} --reps {args.reps} "
        f"--formats {','.join(names)}` "
        f"({time.strftime('%Y-%m-%d')}, torch {torch.__version__}, {platform.machine()}, "
        f"{os.cpu_count()} cores, {torch.get_num_threads()} threads). One `ModelRunner.execute` of B decode "
        f"tokens at a context of {args.context} (attention, norms, logits included), median ms of "
        f"{args.reps}, formats alternating. `auto` here: **{auto}** ({why}).",
        "",
        "| format | " + " | ".join(f"B={b} ms (x vs fp32)" for b in sizes) + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    for n in runners:
        cells = []
        for b in sizes:
            m, f = statistics.median(times[(n, b)]), statistics.median(times[("fp32", b)])
            cells.append(f"{m:.1f} ({f / m:.2f}x)")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += ["", "Quality of each format: docs/perf/quality.md.", ""]
    Path(args.out).write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
