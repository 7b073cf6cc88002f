"""bargein against llama-server on real-size GGUFs: decode tok/s, TTFT, peak RSS.

Issue 42's benchmark. The files are made by ``loadtests/gguf_synth.py``
(seeded random weights in a real model's shape, Q4_K_M or Q8_0, written
block by block) unless ``--model`` names files already made; both servers
serve the same file. Per file and peer, one server up at a time:

- decode tok/s at N = 1, 8, 32 (``--concurrency``): a warm-up wave, then N
  distinct chat prompts of about 24 words sent at once, greedy,
  ``ignore_eos`` with ``--max-tokens`` tokens each (random weights generate
  noise: lengths are fixed, not chosen by the model); tokens after each
  request's first over the wave's first first token to its last token;
- TTFT of one request with a prompt of 512 and of 2,048 tokens
  (``--prompt-tokens``; the chat template adds a few), median of
  ``--repeats``;
- peak RSS of the server process (``VmHWM`` in ``/proc/PID/status``) after
  the load, its weights, its KV cache and every wave;
- seconds from the server's start to ready, bargein's with its cache
  filled (the tokenizer converted from the file's vocabulary, a first
  start's extra seconds, once per file).

Both servers get the same KV capacity (``--kv-tokens`` tokens of fp16/bf16
K and V): llama-server one unified pool (``--kv-unified``) with
``--parallel`` slots and its RAM prompt cache off (``--cache-ram 0``: an
extra cache bargein does not have), bargein ``--kv-cache-bytes`` of the same
tokens (bf16 K/V, the default with the block kernels), voice off, and the
throughput mode of ``peer_bench.py`` (no SLO admission). llama-server is a
benchmark-only binary (``peer_bench.py`` says how to build it).

Usage::

    python loadtests/peers_real.py --llama-server /tmp/llama-build/bin/llama-server \\
        --shapes qwen2.5-1.5b:q4_k_m,qwen2.5-1.5b:q8_0,llama-3.1-8b:q4_k_m --workdir /tmp/real
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from gguf_synth import SHAPES, tensor_types, write_gguf  # noqa: E402
from loadgen import WORDS, make_prompt  # noqa: E402
from openai_stream import StreamTiming, chat_body, stream_chat  # noqa: E402
from server_proc import free_port, load_average, served, serving  # noqa: E402

from bargein.engine.config import ModelConfig  # noqa: E402
from bargein.engine.model.gguf_file import read_gguf  # noqa: E402
from bargein.engine.model.loader import default_model_path, load_tokenizer  # noqa: E402

PEERS = ("bargein", "llama")


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """One peer on one file."""

    peer: str
    file: str
    decode_tps: dict[int, float]
    output_tps: dict[int, float]
    ttft_s: dict[int, float]
    peak_rss_mb: float
    ready_s: float
    errors: int
    loads: list[str]


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set (``VmHWM``), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for {pid}")


def long_prompt(tokens: int, seed: int) -> str:
    """A user message of about ``tokens`` tokens in the files' tokenizer (SmolLM2's)."""
    tokenizer = load_tokenizer(ModelConfig())
    rng = random.Random(seed)
    words: list[str] = []
    while len(tokenizer(" ".join(words))["input_ids"]) < tokens:
        words += [rng.choice(WORDS) for _ in range(32)]
    while len(tokenizer(" ".join(words))["input_ids"]) > tokens:
        words.pop()
    return " ".join(words)


async def wave(url: str, bodies: Sequence[dict[str, Any]]) -> list[StreamTiming]:
    limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=len(bodies))
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(1800.0), limits=limits) as http:
        return list(await asyncio.gather(*(stream_chat(http, b) for b in bodies)))


def decode_tps(timings: Sequence[StreamTiming]) -> float:
    firsts = [t.chunk_times[0] for t in timings if t.chunk_times]
    lasts = [t.chunk_times[-1] for t in timings if t.chunk_times]
    tokens = sum(max(0, t.completion_tokens - 1) for t in timings if t.chunk_times)
    return tokens / (max(lasts) - min(firsts)) if firsts and max(lasts) > min(firsts) else float("nan")


async def measure(
    url: str, args: argparse.Namespace, long: dict[int, str]
) -> tuple[dict[int, float], dict[int, float], dict[int, float], int, list[str]]:
    tps: dict[int, float] = {}
    output: dict[int, float] = {}
    ttft: dict[int, float] = {}
    errors = 0
    loads = []
    for n in args.concurrency:
        rng = random.Random(n)
        await wave(url, [chat_body(make_prompt(rng, 24), 4, ignore_eos=True) for _ in range(n)])
        before = load_average()
        timings = await wave(
            url, [chat_body(make_prompt(rng, 24), args.max_tokens, ignore_eos=True) for _ in range(n)]
        )
        errors += sum(1 for t in timings if t.error or t.completion_tokens != args.max_tokens)
        tps[n] = decode_tps(timings)
        output[n] = output_tps(timings)
        loads.append(f"N={n}: {before} -> {load_average()}")
        print(f"    N={n:3d} decode {tps[n]:7.2f} tok/s, output {output[n]:7.2f} tok/s", file=sys.stderr)
    for tokens, text in long.items():
        samples = []
        for r in range(args.repeats):
            # a different first word each time: no prefix cache answers from an earlier run
            (t,) = await wave(
                url, [chat_body(f"{random.Random(r).choice(WORDS)} {text}", 2, ignore_eos=True)]
            )
            errors += t.error is not None
            if t.ttft is not None:
                samples.append(t.ttft)
        ttft[tokens] = statistics.median(samples) if samples else float("nan")
        print(f"    TTFT {tokens}-token prompt {ttft[tokens]:.2f} s", file=sys.stderr)
    return tps, output, ttft, errors, loads


def output_tps(timings: Sequence[StreamTiming]) -> float:
    """vLLM's output throughput: every completion token over the wave's wall
    time, from the first request sent to the last token (prefills included)."""
    lasts = [t.chunk_times[-1] for t in timings if t.chunk_times]
    start_at = min(t.sent_at for t in timings)
    return sum(t.completion_tokens for t in timings) / (max(lasts) - start_at) if lasts else float("nan")


def kv_bytes_per_token(model: Path) -> int:
    """K and V bytes a token takes in 2-byte elements, from the file's metadata."""
    meta = read_gguf(model).metadata
    arch = meta["general.architecture"]
    heads = meta[f"{arch}.attention.head_count"]
    head_dim = meta.get(f"{arch}.attention.key_length", meta[f"{arch}.embedding_length"] // heads)
    return 2 * meta[f"{arch}.block_count"] * meta.get(f"{arch}.attention.head_count_kv", heads) * head_dim * 2


@contextlib.contextmanager
def start(
    peer: str, model: Path, args: argparse.Namespace, procs: list[subprocess.Popen[bytes]]
) -> Iterator[str]:
    slots = max(args.concurrency)
    if peer == "bargein":
        flags = [
            "--model", str(model), "--voice", "off", "--max-waiting", "0",
            "--target-itl-ms", "0", "--target-ttft-s", "0",
            "--max-num-seqs", str(slots), "--max-tokens", str(max(256, args.max_tokens)),
            "--max-model-len", str(max(args.prompt_tokens) + 256),
            "--kv-cache-bytes", str(args.kv_tokens * kv_bytes_per_token(model)),
            "--cache-dir", str(args.workdir / "cache"),
        ]  # fmt: skip
        with served(flags, timeout_s=1800, on_start=procs.append) as url:
            yield url
        return
    port = free_port()
    cmd = [
        args.llama_server, "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
        "--parallel", str(slots), "--kv-unified", "--ctx-size", str(args.kv_tokens), "--cache-ram", "0",
        "--threads", str(args.threads), "--threads-batch", str(args.threads),
    ]  # fmt: skip
    with serving(cmd, f"http://127.0.0.1:{port}", "/health", timeout_s=1800, on_start=procs.append) as url:
        yield url


def run_peer(peer: str, model: Path, args: argparse.Namespace, long: dict[int, str]) -> Result:
    procs: list[subprocess.Popen[bytes]] = []
    if peer == "bargein":
        # the tokenizer conversion of a first start (once per file, cached):
        # "ready" is a start with the cache filled, as every later one is
        load_tokenizer(ModelConfig(path=str(model), cache_dir=str(args.workdir / "cache")))
    started = time.monotonic()
    with start(peer, model, args, procs) as url:
        ready = time.monotonic() - started
        print(f"  {peer}: ready in {ready:.1f} s", file=sys.stderr)
        tps, output, ttft, errors, loads = asyncio.run(measure(url, args, long))
        rss = peak_rss_mb(procs[0].pid)
    return Result(
        peer=peer,
        file=model.name,
        decode_tps=tps,
        output_tps=output,
        ttft_s=ttft,
        peak_rss_mb=rss,
        ready_s=ready,
        errors=errors,
        loads=loads,
    )


def markdown(results: Sequence[Result], args: argparse.Namespace, sizes: dict[str, float]) -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    lines = [
        "# bargein and llama-server on real-size GGUFs (issue 42)",
        "",
        f"`loadtests/peers_real.py`, one run, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {cpu}, "
        f"{os.cpu_count()} CPUs; llama-server `--threads {args.threads}`. Seeded random weights in each shape "
        "(`loadtests/gguf_synth.py`), the same file for both; greedy, `ignore_eos`, "
        f"{args.max_tokens} tokens a request; KV capacity {args.kv_tokens} tokens for both.",
        "",
        "Decode tok/s: each request's tokens after its first, over the time from the wave's first first "
        "token to its last token (`peer_bench.py`'s measure). Output tok/s: every token over the wave's "
        "wall time from the first request sent (vLLM's `benchmark_serving` output throughput; prefills "
        "included, which a server that interleaves prefill chunks with decoding pays inside the decode window).",
        "",
        "| file | GiB | peer | ready s | "
        + " | ".join(f"N={n} decode / output tok/s" for n in args.concurrency)
        + " | "
        + " | ".join(f"TTFT {t} s" for t in args.prompt_tokens)
        + " | peak RSS MiB | errors |",
        "|" + " --- |" * (6 + len(args.concurrency) + len(args.prompt_tokens)),
    ]
    for r in results:
        lines.append(
            f"| {r.file} | {sizes[r.file]:.2f} | {r.peer} | {r.ready_s:.1f} | "
            + " | ".join(f"{r.decode_tps[n]:.2f} / {r.output_tps[n]:.2f}" for n in args.concurrency)
            + " | "
            + " | ".join(f"{r.ttft_s[t]:.2f}" for t in args.prompt_tokens)
            + f" | {r.peak_rss_mb:.0f} | {r.errors} |"
        )
    lines += [
        "",
        "Ratios, bargein / llama-server (tok/s: higher is better; TTFT and RSS: lower is better):",
        "",
    ]
    lines.append(
        "| file | "
        + " | ".join(f"N={n} decode / output" for n in args.concurrency)
        + " | "
        + " | ".join(f"TTFT {t}" for t in args.prompt_tokens)
        + " | RSS |"
    )
    lines.append("|" + " --- |" * (2 + len(args.concurrency) + len(args.prompt_tokens)))
    for file in dict.fromkeys(r.file for r in results):
        both = {r.peer: r for r in results if r.file == file}
        if set(both) != set(PEERS):
            continue
        b, ll = both["bargein"], both["llama"]
        lines.append(
            f"| {file} | "
            + " | ".join(
                f"{b.decode_tps[n] / ll.decode_tps[n]:.2f}x / {b.output_tps[n] / ll.output_tps[n]:.2f}x"
                for n in args.concurrency
            )
            + " | "
            + " | ".join(f"{b.ttft_s[t] / ll.ttft_s[t]:.2f}x" for t in args.prompt_tokens)
            + f" | {b.peak_rss_mb / ll.peak_rss_mb:.2f}x |"
        )
    lines += ["", "Load average (1, 5, 15 min) before and after each decode wave:", ""]
    lines += [f"- {r.file} {r.peer}: " + "; ".join(r.loads) for r in results]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="qwen2.5-1.5b:q4_k_m", help="comma list of SHAPE:MIX (gguf_synth.py)")
    p.add_argument("--llama-server", required=True)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/bargein-real"))
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--prompt-tokens", default="512,2048")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="TTFT samples per prompt length")
    p.add_argument("--kv-tokens", type=int, default=8192)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--peers", default=",".join(PEERS))
    p.add_argument("--bundled", action="store_true", help="also the bundled SmolLM2-135M-Instruct GGUF")
    p.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent.parent / "docs/perf/peers-real.md"
    )
    args = p.parse_args(argv)
    args.concurrency = [int(n) for n in args.concurrency.split(",")]
    args.prompt_tokens = [int(n) for n in args.prompt_tokens.split(",")]
    args.workdir.mkdir(parents=True, exist_ok=True)
    long = {t: long_prompt(t - 20, t) for t in args.prompt_tokens}  # the template adds about 20
    results: list[Result] = []
    sizes: dict[str, float] = {}
    models = [Path(default_model_path())] if args.bundled else []
    for spec in filter(None, args.shapes.split(",")):
        shape_name, mix = spec.split(":")
        model = args.workdir / f"{shape_name}-{mix}.gguf"
        if not model.exists():
            print(f"writing {model}", file=sys.stderr)
            write_gguf(model, SHAPES[shape_name], tensor_types(SHAPES[shape_name], mix))
        models.append(model)
    for model in models:
        sizes[model.name] = model.stat().st_size / 2**30
        for peer in args.peers.split(","):
            print(f"{model.name}: {peer}", file=sys.stderr)
            results.append(run_peer(peer, model, args, long))
            args.out.with_suffix(".json").write_text(
                json.dumps([dataclasses.asdict(r) for r in results], indent=1)
            )
    args.out.write_text(markdown(results, args, sizes))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
