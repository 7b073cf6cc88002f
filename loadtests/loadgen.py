"""Open-loop load generator for bargein's realtime protocol (``/v1/realtime``).

Requests arrive as a Poisson process at ``--rate`` per second for
``--duration`` seconds, whatever the server does (open loop: a slow server
does not slow the arrivals down, as in real traffic). Each request opens its
own WebSocket (a new session), sends one ``response.create`` and reads the
answer to ``response.done``. Prompt lengths (words) and ``max_tokens`` are
drawn from log-normal distributions (``--prompt-words``, ``--max-tokens``
give the medians). The generator stops by itself: arrivals end at
``--duration``, requests still running get ``--drain`` more seconds, then
it reports. It only targets loopback addresses.

Realtime behaviours, each drawn per request:

- ``--interrupt-rate p``: barge-in: send ``response.cancel`` after a random
  number (1-8) of deltas.
- ``--disconnect-rate p``: drop the TCP connection (no close frame) after a
  random number of deltas, reconnect after 200 ms and ``stream.resume``
  from the last offset received.
- ``--slow-readers N``: N more clients, for the whole run, each asking for a
  long answer and reading one delta per second (their numbers are reported
  apart: they are the experiment, the others are the victims);
  ``--slow-head-start s`` starts them ``s`` seconds before the other arrivals.

Reported (JSON, ``--out``), per offered rate: TTFT (``response.create``
sent -> first delta; the connect is included), inter-token latency (the gap
between deltas divided by the tokens the later one carries, one sample per
token), end-to-end latency, at p50/p95/p99; errors by code (and close codes
at connect; ``<code>_in_queue`` for a request admitted, then dropped from
the queue at its deadline); the latency and ``retry_after_ms`` of
rejections (refusals at submit or connect, not drops); and goodput:
completed requests per second whose TTFT <= ``--slo-ttft`` and whose own
p95 ITL <= ``--slo-itl``. Default SLO on the 2-core CPU box: TTFT 2 s, ITL
250 ms. With ``--rates a,b,c`` it sweeps and plots latency against offered
load (``--plot``, PNG) with the knee marked: the offered rate where goodput
peaks (more offered load brings no more requests within the SLO).

Usage::

    python loadtests/loadgen.py --url ws://127.0.0.1:8000/v1/realtime \\
        --rates 0.5,1,2,4 --duration 30 --out docs/perf/loadgen.json \\
        --plot docs/perf/saturation.png
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import math
import random
import socket
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

SUBPROTOCOL = "bargein.v1.json"
WORDS = (
    "river stone light garden window music paper engine silver morning "
    "question answer winter market forest letter bridge story number travel"
).split()
QUESTIONS = ("Tell me about", "Explain", "Write a short note on", "Describe", "Summarise")


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadConfig:
    """One run's load (times in seconds, probabilities in [0, 1])."""

    url: str
    rate: float
    duration_s: float
    prompt_words: int = 24
    max_tokens: int = 48
    slow_readers: int = 0
    slow_max_tokens: int = 64
    slow_head_start_s: float = 0.0
    slow_requests_each: int = 0  # 0: ask again until the run ends
    interrupt_rate: float = 0.0
    disconnect_rate: float = 0.0
    drain_s: float = 60.0
    api_key: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.duration_s <= 0:
            raise ValueError(f"rate={self.rate} and duration_s={self.duration_s} must be > 0")
        for name in ("interrupt_rate", "disconnect_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)} must be in [0, 1]")


@dataclass(slots=True, kw_only=True)
class Sample:
    """What one request saw (seconds; ``None`` when it never got there)."""

    kind: str = "normal"  # normal, slow
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    e2e: float | None = None
    tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None  # error code, "close_<code>", "http_<status>" or an exception name
    reject_latency: float | None = None  # request sent -> error event
    retry_after_ms: int | None = None
    resumed: bool = False


def require_loopback(url: str) -> None:
    """Raise ``ValueError`` unless every address ``url``'s host resolves to is loopback."""
    host = urlsplit(url).hostname or ""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve {host!r}: {exc}") from exc
    addresses = {info[4][0] for info in infos}
    if not addresses or not all(ipaddress.ip_address(a).is_loopback for a in addresses):
        raise ValueError(f"refusing to load {host!r}: loopback targets only")


def lognormal_int(rng: random.Random, median: int, sigma: float = 0.5, low: int = 1) -> int:
    """An integer from a log-normal with the given median, at least ``low``."""
    return max(low, round(median * math.exp(rng.gauss(0.0, sigma))))


def make_prompt(rng: random.Random, num_words: int) -> str:
    """A user prompt of about ``num_words`` words."""
    words = " ".join(rng.choice(WORDS) for _ in range(num_words))
    return f"{rng.choice(QUESTIONS)} {words}."


def make_story_prompt(rng: random.Random) -> str:
    """A slow reader's prompt: the bundled model answers it at full length
    (``finish_reason`` ``length``), where a question often ends in 30 tokens."""
    return f"Write a long, detailed story about {' '.join(rng.sample(WORDS, 6))}."


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50/p95/p99 (nearest rank) of ``values`` in seconds, or None when empty."""
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

    return {"p50": rank(0.50), "p95": rank(0.95), "p99": rank(0.99)}


class Client:
    """One request over its own connection, timing every event."""

    def __init__(self, cfg: LoadConfig, rng: random.Random, sample: Sample) -> None:
        self.cfg = cfg
        self.rng = rng
        self.sample = sample
        self.ws: ClientConnection | None = None
        self.stream: dict[str, Any] = {}
        self.end = 0
        self.last_at = 0.0

    async def open(self) -> None:
        headers = {"Authorization": f"Bearer {self.cfg.api_key}"} if self.cfg.api_key else {}
        # A slow reader is a voice client: its WebSocket reads the socket as
        # frames come (so it answers the server's pings, as a browser does) and
        # the application takes one delta a second. Unbounded, the library's
        # queue never stops reading the socket: a bounded one would, and the
        # pings would wait behind minutes of deltas until the server's
        # liveness timeout closed the connection. (A client slow at the TCP
        # level is the never-reading client of tests/app/test_backpressure.py.)
        self.ws = await connect(
            self.cfg.url,
            subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
            additional_headers=headers,
            open_timeout=30,
            max_queue=None if self.sample.kind == "slow" else 64,
        )
        first = json.loads(await self.ws.recv())
        assert first["type"] == "session.created", first

    async def recv(self) -> dict[str, Any]:
        assert self.ws is not None
        return json.loads(await self.ws.recv())  # type: ignore[no-any-return]

    async def run(self, prompt: str, max_tokens: int) -> None:
        """Ask, then read to ``response.done`` (with the drawn realtime behaviour)."""
        started = time.perf_counter()
        try:
            await self.open()
        except InvalidStatus as exc:
            self.sample.error = f"http_{exc.response.status_code}"
            return
        except ConnectionClosed as exc:  # 1013: saturated at connect
            self.sample.error = f"close_{exc.rcvd.code if exc.rcvd else 1006}"
            self.sample.reject_latency = time.perf_counter() - started
            return
        assert self.ws is not None
        sent_at = time.perf_counter()
        await self.ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "max_tokens": max_tokens,
                    "temperature": 0.0,
                    "input": [{"role": "user", "content": prompt}],
                }
            )
        )
        self.last_at = sent_at
        await self._read(started, sent_at)

    async def _read(self, started: float, sent_at: float) -> None:
        interrupt_after = self._draw(self.cfg.interrupt_rate)
        drop_after = self._draw(self.cfg.disconnect_rate)
        num_deltas = 0
        while True:
            try:
                event = await self.recv()
            except ConnectionClosed as exc:
                if drop_after == -1 and not self.sample.resumed:
                    await self._resume()
                    continue
                code = exc.rcvd.code if exc.rcvd else 1006
                self.sample.error = f"close_{code}"
                return
            now = time.perf_counter()
            kind = event["type"]
            if kind == "response.created":
                self.stream = event
            elif kind == "response.delta":
                self._delta(event, now, sent_at)
                num_deltas += 1
                if num_deltas == interrupt_after:
                    await self._send({"type": "response.cancel", "response_id": event["response_id"]})
                if num_deltas == drop_after:
                    drop_after = -1
                    self.ws.transport.abort()  # type: ignore[union-attr]
                if self.sample.kind == "slow":
                    await asyncio.sleep(1.0)  # one delta per second
            elif kind == "response.done":
                self.sample.e2e = now - started
                self.sample.finish_reason = event["finish_reason"]
                return
            elif kind == "error":
                self.sample.retry_after_ms = event.get("retry_after_ms")
                if self.stream:  # admitted, then dropped from the queue at its deadline
                    self.sample.error = f"{event['code']}_in_queue"
                    return
                self.sample.error = event["code"]
                self.sample.reject_latency = now - sent_at
                return

    def _draw(self, probability: float) -> int | None:
        """The delta after which to act, or None (not this request)."""
        if probability and self.rng.random() < probability:
            return self.rng.randint(1, 8)
        return None

    def _delta(self, event: dict[str, Any], now: float, sent_at: float) -> None:
        num_tokens = max(1, event["end"] - max(event["start"], self.end))
        if self.sample.ttft is None:
            self.sample.ttft = now - sent_at
        else:
            self.sample.itl += [(now - self.last_at) / num_tokens] * num_tokens
        self.last_at = now
        self.end = max(self.end, event["end"])
        self.sample.tokens = self.end

    async def _send(self, event: dict[str, Any]) -> None:
        assert self.ws is not None
        await self.ws.send(json.dumps(event))

    async def _resume(self) -> None:
        await asyncio.sleep(0.2)
        await self.open()
        self.sample.resumed = True
        await self._send(
            {
                "type": "stream.resume",
                "stream_id": self.stream["stream_id"],
                "resume_token": self.stream["resume_token"],
                "from": self.end,
            }
        )
        self.last_at = time.perf_counter()

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


async def one_request(
    cfg: LoadConfig, rng: random.Random, sample: Sample, prompt: str, max_tokens: int
) -> None:
    """Run one request into ``sample``; never raises (errors are recorded)."""
    client = Client(cfg, rng, sample)
    try:
        await client.run(prompt, max_tokens)
    except (OSError, ConnectionClosed, TimeoutError) as exc:
        sample.error = sample.error or type(exc).__name__
    finally:
        try:
            await client.close()
        except (OSError, ConnectionClosed):
            pass


async def slow_reader(cfg: LoadConfig, rng: random.Random, until: float, samples: list[Sample]) -> None:
    """Ask for long answers one after another, reading a delta per second, until
    ``until`` (or ``cfg.slow_requests_each`` times)."""
    num_asked = 0
    while time.perf_counter() < until and num_asked != cfg.slow_requests_each:
        num_asked += 1
        sample = Sample(kind="slow")
        samples.append(sample)
        await one_request(cfg, rng, sample, make_story_prompt(rng), cfg.slow_max_tokens)


async def run_load(cfg: LoadConfig, samples: list[Sample] | None = None) -> list[Sample]:
    """Offer ``cfg.rate`` requests/s for ``cfg.duration_s`` s; return every sample.

    ``samples``: a list to fill as requests start (to watch a run in progress).
    """
    require_loopback(cfg.url)
    rng = random.Random(cfg.seed)
    samples = [] if samples is None else samples
    start = time.perf_counter() + cfg.slow_head_start_s
    until = start + cfg.duration_s
    tasks = [
        asyncio.create_task(slow_reader(cfg, random.Random(cfg.seed + 1 + i), until, samples))
        for i in range(cfg.slow_readers)
    ]
    next_at = start + rng.expovariate(cfg.rate)
    while next_at < until:
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        sample = Sample()
        samples.append(sample)
        max_tokens = lognormal_int(rng, cfg.max_tokens, sigma=0.3)
        request_rng = random.Random(rng.random())
        prompt = make_prompt(request_rng, lognormal_int(request_rng, cfg.prompt_words))
        tasks.append(asyncio.create_task(one_request(cfg, request_rng, sample, prompt, max_tokens)))
        next_at += rng.expovariate(cfg.rate)
    _, pending = await asyncio.wait(tasks, timeout=cfg.drain_s) if tasks else (set(), set())
    for task in pending:
        task.cancel()
    for sample in samples:
        if sample.e2e is None and sample.error is None:
            sample.error = "unfinished"
    return samples


def summarize(cfg: LoadConfig, samples: Sequence[Sample], slo_ttft: float, slo_itl: float) -> dict[str, Any]:
    """The JSON report of one rate: latencies, goodput under the SLO, errors."""
    normal = [s for s in samples if s.kind == "normal"]
    done = [s for s in normal if s.e2e is not None]
    good = [
        s
        for s in done
        if s.ttft is not None and s.ttft <= slo_ttft and (percentiles(s.itl)["p95"] or 0.0) <= slo_itl
    ]
    rejected = [s for s in normal if s.reject_latency is not None]
    dropped = [s for s in normal if s.error is not None and s.error.endswith("_in_queue")]
    report = {
        "offered_rate": cfg.rate,
        "duration_s": cfg.duration_s,
        "num_requests": len(normal),
        "num_completed": len(done),
        "completed_rate": len(done) / cfg.duration_s,
        "goodput": len(good) / cfg.duration_s,
        "slo": {"ttft_s": slo_ttft, "itl_p95_s": slo_itl},
        "finish_reasons": dict(Counter(s.finish_reason for s in done)),
        "errors": dict(Counter(s.error for s in normal if s.error)),
        "resumed": sum(s.resumed for s in normal),
        "dropped_in_queue": len(dropped),
    }
    report |= _latencies(normal, "")
    report["rejection_latency_s"] = percentiles(
        [s.reject_latency for s in rejected if s.reject_latency is not None]
    )
    report["retry_after_ms"] = sorted(
        {s.retry_after_ms for s in [*rejected, *dropped] if s.retry_after_ms is not None}
    )
    slow = [s for s in samples if s.kind == "slow"]
    if slow:
        report["slow_readers"] = {
            "num_requests": len(slow),
            "errors": dict(Counter(s.error for s in slow if s.error)),
            **_latencies(slow, ""),
        }
    return report


def _latencies(samples: Sequence[Sample], prefix: str) -> dict[str, Any]:
    return {
        f"{prefix}ttft_s": percentiles([s.ttft for s in samples if s.ttft is not None]),
        f"{prefix}itl_s": percentiles([t for s in samples for t in s.itl]),
        f"{prefix}e2e_s": percentiles([s.e2e for s in samples if s.e2e is not None]),
    }


def knee(reports: Sequence[dict[str, Any]]) -> float | None:
    """The offered rate where goodput peaks (the lowest such rate): past it, more
    offered load brings no more requests served within the SLO. None if no goodput."""
    best = max((r["goodput"] for r in reports), default=0.0)
    if best <= 0:
        return None
    return min(r["offered_rate"] for r in reports if r["goodput"] >= best)


def plot(reports: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """Latency percentiles and goodput against offered load, knee marked (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [r["offered_rate"] for r in reports]
    fig, (lat, good) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, label in (("ttft_s", "TTFT"), ("itl_s", "ITL"), ("e2e_s", "end-to-end")):
        for q, style in (("p50", "--"), ("p95", "-")):
            ys = [r[key][q] if r[key][q] is not None else math.nan for r in reports]
            lat.plot(rates, ys, style, marker="o", label=f"{label} {q}")
    rejections = [r["rejection_latency_s"]["p99"] for r in reports]
    if any(v is not None for v in rejections):
        lat.plot(
            rates,
            [math.nan if v is None else v for v in rejections],
            "-",
            marker="x",
            color="black",
            label="rejection p99",
        )
    lat.set(
        xlabel="offered load (requests/s)", ylabel="seconds", yscale="log", title="latency vs offered load"
    )
    good.plot(rates, [r["goodput"] for r in reports], marker="o", label="goodput (SLO met)")
    good.plot(rates, [r["completed_rate"] for r in reports], marker="s", label="completed")
    good.plot(rates, rates, ":", color="gray", label="offered")
    good.set(xlabel="offered load (requests/s)", ylabel="requests/s", title="goodput")
    k = knee(reports)
    for axis in (lat, good):
        if k is not None:
            axis.axvline(k, color="red", alpha=0.5, label=f"knee {k:g}/s")
        axis.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime")
    p.add_argument("--rate", type=float, default=1.0, help="requests per second")
    p.add_argument("--rates", default=None, help="comma list: sweep these rates")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals per rate")
    p.add_argument("--drain", type=float, default=60.0, help="seconds to finish after that")
    p.add_argument("--prompt-words", type=int, default=24, help="median prompt words")
    p.add_argument("--max-tokens", type=int, default=48, help="median max_tokens")
    p.add_argument("--slow-readers", type=int, default=0)
    p.add_argument("--slow-max-tokens", type=int, default=64)
    p.add_argument(
        "--slow-head-start",
        type=float,
        default=0.0,
        help="seconds the slow readers start before the other arrivals",
    )
    p.add_argument("--interrupt-rate", type=float, default=0.0)
    p.add_argument("--disconnect-rate", type=float, default=0.0)
    p.add_argument("--slo-ttft", type=float, default=2.0, help="seconds")
    p.add_argument("--slo-itl", type=float, default=0.25, help="seconds, per-request p95")
    p.add_argument("--api-key", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="JSON report (default: stdout)")
    p.add_argument("--plot", type=Path, default=None, help="PNG of a --rates sweep")
    return p.parse_args(argv)


async def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One run per rate (``--rates``, else ``--rate``), one after the other."""
    rates = [float(r) for r in args.rates.split(",")] if args.rates else [args.rate]
    reports = []
    for rate in rates:
        cfg = LoadConfig(
            url=args.url,
            rate=rate,
            duration_s=args.duration,
            prompt_words=args.prompt_words,
            max_tokens=args.max_tokens,
            slow_readers=args.slow_readers,
            slow_max_tokens=args.slow_max_tokens,
            slow_head_start_s=args.slow_head_start,
            interrupt_rate=args.interrupt_rate,
            disconnect_rate=args.disconnect_rate,
            drain_s=args.drain,
            api_key=args.api_key,
            seed=args.seed,
        )
        samples = await run_load(cfg)
        reports.append(summarize(cfg, samples, args.slo_ttft, args.slo_itl))
        print(
            f"rate {rate:g}/s: {json.dumps(reports[-1]['ttft_s'])} "
            f"goodput {reports[-1]['goodput']:.2f}/s errors {reports[-1]['errors']}",
            file=sys.stderr,
        )
    return reports


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; exit status 2 for a non-loopback target."""
    args = _parse(argv)
    try:
        require_loopback(args.url)
    except ValueError as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return 2
    reports = asyncio.run(sweep(args))
    result = {
        "url": args.url,
        "runs": reports,
        "knee_rate": knee(reports),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    else:
        print(text)
    if args.plot:
        plot(
            reports,
            args.plot,
            f"bargein loadgen, SLO: TTFT <= {args.slo_ttft} s, ITL p95 <= {args.slo_itl} s",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
