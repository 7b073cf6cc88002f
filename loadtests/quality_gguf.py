"""Quality of the block kernels per GGUF type, against the file's own weights in fp32.

For each GGUF file given, bargein serves it twice: ``--quantization none``
(the file's blocks dequantized to fp32 by the ``gguf`` package, exact fp32
arithmetic: the reference) and ``auto`` (the block kernels on the file's
blocks and int8 activations per row and block of 32). Teacher-forced over
``loadtests/data/quality_text.txt`` as ``quality.py`` does, in prefill
chunks of 64 rows (the block path's rows come out the same bits at any
chunk, a decode step's included: issue 37): mean KL(fp32 || blocks) in
nats/token and top-1 agreement. So what
is measured is what the kernels add to the file's own quantization: the
int8 rounding of the activations, and the Q8_0 requantization of any tensor
of a type without a kernel.

The files are the bundled SmolLM2-135M-Instruct requantized by llama.cpp's
``llama-quantize`` (a benchmark-only build of the same source as
``peer_bench.py``'s llama-server) with ``--allow-requantize``, one type
each. SmolLM2's 576-wide rows are not whole K-quant super-blocks of 256, so
llama-quantize puts those tensors in its fallback types (Q5_0, Q5_1, Q8_0)
and only the down projections (1,536 inputs) and the head take the K-quant:
the report lists each file's types.

Usage: ``python loadtests/quality_gguf.py /tmp/smol-Q4_K.gguf /tmp/smol-Q6_K.gguf ...``
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from quality import BLOCK, TEXT, teacher_forced_logits  # noqa: E402

from bargein.engine.config import CacheConfig, ModelConfig  # noqa: E402
from bargein.engine.model.gguf_file import read_gguf  # noqa: E402
from bargein.engine.model_runner import ModelRunner  # noqa: E402

ROWS = 64


def logprobs(path: Path, quantization: str, ids: list[int]) -> tuple[torch.Tensor, str]:
    runner = ModelRunner(
        ModelConfig(path=str(path), quantization=quantization),
        CacheConfig(num_blocks=math.ceil(len(ids) / BLOCK) + 1, block_size=BLOCK),
        len(ids) + BLOCK,
    )
    logits = teacher_forced_logits(runner, ids, ROWS)[:-1]
    return torch.log_softmax(logits.double(), dim=-1), runner.linear_format


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent.parent / "docs/perf/quality-gguf.md"
    )
    args = p.parse_args()
    rows = []
    for path in args.files:
        started = time.perf_counter()
        types = Counter(
            t.ggml_type.name for t in read_gguf(path).tensors.values() if t.ggml_type.name != "F32"
        )
        runner_ids = ModelRunner(
            ModelConfig(path=str(path), quantization="none"), CacheConfig(num_blocks=4, block_size=BLOCK), 64
        ).tokenizer(TEXT.read_text())["input_ids"]
        ref, _ = logprobs(path, "none", runner_ids)
        got, fmt = logprobs(path, "auto", runner_ids)
        kl = float((ref.exp() * (ref - got)).sum(-1).mean())
        top1 = float((ref.argmax(-1) == got.argmax(-1)).double().mean())
        target = torch.tensor(runner_ids[1:])
        nll_ref = float(-ref.gather(1, target[:, None]).mean())
        nll = float(-got.gather(1, target[:, None]).mean())
        kinds = ", ".join(f"{n} {t}" for t, n in types.most_common())
        rows.append((path.name, kinds, fmt, kl, top1, nll_ref, nll))
        print(f"{path.name}: KL {kl:.5f} top1 {top1:.4f} nll {nll_ref:.4f} -> {nll:.4f} "
              f"({time.perf_counter() - started:.0f} s)", flush=True)  # fmt: skip
    lines = [
        "# Block kernels per GGUF type: quality against the file's own weights in fp32 (issue 42)",
        "",
        f"`python loadtests/quality_gguf.py FILES` ({time.strftime('%Y-%m-%d')}, torch {torch.__version__}, "
        f"{platform.machine()}, {os.cpu_count()} cores). Teacher-forced over {len(runner_ids)} tokens of "
        f"`loadtests/data/quality_text.txt` in steps of {ROWS} rows. Reference: the same file dequantized "
        "to fp32 (`--quantization none`); measured: `auto`, the file's blocks on int8 activations. Files: the "
        "bundled SmolLM2-135M-Instruct requantized by `llama-quantize --allow-requantize` (its 576-wide "
        "tensors fall back to Q5_0/Q5_1/Q8_0, which bargein runs as Q8_0).",
        "",
        "| file | matrices by type | format | mean KL (nats/token) | top-1 agreement | NLL fp32 -> blocks |",
        "|---|---|---|---:|---:|---:|",
    ]
    for name, kinds, fmt, kl, top1, nll_ref, nll in rows:
        lines.append(f"| {name} | {kinds} | {fmt} | {kl:.5f} | {top1:.2%} | {nll_ref:.4f} -> {nll:.4f} |")
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
