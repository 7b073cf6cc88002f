"""One decode step, bargein against transformers, beside the GEMM floor of this CPU.

Where ``engine_bench.py`` times whole requests, this times a single decode
step of B sequences at a context of ``--context`` tokens, three ways, in the
same process and alternating (so load drifts hit all three):

- bargein: ``ModelRunner.execute`` on B decode tokens (inputs prepared, the
  paged KV cache read and written, logits of all B rows);
- transformers: one forward of ``LlamaForCausalLM`` on ``[B, 1]`` tokens
  with a ``DynamicCache`` holding the context (what ``generate`` runs per
  step, without its logits processors);
- the GEMM floor: only the model's matrix products for B rows (fused q/k/v,
  o, fused gate/up, down for every layer, and the output head), through the
  fastest GEMM bargein has (oneDNN prepacked weights, ``engine/model/linear.py``).
  No engine can do a decode step faster than its GEMMs in fp32, so
  ``transformers step / GEMM floor`` bounds the speed-up any fp32 engine can
  reach over transformers on this machine.

Also the machine's fp32 GEMM peak (a 2048^3 matrix product) and memory
bandwidth (a 256 MB copy), measured at the start. Medians of ``--reps``.
Writes a markdown report (``--out``).

Usage: ``python loadtests/step_bench.py [--sizes 1,8,32,64] [--context 128]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from bargein.engine.config import CacheConfig, ModelConfig  # noqa: E402
from bargein.engine.model.loader import transformers_folder  # noqa: E402
from bargein.engine.model_runner import ModelRunner, SeqInput  # noqa: E402

BLOCK_SIZE = 16


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,8,32,64", help="comma-separated batch sizes")
    parser.add_argument("--context", type=int, default=128, help="tokens already in the KV cache")
    parser.add_argument("--reps", type=int, default=7, help="timed steps per system and size")
    parser.add_argument("--out", default="docs/perf/engine-step.md")
    return parser.parse_args()


def _median_ms(fn: Callable[[], object], reps: int) -> float:
    fn()  # warm-up (oneDNN primitive creation, allocator)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def machine_peaks() -> tuple[float, float]:
    """(fp32 GEMM GFLOP/s on a 2048^3 product, copy GB/s counting read + write)."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    gemm_ms = _median_ms(lambda: a @ b, 5)
    src = torch.randn(64 * 1024 * 1024)
    dst = torch.empty_like(src)
    copy_ms = _median_ms(lambda: dst.copy_(src), 5)
    return 2 * 2048**3 / gemm_ms / 1e6, 2 * src.numel() * 4 / copy_ms / 1e6


class Systems:
    """The three step functions for one batch size, sharing loaded weights."""

    def __init__(self, context: int, max_batch: int) -> None:
        from transformers import AutoModelForCausalLM

        blocks_per_seq = -(-(context + 1) // BLOCK_SIZE)
        self.context = context
        self.blocks_per_seq = blocks_per_seq
        self.runner = ModelRunner(
            ModelConfig(device="cpu", dtype="float32", quantization="none", linear_dtype="float32"),
            CacheConfig(block_size=BLOCK_SIZE, num_blocks=max_batch * blocks_per_seq),
            context + 1,
        )
        folder = transformers_folder(ModelConfig())
        self.hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    def bargein(self, batch: int) -> Callable[[], object]:
        # the KV cache content does not change the cost: the step reads `context` positions
        per = self.blocks_per_seq
        seqs = [
            SeqInput(
                token_ids=[i + 1],
                start_pos=self.context,
                block_table=list(range(i * per, (i + 1) * per)),
                sample=True,
            )
            for i in range(batch)
        ]
        return lambda: self.runner.execute(seqs)

    @torch.inference_mode()
    def transformers(self, batch: int) -> Callable[[], object]:
        from transformers import DynamicCache

        prompt = torch.randint(0, self.runner.vocab_size, (batch, self.context))
        cache = DynamicCache()
        self.hf(input_ids=prompt, past_key_values=cache, use_cache=True)
        token = torch.ones(batch, 1, dtype=torch.long)
        position = torch.full((batch, 1), self.context)

        @torch.inference_mode()
        def step() -> object:
            logits = self.hf(
                input_ids=token, past_key_values=cache, position_ids=position, use_cache=True
            ).logits
            cache.crop(-1)  # drop the new token: every timed step sees the same context
            return logits

        return step

    def gemm_floor(self, batch: int) -> Callable[[], object]:
        model = self.runner.model
        hidden = torch.randn(batch, model.shape.hidden_size)
        mlp_in = torch.randn(batch, model.layers[0].down.weight.shape[1])
        attn_out = torch.randn(batch, model.layers[0].o_proj.weight.shape[1])

        @torch.inference_mode()
        def gemms() -> object:
            for layer in model.layers:
                layer.qkv(hidden)
                layer.o_proj(attn_out)
                layer.gate_up(hidden)
                layer.down(mlp_in)
            return model.lm_head(hidden)

        return gemms


def main() -> None:
    args = _parse()
    torch.set_num_threads(os.cpu_count() or 1)
    sizes = [int(s) for s in args.sizes.split(",")]
    load_start = " ".join(f"{x:.1f}" for x in os.getloadavg())
    gflops, copy_gbs = machine_peaks()
    systems = Systems(args.context, max(sizes))
    rows = []
    for batch in sizes:
        fns = {
            "bargein": systems.bargein(batch),
            "transformers": systems.transformers(batch),
            "gemm": systems.gemm_floor(batch),
        }
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(3):  # alternate, so a load change hits all three
            for name, fn in fns.items():
                times[name].append(_median_ms(fn, max(1, args.reps // 3)))
        ms = {name: statistics.median(v) for name, v in times.items()}
        flops = (
            2
            * batch
            * sum(
                p.numel()
                for layer in systems.runner.model.layers
                for p in (layer.qkv.weight, layer.o_proj.weight, layer.gate_up.weight, layer.down.weight)
            )
        )
        flops += 2 * batch * systems.runner.model.lm_head.weight.numel()
        rows.append((batch, ms, flops / ms["gemm"] / 1e6))
        print(
            f"B={batch:3d} bargein {ms['bargein']:7.1f} ms  transformers {ms['transformers']:7.1f} ms  "
            f"GEMM floor {ms['gemm']:7.1f} ms",
            flush=True,
        )
    load_end = " ".join(f"{x:.1f}" for x in os.getloadavg())
    text = report(args, rows, gflops, copy_gbs, (load_start, load_end))
    print(text)
    Path(args.out).write_text(text)


def report(
    args: argparse.Namespace,
    rows: list[tuple[int, dict[str, float], float]],
    gflops: float,
    copy_gbs: float,
    load: tuple[str, str],
) -> str:
    """The markdown report."""
    lines = [
        "# One decode step: bargein, transformers and the GEMM floor (CPU, fp32)",
        "",
        f"Written by `loadtests/step_bench.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"the default SmolLM2-135M-Instruct, fp32, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; context {args.context} tokens; medians of {args.reps} steps. "
        f"Load average at start / end: {load[0]} / {load[1]}.",
        "",
        f"This machine: fp32 GEMM peak {gflops:.0f} GFLOP/s (2048^3), copy {copy_gbs:.1f} GB/s (read + write).",
        "",
        "| B | bargein step (ms) | transformers step (ms) | GEMM floor (ms) | GEMM GFLOP/s | bargein speed-up | "
        "most any fp32 engine can reach (transformers / floor) | bargein time over the floor |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for batch, ms, gemm_gflops in rows:
        lines.append(
            f"| {batch} | {ms['bargein']:.1f} | {ms['transformers']:.1f} | {ms['gemm']:.1f} | {gemm_gflops:.0f} | "
            f"{ms['transformers'] / ms['bargein']:.2f}x | {ms['transformers'] / ms['gemm']:.2f}x | "
            f"{ms['bargein'] - ms['gemm']:.1f} ms |"
        )
    lines += [
        "",
        "The GEMM floor is the matrix products alone (no attention, norms, rotary, KV writes, sampling or "
        "Python): a lower bound for any fp32 engine on this CPU, so `transformers / floor` is the largest "
        "decode-step speed-up over transformers that is possible here without changing the arithmetic "
        "(quantized or bf16 weights; bf16 has no native instructions on this CPU, see PERF-NOTES).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
