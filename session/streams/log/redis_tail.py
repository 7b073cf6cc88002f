"""One multiplexed ``XREAD BLOCK`` per node over every stream its readers follow.

Readers of streams written by other nodes (or by this node before it
restarted) do not each hold a blocked connection: they subscribe here with the
last stream entry id they have, and one task per :class:`StreamTailer` runs
``XREAD BLOCK`` over all subscribed keys on its own dedicated connection,
handing each reader the entries past its id.

A new subscription must join the blocked ``XREAD`` at once: the subscriber
appends to a per-node *wake* stream that the same ``XREAD`` also watches, so
the call returns and the next one includes the new key. Nothing is ever
cancelled mid-command on a pooled connection; the dedicated connection is
closed (never reused) when the task stops or the connection fails, so a
half-read reply can never reach another caller (redis-py issues #2579, #2624,
#2663: a blocking command cancelled on a pooled connection poisons it).

The task runs supervised (session/supervise.py): a bug that crashes it is
logged, every subscriber gets TokenLogUnavailable (their clients resume),
``health`` is marked failing until the next good read, and the task restarts.

On a Redis Cluster one ``XREAD`` cannot span hash slots: there the log runs
one blocking reader per followed shard instead (session/streams/log/redis_cluster_tail.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import cast

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import KeyT, StreamIdT

from bargein.session.errors import StreamNotFound, StreamTruncated, TokenLogUnavailable
from bargein.session.supervise import TaskHealth, supervised

log = logging.getLogger(__name__)

StreamId = tuple[int, int]  # (milliseconds part, sequence part) of a Redis stream entry id
RawEntry = tuple[StreamId, dict[bytes, bytes]]

# The metadata field set with a stream's first entry (the layout is in session/streams/log/redis_format.py,
# which imports this module): from then on the stream's log key must exist.
LOGGED = "logged"

_TRANSIENT = (RedisConnectionError, RedisTimeoutError, OSError)
TAILER = "redis-tailer"  # the task's name (the log, /readyz)


def parse_id(raw: bytes) -> StreamId:
    """``b"12-0"`` -> ``(12, 0)``."""
    ms, _, seq = raw.partition(b"-")
    return int(ms), int(seq)


# The replies of our clients are bytes (none sets decode_responses); redis-py types
# them for either setting (``bytes | str``), so they are narrowed where they are parsed.
RawReply = list[tuple[bytes, dict[bytes, bytes]]]  # entries of an XRANGE, XREVRANGE or XREAD


def parse_entries(reply: object) -> list[RawEntry]:
    """The entries of an ``XRANGE``/``XREVRANGE`` reply (or of one key of an ``XREAD``)."""
    return [(parse_id(raw_id), fields) for raw_id, fields in cast(RawReply, reply)]


def format_id(stream_id: StreamId) -> str:
    """``(12, 0)`` -> ``"12-0"``."""
    return f"{stream_id[0]}-{stream_id[1]}"


@dataclass(eq=False, slots=True, kw_only=True)
class Subscription:
    """One reader's interest in one stream key.

    ``queue`` receives lists of entries past ``last_id`` in id order, or an
    exception (StreamNotFound, TokenLogUnavailable) after which nothing comes.
    """

    stream_id: str
    log_key: str
    meta_key: str
    last_id: StreamId
    queue: asyncio.Queue[list[RawEntry] | Exception] = field(default_factory=asyncio.Queue)


class StreamTailer:
    """Runs the node's single blocking reader.

    Args:
        make_client: builds a single-connection client (no pool sharing) whose
            socket timeout exceeds ``block_ms``.
        wake: coroutine that appends to ``wake_key`` (on a pooled client).
        wake_key: this node's wake stream.
        block_ms: longest ``XREAD BLOCK``; after an empty one the tailer checks
            that every followed stream still exists (a writer that died leaves
            keys that expire by their live TTL: readers then get StreamNotFound;
            a log lost while its metadata remains: StreamTruncated).
        timeout_s: how much longer than ``block_ms`` a reply may take before the
            server counts as hung (timed here: the client has no socket timeout).
        unavailable_after_s: how long Redis may stay unreachable before every
            subscriber gets TokenLogUnavailable.
        count: most entries per key per ``XREAD``.
        health: marked while the task crashes (a bug), cleared by a good read.
    """

    def __init__(
        self,
        *,
        make_client: Callable[[], Redis],
        wake: Callable[[], Awaitable[object]],
        wake_key: str,
        block_ms: int,
        timeout_s: float,
        unavailable_after_s: float,
        count: int = 1024,
        health: TaskHealth | None = None,
    ) -> None:
        self.health = health or TaskHealth()
        self._make_client = make_client
        self._wake = wake
        self._wake_key = wake_key
        self._block_ms = block_ms
        self._timeout_s = timeout_s
        self._unavailable_after_s = unavailable_after_s
        self._count = count
        self._subs: dict[str, set[Subscription]] = {}  # log key -> its subscribers
        self._has_subs = asyncio.Event()
        self._wake_id: StreamId = (0, 0)
        self._task: asyncio.Task[None] | None = None

    async def subscribe(self, sub: Subscription) -> None:
        """Start delivering entries past ``sub.last_id`` to ``sub.queue``."""
        self._subs.setdefault(sub.log_key, set()).add(sub)
        self._has_subs.set()
        if self._task is None or self._task.done():
            self._task = supervised(self._run, name=TAILER, on_crash=self._crashed, health=self.health)
        else:
            await self._wake()  # a blocked XREAD returns and re-reads with this key

    def unsubscribe(self, sub: Subscription) -> None:
        """Stop delivering to ``sub`` (idempotent)."""
        subs = self._subs.get(sub.log_key)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.log_key]
        if not self._subs:
            self._has_subs.clear()

    async def close(self) -> None:
        """Stop the task (closing its connection); subscribers get TokenLogUnavailable."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._fail_all(TokenLogUnavailable("token log closed"))

    async def _run(self) -> None:
        client: Redis | None = None
        down_since: float | None = None
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._has_subs.wait()
                if client is None:
                    client = self._make_client()
                try:
                    await self._poll(client)
                    down_since = None
                    self.health.working(TAILER)
                except _TRANSIENT as exc:
                    await client.aclose()  # never reuse a connection that failed mid-reply
                    client = None
                    down_since = loop.time() if down_since is None else down_since
                    if loop.time() - down_since >= self._unavailable_after_s:
                        self._fail_all(TokenLogUnavailable(f"redis unreachable: {exc}"))
                    await asyncio.sleep(0.1)
                except RedisError as exc:  # an error reply (e.g. a key of the wrong type)
                    log.error("token log tailer: %r; failing its %d keys' readers", exc, len(self._subs))
                    self._fail_all(TokenLogUnavailable(f"redis refused the tailer's read: {exc}"))
        finally:
            if client is not None:
                await client.aclose()

    async def _crashed(self, exc: Exception) -> None:
        """The task crashed (its connection is closed): its readers must not wait
        for entries it will not deliver; they get a retryable error."""
        self._fail_all(TokenLogUnavailable(f"the token log's tailer failed: {exc!r}"))

    async def _poll(self, client: Redis) -> None:
        """One XREAD BLOCK over the wake key and every subscribed key."""
        streams: dict[KeyT, StreamIdT] = {self._wake_key: format_id(self._wake_id)}
        streams.update((key, format_id(min(s.last_id for s in subs))) for key, subs in self._subs.items())
        async with asyncio.timeout(self._block_ms / 1000 + self._timeout_s):
            reply = await client.xread(streams, count=self._count, block=self._block_ms)
        if not reply:
            async with asyncio.timeout(self._timeout_s):
                await self._drop_missing(client)
            return
        # RESP2 (the default protocol): a list of [key, entries] pairs.
        for raw_key, raw_entries in cast(list[tuple[bytes, RawReply]], reply):
            key = raw_key.decode()
            entries = parse_entries(raw_entries)
            if key == self._wake_key:
                self._wake_id = entries[-1][0]
            else:
                self._deliver(key, entries)

    def _deliver(self, key: str, entries: list[RawEntry]) -> None:
        for sub in list(self._subs.get(key, ())):
            fresh = [e for e in entries if e[0] > sub.last_id]
            if fresh:
                sub.last_id = fresh[-1][0]
                sub.queue.put_nowait(fresh)

    async def _drop_missing(self, client: Redis) -> None:
        """Tell subscribers of streams whose metadata is gone (expired) to stop, and
        those whose log is gone while the metadata says tokens were logged (lost)."""
        subs = [sub for key_subs in self._subs.values() for sub in key_subs]
        async with client.pipeline(transaction=False) as pipe:
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
            self.unsubscribe(sub)
            sub.queue.put_nowait(error)

    def _fail_all(self, error: Exception) -> None:
        for sub in [sub for key_subs in self._subs.values() for sub in key_subs]:
            self.unsubscribe(sub)
            sub.queue.put_nowait(error)
