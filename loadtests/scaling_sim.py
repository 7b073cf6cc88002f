"""Capacity model of bargein on Redis (docs/scaling.md), extrapolated to many nodes.

Pure arithmetic from the per-operation costs of the token log and the cluster
coordinator (session/streams/log/, session/streams/cluster/), with the measured inputs of
docs/scaling.md as defaults. For a deployment of ``--nodes`` nodes and
``--clients`` connected clients it prints, per Redis shard count, the load of
each shard (commands/s, bytes/s written, memory, client connections) against
its limit (a shard runs commands on one core: CPU is counted from the
measured microseconds per command), and names the first limit hit: the resource to watch and the
number of shards that keeps every one under ``--headroom`` of its limit.

Usage: ``python loadtests/scaling_sim.py [--nodes 100] [--clients 1000000]``
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Inputs:
    """What the model is computed from (units in the names; defaults: docs/scaling.md)."""

    nodes: int = 100
    clients: int = 1_000_000
    streams_per_node: int = 128  # concurrently generating streams (engine batch)
    steps_per_s: float = 30.0  # engine decode steps per second per node
    tokens_per_response: int = 300
    think_s: float = 60.0  # a client's pause between answers
    remote_read_fraction: float = 0.05  # answers read on another node than their generating one
    retention_s: float = 600.0
    lease_renew_s: float = 1.0
    bytes_per_token: float = 54.0  # measured: MEMORY USAGE of a 300-entry log / 300
    bytes_per_response: float = 280 + 1200 + 200  # meta + generation record (300-id prompt) + lease/epoch
    bytes_per_session: float = 296 + 1000  # measured key of a 200-byte state, plus a typical state
    entry_bytes_written: float = 90.0  # one EVALSHA of one token: script args + entry
    step_script_us: float = 20.0  # measured: usec_per_call of the fenced step (one token, one stream)
    lease_script_us: float = 28.0  # measured: the renew EVAL
    simple_command_us: float = 2.0  # measured: XADD, SET, XRANGE of a few entries, GET, EXISTS
    io_us_per_command: float = 3.0  # reading, parsing and answering one pipelined command (estimate)
    shard_memory_bytes: float = 25e9  # usable memory per shard
    shard_write_bytes_per_s: float = 100e6  # replication + network per shard
    shard_max_clients: int = 10_000  # Redis maxclients
    pool_connections_per_shard: int = 8  # a node's pooled connections to one shard (log + cluster)
    headroom: float = 0.5  # keep every resource under this fraction of its limit


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    """Per-shard load with ``shards`` shards."""

    shards: int
    ops_per_s: float
    cpu_us_per_s: float
    write_bytes_per_s: float
    memory_bytes: float
    connections: int

    def usage(self, i: Inputs) -> dict[str, float]:
        """Fraction of each limit used."""
        return {
            "CPU": self.cpu_us_per_s / 1e6,
            "write bytes/s": self.write_bytes_per_s / i.shard_write_bytes_per_s,
            "memory": self.memory_bytes / i.shard_memory_bytes,
            "connections": self.connections / i.shard_max_clients,
        }


def load(i: Inputs, shards: int) -> Load:
    """The load of one shard (streams spread evenly by hash slot).

    Per generated token: one fenced-step script (decode writes one token per
    stream per step). Per node and step: one doorbell ring per shard it wrote
    (on a Cluster). Per followed shard and ring: one XRANGE per remote reader
    named in it. Per held lease and tick: one renew script and one EXISTS of
    the cancel flag. Per answer: create (1 script), claim (SET + script), end
    and release (2 scripts); per remote read: one metadata read and one
    replay XRANGE per 1024 entries.
    """
    tokens_per_s = i.nodes * i.streams_per_node * i.steps_per_s
    answers_per_s = tokens_per_s / i.tokens_per_response
    token_ops = tokens_per_s
    rings = i.nodes * i.steps_per_s * min(shards, i.streams_per_node) if shards > 1 else 0.0
    remote_reads = tokens_per_s * i.remote_read_fraction
    leases = i.nodes * i.streams_per_node * 2 / i.lease_renew_s
    answer_ops = answers_per_s * (5 + i.remote_read_fraction * (2 + i.tokens_per_response / 1024))
    sessions_ops = i.clients / (i.think_s + i.tokens_per_response / i.steps_per_s)  # one save per answer
    simple_ops = rings + remote_reads + leases / 2 + answer_ops + sessions_ops
    total_ops = token_ops + simple_ops + leases / 2
    cpu = (
        token_ops * i.step_script_us
        + leases / 2 * i.lease_script_us
        + simple_ops * i.simple_command_us
        + total_ops * i.io_us_per_command
    )
    write_bytes = tokens_per_s * i.entry_bytes_written + rings * 60 + sessions_ops * i.bytes_per_session
    retained = answers_per_s * i.retention_s
    memory = retained * (i.tokens_per_response * i.bytes_per_token + i.bytes_per_response)
    memory += i.clients * i.bytes_per_session  # sessions are kept retention_s after their last save
    connections = i.nodes * (i.pool_connections_per_shard + 2)  # + tailer + abort subscription
    return Load(
        shards=shards,
        ops_per_s=total_ops / shards,
        cpu_us_per_s=cpu / shards,
        write_bytes_per_s=write_bytes / shards,
        memory_bytes=memory / shards,
        connections=connections,
    )


def first_bottleneck(i: Inputs) -> tuple[str, int]:
    """The resource that needs the most shards to stay under the headroom, and that count."""
    one = load(i, 1).usage(i)
    need = {name: max(1, math.ceil(use / i.headroom)) for name, use in one.items()}
    if need["connections"] > 1:  # every node connects to every shard: more shards do not help
        return "connections", -1
    for shards in range(1, 1025):  # rings grow with the shard count: solve by search
        if all(u <= i.headroom for u in load(i, shards).usage(i).values()):
            worst = max(one, key=lambda n: need[n])
            return worst, shards
    return max(one, key=lambda n: one[n]), -1


def report(i: Inputs) -> str:
    lines = [
        f"{i.nodes} nodes x {i.streams_per_node} streams x {i.steps_per_s:g} steps/s = "
        f"{i.nodes * i.streams_per_node * i.steps_per_s:,.0f} tokens/s; {i.clients:,} connected clients",
        "",
        "| shards | commands/s per shard | CPU per shard | write MB/s | memory GB | connections | highest use |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for shards in (1, 3, 6, 12, 24, 48):
        per = load(i, shards)
        use = per.usage(i)
        worst = max(use, key=lambda n: use[n])
        lines.append(
            f"| {shards} | {per.ops_per_s:,.0f} | {use['CPU']:.0%} | {per.write_bytes_per_s / 1e6:.1f} | "
            f"{per.memory_bytes / 1e9:.1f} | {per.connections:,} | {worst} {use[worst]:.0%} |"
        )
    name, shards = first_bottleneck(i)
    lines.append("")
    if shards < 0:
        lines.append(f"First bottleneck: {name}, which more shards do not relieve.")
    else:
        lines.append(
            f"First bottleneck: {name} (one shard would be at {load(i, 1).usage(i)[name]:.0%}); "
            f"{shards} shards keep every resource under {i.headroom:.0%}."
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Inputs()
    for field_name in Inputs.__dataclass_fields__:
        value = getattr(defaults, field_name)
        parser.add_argument(f"--{field_name.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args()
    print(report(Inputs(**vars(args))))


if __name__ == "__main__":
    main()
