"""Redis Cluster plumbing of the token log: which shard holds a key, its doorbell, per-shard writes.

A stream's keys all carry its ``{stream_id}`` hash tag, so each stream lives
on one shard (the primary serving its slot), but one engine step writes
streams of many slots, and Redis refuses a multi-key command across slots
(``CROSSSLOT``), even on one node. So:

- a step's commands are grouped by the primary serving each stream and sent
  as one packed write per primary, all primaries at once (one round trip in
  parallel, not one per shard in turn);
- every such write ends with a *ring* of that shard's doorbell: an ``XADD``
  to ``<prefix>shard:{bell-<k>}:ring`` (``MAXLEN ~`` :data:`RING_MAXLEN`)
  naming the streams just written, where ``k`` is the first number whose
  key hashes to a slot of that primary: every node computes the same key
  from the same slot map. A node following streams of that shard blocks on
  that one key (session/streams/log/redis_cluster_tail.py): one blocking reader per
  shard, whatever the number of streams followed.

A reply ``MOVED``/``ASK``/``TRYAGAIN``/``CLUSTERDOWN``/``READONLY`` (a
failover or resharding moved a slot) refreshes the slot map and fails the
write with :class:`Redirected`, a connection error: the token log's bounded
retry sends it again, to the new primary (every write of a step is
idempotent, see session/streams/log/redis_format.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from redis.asyncio import RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    MasterDownError,
    MovedError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

log = logging.getLogger(__name__)

RING_MAXLEN = 1024  # doorbell entries kept per shard (a ring is a hint: sweeps cover lost ones)
MAX_BELL_SEARCH = 1 << 20  # a shard with one slot is found within ~16384 tries on average
_MOVED = (MovedError, AskError, TryAgainError, ClusterDownError, MasterDownError, ReadOnlyError)
# What a failover or resharding makes a command raise for a while: retried like a lost connection.
IN_FLUX = (*_MOVED, ClusterError, RedisClusterException)


class Redirected(RedisConnectionError):
    """A shard answered that a key's slot is served elsewhere now: retry after the refresh."""


class ShardMap:
    """The cluster's primaries as the client's slot map has them, and each one's doorbell.

    Args:
        cluster: the token log's pooled cluster client.
        key_prefix: the token log's key prefix.
    """

    def __init__(self, cluster: RedisCluster, key_prefix: str) -> None:
        self.cluster = cluster
        self._prefix = key_prefix
        self._bells: dict[str, str] = {}  # primary name -> its doorbell key
        self._refreshing: asyncio.Task[None] | None = None

    async def ready(self) -> None:
        """Learn the slot map if not known yet (the first call connects)."""
        await self.cluster.initialize()

    def primary(self, key: str) -> ClusterNode:
        """The primary serving ``key``'s slot now. Raises SlotNotCoveredError."""
        node = self.cluster.get_node_from_key(key)
        if node is None:
            raise SlotNotCoveredError(f"no primary serves the slot of {key!r}")
        return node

    def doorbell(self, node: ClusterNode) -> str:
        """The doorbell key of the shard ``node`` is primary of (cached per slot map)."""
        bell = self._bells.get(node.name)
        if bell is None:
            slots = self.cluster.nodes_manager.slots_cache
            for k in range(MAX_BELL_SEARCH):
                key = f"{self._prefix}shard:{{bell-{k}}}:ring"
                owners = slots.get(self.cluster.keyslot(key))
                if owners and owners[0].name == node.name:
                    bell = self._bells[node.name] = key
                    break
            else:
                raise RuntimeError(f"no doorbell key hashes to a slot of {node.name}")
        return bell

    async def refresh(self) -> None:
        """Ask the cluster for its slot map again (one refresh at a time: concurrent
        callers wait for the one running)."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.create_task(self._refresh())
        await asyncio.shield(self._refreshing)

    async def _refresh(self) -> None:
        try:
            await self.cluster.nodes_manager.initialize()
        except (RedisError, OSError) as exc:  # no seed answers now: the caller's retry tries again
            log.info("redis cluster: slot map refresh failed: %r", exc)
        self._bells.clear()


def redirected(results: Sequence[object]) -> bool:
    """Whether some reply says a slot moved (or its shard is failing over)."""
    return any(isinstance(r, _MOVED) for r in results)


async def send_packed(node: ClusterNode, commands: Sequence[bytes]) -> list[Any]:
    """Send ``commands`` (RESP) as one write on one connection of ``node``; every reply.

    Error replies come back as ResponseError values (their subclasses tell a
    redirection). A failure or cancellation mid-way disconnects the
    connection (redis-py does), so a half-read one never goes back to the pool.
    """
    conn = node.acquire_connection()
    try:
        return await exchange(conn, commands)
    finally:
        node.release(conn)


async def exchange(conn: Any, commands: Sequence[bytes]) -> list[Any]:
    """Write ``commands`` (RESP) on ``conn`` at once and read one reply each,
    error replies as ResponseError values (the caller owns the connection)."""
    await conn.send_packed_command(b"".join(commands), check_health=False)
    results: list[Any] = []
    for _ in commands:
        try:
            results.append(await conn.read_response())
        except ResponseError as exc:
            results.append(exc)
    return results


async def send_grouped(
    shards: ShardMap, groups: dict[str, tuple[ClusterNode, list[bytes]]]
) -> dict[str, list[Any]]:
    """Send each primary its commands, all at once; the replies by primary name.

    Raises Redirected (after refreshing the slot map) when a reply says a
    slot moved, and the connection errors of a node that does not answer
    (after the same refresh: the retry finds the promoted replica).
    """
    names = list(groups)
    try:
        replies = await asyncio.gather(*(send_packed(*groups[name]) for name in names))
    except (RedisConnectionError, OSError):
        await shards.refresh()
        raise
    by_name = dict(zip(names, replies))
    if any(redirected(r) for r in replies):
        await shards.refresh()
        raise Redirected("a slot moved (failover or resharding): retrying on its new primary")
    return by_name
