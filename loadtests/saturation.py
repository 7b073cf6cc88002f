"""Goodput past the knee: the SLO-aware policy against the old one, in one run.

Sweeps offered load from a quarter of the knee to eight times it (open loop,
Poisson arrivals, :mod:`loadtests.loadgen`), on ``bargein serve`` (bundled
model, one subprocess per sweep), with

- ``new``: the serve defaults: every step filled up to ``--target-itl-ms``
  by the learned step-time model, admission against the same model and
  ``--target-ttft-s`` (docs/operating.md, Overload);
- ``old``: the policy before it, for comparison: ``--target-itl-ms 0`` (the
  token limits alone) and the queue-time deadline ``--max-queue-time``;

and the variants ``slow`` (10 slow readers besides the arrivals) and
``interrupts`` (30% of requests barge in after 1-8 deltas). Each sweep's
rates run one after the other on its server. The report checks the targets
of issue 21 for the new policy: goodput at 4x and 8x the knee at least 90%
of the peak goodput, admitted requests' TTFT p95 and ITL p95 within the SLO
at every rate, refusals' p99 under 50 ms, each with ``retry_after_ms``.

Usage: ``python loadtests/saturation.py`` (at most 16 minutes: it prints its
estimate first) writes ``docs/perf/saturation.md``, ``.json`` and ``.png``;
it needs a quiet machine. A smoke: ``--multiples 1,4 --duration 3 --drain 5
--variants base --out /tmp/sat/saturation.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtests.loadgen import LoadConfig, run_load, summarize  # noqa: E402
from loadtests.server_proc import load_average, served  # noqa: E402

SERVER_START_S = 20.0  # model load from the converted-weights cache, and the readiness wait
REFUSALS = ("overloaded", "rate_limited", "close_1013")
# Orphaned generation (a request the load generator gave up on at the drain)
# must not load the next rate: it stops 2 s after its client left (a resume
# comes back within 200 ms).
COMMON_FLAGS = ("--abandon-grace", "2")


@dataclass(frozen=True, slots=True, kw_only=True)
class Sweep:
    """One server and its rates: a policy under a variant of the load."""

    policy: str  # new, old
    variant: str  # base, slow, interrupts
    flags: tuple[str, ...]
    load: dict[str, Any] = field(default_factory=dict)  # LoadConfig fields of the variant

    @property
    def name(self) -> str:
        return f"{self.variant}/{self.policy}"


def policy_flags(policy: str, args: argparse.Namespace) -> tuple[str, ...]:
    """The server flags of a policy (on top of :data:`COMMON_FLAGS`)."""
    if policy == "new":
        return ()  # the serve defaults: no tuning
    if policy == "old":
        return (
            "--target-itl-ms",
            "0",
            "--target-ttft-s",
            "0",
            "--max-queue-time",
            f"{args.old_queue_time:g}",
        )
    raise ValueError(f"unknown policy {policy!r}: new or old")


VARIANTS: dict[str, dict[str, Any]] = {
    "base": {},
    "slow": {"slow_readers": 10, "slow_head_start_s": 3.0},
    "interrupts": {"interrupt_rate": 0.3},
}


def sweeps(args: argparse.Namespace) -> list[Sweep]:
    """Every sweep of the run: each variant under each policy asked for it."""
    out = []
    for variant in args.variants.split(","):
        policies = args.policies if variant == "base" else args.variant_policies
        for policy in policies.split(","):
            out.append(
                Sweep(
                    policy=policy,
                    variant=variant,
                    flags=(*COMMON_FLAGS, *policy_flags(policy, args), *args.server_flags.split()),
                    load=VARIANTS[variant],
                )
            )
    return out


def rates(args: argparse.Namespace) -> list[float]:
    return [args.knee * float(m) for m in args.multiples.split(",")]


def expected_s(args: argparse.Namespace) -> float:
    """An upper bound on the run's wall time: servers, arrivals, drains."""
    per_rate = args.duration + args.drain
    total = 0.0
    for sweep in sweeps(args):
        total += SERVER_START_S + len(rates(args)) * (per_rate + sweep.load.get("slow_head_start_s", 0.0))
    return total


async def run_sweep(sweep: Sweep, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One server, its rates lowest first; a report per rate."""
    reports = []
    with served(list(sweep.flags)) as url:
        for rate in rates(args):
            cfg = LoadConfig(
                url=url.replace("http://", "ws://") + "/v1/realtime",
                rate=rate,
                duration_s=args.duration,
                prompt_words=args.prompt_words,
                max_tokens=args.max_tokens,
                drain_s=args.drain,
                seed=args.seed,
                **sweep.load,
            )
            report = summarize(cfg, await run_load(cfg), args.slo_ttft, args.slo_itl)
            report["multiple"] = rate / args.knee
            reports.append(report)
            print(
                f"{sweep.name} {rate:g}/s: goodput {report['goodput']:.2f} errors {report['errors']}",
                file=sys.stderr,
            )
    return reports


def _num_refused(report: dict[str, Any]) -> int:
    return sum(v for code, v in report["errors"].items() if code in REFUSALS)


def targets(
    reports: Sequence[dict[str, Any]], args: argparse.Namespace
) -> list[tuple[str, bool | None, str]]:
    """Issue 21's targets on one sweep: (what, met (None: no rate to judge), the numbers)."""
    peak = max((r["goodput"] for r in reports), default=0.0)
    far = [r for r in reports if r["multiple"] >= 4]
    out = [
        (
            "goodput at 4x and 8x the knee >= 90% of the peak",
            (peak > 0 and all(r["goodput"] >= 0.9 * peak for r in far)) if far else None,
            f"peak {peak:.2f}/s; " + ", ".join(f"{r['multiple']:g}x {r['goodput']:.2f}/s" for r in far),
        )
    ]
    ttft = [r["ttft_s"]["p95"] for r in reports]
    itl = [r["itl_s"]["p95"] for r in reports]
    out.append(
        (
            f"admitted TTFT p95 <= {args.slo_ttft:g} s at every rate",
            all(v is not None and v <= args.slo_ttft for v in ttft),
            "max " + _s(max((v for v in ttft if v is not None), default=None)),
        )
    )
    out.append(
        (
            f"admitted ITL p95 <= {args.slo_itl:g} s at every rate",
            all(v is not None and v <= args.slo_itl for v in itl),
            "max " + _s(max((v for v in itl if v is not None), default=None)),
        )
    )
    refusal_p99 = [r["rejection_latency_s"]["p99"] for r in reports if r["rejection_latency_s"]["p99"]]
    with_retry = all(r["retry_after_ms"] for r in reports if _num_refused(r))
    out.append(
        (
            "refusals p99 < 50 ms, with retry_after_ms",
            all(v < 0.05 for v in refusal_p99) and with_retry,
            ("max " + _ms1(max(refusal_p99)) + " ms" if refusal_p99 else "no refusals")
            + ("" if with_retry else "; some without retry_after_ms"),
        )
    )
    return out


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{1000 * value:.0f}"


def _ms1(value: float | None) -> str:
    return "n/a" if value is None else f"{1000 * value:.1f}"


def table(reports: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        "| x knee | offered /s | requests | completed /s | goodput /s | TTFT p50 / p95 ms "
        "| ITL p50 / p95 ms | refused | refusal p50 / p99 ms | dropped | retry_after_ms | other errors |",
        "|" + " ---: |" * 10 + " --- | --- |",
    ]
    for r in reports:
        rej, retry = r["rejection_latency_s"], r["retry_after_ms"]
        other = {c: v for c, v in r["errors"].items() if c not in REFUSALS}
        lines.append(
            f"| {r['multiple']:g} | {r['offered_rate']:g} | {r['num_requests']} | {r['completed_rate']:.2f} | "
            f"{r['goodput']:.2f} | {_ms(r['ttft_s']['p50'])} / {_ms(r['ttft_s']['p95'])} | "
            f"{_ms(r['itl_s']['p50'])} / {_ms(r['itl_s']['p95'])} | {_num_refused(r)} | "
            f"{_ms1(rej['p50'])} / {_ms1(rej['p99'])} | {r['dropped_in_queue']} | "
            f"{f'{min(retry)}-{max(retry)}' if retry else '-'} | {other or '-'} |"
        )
    return lines


def markdown(
    results: dict[str, list[dict[str, Any]]], args: argparse.Namespace, load: tuple[str, str], wall_s: float
) -> str:
    """The report: the targets' verdicts, then one table per sweep."""
    by_name = {s.name: s for s in sweeps(args)}
    lines = [
        "# Saturation: goodput past the knee, SLO-aware policy against the old one",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `python "
        f"loadtests/saturation.py {' '.join(args.argv)}` ({wall_s / 60:.0f} min) on the bundled "
        "SmolLM2-135M (CPU), load average "
        f"{load[0]} at the start, {load[1]} at the end; the load generator shares the machine.",
        "",
        f"Open loop, Poisson arrivals, {args.duration:g} s per rate, each request on a new "
        f"WebSocket; median {args.prompt_words} prompt words and {args.max_tokens} max_tokens. "
        f"Rates are multiples of the knee, {args.knee:g} requests/s (the old policy's, issue 21). "
        f"SLO: TTFT <= {args.slo_ttft:g} s and the request's own ITL p95 <= {args.slo_itl:g} s; "
        "goodput = requests/s completed within it. TTFT and ITL columns are the admitted "
        "requests'. Refusal latency: `response.create` sent -> `error` received (or connect -> "
        "close 1013). *dropped*: admitted, then dropped from the queue at `--max-queue-time`.",
        "",
        "Policies: **new** = `bargein serve` defaults (`--target-itl-ms 200 --target-ttft-s 1.5`: "
        "each step filled up to the ITL target by the learned step-time model, admission "
        "against the same model); **old** = `--target-itl-ms 0 --target-ttft-s 0 "
        f"--max-queue-time {args.old_queue_time:g}` (the token limits, up to 64 sequences a "
        "step, and the queue-time estimate). Every server also runs with "
        f"`{' '.join(COMMON_FLAGS)}`. Variants: *base*; *slow*: 10 slow readers (a delta a "
        "second, long answers) besides the arrivals; *interrupts*: 30% of requests barge in "
        "after 1-8 deltas.",
        "",
        "![saturation](saturation.png)",
        "",
        "## Targets (issue 21)",
        "",
        "| sweep | target | met | numbers |",
        "| --- | --- | --- | --- |",
    ]
    for name, reports in results.items():
        for what, met, detail in targets(reports, args):
            verdict = "n/a" if met is None else "yes" if met else "**no**"
            lines.append(f"| {name} | {what} | {verdict} | {detail} |")
    for name, reports in results.items():
        sweep = by_name[name]
        lines += ["", f"## {name}", "", f"Server flags: `{' '.join(sweep.flags)}`.", "", *table(reports)]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, list[dict[str, Any]]], path: Path, args: argparse.Namespace) -> None:
    """Goodput, TTFT p95 and ITL p95 against offered load, one line per sweep (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    styles = {"new": "-", "old": "--"}
    for name, reports in results.items():
        policy = name.split("/")[1]
        xs = [r["offered_rate"] for r in reports]
        series = (
            [r["goodput"] for r in reports],
            [math.nan if r["ttft_s"]["p95"] is None else r["ttft_s"]["p95"] for r in reports],
            [math.nan if r["itl_s"]["p95"] is None else r["itl_s"]["p95"] for r in reports],
        )
        for axis, ys in zip(axes, series, strict=True):
            axis.plot(xs, ys, styles.get(policy, ":"), marker="o", label=name)
    axes[1].axhline(args.slo_ttft, color="red", alpha=0.4, label="SLO")
    axes[2].axhline(args.slo_itl, color="red", alpha=0.4, label="SLO")
    titles = ("goodput (SLO met), requests/s", "admitted TTFT p95, s", "admitted ITL p95, s")
    for axis, title in zip(axes, titles, strict=True):
        axis.set(xscale="log", xlabel="offered load (requests/s)", title=title)
        axis.axvline(args.knee, color="gray", alpha=0.4)
        axis.legend(fontsize=7)
    fig.suptitle(
        f"bargein saturation: new (SLO-aware) vs old policy; knee {args.knee:g}/s; "
        f"SLO TTFT <= {args.slo_ttft:g} s, ITL p95 <= {args.slo_itl:g} s",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--knee", type=float, default=4.0, help="requests/s: the old policy's knee (issue 21)")
    p.add_argument("--multiples", default="0.25,0.5,1,2,4,8", help="offered rates, in knees")
    p.add_argument("--duration", type=float, default=12.0, help="seconds of arrivals per rate")
    p.add_argument("--drain", type=float, default=25.0, help="most seconds to finish after that")
    p.add_argument("--prompt-words", type=int, default=24)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--policies", default="new,old", help="policies of the base sweep")
    p.add_argument("--variants", default="base,slow,interrupts")
    p.add_argument("--variant-policies", default="new", help="policies of the other variants")
    p.add_argument("--old-queue-time", type=float, default=1.5, help="the old policy's --max-queue-time")
    p.add_argument("--slo-ttft", type=float, default=2.0)
    p.add_argument("--slo-itl", type=float, default=0.5)
    p.add_argument("--server-flags", default="", help="more bargein serve flags, for every sweep")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--out", type=Path, default=Path("docs/perf/saturation.md"))
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Every sweep, then the markdown, the JSON and the plot."""
    args = _parse(argv)
    plan = sweeps(args)
    print(
        f"{len(plan)} sweeps x {len(rates(args))} rates: at most {expected_s(args) / 60:.0f} min",
        file=sys.stderr,
    )
    start_load, started = load_average(), time.monotonic()
    results = {sweep.name: asyncio.run(run_sweep(sweep, args)) for sweep in plan}
    wall_s = time.monotonic() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(results, args, (start_load, load_average()), wall_s))
    verdicts = {name: targets(reports, args) for name, reports in results.items()}
    args.out.with_suffix(".json").write_text(
        json.dumps(
            {
                "knee_rate": args.knee,
                "sweeps": {
                    name: {"flags": s.flags, "load": s.load, "runs": results[name], "targets": verdicts[name]}
                    for name, s in ((s.name, s) for s in plan)
                },
            },
            indent=2,
        )
        + "\n"
    )
    plot(results, args.out.with_suffix(".png"), args)
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
