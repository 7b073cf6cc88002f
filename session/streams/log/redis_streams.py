"""The production TokenLog on Redis Streams (redis-py asyncio).

The key layout and entry format are in session/streams/log/redis_format.py.

Writes: every command of an engine step goes out as one packed write on one
pooled connection (a pipeline: one round trip; the finish is queued after the
entries), retried with backoff for at most ``retry_for_s``; then
:class:`TokenLogUnavailable` names the step's streams, which are broken from
then on (the step's other streams are still written). A stream whose keys vanished (Redis restarted without persistence)
is detected by ``XADD NOMKSTREAM`` returning nil (or its metadata missing at
its first write); it is reported the same way and its partial keys deleted.

Reads: streams this node writes are fed from an in-process tail of their
last ``fanout_entries`` entries as soon as each step's pipeline returns (no
Redis read per token per client); a reader behind that tail, and every
reader of a stream written elsewhere, replays with ``XRANGE`` and then follows
through the node's one multiplexed ``XREAD BLOCK`` (session/streams/log/redis_tail.py).

On a Redis Cluster (``redis+cluster://``) a step goes out as one packed write
per primary, all at once, each ringing its shard's doorbell, and readers
follow through one blocking reader per shard (session/streams/log/redis_shards.py,
session/streams/log/redis_cluster_tail.py). Behind Sentinel (``redis+sentinel://``)
the clients ask the Sentinels for the primary at every new connection.
``config.durability`` adds a ``WAIT`` to step writes (session/streams/log/durability.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any, TypeVar, cast

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError, ResponseError

from bargein.session.errors import (
    OffsetOutOfRange,
    StreamEnded,
    StreamExists,
    StreamFenced,
    StreamNotFound,
    StreamTruncated,
    TokenLogUnavailable,
)
from bargein.session.streams.log.contract import (
    DEFAULT_LIVE_TTL_S,
    DEFAULT_RETENTION_S,
    LogEntry,
    ReadCursor,
    StreamCursor,
    StreamEnd,
    StreamInfo,
    StreamWrite,
    check_writes,
)
from bargein.session.streams.log.durability import LogDurability
from bargein.session.streams.log.fence import Fence
from bargein.session.streams.log.redis_client import open_client
from bargein.session.streams.log.redis_cluster_tail import ClusterTailer
from bargein.session.streams.log.redis_format import (
    CREATE_LUA,
    FENCED,
    FENCED_STEP_LUA,
    FENCED_STEP_SHA,
    GAP,
    WRITTEN,
    Keys,
    already_added,
    decode,
    fenced_step_calls,
    info_from_meta,
    resp,
    ring_command,
    step_commands,
)
from bargein.session.streams.log.redis_shards import IN_FLUX, RING_MAXLEN, ShardMap, exchange, send_grouped
from bargein.session.streams.log.redis_tail import (
    _TRANSIENT,
    LOGGED,
    RawEntry,
    StreamId,
    StreamTailer,
    Subscription,
    parse_entries,
    parse_id,
)
from bargein.session.streams.log.redis_url import parse_redis_url
from bargein.session.supervise import TaskHealth

T = TypeVar("T")
log = logging.getLogger(__name__)

_REMEMBERED = 65_536  # ended (broken) stream ids kept to refuse late writes
_DROPPED = (RedisConnectionError, ConnectionError)  # a closed connection (not a hang): retry
_PING_RETRY_S = 0.05


def _remember(ids: dict[str, None], stream_id: str) -> None:
    ids[stream_id] = None
    if len(ids) > _REMEMBERED:
        del ids[next(iter(ids))]


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisLogConfig:
    """Tuning of :class:`RedisTokenLog`.

    Attributes:
        retention_s: seconds an ended stream and a saved session are kept.
        live_ttl_s: seconds after creation a stream's keys expire if it never ends.
        retry_for_s: how long a failing write or read is retried before
            TokenLogUnavailable.
        socket_timeout_s: longest wait for one attempt of a call (a hung Redis
            is a failure, retried within ``retry_for_s``); also the connect timeout.
        block_ms: longest XREAD BLOCK of the node's tailer.
        replay_batch: entries per XRANGE when replaying.
        fanout_entries: entries of each stream this node writes kept in memory
            for its local readers.
        key_prefix: prefix of every key (tests give each test its own).
        durability: when a step write waits for replicas (session/streams/log/durability.py).
    """

    retention_s: float = DEFAULT_RETENTION_S
    live_ttl_s: float = DEFAULT_LIVE_TTL_S
    retry_for_s: float = 5.0
    socket_timeout_s: float = 1.0
    block_ms: int = 5000
    replay_batch: int = 1024
    fanout_entries: int = 256
    key_prefix: str = "bargein:"
    durability: LogDurability = LogDurability()

    def __post_init__(self) -> None:
        for name in ("retention_s", "live_ttl_s", "retry_for_s", "socket_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be > 0")
        for name in ("block_ms", "replay_batch", "fanout_entries"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")


class _LocalStream:
    """A stream this node writes: its write cursor and the tail its local readers follow."""

    __slots__ = ("info", "cursor", "tail", "finish", "changed", "error")

    def __init__(self, info: StreamInfo, tail_entries: int) -> None:
        self.info = info
        self.cursor = StreamCursor(info.stream_id)
        self.tail: deque[LogEntry] = deque(maxlen=tail_entries)
        self.finish: StreamEnd | None = None
        self.changed = asyncio.Event()  # replaced on every change (see MemoryTokenLog)
        self.error: Exception | None = None

    def tail_start(self) -> int:
        """First offset the tail still holds (the end when it holds nothing)."""
        return self.tail[0].start if self.tail else self.cursor.end

    def entries_after(self, pos: int) -> list[LogEntry]:
        """Tail entries with end > pos, oldest first (scans only those)."""
        fresh: list[LogEntry] = []
        for entry in reversed(self.tail):
            if entry.end <= pos:
                break
            fresh.append(entry)
        fresh.reverse()
        return fresh

    def notify(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()


class RedisTokenLog:
    """:class:`~bargein.session.streams.log.TokenLog` on Redis Streams; see the module doc.

    Args:
        url: ``redis://host:port/db`` (or rediss://, unix://), a Redis Cluster
            (``redis+cluster://host:port,...``) or Sentinel's primary
            (``redis+sentinel://host:port,.../master``): session/streams/log/redis_url.py.
            Nothing connects before the first call.
        node_id: this server's unique name: owner of the streams it creates,
            and the name of its tailer's wake stream.
        config: tuning; the default keeps ended streams 600 s.

    Calls are for one event loop. ``write_step`` calls are applied one after
    the other in call order.
    """

    def __init__(
        self, url: str, *, node_id: str = "node-0", config: RedisLogConfig = RedisLogConfig()
    ) -> None:
        self._cfg = config
        self._node_id = node_id
        no_retry = Retry(NoBackoff(), 0)  # retries are ours, bounded by retry_for_s
        timeout = config.socket_timeout_s
        target = parse_redis_url(url)
        # No redis-py socket_timeout: with one set, redis-py sends through asyncio.wait_for,
        # which on Python 3.11 can swallow a cancellation racing the send (CPython gh-86296):
        # a cancelled reader would run on. Every call is timed here with asyncio.timeout.
        options: dict[str, Any] = {
            "socket_timeout": None,
            "socket_connect_timeout": timeout,
            "retry": no_retry,
        }
        self._redis = cast(Redis, open_client(target, **options))
        self._create = self._redis.register_script(CREATE_LUA)
        self._keys = Keys(config.key_prefix)
        wake_key = self._wake_key = self._keys.wake(node_id)
        self.health = TaskHealth()  # the tailer's crashes (a bug): /readyz lists them
        self._shards: ShardMap | None = None  # a Redis Cluster's primaries (None: one server)
        self._tailer: StreamTailer | ClusterTailer
        if isinstance(self._redis, RedisCluster):
            self._shards = ShardMap(self._redis, config.key_prefix)
            auth = {"username": target.username, "password": target.password, "ssl": target.tls}
            self._tailer = ClusterTailer(
                shards=self._shards,
                make_client=lambda host, port: Redis(
                    host=host, port=port, single_connection_client=True, **auth, **options
                ),
                block_ms=config.block_ms,
                timeout_s=timeout,
                unavailable_after_s=config.retry_for_s,
                count=config.replay_batch,
                health=self.health,
            )
        else:
            self._tailer = StreamTailer(
                make_client=lambda: cast(
                    Redis, open_client(target, single_connection_client=True, **options)
                ),
                wake=self._wake,
                wake_key=wake_key,
                block_ms=config.block_ms,
                timeout_s=timeout,
                unavailable_after_s=config.retry_for_s,
                count=config.replay_batch,
                health=self.health,
            )
        self._waited_at: dict[str, float] = {}  # shard (or "") -> loop time of its last WAIT
        self.num_unreplicated = 0  # WAITs that timed out short of their replicas
        self._live: dict[str, _LocalStream] = {}
        # Recently broken (log incomplete after a failure) and ended stream ids, oldest first,
        # bounded: late writes to them get TokenLogUnavailable / StreamEnded.
        self._broken: dict[str, None] = {}
        self._ended: dict[str, None] = {}
        self._write_lock = asyncio.Lock()
        self._fence_of: Callable[[str], Fence | None] | None = None  # see fence_with
        self._degraded = False  # after an outage, fail fast (one attempt) until a call succeeds
        self._closed = False

    # -- bounded retries ------------------------------------------------------

    async def _call(
        self, what: str, fn: Callable[[Redis], Awaitable[T]], stream_ids: tuple[str, ...] = ()
    ) -> T:
        """Run ``fn`` until it succeeds, retrying connection failures for ``retry_for_s``.

        Raises TokenLogUnavailable (naming ``stream_ids``) past the bound, at
        once when the log is closed, and after one failed attempt while degraded.
        """
        loop = asyncio.get_running_loop()
        timeout = self._cfg.socket_timeout_s
        deadline = loop.time() + (timeout if self._degraded else self._cfg.retry_for_s)
        delay = 0.02
        while True:
            if self._closed:
                raise TokenLogUnavailable("token log closed", stream_ids)
            try:
                # An expired timeout cancels the command: redis-py then drops that connection.
                async with asyncio.timeout(min(max(deadline - loop.time(), 0.001), timeout)):
                    result = await fn(self._redis)
                self._degraded = False
                return result
            except (*_TRANSIENT, *IN_FLUX) as exc:  # + asyncio.timeout's TimeoutError; a failover
                remaining = deadline - loop.time()
                if remaining <= 0:
                    self._degraded = True
                    raise TokenLogUnavailable(f"{what}: redis unreachable ({exc!r})", stream_ids) from exc
                await asyncio.sleep(min(delay, remaining))
                delay = min(delay * 2, 0.5)
            except RedisError as exc:  # an error reply, e.g. a key of the wrong type: no retry
                raise TokenLogUnavailable(f"{what}: redis refused it ({exc})", stream_ids) from exc

    # -- writing --------------------------------------------------------------

    async def create_stream(self, info: StreamInfo) -> None:
        sid = info.stream_id
        if sid in self._live or sid in self._broken:
            raise StreamExists(sid)
        meta = {
            "response_id": info.response_id,
            "principal": info.principal,
            "session_id": info.session_id,
            "owner_node": info.owner_node,
            "status": "live",
        }
        if info.tool_mode is not None:
            meta["tool_mode"] = info.tool_mode
        args: list[Any] = [int(self._cfg.live_ttl_s * 1000)]
        for key, value in meta.items():
            args += [key, value]
        attempts = 0

        async def create(redis: Redis) -> Any:
            nonlocal attempts
            attempts += 1
            return await self._create(keys=[self._keys.meta(sid)], args=args, client=redis)

        if not await self._call("create_stream", create, (sid,)):
            if attempts == 1 or not await self._created_by_us(sid, meta):
                raise StreamExists(sid)
        self._live[sid] = _LocalStream(
            replace(info, status="live", end=0, finish=None), self._cfg.fanout_entries
        )

    async def _created_by_us(self, sid: str, meta: dict[str, str]) -> bool:
        """After a retried create found the hash: was it our own first attempt?"""
        found = await self._call("create_stream", lambda r: r.hgetall(self._keys.meta(sid)), (sid,))
        raw = cast(dict[bytes, bytes], found)  # bytes: the client does not decode responses
        return {k.decode(): v.decode() for k, v in raw.items()} == meta

    def adopt_stream(self, info: StreamInfo) -> None:
        """Write on a stream another node created, from its end ``info.end``.

        For a takeover (session/streams/cluster/takeover.py): the caller holds the stream's
        lease, so no other node writes it any more.
        """
        sid = info.stream_id
        self._broken.pop(sid, None)
        self._ended.pop(sid, None)
        local = _LocalStream(replace(info, status="live", finish=None), self._cfg.fanout_entries)
        local.cursor.end = info.end
        self._live[sid] = local

    def fence_with(self, fence_of: Callable[[str], Fence | None]) -> None:
        """Fence every write from now on (several nodes: session/streams/cluster/).

        ``fence_of(stream_id)`` is the lease and epoch a write of that stream
        must still hold in Redis (session/streams/cluster/lease.py), None when this node holds
        none: such writes are refused. Each stream's writes of a step then go
        out as one script that checks the fence and writes, atomically (still
        one round trip per step); a write refused there raises StreamFenced.
        """
        self._fence_of = fence_of

    def abandon_stream(self, stream_id: str) -> None:
        """Stop writing a stream another node may now continue: late writes
        are refused and local readers get a retryable TokenLogUnavailable
        (their clients resume it, on any node)."""
        self._break((stream_id,), TokenLogUnavailable("another node continues this stream", (stream_id,)))

    def _cursor(self, stream_id: str) -> StreamCursor:
        local = self._live.get(stream_id)
        if local is None:
            if stream_id in self._ended:
                raise StreamEnded(stream_id)
            raise StreamNotFound(stream_id, "not live on this node")
        return local.cursor

    async def write_step(self, writes: Sequence[StreamWrite]) -> None:
        if not writes:
            return
        async with self._write_lock:
            # Streams already broken are refused, but the rest of the step is still written:
            # their readers must not see a gap because another stream failed.
            failed = tuple(dict.fromkeys(w.stream_id for w in writes if w.stream_id in self._broken))
            healthy = [w for w in writes if w.stream_id not in self._broken]
            check_writes(healthy, self._cursor)
            fenced: tuple[str, ...] = ()
            if healthy and self._fence_of is not None:
                lost, fenced = await self._write_fenced(healthy, self._fence_of)
                failed += lost
            elif healthy:
                failed += await self._write_healthy(healthy)
            if failed:
                raise TokenLogUnavailable(
                    "these streams' log is incomplete after a redis failure", failed + fenced
                )
            if fenced:
                raise StreamFenced(fenced)

    async def _write_fenced(
        self, writes: Sequence[StreamWrite], fence_of: Callable[[str], Fence | None]
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Write validated writes through the fence; returns the streams lost
        and those fenced off (both now broken here).

        Lost streams' partial keys are deleted; a fenced stream's keys are
        another node's now and stay untouched.
        """
        sids = tuple(dict.fromkeys(w.stream_id for w in writes))
        calls, unfenced = fenced_step_calls(
            writes,
            {sid: self._live[sid].cursor.end for sid in sids},
            self._keys,
            fence_of,
            retention_ms=int(self._cfg.retention_s * 1000),
            live_ttl_ms=int(self._cfg.live_ttl_s * 1000),
        )
        ending = {w.stream_id for w in writes if w.finish is not None}
        try:
            results = await self._call("write_step", lambda r: self._run_fenced(calls, ending), sids)
        except TokenLogUnavailable as exc:
            self._break(sids, exc)
            return sids, ()
        lost = tuple(
            sid for (sid, _), result in zip(calls, results) if result not in (WRITTEN, FENCED, GAP)
        )  # LOST, or an error reply
        gaps = tuple(sid for (sid, _), result in zip(calls, results) if result == GAP)
        if gaps:
            log.warning(
                "redis lost the last entries of %s (a failover?): handing them to a reader's node", gaps
            )
        fenced = tuple(unfenced) + tuple(
            sid for (sid, _), result in zip(calls, results) if result in (FENCED, GAP)
        )
        self._apply(writes, lost + fenced)
        if fenced:
            self._break(fenced, StreamFenced(fenced))
        if lost:
            self._break(lost, TokenLogUnavailable("redis lost these streams (restarted without data?)", lost))
            await self._delete_partial(lost)
        return lost, fenced

    async def _run_fenced(
        self, calls: list[tuple[str, list[bytes | str | int]]], ending: set[str]
    ) -> list[Any]:
        """Run the step's fenced scripts by SHA in one round trip; a Redis that
        does not know the script yet (first use, restarted, flushed) gets the
        refused calls again in full, in a second one (a refused EVALSHA ran nothing)."""
        results = await self._send(
            [(sid, resp("EVALSHA", FENCED_STEP_SHA, 4, *args)) for sid, args in calls], ending
        )
        retry = [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]
        if retry:
            again = await self._send(
                [(calls[i][0], resp("EVAL", FENCED_STEP_LUA, 4, *calls[i][1])) for i in retry], ending
            )
            for i, result in zip(retry, again):
                results[i] = result
        return results

    async def _write_healthy(self, writes: Sequence[StreamWrite]) -> tuple[str, ...]:
        """Write validated writes; returns the streams that failed (now broken)."""
        by_stream: dict[str, list[StreamWrite]] = {}
        for write in writes:
            by_stream.setdefault(write.stream_id, []).append(write)
        sids = tuple(by_stream)
        pairs: list[tuple[str, bytes]] = []
        owners: list[str | None] = []
        for sid, stream_writes in by_stream.items():  # by stream: each goes to the shard holding it
            commands, stream_owners = step_commands(
                stream_writes,
                {sid: self._live[sid].cursor.end},
                self._keys,
                retention_ms=int(self._cfg.retention_s * 1000),
                live_ttl_ms=int(self._cfg.live_ttl_s * 1000),
            )
            pairs += [(sid, command) for command in commands]
            owners += stream_owners
        ending = {w.stream_id for w in writes if w.finish is not None}
        try:
            results = await self._call("write_step", lambda r: self._send(pairs, ending), sids)
        except TokenLogUnavailable as exc:
            self._break(sids, exc)
            return sids
        lost = tuple(
            dict.fromkeys(
                sid for sid, result in zip(owners, results) if sid is not None and self._failed(result)
            )
        )
        self._apply(writes, lost)
        if lost:
            self._break(lost, TokenLogUnavailable("redis lost these streams (restarted without data?)", lost))
            await self._delete_partial(lost)
        return lost

    async def _send(self, pairs: Sequence[tuple[str, bytes]], ending: set[str]) -> list[Any]:
        """Send a step's commands, each tagged with its stream; their replies in order.

        One server: one packed write. A Cluster: one packed write per primary
        holding a written stream, all at once, each followed by that shard's
        doorbell ring (session/streams/log/redis_shards.py). Either way a ``WAIT``
        goes last on a connection when the durability setting asks for one.
        """
        if self._shards is None:
            commands = [command for _, command in pairs]
            wait = self._wait_command("", any(sid in ending for sid, _ in pairs))
            results = await self._run_step(self._redis, commands + ([wait] if wait else []))
            self._count_wait(results[len(commands) :])
            return results[: len(commands)]
        await self._shards.ready()
        groups: dict[str, tuple[ClusterNode, list[bytes]]] = {}
        members: dict[str, list[int]] = {}  # primary -> indexes into pairs
        streams: dict[str, dict[str, None]] = {}
        for i, (sid, command) in enumerate(pairs):
            node = self._shards.primary(self._keys.log(sid))
            groups.setdefault(node.name, (node, []))[1].append(command)
            members.setdefault(node.name, []).append(i)
            streams.setdefault(node.name, {})[sid] = None
        for name, (node, commands) in groups.items():
            commands.append(ring_command(self._shards.doorbell(node), list(streams[name]), RING_MAXLEN))
            wait = self._wait_command(name, any(sid in ending for sid in streams[name]))
            if wait:
                commands.append(wait)
        replies = await send_grouped(self._shards, groups)
        ordered: list[Any] = [None] * len(pairs)
        for name, indexes in members.items():
            for i, result in zip(indexes, replies[name]):
                ordered[i] = result
            self._count_wait(replies[name][len(indexes) + 1 :])
        return ordered

    def _wait_command(self, shard: str, ends_stream: bool) -> bytes | None:
        """The ``WAIT`` this write to ``shard`` ends with, or None (session/streams/log/durability.py)."""
        durability = self._cfg.durability
        now = asyncio.get_running_loop().time()
        since_ms = (now - self._waited_at.get(shard, 0.0)) * 1000
        if not durability.due(ends_stream=ends_stream, since_last_ms=since_ms):
            return None
        self._waited_at[shard] = now
        return resp("WAIT", durability.replicas, durability.timeout_ms)

    def _count_wait(self, replies: Sequence[Any]) -> None:
        for reply in replies:
            if isinstance(reply, int) and reply < self._cfg.durability.replicas:
                self.num_unreplicated += 1
                log.warning(
                    "token log: WAIT timed out with %d of %d replicas", reply, self._cfg.durability.replicas
                )

    @staticmethod
    async def _run_step(redis: Redis, commands: list[bytes]) -> list[Any]:
        """Send the step as one packed write on one pooled connection and read every reply.

        This is what a non-transactional pipeline does, minus redis-py's
        per-argument Python packing, which cost more than the round trip here.
        Error replies come back as ResponseError values; a connection failure
        or cancellation mid-way makes redis-py drop the connection, never
        return it half-read.
        """
        pool = redis.connection_pool
        conn = await pool.get_connection()
        try:
            return await exchange(conn, commands)
        finally:
            await asyncio.shield(pool.release(conn))

    @staticmethod
    def _failed(result: object) -> bool:
        """Whether a checked command's result shows its stream was lost."""
        if isinstance(result, Exception):
            return not already_added(result)
        return result is None or result == 0  # XADD NOMKSTREAM on a missing key / EXISTS

    def _apply(self, writes: Sequence[StreamWrite], lost: tuple[str, ...]) -> None:
        """Advance cursors and tails of the written streams, then wake their readers."""
        touched: dict[str, _LocalStream] = {}
        for write in writes:
            if write.stream_id in lost:
                continue
            local = touched[write.stream_id] = self._live[write.stream_id]
            local.cursor.advance(write)
            if write.entry is not None:
                local.tail.append(write.entry)
            if write.finish is not None:
                local.finish = write.finish
                del self._live[write.stream_id]  # readers that hold it finish from its tail
                _remember(self._ended, write.stream_id)
        for local in touched.values():
            local.notify()

    def _break(self, stream_ids: Sequence[str], error: Exception) -> None:
        for sid in stream_ids:
            local = self._live.pop(sid, None)
            _remember(self._broken, sid)
            if local is not None:
                local.error = error
                local.notify()

    async def _delete_partial(self, stream_ids: Sequence[str]) -> None:
        """Remove keys that writes to lost streams re-created (best effort)."""

        async def delete(redis: Redis) -> None:
            async with redis.pipeline(transaction=False) as pipe:
                for sid in stream_ids:  # one DEL per stream: a cluster holds each in its own slot
                    pipe.delete(self._keys.log(sid), self._keys.meta(sid))
                await pipe.execute()

        try:
            await self._call("cleanup", delete)
        except TokenLogUnavailable:
            pass  # their live TTL removes them anyway

    # -- reading --------------------------------------------------------------

    async def info(self, stream_id: str) -> StreamInfo | None:
        local = self._live.get(stream_id)
        if local is not None:
            return replace(local.info, end=local.cursor.end)
        meta, last = await self._fetch_meta(stream_id)
        return info_from_meta(stream_id, meta, last)

    async def _fetch_meta(self, stream_id: str) -> tuple[dict[bytes, bytes], list[Any]]:
        """The metadata hash and the log's newest raw entry (empty list if none)."""

        async def fetch(redis: Redis) -> list[Any]:
            async with redis.pipeline(transaction=False) as pipe:
                pipe.hgetall(self._keys.meta(stream_id))
                pipe.xrevrange(self._keys.log(stream_id), "+", "-", count=1)
                return await pipe.execute()

        meta, last = await self._call("read", fetch, (stream_id,))
        return meta, last

    def read(self, stream_id: str, from_offset: int) -> AsyncGenerator[LogEntry | StreamEnd, None]:
        if from_offset < 0:
            raise ValueError(f"{from_offset=} must be >= 0")
        return self._read(stream_id, from_offset)

    async def _read(self, stream_id: str, from_offset: int) -> AsyncGenerator[LogEntry | StreamEnd, None]:
        local = self._live.get(stream_id)
        inner = (
            self._read_local(local, from_offset)
            if local is not None
            else self._read_remote(stream_id, from_offset)
        )
        async with aclosing(inner) as events:
            async for event in events:
                yield event

    async def _fetch(self, stream_id: str, after: StreamId) -> list[RawEntry]:
        """Up to ``replay_batch`` raw entries with ids after ``after``."""
        raw = await self._call(
            "read",
            lambda r: r.xrange(
                self._keys.log(stream_id),
                min=f"({after[0]}-{after[1]}",
                max="+",
                count=self._cfg.replay_batch,
            ),
            (stream_id,),
        )
        return parse_entries(raw)

    async def _read_local(
        self, local: _LocalStream, from_offset: int
    ) -> AsyncGenerator[LogEntry | StreamEnd, None]:
        """Follow a stream this node writes: from its tail, from Redis when behind it."""
        sid = local.info.stream_id
        cursor = ReadCursor(sid, from_offset)
        while True:
            changed = local.changed
            if local.tail_start() > cursor.pos:
                # Everything below the tail was written to Redis first: it must hold it.
                batch = await self._fetch(sid, (cursor.pos, 0))
                if not batch:
                    raise StreamTruncated(sid, cursor.pos, local.tail_start())
                for rid, fields in batch:
                    event = decode(rid, fields)
                    if isinstance(event, StreamEnd):
                        yield cursor.finish(event)
                        return
                    if cursor.take(event):
                        yield event
                continue
            fresh = local.entries_after(cursor.pos)
            for entry in fresh:
                if cursor.take(entry):
                    yield entry
            if fresh:
                continue
            if local.finish is not None:
                yield cursor.finish(local.finish)
                return
            if local.error is not None:
                raise local.error
            await changed.wait()

    async def _read_remote(
        self, stream_id: str, from_offset: int
    ) -> AsyncGenerator[LogEntry | StreamEnd, None]:
        """Replay from Redis, then follow through the node's tailer.

        Raises StreamNotFound (no metadata), OffsetOutOfRange, StreamTruncated
        (the log lost entries the reader needs, or all of them), TokenLogUnavailable.
        """
        meta, newest = await self._fetch_meta(stream_id)
        info = info_from_meta(stream_id, meta, newest)
        if info is None:
            raise StreamNotFound(stream_id)
        if info.finish is not None and info.finish.truncated:
            raise StreamTruncated(stream_id, min(from_offset, info.end))
        if info.finish is not None and from_offset > info.end:
            raise OffsetOutOfRange(stream_id, from_offset, info.end)
        if info.finish is None and not newest and LOGGED.encode() in meta:
            raise StreamTruncated(stream_id, from_offset)  # tokens were logged; the log is gone
        cursor = ReadCursor(stream_id, from_offset)
        # Past the live end, follow from the newest id: entries up to from_offset are
        # skipped, but a finish below from_offset must still be seen.
        last = min((from_offset, 0), parse_id(newest[0][0]) if newest else (0, 0))
        while True:
            batch = await self._fetch(stream_id, last)
            for rid, fields in batch:
                last = rid
                event = decode(rid, fields)
                if isinstance(event, StreamEnd):
                    yield cursor.finish(event)
                    return
                if cursor.take(event):
                    yield event
            if len(batch) < self._cfg.replay_batch:
                break
        if info.finish is not None:
            # The log lost its finish entry (or every entry): the metadata holds the end,
            # and the entries read must reach it.
            yield cursor.finish(info.finish)
            return
        async with aclosing(self._follow(stream_id, cursor, last)) as events:
            async for event in events:
                yield event

    async def _follow(
        self, stream_id: str, cursor: ReadCursor, last: StreamId
    ) -> AsyncGenerator[LogEntry | StreamEnd, None]:
        sub = Subscription(
            stream_id=stream_id,
            log_key=self._keys.log(stream_id),
            meta_key=self._keys.meta(stream_id),
            last_id=last,
        )
        try:
            await self._tailer.subscribe(sub)
            while True:
                item = await sub.queue.get()
                if isinstance(item, Exception):
                    raise item
                for rid, fields in item:
                    event = decode(rid, fields)
                    if isinstance(event, StreamEnd):
                        yield cursor.finish(event)
                        return
                    if cursor.take(event):  # entries up to a from_offset past the live end are skipped
                        yield event
        finally:
            self._tailer.unsubscribe(sub)

    async def _wake(self) -> None:
        """Make the tailer's blocked XREAD return so it picks up a new subscription."""

        async def wake(redis: Redis) -> None:
            async with redis.pipeline(transaction=False) as pipe:
                pipe.xadd(self._wake_key, {"w": 1}, maxlen=16, approximate=True)
                pipe.pexpire(self._wake_key, int(self._cfg.live_ttl_s * 1000))
                await pipe.execute()

        await self._call("wake", wake)

    # -- sessions and health --------------------------------------------------

    async def save_session(self, session_id: str, state: bytes) -> None:
        px = int(self._cfg.retention_s * 1000)
        await self._call("save_session", lambda r: r.set(self._keys.session(session_id), state, px=px))

    async def load_session(self, session_id: str) -> bytes | None:
        state = await self._call("load_session", lambda r: r.get(self._keys.session(session_id)))
        return cast(bytes | None, state)  # bytes: the client does not decode responses

    async def shared_secret(self, candidate: bytes) -> bytes:
        """The token key of every node on this Redis and key prefix.

        The first node to ask stores ``candidate`` (``SET NX``, no expiry);
        every later ask, on any node, after any restart, gets that one back.
        Raises TokenLogUnavailable (retried for ``retry_for_s`` first).
        """
        key = self._keys.token_secret()

        async def load(redis: Redis) -> bytes:
            async with redis.pipeline(transaction=False) as pipe:
                pipe.set(key, candidate, nx=True)
                pipe.get(key)
                stored: bytes = (await pipe.execute())[1]
            return stored

        return await self._call("shared_secret", load)

    async def ping(self) -> bool:
        """PING within the socket timeout, once more if the connection was dropped; never raises.

        A connection Redis closed (``CLIENT KILL``, a restart) fails at once and
        is replaced by the retry, so /readyz does not flap once per dead pooled
        connection. A timeout (a hung Redis) is not retried: the probe stays bounded.
        On a Cluster every primary must answer (any stream may hash to any of
        them; a replica's death does not make the node unready), and a failure
        refreshes the slot map first, so a promoted replica is pinged next time.
        """
        for attempt in range(2):
            try:
                async with asyncio.timeout(self._cfg.socket_timeout_s):
                    ok = bool(await self._ping_once())
            except _DROPPED:
                if self._shards is not None:
                    await self._shards.refresh()
                if attempt == 0:
                    await asyncio.sleep(_PING_RETRY_S)
                    continue
                return False
            except (*_TRANSIENT, ResponseError, RedisClusterException):
                if self._shards is not None:
                    await self._shards.refresh()
                return False
            self._degraded = self._degraded and not ok
            return ok
        return False

    async def _ping_once(self) -> bool:
        if isinstance(self._redis, RedisCluster):
            await self._redis.initialize()
            return bool(await self._redis.ping(target_nodes=RedisCluster.PRIMARIES))
        return bool(await self._redis.ping())

    async def close(self) -> None:
        self._closed = True
        await self._tailer.close()
        error = TokenLogUnavailable("token log closed")
        for local in self._live.values():
            local.error = error
            local.notify()
        self._live.clear()
        await self._redis.aclose()
