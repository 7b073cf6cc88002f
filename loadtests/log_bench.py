"""Token log benchmark: pipelined steps against one XADD per token, replay, and delivery latency.

On a loopback redis-server (started here unless ``--redis-url`` is given), in
one run, reported as medians over ``--runs``:

1. Append throughput for ``--streams`` concurrent streams, one token per
   stream per engine step (decode): bargein's ``RedisTokenLog.write_step``
   (one pipeline per step) against one ``XADD`` per token, awaited one after
   the other (a per-token write loop) and from one task per stream (64
   concurrent writers on a connection pool).
2. Replay of a completed ``--replay-tokens``-token stream written one token
   per entry (the worst case): a reader on another node (XRANGE batches), and
   the memory backend.
3. Latency from the engine output (``write_step`` called) to a reader
   receiving the entry, p50 and p99, ``--streams`` streams with one reader
   each, a step every ``--step-ms``: memory backend; Redis backend with the
   reader on the writing node (in-process fan-out); reader on another node
   (the multiplexed ``XREAD BLOCK``).

With ``--deployments`` (issue 23) it measures instead, in one run: append
tokens/s and replay tokens/s on a local Redis Cluster of 1 and of 3 shards
(``redis+cluster://``: per-shard step writes with their doorbell rings), and
the cost of ``--log-durability`` (none, wait-on-end, wait-every-ms:10) on a
primary with one replica.

Writes a markdown report (``--out``).
Usage: ``python loadtests/log_bench.py [--streams 64] [--steps 256] [--runs 3] [--deployments]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bargein.session.streams.log import LogEntry, MemoryTokenLog, StreamEnd, StreamInfo, StreamWrite, TokenLog  # noqa: E402
from bargein.session.streams.log.durability import parse_durability  # noqa: E402
from bargein.session.streams.log.redis_streams import RedisLogConfig, RedisTokenLog  # noqa: E402
from loadtests.redis_cluster import RedisClusterServers  # noqa: E402
from loadtests.redis_server import RedisServer  # noqa: E402

TEXT = " token"  # a typical one-token text delta


def _info(sid: str) -> StreamInfo:
    return StreamInfo(
        stream_id=sid,
        response_id=f"r-{sid}",
        principal="bench",
        session_id=f"s-{sid}",
        owner_node="bench",
        status="live",
        end=0,
        finish=None,
    )


def _step(sids: list[str], end: int) -> list[StreamWrite]:
    """One decode step: token ``end - 1`` of every stream."""
    return [
        StreamWrite(
            stream_id=sid,
            entry=LogEntry(start=end - 1, end=end, text=TEXT, token_ids=(1000 + end,)),
            finish=None,
        )
        for sid in sids
    ]


def _finish(sids: list[str], end: int) -> list[StreamWrite]:
    done = StreamEnd(
        end=end, finish_reason="length", prompt_tokens=10, completion_tokens=end, cached_tokens=0
    )
    return [StreamWrite(stream_id=sid, entry=None, finish=done) for sid in sids]


class Run:
    """Fresh key prefixes per measurement so runs never see each other's keys."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.count = 0

    def log(self, node: str = "node-a", prefix: str | None = None) -> tuple[RedisTokenLog, str]:
        self.count += 1
        prefix = prefix or f"bench{os.getpid()}.{self.count}:"
        return RedisTokenLog(self.url, node_id=node, config=RedisLogConfig(key_prefix=prefix)), prefix


class Rate:
    """Tokens per wall second, and this process's CPU microseconds per token (robust to other load)."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def stop(self) -> tuple[float, float]:
        wall, cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu
        return self.tokens / wall, cpu / self.tokens * 1e6


async def append_pipelined(run: Run, streams: int, steps: int) -> tuple[float, float]:
    """Tokens/s and CPU us/token through write_step, one pipeline per step."""
    log, _ = run.log()
    sids = [f"p{i}" for i in range(streams)]
    for sid in sids:
        await log.create_stream(_info(sid))
    rate = Rate(streams * steps)
    for end in range(1, steps + 1):
        await log.write_step(_step(sids, end))
    result = rate.stop()
    await log.write_step(_finish(sids, steps))
    await log.close()
    return result


async def append_per_token(run: Run, streams: int, steps: int, concurrent: bool) -> tuple[float, float]:
    """Tokens/s and CPU us/token with one awaited XADD per token (an entry's size)."""
    run.count += 1
    redis = Redis.from_url(run.url)
    keys = [f"naive{os.getpid()}.{run.count}:{{{i}}}:log" for i in range(streams)]
    fields = {"d": b"\x00" * 12 + TEXT.encode()}  # the size of a packed one-token entry

    async def one_stream(key: str) -> None:
        for end in range(1, steps + 1):
            await redis.xadd(key, fields, id=f"{end}-0")

    rate = Rate(streams * steps)
    if concurrent:
        await asyncio.gather(*(one_stream(key) for key in keys))
    else:
        for end in range(1, steps + 1):
            for key in keys:
                await redis.xadd(key, fields, id=f"{end}-0")
    result = rate.stop()
    await redis.delete(*keys)
    await redis.aclose()
    return result


async def _write_long(log: TokenLog, sid: str, tokens: int) -> None:
    await log.create_stream(_info(sid))
    for end in range(1, tokens + 1):
        await log.write_step(_step([sid], end))
    await log.write_step(_finish([sid], tokens))


async def _time_replay(log: TokenLog, sid: str, tokens: int) -> float:
    started = time.perf_counter()
    count = 0
    async for event in log.read(sid, 0):
        if isinstance(event, LogEntry):
            count += event.end - event.start
    assert count == tokens, count
    return time.perf_counter() - started


async def replay(run: Run, tokens: int, runs: int) -> dict[str, float]:
    """Seconds to replay a completed stream: Redis (another node) and memory."""
    writer, prefix = run.log("node-a")
    reader, _ = run.log("node-b", prefix)
    await _write_long(writer, "long", tokens)
    redis_s = statistics.median([await _time_replay(reader, "long", tokens) for _ in range(runs)])
    await writer.close()
    await reader.close()
    memory = MemoryTokenLog()
    await _write_long(memory, "long", tokens)
    memory_s = statistics.median([await _time_replay(memory, "long", tokens) for _ in range(runs)])
    return {"redis": redis_s, "memory": memory_s}


async def latency(writer: TokenLog, reader: TokenLog, streams: int, steps: int, step_s: float) -> list[float]:
    """Seconds from write_step called to the reader holding the entry, per entry."""
    sids = [f"l{i}" for i in range(streams)]
    for sid in sids:
        await writer.create_stream(_info(sid))
    sent: dict[int, float] = {}
    samples: list[float] = []
    warm = asyncio.Semaphore(0)

    async def follow(sid: str) -> None:
        async for event in reader.read(sid, 0):
            if isinstance(event, LogEntry) and event.end == 1:
                warm.release()
            elif isinstance(event, LogEntry):
                samples.append(time.perf_counter() - sent[event.end])

    readers = [asyncio.create_task(follow(sid)) for sid in sids]
    await writer.write_step(_step(sids, 1))  # warm-up: every reader caught up and following
    for _ in sids:
        await warm.acquire()
    for end in range(2, steps + 1):
        sent[end] = time.perf_counter()
        await writer.write_step(_step(sids, end))
        await asyncio.sleep(step_s)
    await writer.write_step(_finish(sids, steps))
    await asyncio.wait_for(asyncio.gather(*readers), 30)
    return samples


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def latencies(run: Run, streams: int, steps: int, step_s: float) -> dict[str, tuple[float, float]]:
    """p50/p99 ms per backend."""
    out: dict[str, tuple[float, float]] = {}
    memory = MemoryTokenLog()
    cases: list[tuple[str, Callable[[], Awaitable[tuple[TokenLog, TokenLog, list[TokenLog]]]]]] = []

    async def mem() -> tuple[TokenLog, TokenLog, list[TokenLog]]:
        return memory, memory, [memory]

    async def local() -> tuple[TokenLog, TokenLog, list[TokenLog]]:
        log, _ = run.log()
        return log, log, [log]

    async def remote() -> tuple[TokenLog, TokenLog, list[TokenLog]]:
        writer, prefix = run.log("node-a")
        reader, _ = run.log("node-b", prefix)
        return writer, reader, [writer, reader]

    cases = [
        ("memory", mem),
        ("redis, reader on the writing node (fan-out)", local),
        ("redis, reader on another node (XREAD)", remote),
    ]
    for name, make in cases:
        writer, reader, to_close = await make()
        samples = await latency(writer, reader, streams, steps, step_s)
        out[name] = (_pct(samples, 0.50), _pct(samples, 0.99))
        for log in to_close:
            await log.close()
    return out


Append = dict[str, tuple[float, float]]  # writer -> (tokens/s, client CPU us per token)


def _report(
    args: argparse.Namespace,
    append: Append,
    replayed: dict[str, float],
    lat: dict[str, tuple[float, float]],
    redis_version: str,
) -> str:
    pipelined = append["pipelined"][0]
    lines = [
        "# Token log benchmark",
        "",
        f"`python loadtests/log_bench.py --streams {args.streams} --steps {args.steps} --runs {args.runs}`, "
        f"{time.strftime('%Y-%m-%d')}, {platform.machine()} {os.cpu_count()} CPUs (load average "
        f"{os.getloadavg()[0]:.1f} at the end: compare within this run), Python "
        f"{platform.python_version()}, redis-server {redis_version} on loopback, no persistence. "
        "Medians over runs.",
        "",
        f"## Append: {args.streams} concurrent streams, one token per stream per step",
        "",
        "| writer | tokens/s | vs pipelined | client CPU per token |",
        "| --- | --- | --- | --- |",
    ]
    for name, label in [
        ("pipelined", "`write_step`: one pipeline per engine step"),
        ("sequential", "one `XADD` per token, awaited in turn"),
        ("concurrent", f"one `XADD` per token, {args.streams} concurrent writers"),
    ]:
        tok_s, cpu_us = append[name]
        lines.append(f"| {label} | {tok_s:,.0f} | {tok_s / pipelined:.2f}x | {cpu_us:.0f} us |")
    tokens = args.replay_tokens
    lines += [
        "",
        f"## Replay of a completed {tokens:,}-token stream (one token per entry)",
        "",
        "| backend | ms | tokens/s |",
        "| --- | --- | --- |",
        f"| redis, reader on another node (XRANGE, {RedisLogConfig().replay_batch} per batch) | "
        f"{replayed['redis'] * 1000:.1f} | {tokens / replayed['redis']:,.0f} |",
        f"| memory | {replayed['memory'] * 1000:.1f} | {tokens / replayed['memory']:,.0f} |",
        "",
        "## Latency from `write_step` called to the reader holding the entry",
        "",
        f"{args.streams} streams, one reader each, one step every {args.step_ms} ms, {args.steps} steps "
        f"({args.streams * args.steps:,} samples per row).",
        "",
        "| backend | p50 ms | p99 ms |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {name} | {p50:.2f} | {p99:.2f} |" for name, (p50, p99) in lat.items()]
    lines += ["", "## Reading", "", *_notes(args, append, replayed), ""]
    return "\n".join(lines)


def _notes(args: argparse.Namespace, append: Append, replayed: dict[str, float]) -> list[str]:
    (pipe, pipe_cpu), (seq, seq_cpu), (conc, conc_cpu) = (
        append[k] for k in ("pipelined", "sequential", "concurrent")
    )
    return [
        f"- One pipeline per step appends {pipe / seq:.1f}x the tokens/s of a per-token `XADD` loop and "
        f"{pipe / conc:.1f}x that of {args.streams} concurrent per-token writers, for "
        f"{seq_cpu / pipe_cpu:.1f}x ({conc_cpu / pipe_cpu:.1f}x) less client CPU per token: a "
        f"{args.streams}-stream step costs {args.streams * pipe_cpu / 1000:.2f} ms of event-loop CPU, "
        "against an engine step of tens of ms on this machine. Wall-clock rates here are bounded by "
        "the CPU share this process gets; the CPU column is the steadier comparison.",
        f"- A client resuming a finished {args.replay_tokens:,}-token answer from another node waits "
        f"{replayed['redis'] * 1000:.0f} ms for the whole replay.",
        "- Readers on the writing node never read Redis once caught up: their latency is the step's one "
        "pipeline round trip; readers elsewhere add one `XREAD` wake-up, shared by every stream they follow.",
    ]


async def _main(args: argparse.Namespace, url: str) -> str:
    run = Run(url)
    append: Append = {}
    for name, bench in [
        ("pipelined", lambda: append_pipelined(run, args.streams, args.steps)),
        ("sequential", lambda: append_per_token(run, args.streams, args.steps, False)),
        ("concurrent", lambda: append_per_token(run, args.streams, args.steps, True)),
    ]:
        rates = [await bench() for _ in range(args.runs)]
        append[name] = (statistics.median(r[0] for r in rates), statistics.median(r[1] for r in rates))
    replayed = await replay(run, args.replay_tokens, args.runs)
    lat = await latencies(run, args.streams, args.steps, args.step_ms / 1000)
    redis = Redis.from_url(url)
    version = (await redis.info("server"))["redis_version"]
    await redis.aclose()
    return _report(args, append, replayed, lat, version)


async def _append_and_replay(
    url: str, streams: int, steps: int, replay_tokens: int, durability: str
) -> tuple[float, float]:
    """Appended tokens/s (``streams`` streams, one token each per step, then their ends)
    and replay tokens/s of a ``replay_tokens``-token stream read on another node."""
    prefix = f"dep{time.monotonic_ns()}:"
    config = RedisLogConfig(key_prefix=prefix, durability=parse_durability(durability))
    writer = RedisTokenLog(url, node_id="w", config=config)
    reader = RedisTokenLog(url, node_id="r", config=config)
    sids = [f"s{i}" for i in range(streams)]
    for sid in sids:
        await writer.create_stream(_info(sid))
    started = time.perf_counter()
    for end in range(1, steps + 1):
        await writer.write_step(_step(sids, end))
    await writer.write_step(_finish(sids, steps))
    appended = streams * steps / (time.perf_counter() - started)
    await _write_long(writer, "long", replay_tokens)
    replayed = replay_tokens / await _time_replay(reader, "long", replay_tokens)
    await writer.close()
    await reader.close()
    return appended, replayed


async def _deployments(args: argparse.Namespace) -> str:
    rows: list[str] = []
    for shards in (1, 3):
        cluster = RedisClusterServers(primaries=shards, replicas=0)
        cluster.start()
        try:
            rates = [
                await _append_and_replay(cluster.url, args.streams, args.steps, args.replay_tokens, "none")
                for _ in range(args.runs)
            ]
        finally:
            cluster.close()
        rows.append(
            f"| cluster, {shards} shard{'s' if shards > 1 else ''} | none | "
            f"{statistics.median(r[0] for r in rates):,.0f} | {statistics.median(r[1] for r in rates):,.0f} |"
        )
    primary = RedisServer()
    primary.start()
    replica = RedisServer(extra_args=("--replicaof", "127.0.0.1", str(primary.port)))
    replica.start()
    synced = Redis(port=replica.port)
    while (await synced.info("replication")).get("master_link_status") != "up":
        await asyncio.sleep(0.05)
    await synced.aclose()
    try:
        for durability in ("none", "wait-on-end", "wait-every-ms:10"):
            rates = [
                await _append_and_replay(
                    primary.url, args.streams, args.steps, args.replay_tokens, durability
                )
                for _ in range(args.runs)
            ]
            rows.append(
                f"| primary + replica | {durability} | {statistics.median(r[0] for r in rates):,.0f} | "
                f"{statistics.median(r[1] for r in rates):,.0f} |"
            )
    finally:
        replica.close()
        primary.close()
    return "\n".join(
        [
            "# Token log on Redis deployments (loadtests/log_bench.py --deployments)",
            "",
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores (shared), Python "
            f"{platform.python_version()}; {args.streams} streams x {args.steps} tokens, one token per "
            f"stream per step, unfenced writes; replay of a {args.replay_tokens:,}-token stream from "
            f"another node; median of {args.runs} runs. Every server runs on this machine.",
            "",
            "| deployment | --log-durability | appended tokens/s | replay tokens/s |",
            "| --- | --- | ---: | ---: |",
            *rows,
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", help="an existing Redis (default: start redis-server here)")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--steps", type=int, default=256, help="tokens per stream")
    parser.add_argument("--replay-tokens", type=int, default=4096)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=None, help="default docs/perf/token-log[-deployments].md")
    parser.add_argument("--deployments", action="store_true", help="Cluster shards and durability instead")
    args = parser.parse_args()
    if args.deployments:
        report = asyncio.run(_deployments(args))
        Path(args.out or "docs/perf/token-log-deployments.md").write_text(report)
        print(report)
        return
    args.out = args.out or "docs/perf/token-log.md"
    server = None
    if args.redis_url is None:
        server = RedisServer()
        server.start()
    try:
        report = asyncio.run(_main(args, args.redis_url or server.url))  # type: ignore[union-attr]
    finally:
        if server is not None:
            server.close()
    Path(args.out).write_text(report)
    print(report)


if __name__ == "__main__":
    main()
