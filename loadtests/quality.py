"""Quality of each linear-layer format against exact fp32, on the bundled model.

Teacher-forced: the fixed English text ``loadtests/data/quality_text.txt``
(~2,100 tokens: fiction, dialogue, science, a recipe, news, a letter, advice)
runs through the model once per format, in prefill chunks of 256 tokens;
at every position the next-token distribution is compared with fp32's:

- mean KL(fp32 || format) in nats/token,
- top-1 agreement (the same argmax as fp32),
- NLL of the true next token (and its perplexity), beside fp32's.

Greedy: ``--prompts`` windows of 24 tokens of the same text, each continued
``--tokens`` tokens greedily (EOS ignored), all prompts decoded together as
one batch (so the batched int8/bf16 paths run, not the one-row path);
reported: the mean share of tokens before the first divergence from fp32,
and the share of prompts whose first 32 tokens equal fp32's.

Formats: fp32 (reference), bf16, int8 (smoothed W8A8, head and edge layers
in bf16), and int8 a few rows at a time (``int8-few-rows``: the checkpoint's
4-bit weights, what steps of up to ``weight_only.MAX_ROWS`` rows run), and
int4 (``auto`` on x86 where the block kernels run: the 4-bit layers and an
8-bit head at every row count; without them, a few rows and fp32 above;
measured at 4 rows, where both run in either case);
``auto`` is named in the report. Writes a markdown report (``--out``).

Usage: ``python loadtests/quality.py [--prompts 64] [--tokens 128]``
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from bargein.engine.config import CacheConfig, ModelConfig  # noqa: E402
from bargein.engine.model.linear import choose_linear_format, make_linear  # noqa: E402
from bargein.engine.model.loader import load_model  # noqa: E402
from bargein.engine.model.weight_only import MAX_ROWS  # noqa: E402
from bargein.engine.model_runner import ModelRunner, SeqInput  # noqa: E402

HERE = Path(__file__).resolve().parent
TEXT = HERE / "data" / "quality_text.txt"
BLOCK = 16
CHUNK = 256
PROMPT_LEN = 24

# name -> (quantization, linear_dtype, head format override, down_proj format override, KV dtype)
# int8 is SmoothQuant-smoothed with its head and edge layers in bf16 (or fp32
# without bf16): engine/model/smooth.py, ModelRunner._smoothed_int8. The KV
# dtype "auto" is what `bargein serve` runs (bfloat16 under int8, int4 or bf16
# linears); the "/kv-fp32" rows keep fp32 K/V to show what the bf16 cache costs.
FORMATS: dict[str, tuple[str, str, str | None, str | None, str]] = {
    "fp32": ("none", "float32", None, None, "auto"),
    "bf16": ("none", "bfloat16", None, None, "auto"),
    "bf16/kv-fp32": ("none", "bfloat16", None, None, "float32"),
    "int8": ("int8", "auto", None, None, "auto"),
    "int8/kv-fp32": ("int8", "auto", None, None, "float32"),
    "int8-few-rows": ("int8", "auto", None, None, "auto"),
    "int8-few-rows/kv-fp32": ("int8", "auto", None, None, "float32"),
    "int4": ("int4", "auto", None, None, "auto"),
}
# Formats measured a few rows at a time (teacher-forced in chunks of this many
# rows, greedy one prompt at a time): where the int8 format runs the
# checkpoint's 4-bit weights (steps of up to weight_only.MAX_ROWS rows), as a
# voice user decoding alone does.
# int4 runs its block kernels at every row count (without them, fp32 above
# weight_only.FP32_MAX_ROWS and HEAD_MAX_ROWS): its own rounding is at 4 rows,
# where its 4-bit layers and 8-bit head run in either case.
FEW_ROWS = {"int8-few-rows": 4, "int8-few-rows/kv-fp32": 4, "int4": 4}


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--formats", default=",".join(FORMATS), help="comma list of " + ", ".join(FORMATS))
    p.add_argument("--out", default=str(HERE.parent / "docs" / "perf" / "quality.md"))
    return p.parse_args()


def build(name: str, fp32_weights: dict[str, torch.Tensor], num_blocks: int, max_len: int) -> ModelRunner:
    quant, linear_dtype, head, down, kv = FORMATS[name]
    runner = ModelRunner(
        ModelConfig(device="cpu", quantization=quant, linear_dtype=linear_dtype),
        CacheConfig(num_blocks=num_blocks, block_size=BLOCK, dtype=kv),  # type: ignore[arg-type]
        max_len,
    )
    model = runner.model
    if head is not None:
        model.lm_head = make_linear(model.embed, None, head)  # type: ignore[arg-type]
    if down is not None:
        model.layers = [
            dataclasses.replace(
                layer,
                down=make_linear(fp32_weights[f"model.layers.{i}.mlp.down_proj.weight"], None, down),  # type: ignore[arg-type]
            )
            for i, layer in enumerate(model.layers)
        ]
    return runner


@torch.inference_mode()
def teacher_forced_logits(runner: ModelRunner, ids: list[int], rows: int = CHUNK) -> torch.Tensor:
    """``[len(ids), vocab]`` fp32 logits at every position (prefill chunks of ``rows``)."""
    table = list(range(math.ceil(len(ids) / BLOCK)))
    out = []
    for s in range(0, len(ids), rows):
        chunk = ids[s : s + rows]
        seq = SeqInput(
            token_ids=chunk,
            start_pos=s,
            block_table=table[: math.ceil((s + len(chunk)) / BLOCK)],
            sample=True,
        )
        input_ids, positions, meta = runner._prepare([seq])
        hidden = runner.model.forward(input_ids, positions, meta, runner.kv_caches)
        out.append(runner.model.compute_logits(hidden))
    return torch.cat(out)


@torch.inference_mode()
def greedy(runner: ModelRunner, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    """Each prompt continued ``tokens`` tokens greedily, all decoded as one batch."""
    per_seq = math.ceil((PROMPT_LEN + tokens) / BLOCK)
    tables = [list(range(j * per_seq, (j + 1) * per_seq)) for j in range(len(prompts))]
    logits = runner.execute(
        [SeqInput(token_ids=p, start_pos=0, block_table=t, sample=True) for p, t in zip(prompts, tables)]
    )
    outs: list[list[int]] = [[] for _ in prompts]
    for step in range(tokens):
        nxt = logits.argmax(dim=-1).tolist()
        for o, t in zip(outs, nxt):
            o.append(t)
        if step == tokens - 1:
            break
        logits = runner.execute(
            [
                SeqInput(token_ids=[t], start_pos=PROMPT_LEN + step, block_table=tab, sample=True)
                for t, tab in zip(nxt, tables)
            ]
        )
    return outs


def _prefix_share(a: list[int], b: list[int]) -> float:
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
    return n / len(a)


def main() -> None:
    args = _parse()
    names = [n.strip() for n in args.formats.split(",")]
    if names[0] != "fp32":
        names.insert(0, "fp32")
    torch.manual_seed(0)
    fp32_weights = load_model(ModelConfig()).weights
    probe = build("fp32", fp32_weights, 8, 64)
    ids = probe.tokenizer(TEXT.read_text())["input_ids"]
    del probe
    targets = torch.tensor(ids[1:])
    stride = max(1, (len(ids) - PROMPT_LEN) // args.prompts)
    prompts = [ids[j * stride : j * stride + PROMPT_LEN] for j in range(args.prompts)]
    max_len = max(len(ids), PROMPT_LEN + args.tokens) + BLOCK
    num_blocks = max(
        math.ceil(len(ids) / BLOCK), args.prompts * math.ceil((PROMPT_LEN + args.tokens) / BLOCK)
    )
    rows = []
    ref_logp: torch.Tensor | None = None
    ref_greedy: list[list[int]] = []
    for name in names:
        t0 = time.perf_counter()
        runner = build(name, fp32_weights, num_blocks, max_len)
        few = FEW_ROWS.get(name)
        logp = torch.log_softmax(teacher_forced_logits(runner, ids, few or CHUNK)[:-1].double(), dim=-1)
        if few is None:
            outs = greedy(runner, prompts, args.tokens) if args.prompts else []
        else:
            outs = [greedy(runner, [p], args.tokens)[0] for p in prompts]
        nll = float(-logp.gather(1, targets[:, None]).mean())
        if ref_logp is None:
            ref_logp, ref_greedy = logp, outs
        kl = float((ref_logp.exp() * (ref_logp - logp)).sum(-1).mean())
        top1 = float((ref_logp.argmax(-1) == logp.argmax(-1)).double().mean())
        prefix = sum(_prefix_share(a, b) for a, b in zip(outs, ref_greedy)) / max(1, len(outs))
        first32 = sum(a[:32] == b[:32] for a, b in zip(outs, ref_greedy)) / max(1, len(outs))
        kv_dtype = str(runner.kv_caches.dtype).removeprefix("torch.")
        rows.append((name, runner.linear_format, kv_dtype, kl, top1, nll, prefix, first32))
        print(
            f"{name:22s} KL {kl:.5f} top1 {top1:.4f} nll {nll:.4f} greedy-prefix {prefix:.3f} "
            f"first32 {first32:.3f} ({time.perf_counter() - t0:.0f}s)",
            flush=True,
        )
        del runner, logp
    auto, why = choose_linear_format("auto", "auto", device_type="cpu", dtype="float32")
    report(args, rows, len(ids), auto, why)


def report(args: argparse.Namespace, rows: list[tuple], n_tokens: int, auto: str, why: str) -> None:
    lines = [
        "# Linear-layer formats: quality against fp32",
        "",
        f"`python loadtests/quality.py --prompts {args.prompts} --tokens {args.tokens}` "
        f"({time.strftime('%Y-%m-%d')}, torch {torch.__version__}, {platform.machine()}, "
        f"{os.cpu_count()} cores). Model: the bundled SmolLM2-135M-Instruct (GGUF Q4_1, "
        "dequantized to fp32: fp32 is the reference here, not the original bf16 checkpoint).",
        "",
        f"`auto` on this machine: **{auto}** ({why}).",
        "",
        f"Teacher-forced over {n_tokens} tokens of `loadtests/data/quality_text.txt` "
        f"(prefill chunks of {CHUNK} rows); greedy: {args.prompts} prompts of {PROMPT_LEN} tokens "
        f"from the same text x {args.tokens} tokens, decoded as one batch of {args.prompts}. "
        f"*int8-few-rows* is the int8 format a few rows at a time (teacher-forced in chunks of "
        f"{FEW_ROWS['int8-few-rows']} rows, greedy one prompt alone): the steps of up to "
        f"{MAX_ROWS} rows, which run the checkpoint's 4-bit weights (`engine/model/weight_only.py`).",
        "",
        "| format | linears | K/V | mean KL vs fp32 (nats/token) | top-1 agreement | NLL (ppl) "
        "| greedy: tokens before first divergence | greedy: first 32 identical |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, fmt, kv_dtype, kl, top1, nll, prefix, first32 in rows:
        lines.append(
            f"| {name} | {fmt} | {kv_dtype} | {kl:.5f} | {top1:.2%} | {nll:.4f} ({math.exp(nll):.2f}) "
            f"| {prefix:.1%} | {first32:.0%} |"
        )
    lines += [
        "",
        "Target: the `auto` format's mean KL < 0.01 nats/token.",
        "Greedy divergence compounds: once one token differs the continuations part, so "
        "'tokens before first divergence' is a strict measure (fp32 against itself in a different "
        "batch shape is not 100% either, oneDNN's blocking changes the rounding).",
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
