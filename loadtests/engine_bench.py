"""bargein's engine against transformers ``generate`` on the same model, same run.

For each batch size N (concurrent requests), N copies of one chat prompt ask
for ``--new-tokens`` tokens each (greedy, EOS ignored); the two systems take
turns per size and run, so load drifts on a shared machine hit both. bargein: all N
requests are added at once and the engine is stepped until they finish.
transformers: one ``generate`` call on the N prompts, left padded. Reported
per system, median over ``--runs``:

- TTFT: seconds from the start until the first token (bargein: median over
  requests; transformers: the first step of the batch).
- decode tokens/s: tokens generated after every request has its first
  token, over the time from then to the last token (transformers: the time
  from the batch's first token to its last), aggregated over the batch.
- total: seconds from the start until all N requests are done (prefill and
  decode; for bargein with chunked prefill this is the fairest single number).

Also the KV cache bytes per token, peak RSS after the bargein runs and at
the end, and where the engine's step time went (model forward, sampling,
scheduling, post-processing). Writes a markdown report (``--out``).

Usage: ``python loadtests/engine_bench.py [--sizes 1,8,32,64] [--runs 3]``
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from bargein.engine.config import CacheConfig, ModelConfig, SchedulerConfig
from bargein.engine.engine import LLMEngine
from bargein.engine.model.loader import transformers_folder
from bargein.engine.model_runner import ModelRunner
from bargein.engine.request import EngineRequest, SamplingParams

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """One system at one batch size: medians over runs."""

    ttft_s: float
    decode_tok_s: float
    total_s: float


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,8,32,64", help="comma-separated batch sizes")
    parser.add_argument("--runs", type=int, default=3, help="runs per size (median)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--out", default="docs/perf/engine-cpu.md")
    parser.add_argument("--skip-hf", action="store_true", help="bargein only")
    return parser.parse_args()


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def build_engine(max_batch: int, prompt_len: int, new_tokens: int, batched_tokens: int) -> LLMEngine:
    """The engine with a KV pool just large enough for ``max_batch`` sequences."""
    max_model_len = prompt_len + new_tokens + 1
    blocks_per_seq = -(-max_model_len // 16)
    runner = ModelRunner(
        ModelConfig(device="cpu", dtype="float32", quantization="none", linear_dtype="float32"),
        CacheConfig(block_size=16, num_blocks=max_batch * blocks_per_seq),
        max_model_len,
    )
    config = SchedulerConfig(
        max_num_seqs=max(max_batch, 1),
        max_num_batched_tokens=max(batched_tokens, max_batch),
        prefill_chunk_size=min(256, max(batched_tokens, max_batch)),
        max_model_len=max_model_len,
    )
    return LLMEngine(runner, config)


def run_bargein(engine: LLMEngine, prompt: list[int], n: int, new_tokens: int, tag: str) -> Result:
    """Add ``n`` requests at once; step until all finished."""
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    for i in range(n):
        engine.add_request(
            EngineRequest(request_id=f"{tag}-{i}", prompt_token_ids=tuple(prompt), params=params)
        )
    first: dict[str, float] = {}
    # (time, tokens) of each step's new tokens, for the decode window below
    produced: list[tuple[float, int]] = []
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            first.setdefault(out.request_id, now)
        produced.append((now, sum(len(out.new_token_ids) for out in outputs)))
    end = time.perf_counter()
    # The window opens when every request has its first token, as in a batched
    # `generate` (whose prefill ends for all N at once); before that, chunked
    # prefill steps of the later prompts are running, which TTFT accounts for.
    window_start = max(first.values())
    decoded = sum(tokens for t, tokens in produced if t > window_start)
    return Result(
        ttft_s=statistics.median(t - start for t in first.values()),
        decode_tok_s=decoded / (end - window_start) if end > window_start else float("nan"),
        total_s=end - start,
    )


class _FirstTokenClock:
    """A stopping criterion that never stops; it notes when the first token came."""

    def __init__(self) -> None:
        self.first: float | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: object) -> torch.Tensor:
        if self.first is None:
            self.first = time.perf_counter()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def run_hf(model: object, tokenizer: object, prompt_text: str, n: int, new_tokens: int) -> Result:
    """One left-padded ``generate`` call over ``n`` copies of the prompt."""
    from transformers import StoppingCriteriaList

    batch = tokenizer([prompt_text] * n, return_tensors="pt", padding=True, add_special_tokens=False)
    clock = _FirstTokenClock()
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            **batch,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            stopping_criteria=StoppingCriteriaList([clock]),
        )
    end = time.perf_counter()
    assert out.shape[1] - batch["input_ids"].shape[1] == new_tokens
    assert clock.first is not None
    return Result(
        ttft_s=clock.first - start,
        decode_tok_s=n * (new_tokens - 1) / (end - clock.first),
        total_s=end - start,
    )


def _median(results: list[Result]) -> Result:
    return Result(
        ttft_s=statistics.median(r.ttft_s for r in results),
        decode_tok_s=statistics.median(r.decode_tok_s for r in results),
        total_s=statistics.median(r.total_s for r in results),
    )


def setup_bargein(args: argparse.Namespace, sizes: list[int]) -> tuple[LLMEngine, list[int], str]:
    """The engine, warmed up, and the chat prompt (ids and text)."""
    engine = build_engine(max(sizes), 64, args.new_tokens, args.max_num_batched_tokens)
    tokenizer = engine.tokenizer
    prompt_text = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False
    )
    prompt = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    assert len(prompt) <= 64, len(prompt)
    run_bargein(engine, prompt, 2, 4, "warmup")
    engine.time_by_phase.clear()
    return engine, prompt, prompt_text


def setup_hf() -> tuple[object, object]:
    """transformers' model and a left-padding tokenizer on the same weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = transformers_folder(ModelConfig())
    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return model, tokenizer


def bench(
    args: argparse.Namespace, sizes: list[int]
) -> tuple[dict[int, Result], dict[int, Result], LLMEngine, int, float]:
    """Both systems, alternating per size and run so load drifts hit both alike.

    Returns bargein's and transformers' medians, the engine, the prompt length
    and the peak RSS (MiB) with only bargein loaded.
    """
    engine, prompt, prompt_text = setup_bargein(args, sizes)
    rss_ours = _peak_rss_mb()
    hf = None if args.skip_hf else setup_hf()
    if hf is not None:
        run_hf(hf[0], hf[1], prompt_text, 2, 4)
    ours: dict[int, list[Result]] = {n: [] for n in sizes}
    theirs: dict[int, list[Result]] = {n: [] for n in sizes}
    for r in range(args.runs):
        for n in sizes:
            ours[n].append(run_bargein(engine, prompt, n, args.new_tokens, f"n{n}r{r}"))
            _print("bargein", n, ours[n][-1])
            if hf is not None:
                theirs[n].append(run_hf(hf[0], hf[1], prompt_text, n, args.new_tokens))
                _print("transformers", n, theirs[n][-1])
    medians = {n: _median(v) for n, v in ours.items()}
    return medians, {n: _median(v) for n, v in theirs.items() if v}, engine, len(prompt), rss_ours


def _print(system: str, n: int, result: Result) -> None:
    print(
        f"{system:12s} N={n:3d}  TTFT {result.ttft_s:7.3f} s  decode {result.decode_tok_s:8.1f} tok/s",
        flush=True,
    )


def report(
    args: argparse.Namespace,
    ours: dict[int, Result],
    theirs: dict[int, Result],
    engine: LLMEngine,
    prompt_len: int,
    rss: tuple[float, float],
    load: tuple[str, str],
) -> str:
    """The markdown report (also printed)."""
    lines = [
        "# bargein engine vs transformers `generate` on the CPU",
        "",
        f"Written by `loadtests/engine_bench.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
        f"Model: the default SmolLM2-135M-Instruct, fp32, torch backend; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, torch {torch.__version__} with {torch.get_num_threads()} threads, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}. "
        f"Load average at start / end: {load[0]} / {load[1]} (compare rows of the same run only).",
        "",
        f"Each of N requests: the same {prompt_len}-token chat prompt, {args.new_tokens} new tokens, greedy, EOS ignored; "
        f"median of {args.runs} run(s). transformers: one left-padded `generate` call for the N prompts. "
        "Decode tokens/s = tokens generated after every request has its first token / (last token time - that time), "
        "all requests together (transformers' batch gets all first tokens in one step). "
        "Total = start to last token, prefill included.",
        "",
        "| N | bargein decode tok/s | transformers decode tok/s | ratio | bargein TTFT (s) | transformers TTFT (s) | bargein total (s) | transformers total (s) | total speed-up |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n, ours_n in ours.items():
        hf = theirs.get(n)
        ratio = f"{ours_n.decode_tok_s / hf.decode_tok_s:.2f}x" if hf else "-"
        lines.append(
            f"| {n} | {ours_n.decode_tok_s:.1f} | {hf.decode_tok_s if hf else float('nan'):.1f} | {ratio} | "
            f"{ours_n.ttft_s:.3f} | {hf.ttft_s if hf else float('nan'):.3f} | {ours_n.total_s:.2f} | "
            f"{hf.total_s if hf else float('nan'):.2f} | {f'{hf.total_s / ours_n.total_s:.2f}x' if hf else '-'} |"
        )
    lines += ["", *_targets(ours, theirs)]
    phases = Counter(engine.time_by_phase)
    total = sum(phases.values()) or 1.0
    stats = engine.stats()
    lines += [
        "",
        f"- KV cache: {engine.runner.kv_bytes_per_token} bytes per token "
        f"({engine.runner.kv_bytes_per_token * 16} per 16-token block), fp32, all layers, K and V.",
        f"- Peak RSS: {rss[0]:.0f} MiB with bargein alone (model + KV pool of "
        f"{engine.pool.num_total_blocks} blocks, after a warm-up), {rss[1]:.0f} MiB at the end "
        "(transformers' model loaded too, after every run).",
        f"- Where bargein's step time went ({stats.num_steps} steps): "
        + ", ".join(f"{k} {v:.1f} s ({100 * v / total:.1f}%)" for k, v in phases.most_common())
        + ". `model` is `ModelRunner.execute` (input preparation + forward + logits); the rest is the engine's Python "
        "(scheduling, SeqInput building, sampling, detokenization and stop checks).",
        "",
    ]
    return "\n".join(lines)


def _targets(ours: dict[int, Result], theirs: dict[int, Result]) -> list[str]:
    """The issue's two targets, checked on this run's numbers."""
    lines = []
    if 32 in ours and 32 in theirs:
        ratio = ours[32].decode_tok_s / theirs[32].decode_tok_s
        verdict = "met" if ratio >= 2 else "missed"
        lines.append(f"- Target, 32 concurrent >= 2x transformers' decode tokens/s: {ratio:.2f}x, {verdict}.")
    if 1 in ours and 1 in theirs:
        slowdown = theirs[1].decode_tok_s / ours[1].decode_tok_s
        verdict = "met" if slowdown <= 1.2 else "missed"
        lines.append(
            f"- Target, single request no slower than 1.2x transformers: {slowdown:.2f}x the time per token, {verdict}."
        )
    return lines


def main() -> None:
    args = _parse()
    sizes = [int(s) for s in args.sizes.split(",")]
    load_start = " ".join(f"{x:.1f}" for x in os.getloadavg())
    ours, theirs, engine, prompt_len, rss_ours = bench(args, sizes)
    load_end = " ".join(f"{x:.1f}" for x in os.getloadavg())
    text = report(args, ours, theirs, engine, prompt_len, (rss_ours, _peak_rss_mb()), (load_start, load_end))
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)


if __name__ == "__main__":
    main()
