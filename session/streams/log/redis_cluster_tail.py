"""Tail reads on a Redis Cluster: one blocking reader per shard the node follows.

The single-server tailer (session/streams/log/redis_tail.py) runs one ``XREAD BLOCK``
over every followed stream; on a Cluster that command would span hash slots,
which Redis refuses. Here each shard that holds a followed stream gets one
task with its own dedicated connection to that shard's primary, blocked in
``XREAD BLOCK`` on the shard's *doorbell* (session/streams/log/redis_shards.py):
every write of a stream rings its shard's doorbell with the stream's id, so
the task wakes, reads the new entries of the followed streams named in the
ring (``XRANGE`` from each reader's last id, pipelined through the pooled
cluster client) and hands them over.

A ring is only a hint, never the data, so nothing depends on it arriving:

- a new subscription reads its stream once right after joining (entries
  written before the ring it would have missed);
- after an empty ``XREAD`` (``block_ms`` without a ring) and after every
  reconnection (a failover, a dropped connection), the task sweeps: it
  reads every followed stream of its shard, and checks that each still
  exists (like the single-server tailer: StreamNotFound once expired,
  StreamTruncated when the log vanished while its metadata says tokens
  were logged).

Each reader still gets each entry once, in order: a delivery hands over only
entries past the reader's last id and moves it (all on one event loop).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode
from redis.exceptions import RedisClusterException, RedisError

from bargein.session.errors import StreamNotFound, StreamTruncated, TokenLogUnavailable
from bargein.session.streams.log.redis_shards import ShardMap, redirected
from bargein.session.streams.log.redis_tail import (
    _TRANSIENT,
    LOGGED,
    TAILER,
    RawEntry,
    RawReply,
    StreamId,
    Subscription,
    format_id,
    parse_entries,
)
from bargein.session.supervise import TaskHealth, supervised

log = logging.getLogger(__name__)


class ClusterTailer:
    """The node's blocking readers on a Redis Cluster, one per followed shard.

    Args:
        shards: the token log's shard map (its pooled cluster client reads).
        make_client: ``make_client(host, port)`` builds a single-connection
            client of one primary, without socket timeout (timed here).
        block_ms: longest ``XREAD BLOCK`` on a doorbell; then a sweep.
        timeout_s: how much longer than ``block_ms`` a reply may take.
        unavailable_after_s: how long a shard may stay unreachable before its
            readers get TokenLogUnavailable (they resume).
        count: most entries per stream per read.
        health: marked while a shard's task crashes (a bug).
    """

    def __init__(
        self,
        *,
        shards: ShardMap,
        make_client: Callable[[str, int], Redis],
        block_ms: int,
        timeout_s: float,
        unavailable_after_s: float,
        count: int = 1024,
        health: TaskHealth | None = None,
    ) -> None:
        self.health = health or TaskHealth()
        self._shards = shards
        self._make_client = make_client
        self._block_ms = block_ms
        self._timeout_s = timeout_s
        self._unavailable_after_s = unavailable_after_s
        self._count = count
        self._subs: dict[str, set[Subscription]] = {}  # stream id -> its subscribers
        self._tasks: dict[str, asyncio.Task[None]] = {}  # primary name -> its reader
        self._swept: dict[str, float] = {}  # primary name -> loop time of its last sweep

    async def subscribe(self, sub: Subscription) -> None:
        """Start delivering entries past ``sub.last_id`` to ``sub.queue`` (never raises:
        a shard that cannot be read now is read by its reader's next sweep)."""
        self._subs.setdefault(sub.stream_id, set()).add(sub)
        try:
            await self._shards.ready()
            self._ensure_readers()
            async with asyncio.timeout(self._timeout_s):
                await self._read([sub])  # what was written before this reader's first ring
        except (*_TRANSIENT, RedisError, RedisClusterException) as exc:
            log.info(
                "token log: first read of %s failed (%r); its shard's sweep reads it", sub.stream_id, exc
            )

    def unsubscribe(self, sub: Subscription) -> None:
        """Stop delivering to ``sub`` (idempotent)."""
        subs = self._subs.get(sub.stream_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.stream_id]

    async def close(self) -> None:
        """Stop every shard's reader; subscribers get TokenLogUnavailable."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._fail(self._all(), TokenLogUnavailable("token log closed"))

    # -- which shard reads what ---------------------------------------------

    def _all(self) -> list[Subscription]:
        return [sub for subs in self._subs.values() for sub in subs]

    def _primary(self, sub: Subscription) -> ClusterNode | None:
        """The primary serving ``sub``'s stream, None while the slot map has none."""
        try:
            return self._shards.primary(sub.log_key)
        except RedisClusterException:
            return None

    def _of_shard(self, name: str) -> list[Subscription]:
        return [sub for sub in self._all() if (node := self._primary(sub)) is not None and node.name == name]

    def _ensure_readers(self) -> None:
        """One running reader per primary that holds a followed stream."""
        for node in {node for sub in self._all() if (node := self._primary(sub)) is not None}:
            task = self._tasks.get(node.name)
            if task is None or task.done():
                self._tasks[node.name] = supervised(
                    functools.partial(self._run, node),
                    name=f"{TAILER}:{node.name}",
                    on_crash=functools.partial(self._crashed, node.name),
                    health=self.health,
                )

    # -- one shard's reader ---------------------------------------------------

    async def _run(self, node: ClusterNode) -> None:
        """Follow one shard until it holds no followed stream (or stops being a primary)."""
        client: Redis | None = None
        down_since: float | None = None
        bell_id: StreamId | None = None  # None: sweep, then read rings from the newest
        loop = asyncio.get_running_loop()
        try:
            while True:
                subs = self._of_shard(node.name)
                if not subs:
                    return  # nothing followed here any more (or the slots moved away)
                if client is None:
                    client = self._make_client(node.host, int(node.port))
                try:
                    if bell_id is None:
                        bell_id = await self._newest_ring(client, node)
                        await self._sweep(subs, node.name)
                    bell_id = await self._wait(client, node, bell_id)
                    down_since = None
                    self.health.working(TAILER)
                except (*_TRANSIENT, RedisClusterException) as exc:  # the latter: a slot map in flux
                    await client.aclose()  # never reuse a connection that failed mid-reply
                    client, bell_id = None, None
                    down_since = loop.time() if down_since is None else down_since
                    if loop.time() - down_since >= self._unavailable_after_s:
                        self._fail(subs, TokenLogUnavailable(f"redis shard {node.name} unreachable: {exc}"))
                    await self._shards.refresh()
                    self._ensure_readers()  # a promoted replica gets its own reader
                    await asyncio.sleep(0.1)
                except RedisError as exc:
                    if redirected([exc]):  # the doorbell's slot moved: a new map, new readers
                        await self._shards.refresh()
                        self._ensure_readers()
                        await client.aclose()
                        client, bell_id = None, None
                        await asyncio.sleep(0.1)
                        continue
                    log.error("token log tailer %s: %r; failing its %d readers", node.name, exc, len(subs))
                    self._fail(subs, TokenLogUnavailable(f"redis refused the tailer's read: {exc}"))
        finally:
            if self._tasks.get(node.name) is asyncio.current_task():
                del self._tasks[node.name]
                if self._of_shard(node.name):  # subscribed while this one was ending
                    self._ensure_readers()
            if client is not None:
                await client.aclose()

    async def _newest_ring(self, client: Redis, node: ClusterNode) -> StreamId:
        async with asyncio.timeout(self._timeout_s):
            newest = parse_entries(await client.xrevrange(self._shards.doorbell(node), "+", "-", count=1))
        return newest[0][0] if newest else (0, 0)

    async def _wait(self, client: Redis, node: ClusterNode, bell_id: StreamId) -> StreamId:
        """One ``XREAD BLOCK`` on the doorbell, then read what it names (or sweep)."""
        bell = self._shards.doorbell(node)
        async with asyncio.timeout(self._block_ms / 1000 + self._timeout_s):
            reply = await client.xread({bell: format_id(bell_id)}, count=self._count, block=self._block_ms)
        if (
            not reply
            or asyncio.get_running_loop().time() - self._swept.get(node.name, 0.0) > self._block_ms / 1000
        ):
            # No ring for block_ms, or a busy shard not swept for as long: a ring lost
            # (trimmed, or written to a primary that then failed) must not stall a reader.
            await self._sweep(self._of_shard(node.name), node.name)
        if not reply:
            return bell_id
        rung: set[str] = set()
        rings = 0
        for _, raw_entries in cast(list[tuple[bytes, RawReply]], reply):
            entries = parse_entries(raw_entries)
            bell_id, rings = entries[-1][0], rings + len(entries)
            for _, fields in entries:
                rung.update(fields.get(b"s", b"").decode().split())
        if rings >= self._count:  # more rings wait: read every followed stream
            rung = {sub.stream_id for sub in self._of_shard(node.name)}
        subs = [sub for sid in rung for sub in self._subs.get(sid, ())]
        if subs:
            async with asyncio.timeout(self._timeout_s):
                await self._read(subs)
        return bell_id

    # -- reading and delivering -----------------------------------------------

    async def _sweep(self, subs: list[Subscription], name: str) -> None:
        """Read every followed stream of the shard and drop those gone."""
        self._swept[name] = asyncio.get_running_loop().time()
        if not subs:
            return
        async with asyncio.timeout(self._timeout_s):
            await self._read(subs)
            await self._drop_missing([s for s in subs if s in self._subs.get(s.stream_id, ())])

    async def _read(self, subs: Iterable[Subscription]) -> None:
        """Entries past each reader's last id, one pipelined ``XRANGE`` per stream,
        repeated for streams that had a full batch."""
        pending = list(subs)
        while pending:
            by_key: dict[str, StreamId] = {}
            for sub in pending:
                by_key[sub.log_key] = min(sub.last_id, by_key.get(sub.log_key, sub.last_id))
            async with self._shards.cluster.pipeline(transaction=False) as pipe:
                for key, last in by_key.items():
                    pipe.xrange(key, min=f"({format_id(last)}", max="+", count=self._count)
                replies: list[Any] = await pipe.execute()
            full: set[str] = set()
            for key, raw in zip(by_key, replies):
                entries = parse_entries(raw)
                self._deliver(key, entries, pending)
                if len(entries) >= self._count:
                    full.add(key)
            pending = [
                sub for sub in pending if sub.log_key in full and sub in self._subs.get(sub.stream_id, ())
            ]

    def _deliver(self, key: str, entries: list[RawEntry], subs: list[Subscription]) -> None:
        for sub in subs:
            if sub.log_key != key:
                continue
            fresh = [e for e in entries if e[0] > sub.last_id]
            if fresh:
                sub.last_id = fresh[-1][0]
                sub.queue.put_nowait(fresh)

    async def _drop_missing(self, subs: list[Subscription]) -> None:
        """Readers of streams whose metadata expired get StreamNotFound; of
        streams whose log vanished after tokens were logged, StreamTruncated."""
        if not subs:
            return
        async with self._shards.cluster.pipeline(transaction=False) as pipe:
            for sub in subs:
                pipe.hmget(sub.meta_key, ["principal", LOGGED])
                pipe.exists(sub.log_key)
            replies = await pipe.execute()
        for sub, (principal, logged), log_exists in zip(subs, replies[::2], replies[1::2]):
            if principal is None:
                error: StreamNotFound = StreamNotFound(sub.stream_id, "expired while followed")
            elif logged is not None and not log_exists:
                error = StreamTruncated(sub.stream_id, sub.last_id[0])
            else:
                continue
            self._fail([sub], error)

    async def _crashed(self, name: str, exc: Exception) -> None:
        """A shard's reader crashed (a bug): its readers get a retryable error."""
        self._fail(self._of_shard(name), TokenLogUnavailable(f"the token log's tailer failed: {exc!r}"))

    def _fail(self, subs: Iterable[Subscription], error: Exception) -> None:
        for sub in list(subs):
            self.unsubscribe(sub)
            sub.queue.put_nowait(error)
