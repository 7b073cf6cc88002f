"""How long the token log waits for replicas: ``--log-durability``.

Redis replicates asynchronously: a write the primary acknowledged can be lost
when a replica is promoted before it got it. ``WAIT <replicas> <timeout>``,
sent on the connection that wrote, returns once that many replicas
acknowledged every earlier write of the connection (or at the timeout), so
it bounds what a failover can take away:

- ``none`` (default): never wait. A failover can lose the last entries of
  each stream being written (on this machine, replication lags well under a
  millisecond; on a network, about one round trip).
- ``wait-on-end``: a step that ends a stream waits before the end is handed
  to any reader, so a client that got ``response.done`` got an end that
  survives a failover of its shard (unless the replica also fails).
- ``wait-every-ms:N``: additionally a step waits if its shard was not
  waited on for ``N`` ms: at most about ``N`` ms of entries can be lost.

A ``WAIT`` that times out (no replica answered) does not fail the write;
the log counts it (``RedisTokenLog.num_unreplicated``). What a failover
takes away anyway is never a silent gap: see docs/scaling.md ("Failover").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mode = Literal["none", "wait-on-end", "wait-every-ms"]
DEFAULT_WAIT_TIMEOUT_MS = 500


@dataclass(frozen=True, slots=True, kw_only=True)
class LogDurability:
    """When the token log sends ``WAIT``.

    Attributes:
        mode: ``none``, ``wait-on-end`` or ``wait-every-ms``.
        every_ms: for ``wait-every-ms``, the longest time between waits per shard.
        replicas: how many replicas must acknowledge (``WAIT``'s first argument).
        timeout_ms: the longest wait (``WAIT``'s second argument; 0 is refused:
            it would wait forever for a dead replica).
    """

    mode: Mode = "none"
    every_ms: int = 0
    replicas: int = 1
    timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS

    def __post_init__(self) -> None:
        if self.mode not in ("none", "wait-on-end", "wait-every-ms"):
            raise ValueError(f"log durability {self.mode!r} must be none, wait-on-end or wait-every-ms")
        if self.mode == "wait-every-ms" and self.every_ms < 1:
            raise ValueError(f"wait-every-ms needs a period >= 1 ms, not {self.every_ms}")
        if self.replicas < 1 or self.timeout_ms < 1:
            raise ValueError(f"{self.replicas=} and {self.timeout_ms=} must be >= 1")

    def due(self, *, ends_stream: bool, since_last_ms: float) -> bool:
        """Whether a step write waits: it ends a stream (``ends_stream``), or
        ``since_last_ms`` passed since the last wait on its shard."""
        if self.mode == "none":
            return False
        if ends_stream:
            return True
        return self.mode == "wait-every-ms" and since_last_ms >= self.every_ms


def parse_durability(text: str) -> LogDurability:
    """``none``, ``wait-on-end`` or ``wait-every-ms:N`` (N in ms). Raises ValueError."""
    mode, _, period = text.strip().partition(":")
    if mode == "wait-every-ms":
        if not period.isdigit():
            raise ValueError(f"log durability {text!r}: write wait-every-ms:N, N in milliseconds")
        return LogDurability(mode="wait-every-ms", every_ms=int(period))
    if period:
        raise ValueError(f"log durability {text!r}: only wait-every-ms takes a period")
    return LogDurability(mode=mode)  # type: ignore[arg-type]  # checked in __post_init__
