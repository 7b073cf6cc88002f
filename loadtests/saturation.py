"""The saturation curve of bargein on this machine, and admission past it.

Starts ``bargein serve`` (bundled model, subprocess) with a bounded waiting
queue (``--max-waiting``) and a queue-time deadline (``--max-queue-time``,
the TTFT target), then sweeps offered load with :mod:`loadtests.loadgen`:
latency percentiles and goodput against offered load, the knee (the offered
rate where goodput peaks), and past it, how
admission refuses: how many, how fast (request sent -> ``error`` event, or
connect -> close 1013), with which ``retry_after_ms``.

Usage: ``python loadtests/saturation.py [--rates 0.5,1,2,4,8] [--duration 15]``
writes ``docs/perf/saturation.md``, ``.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.loadgen import LoadConfig, knee, plot, run_load, summarize  # noqa: E402
from loadtests.server_proc import load_average, served  # noqa: E402


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{1000 * value:.0f}"


def _ms1(value: float | None) -> str:
    return "n/a" if value is None else f"{1000 * value:.1f}"


def markdown(reports: Sequence[dict[str, Any]], args: argparse.Namespace, load: tuple[str, str]) -> str:
    """The report: one row per offered rate, the knee, the admission numbers."""
    k = knee(reports)
    rejections = [
        r["rejection_latency_s"]["p99"] for r in reports if r["rejection_latency_s"]["p99"] is not None
    ]
    lines = [
        "# Saturation: latency against offered load, and admission past the knee",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
        "`python loadtests/saturation.py` on the bundled SmolLM2-135M (fp32, CPU), "
        f"server flags `--max-waiting {args.max_waiting} --max-queue-time "
        f"{args.max_queue_time:g} {args.server_flags}`, on a 2-core machine with load average "
        f"{load[0]} at the start, {load[1]} at the end (the knee is this machine's, with the "
        "load generator on the same 2 cores).",
        "",
        f"Open loop, Poisson arrivals, {args.duration:g} s per rate, each request on a "
        f"new WebSocket; median {args.prompt_words} prompt words and {args.max_tokens} "
        f"max_tokens. SLO: TTFT <= {args.slo_ttft:g} s and the request's own ITL p95 <= "
        f"{args.slo_itl:g} s; goodput = requests/s completed within it. "
        "`--max-num-seqs` bounds the running batch, so admitted "
        "requests keep their ITL; the rest wait in the engine's queue, bounded by "
        "`--max-waiting` and refused up front when the expected wait passes "
        "`--max-queue-time` (`overloaded`), or at connect with close 1013 when the queue "
        "is full; an admitted request the engine has not scheduled by `--max-queue-time` "
        "is dropped from the queue with `overloaded` (column *dropped*). TTFT and ITL "
        "columns are the admitted requests'. Rejection latency: `response.create` sent -> "
        "`error` received, or, for 1013, connect started -> close received (TCP and "
        "WebSocket handshakes included).",
        "",
        f"**Knee: {k if k is not None else 'none (no goodput)'} requests/s** (the "
        "offered rate where goodput peaks). Rejection latency p99 "
        f"over all rates: max {_ms1(max(rejections)) if rejections else 'n/a'} ms "
        "(target < 50 ms).",
        "",
        "![saturation](saturation.png)",
        "",
        "| offered /s | requests | completed /s | goodput /s | TTFT p50 ms | TTFT p95 ms "
        "| ITL p95 ms | E2E p95 ms | rejected | rejection p50 / p99 ms | dropped "
        "| retry_after_ms | errors |",
        "|" + " --- |" * 13,
    ]
    for r in reports:
        rej = r["rejection_latency_s"]
        num_rejected = sum(
            v for c, v in r["errors"].items() if c in ("overloaded", "rate_limited", "close_1013")
        )
        retry = r["retry_after_ms"]
        lines.append(
            f"| {r['offered_rate']:g} | {r['num_requests']} | {r['completed_rate']:.2f} | "
            f"{r['goodput']:.2f} | {_ms(r['ttft_s']['p50'])} | {_ms(r['ttft_s']['p95'])} | "
            f"{_ms(r['itl_s']['p95'])} | {_ms(r['e2e_s']['p95'])} | {num_rejected} | "
            f"{_ms1(rej['p50'])} / {_ms1(rej['p99'])} | {r['dropped_in_queue']} | "
            f"{f'{min(retry)}-{max(retry)}' if retry else '-'} | {r['errors'] or '-'} |"
        )
    return "\n".join(lines) + "\n"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="0.25,0.5,1,2,4,8")
    p.add_argument("--duration", type=float, default=15.0)
    p.add_argument("--drain", type=float, default=30.0)
    p.add_argument("--prompt-words", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-waiting", type=int, default=8)
    p.add_argument(
        "--max-queue-time", type=float, default=1.5, help="seconds; the TTFT target less a prefill's time"
    )
    p.add_argument("--slo-ttft", type=float, default=2.0)
    # 0.5 s: on 2 cores shared with the load generator (which parses every
    # delta of up to 100 connections), 8 sequences decode at ~0.3 s p95 ITL
    p.add_argument("--slo-itl", type=float, default=0.5)
    p.add_argument(
        "--server-flags",
        default="--max-num-seqs 8",
        help="more bargein serve flags (the batch bound keeps admitted ITL flat)",
    )
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--out", type=Path, default=Path("docs/perf/saturation.md"))
    return p.parse_args(argv)


async def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One run per rate on one server, lowest first."""
    flags = [
        "--max-waiting",
        str(args.max_waiting),
        "--max-queue-time",
        str(args.max_queue_time),
        *args.server_flags.split(),
    ]
    reports = []
    with served(flags) as url:
        for rate in (float(r) for r in args.rates.split(",")):
            cfg = LoadConfig(
                url=url.replace("http://", "ws://") + "/v1/realtime",
                rate=rate,
                duration_s=args.duration,
                prompt_words=args.prompt_words,
                max_tokens=args.max_tokens,
                drain_s=args.drain,
                seed=args.seed,
            )
            reports.append(summarize(cfg, await run_load(cfg), args.slo_ttft, args.slo_itl))
            print(
                f"{rate:g}/s: goodput {reports[-1]['goodput']:.2f} errors {reports[-1]['errors']}",
                file=sys.stderr,
            )
    return reports


def main(argv: Sequence[str] | None = None) -> int:
    """Sweep, then write the markdown, the JSON and the plot."""
    args = _parse(argv)
    start_load = load_average()
    reports = asyncio.run(sweep(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(reports, args, (start_load, load_average())))
    args.out.with_suffix(".json").write_text(
        json.dumps({"runs": reports, "knee_rate": knee(reports)}, indent=2) + "\n"
    )
    plot(
        reports,
        args.out.with_suffix(".png"),
        f"bargein saturation (2-core CPU), --max-waiting {args.max_waiting}, "
        f"--max-queue-time {args.max_queue_time:g} s; SLO TTFT <= {args.slo_ttft:g} s, "
        f"ITL p95 <= {args.slo_itl:g} s",
    )
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
