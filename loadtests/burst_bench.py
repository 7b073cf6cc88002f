"""Bursts of short chat requests against one ``bargein serve``: served or refused, and were the refusals right?

Starts a server (default flags: the SLO-aware admission of ``--target-itl-ms``
and ``--target-ttft-ms``), warms it up, then sends bursts of 8, 16 and 32
streamed ``/v1/chat/completions`` requests (``max_tokens`` 48, greedy, all
sent at once) and reports per burst: served and refused (with their HTTP
statuses and whether each 503/429 carried ``Retry-After``), TTFT p50/p95
and ITL p95 of the served ones, and the admission's predicted TTFT against
the measured one (``bargein_admission_ttft_error_ratio`` from ``/metrics``:
measured over predicted, per admitted request). The targets are the serve
defaults (TTFT 1.5 s, ITL 200 ms). The same bursts against a server without
TTFT queueing (``--target-ttft-s 0``: the rule before, refused past the ITL
batch) are the baseline of the same run.

Usage::

    .venv/bin/python loadtests/burst_bench.py [--bursts 8,16,32] [--max-tokens 48]
        [--out docs/perf/bursts.md] [--flags "..."]

Writes ``--out`` (Markdown) and the same name with ``.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import re
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from openai_stream import StreamTiming, _read_events, chat_body  # noqa: E402
from server_proc import served  # noqa: E402

PROMPTS = [
    "Name three colours and say one thing about each.",
    "Write two sentences about the sea.",
    "Give a short tip for learning to cook.",
    "Describe a cat in a few words.",
]
TTFT_TARGET_S = 1.5
ITL_TARGET_S = 0.2


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by linear interpolation, None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


async def one(http: httpx.AsyncClient, body: dict[str, Any]) -> tuple[StreamTiming, dict[str, str]]:
    """One streamed request: its timing and, when refused, the answer's headers."""
    timing = StreamTiming(sent_at=time.perf_counter())
    headers: dict[str, str] = {}
    try:
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                headers = dict(response.headers)
                timing.error = f"http_{response.status_code}"
                await response.aread()
                return timing, headers
            await _read_events(response, timing)
    except httpx.HTTPError as exc:
        timing.error = type(exc).__name__
    timing.done_at = time.perf_counter()
    return timing, headers


def ratio_histogram(metrics_text: str) -> dict[str, float]:
    """Sum and count of ``bargein_admission_ttft_error_ratio`` (0 when absent)."""
    out = {"sum": 0.0, "count": 0.0}
    for kind in out:
        match = re.search(rf"^bargein_admission_ttft_error_ratio_{kind} ([0-9.e+-]+)$", metrics_text, re.M)
        if match:
            out[kind] = float(match.group(1))
    return out


async def burst(url: str, size: int, max_tokens: int) -> dict[str, Any]:
    """Send ``size`` requests at once; what came of them."""
    limits = httpx.Limits(max_connections=size + 4, max_keepalive_connections=size + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        before = ratio_histogram((await http.get("/metrics")).text)
        bodies = [chat_body(PROMPTS[i % len(PROMPTS)], max_tokens, ignore_eos=True) for i in range(size)]
        results = await asyncio.gather(*(one(http, body) for body in bodies))
        after = ratio_histogram((await http.get("/metrics")).text)
    served_ = [t for t, _ in results if t.error is None]
    refused = [(t, h) for t, h in results if t.error is not None]
    ttfts = [t.ttft for t in served_ if t.ttft is not None]
    itls = [gap for t in served_ for gap in t.itls]
    n_pred = after["count"] - before["count"]
    statuses: dict[str, int] = {}
    for t, _ in refused:
        statuses[str(t.error)] = statuses.get(str(t.error), 0) + 1
    return {
        "burst": size,
        "served": len(served_),
        "refused": len(refused),
        "refusals": statuses,
        "refusals_without_retry_after": sum(
            1 for t, h in refused if str(t.error) in ("http_503", "http_429") and "retry-after" not in h
        ),
        "ttft_p50_s": percentile(ttfts, 0.5),
        "ttft_p95_s": percentile(ttfts, 0.95),
        "ttft_max_s": max(ttfts) if ttfts else None,
        "itl_p95_s": percentile(itls, 0.95),
        "e2e_max_s": max((t.done_at - t.sent_at for t in served_ if t.done_at), default=None),
        "ttft_measured_over_predicted_mean": (after["sum"] - before["sum"]) / n_pred if n_pred else None,
        "predictions": int(n_pred),
    }


def fmt(value: float | None, unit: str = "s") -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if unit == "ms" else f"{value:.2f} {unit}".strip()


# (name, extra flags): the serve defaults, and in the same run the rule before
# bursts were queued (a TTFT target of 0: past the ITL batch, refused at once).
ABBA = (0, 1, 1, 0)  # the order the policies run in
POLICIES = (
    ("defaults (queue within the TTFT target)", ()),
    ("baseline: --target-ttft-s 0", ("--target-ttft-s", "0")),
)


def report(args: argparse.Namespace, runs: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Bursts of short chat requests",
        "",
        f"Command: `{meta['command']}`  ",
        f"Date: {meta['date']}; machine: {meta['machine']}; load average before/after: "
        f"{meta['load_before']} / {meta['load_after']}  ",
        f"Extra server flags: `{meta['flags'] or '(none)'}`; targets: TTFT {TTFT_TARGET_S} s, "
        f"ITL {ITL_TARGET_S * 1000:.0f} ms (the serve defaults).",
        "",
        f"Each burst sends N streamed `/v1/chat/completions` requests at once (max_tokens {args.max_tokens}, "
        "`ignore_eos`, greedy), after the previous burst ended, to a server warmed up by two requests. "
        "TTFT and ITL are measured at the client over the served requests. *Measured / predicted TTFT* "
        "is the mean over the admitted requests of `bargein_admission_ttft_error_ratio` (the admission's "
        "TTFT prediction against the TTFT the engine then measured): 1 is exact, above 1 the model was "
        "optimistic, below 1 pessimistic. The baseline is the same server without TTFT queueing "
        "(`--target-ttft-s 0`), in the same run; the two alternate (A B B A) because other processes "
        "load the machine unevenly: compare a pass with its neighbour, and each row's ITL with the "
        "200 ms target (a served request's ITL past it says the machine, not the admission, was slow).",
        "",
    ]
    for number, policy in enumerate(runs, 1):
        lines += [
            f"## Pass {number}: {policy['policy']}",
            "",
            "| burst | served | refused | refusals | 503/429 without Retry-After | TTFT p50 | TTFT p95 | "
            "ITL p95 | slowest request | measured / predicted TTFT |",
            "| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for row in policy["bursts"]:
            ratio = row["ttft_measured_over_predicted_mean"]
            lines.append(
                f"| {row['burst']} | {row['served']} | {row['refused']} | "
                f"{', '.join(f'{k}: {v}' for k, v in row['refusals'].items()) or '-'} | "
                f"{row['refusals_without_retry_after']} | {fmt(row['ttft_p50_s'])} | "
                f"{fmt(row['ttft_p95_s'])} | {fmt(row['itl_p95_s'], 'ms')} | {fmt(row['e2e_max_s'])} | "
                f"{'-' if ratio is None else f'{ratio:.2f}'} |"
            )
        lines.append("")
    return "\n".join(lines)


async def run_policy(args: argparse.Namespace, flags: Sequence[str]) -> list[dict[str, Any]]:
    """Start a server with ``flags``, warm it up, send the bursts; their rows."""
    rows = []
    with served(["--voice", "off", *flags]) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:  # warm-up: the step model learns
            for _ in range(2):
                await one(http, chat_body(PROMPTS[0], args.max_tokens, ignore_eos=True))
        for size in args.bursts:
            row = await burst(url, size, args.max_tokens)
            print(json.dumps(row), flush=True)
            rows.append(row)
            await asyncio.sleep(1.0)
    return rows


async def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    flags = shlex.split(args.flags)
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    runs = []
    for i in ABBA:  # the machine's load drifts (other processes): each policy runs twice, around the other
        name, policy_flags = POLICIES[i]
        print(name, flush=True)
        runs.append({"policy": name, "bursts": await run_policy(args, [*flags, *policy_flags])})
    meta = {
        "command": " ".join(["python", *sys.argv]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "load_before": load_before,
        "load_after": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "flags": args.flags,
    }
    return runs, meta


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bursts", default="8,16,32", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--flags", default="", help="extra bargein serve flags")
    parser.add_argument("--out", default="docs/perf/bursts.md")
    args = parser.parse_args(argv)
    runs, meta = asyncio.run(run(args))
    out = Path(args.out)
    out.write_text(report(args, runs, meta))
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=2) + "\n")
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
