"""Several bargein nodes on one Redis: leases, forwarded interrupts, takeover.

One :class:`Cluster` per node, beside its service and its
:class:`~bargein.session.streams.log.redis_streams.RedisTokenLog` (same Redis, same key
prefix). It is the multi-node :class:`~bargein.session.streams.peers.Peers`:
the service calls it at these points:

- ``claim`` when it creates a stream: the generation record
  (session/streams/cluster/takeover.py) is stored and the lease taken, in one round trip,
  before the stream exists;
- ``fence`` before each step's log write: only streams whose lease is
  locally valid are written (session/streams/cluster/lease.py); the write itself is fenced
  in Redis by the lease's epoch (the log's ``fence_with``), so a node that
  stalled between this check and its write still cannot write a stream
  another node took over;
- ``ended`` when a stream's generation ended: its lease is released at the
  next tick;
- ``abort_elsewhere`` for a cancel of a stream this node does not generate
  (session/streams/cluster/forward.py);
- ``follow`` when a client resumes a stream here: the stream is watched, and
  if it is unfinished with no lease (its node died), taken over.

It asks the service back only through :class:`~bargein.session.streams.peers.LocalNode`
(abort a request, continue a stream taken over), so it imports nothing of the runtime.

One task ticks every ``renew_every_s``: it renews every lease in one
pipeline (reading the cancel flags on the way), releases ended streams'
leases, checks the leases of the streams watched here, and exchanges
readers: a node delivering a stream generated elsewhere refreshes the
stream's ``readers`` key, so the generating node's abandon grace
(``--abandon-grace``) does not cut a stream whose client moved to another node.
The tick and the abort listener run supervised (session/supervise.py): a bug
that crashes one is logged, marks ``health`` failing (``/readyz`` 503) until
its next good run, and the task restarts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Literal

from redis.exceptions import RedisError

from bargein.engine.request import FinishReason, SamplingParams
from bargein.session.cancel import cancel_and_wait
from bargein.session.errors import TokenLogError, TokenLogUnavailable
from bargein.session.streams.cluster.adopt import Adopter, Outcome
from bargein.session.streams.cluster.forward import Forwarder
from bargein.session.streams.cluster.lease import LeaseConfig, Leases
from bargein.session.streams.cluster.registry import NodeRegistry
from bargein.session.streams.cluster.takeover import GenerationRecord, gen_key
from bargein.session.streams.log import StreamWrite
from bargein.session.streams.log.redis_client import retrying_client
from bargein.session.streams.log.redis_streams import RedisTokenLog
from bargein.session.streams.peers import LocalNode
from bargein.session.supervise import TaskHealth, supervised

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 5.0  # most seconds stop() waits for its tasks to end

_REDIS_ERRORS = (RedisError, OSError)
ORPHAN_GRACE_S = 30.0  # a claim not followed by generation this long was abandoned
TICK = "cluster-tick"  # the tick's task name (the log, /readyz)


def readers_key(prefix: str, stream_id: str) -> str:
    """Set while a node other than the generating one delivers the stream."""
    return f"{prefix}{{{stream_id}}}:readers"


class Cluster:
    """This node's part of a multi-node deployment (see the module doc).

    Args:
        url: the Redis URL (the token log's).
        node_id: unique name of this node (written into its leases).
        log: the node's token log on that Redis: the cluster fences its
            writes, adopts the streams it takes over and stops the ones it lost.
        key_prefix: the token log's key prefix.
        lease: lease timing.
        record_ttl_s: how long a generation record outlives a dead node
            (the token log's live TTL).
    """

    def __init__(
        self,
        url: str,
        node_id: str,
        log: RedisTokenLog,
        *,
        key_prefix: str = "bargein:",
        lease: LeaseConfig = LeaseConfig(),
        record_ttl_s: float = 3600.0,
    ) -> None:
        self.node_id = node_id
        self._token_log = log
        # Every command of this client is safe to send twice (session/streams/log/redis_client.py).
        self.redis = retrying_client(url)
        self.health = TaskHealth()  # the tick's and the abort listener's crashes
        self.forwarder = Forwarder(
            self.redis, node_id, self._on_forwarded_abort, key_prefix=key_prefix, health=self.health
        )
        # The epoch outlives every key of the stream (the record lives as long as they do).
        self.leases = Leases(
            self.redis,
            node_id,
            key_prefix=key_prefix,
            config=lease,
            flag_key=self.forwarder.flag_key,
            epoch_ttl_s=2 * record_ttl_s,
        )
        self.registry = NodeRegistry(self.redis, node_id, ttl_s=lease.ttl_s, key_prefix=key_prefix)
        self._prefix = key_prefix
        self._record_ttl_ms = int(record_ttl_s * 1000)
        self._node: LocalNode | None = None  # set by start
        self._ended: list[str] = []
        self._claimed_at: dict[str, float] = {}  # claimed here, not yet ended
        self._reading: dict[str, int] = {}  # stream id -> deliveries of it here
        self._read_elsewhere: set[str] = set()  # streams of ours other nodes read
        self._watched: set[str] = set()
        self._taking: dict[str, asyncio.Task[Outcome]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ticker: asyncio.Task[None] | None = None
        self._handing_over = False
        self._adopter = Adopter(
            self.redis, self.leases, log, self.forwarder.flag_key, node_id, key_prefix=key_prefix
        )

    @property
    def num_takeovers(self) -> int:
        """Streams this node continued after their node died."""
        return self._adopter.num_takeovers

    # ---- life cycle ------------------------------------------------------------

    async def start(self, node: LocalNode) -> None:
        """Attach to this node's service (its engine, clock, model length) and start ticking.

        Raises:
            NodeIdInUse: another live node holds this node's id
                (session/streams/cluster/registry.py).
        """
        await self.registry.register()
        self._node = node
        self._token_log.fence_with(self.leases.fence)  # every write checks the lease's epoch
        await self.forwarder.start()
        self._ticker = supervised(self._tick_loop, name=TICK, health=self.health)

    async def hand_over(self) -> None:
        """Before a graceful shutdown: stop writing every stream generated here
        and release their leases at once (their generation records stay), so
        the nodes their clients resume on continue them, instead of the engine
        shutdown ending them as cancelled. Local readers get a retryable error."""
        self._handing_over = True
        held = self.leases.held
        for sid in held:
            self._token_log.abandon_stream(sid)
        try:
            await self.leases.release(held)
        except _REDIS_ERRORS as exc:
            log.warning("releasing leases at shutdown failed (they expire): %r", exc)

    async def stop(self) -> None:
        """Stop ticking and listening (leases are left to expire: another node
        takes the streams over if this one does not come back)."""
        tasks = [t for t in (self._ticker, *self._tasks, *self._taking.values()) if t is not None]
        # A task inside a redis-py call can miss its cancellation (CPython
        # gh-86296 on 3.11): bound the wait, so shutdown never hangs on one.
        await cancel_and_wait(tasks, timeout_s=STOP_TIMEOUT_S)
        await self.forwarder.stop()
        try:
            await self.registry.release()  # a restart under the same id need not wait
        except _REDIS_ERRORS as exc:
            log.warning("releasing the node id at shutdown failed (it expires): %r", exc)
        await self.redis.aclose()

    # ---- hooks of the service --------------------------------------------------

    async def claim(self, stream_id: str, prompt_token_ids: tuple[int, ...], params: SamplingParams) -> None:
        """Store the generation record and take the lease of a new stream.

        Raises TokenLogUnavailable when Redis refuses or fails (the stream
        must not be created: nobody could continue it).
        """
        record = GenerationRecord(prompt_token_ids=prompt_token_ids, params=params)
        try:
            taken = await self.leases.acquire(
                stream_id, set_also=(gen_key(self._prefix, stream_id), record.encode(), self._record_ttl_ms)
            )
        except _REDIS_ERRORS as exc:
            raise TokenLogUnavailable(f"cannot claim stream {stream_id}: {exc!r}", (stream_id,)) from exc
        if not taken:
            raise TokenLogUnavailable(f"stream {stream_id} already has a lease", (stream_id,))
        self._claimed_at[stream_id] = self._local.clock()

    async def fence(self, writes: list[StreamWrite]) -> list[StreamWrite]:
        """The writes this node may still make: streams whose lease it holds.

        A lease whose local validity ran out (a stalled loop) is renewed
        first; one another node holds now is abandoned.
        """
        if self._handing_over:
            return []
        lapsed = {
            w.stream_id
            for w in writes
            if self.leases.holds(w.stream_id) and not self.leases.valid(w.stream_id)
        }
        if lapsed:
            try:
                renewal = await self.leases.renew(lapsed)
                lost: tuple[str, ...] = renewal.lost
            except _REDIS_ERRORS as exc:
                log.error("lease renewal failed (%r): abandoning %d streams", exc, len(lapsed))
                lost = tuple(lapsed)
            for sid in lost:
                self._abandon(sid)
        return [w for w in writes if self.leases.holds(w.stream_id)]

    def lost(self, stream_id: str) -> None:
        """A write of ``stream_id`` was fenced off: another node took it over."""
        log.warning("stream %s was taken over by another node: stopped generating it", stream_id)
        self._abandon(stream_id)

    def ended(self, stream_id: str) -> None:
        """Generation of a stream this node wrote ended (its finish is logged)."""
        if self._handing_over:
            return  # ended by the shutdown, not logged: its record must stay
        self._ended.append(stream_id)
        self._claimed_at.pop(stream_id, None)

    def abort_elsewhere(self, stream_id: str, reason: FinishReason) -> None:
        """A cancel for a stream this node does not generate: forward it."""
        self._spawn(self._forward(stream_id, reason), f"forward-{stream_id}")

    def reader_started(self, stream_id: str) -> None:
        """A connection here delivers ``stream_id`` (maybe generated elsewhere)."""
        self._reading[stream_id] = self._reading.get(stream_id, 0) + 1

    def reader_ended(self, stream_id: str) -> None:
        """A delivery of ``stream_id`` here ended."""
        left = self._reading.pop(stream_id, 1) - 1
        if left > 0:
            self._reading[stream_id] = left

    def read_elsewhere(self, stream_id: str) -> bool:
        """At the last tick, a client on another node was reading this stream
        generated here (its abandon grace must not cut it)."""
        return stream_id in self._read_elsewhere

    async def follow(self, stream_id: str) -> None:
        """A client here reads ``stream_id``: watch it, take it over if its node died."""
        self._watched.add(stream_id)
        await self._take_over_once(stream_id)

    # ---- forwarding ------------------------------------------------------------

    async def _forward(self, stream_id: str, reason: FinishReason) -> None:
        try:
            owner = await self.leases.owner(stream_id)
            target = owner if owner != self.node_id else None  # never to ourselves
            received = await self.forwarder.forward(stream_id, reason, target)
        except _REDIS_ERRORS as exc:
            log.error("forwarding the cancel of %s failed: %r", stream_id, exc)
            return
        if owner is None or received == 0:
            # Nobody generates it: the node taking it over ends it as cancelled.
            self._watched.add(stream_id)
            await self._take_over_once(stream_id)

    def _on_forwarded_abort(self, stream_id: str, reason: FinishReason) -> None:
        node = self._node
        if node is not None and self.leases.holds(stream_id):
            node.abort(stream_id, reason, node.clock())

    # ---- the tick --------------------------------------------------------------

    async def _tick_loop(self) -> None:
        """Tick forever (supervised: a bug's crash restarts it, see the module doc)."""
        every = self.leases.config.renew_every_s
        while True:
            await asyncio.sleep(every)
            try:
                await self._tick()
            except _REDIS_ERRORS as exc:  # Redis is down: /readyz says so by its ping
                log.warning("cluster tick failed: %r", exc)
            else:
                self.health.working(TICK)

    async def _tick(self) -> None:
        """Renew, apply cancel flags, release ended leases, check watched streams."""
        node = self._local
        await self.registry.renew()
        renewal = await self.leases.renew()
        for sid in renewal.lost:
            log.error("lease of %s is held by another node: abandoning it", sid)
            self._abandon(sid)
        for sid in renewal.flagged:  # a forwarded cancel whose message was lost
            if node.is_generating(sid):
                node.abort(sid, FinishReason.INTERRUPTED, node.clock())
        ended, self._ended = self._ended, []
        ended += self._orphans(node)
        if ended:  # a record goes with its lease: never one another node took meanwhile
            await self.leases.release(ended, with_lease=lambda s: [gen_key(self._prefix, s)])
        await self._check_watched()
        await self._exchange_readers(node)

    async def _exchange_readers(self, node: LocalNode) -> None:
        """One pipeline: say which streams generated elsewhere are read here
        (a key that lives three ticks), and learn which of ours are read elsewhere."""
        remote = [s for s in self._reading if not node.is_generating(s)]
        held = self.leases.held
        if not remote and not held:
            self._read_elsewhere = set()
            return
        px = int(3000 * self.leases.config.renew_every_s)
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in remote:
                pipe.set(readers_key(self._prefix, sid), self.node_id, px=px)
            for sid in held:
                pipe.exists(readers_key(self._prefix, sid))
            results = await pipe.execute()
        self._read_elsewhere = {sid for sid, n in zip(held, results[len(remote) :]) if n}

    def _orphans(self, node: LocalNode) -> list[str]:
        """Held leases of streams that never started generating here (their
        creation failed after the claim), past a grace period."""
        now = node.clock()
        orphans = [
            sid
            for sid, at in self._claimed_at.items()
            if now - at > ORPHAN_GRACE_S and not node.is_generating(sid)
        ]
        for sid in orphans:
            del self._claimed_at[sid]
        return [sid for sid in orphans if self.leases.holds(sid)]

    async def _check_watched(self) -> None:
        sids = [s for s in self._watched if not self.leases.holds(s) and s not in self._taking]
        if not sids:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in sids:  # one EXISTS each: a cluster may hold them in different slots
                pipe.exists(self.leases.key(sid))
            leased = await pipe.execute()
        for sid, has_owner in zip(sids, leased):
            if not has_owner:
                self._spawn(self._take_over_once(sid), f"takeover-{sid}")

    # ---- takeover --------------------------------------------------------------

    async def _take_over_once(self, stream_id: str) -> Outcome | Literal["failed"]:
        """Run at most one takeover attempt per stream at a time
        (session/streams/cluster/adopt.py); its outcome."""
        task = self._taking.get(stream_id)
        if task is None:
            task = self._taking[stream_id] = asyncio.create_task(
                self._adopter.take_over(stream_id, self._local), name=f"takeover-{stream_id}"
            )
            task.add_done_callback(lambda _: self._taking.pop(stream_id, None))
        try:
            outcome = await asyncio.shield(task)
        except (TokenLogError, *_REDIS_ERRORS) as exc:
            log.warning("takeover of %s failed: %r", stream_id, exc)
            return "failed"
        except Exception as exc:  # a bug: the resuming client still gets its delivery
            log.error("takeover of %s failed (a bug in bargein): %r", stream_id, exc, exc_info=exc)
            return "failed"
        if outcome != "owned":
            self._watched.discard(stream_id)
        return outcome

    def _abandon(self, stream_id: str) -> None:
        """Another node may continue this stream: stop generating and writing it."""
        self.leases.forget(stream_id)
        self._local.runner.abort(stream_id, FinishReason.CANCELLED)
        self._token_log.abandon_stream(stream_id)

    @property
    def _local(self) -> LocalNode:
        """The node's service (:meth:`start` attached it)."""
        assert self._node is not None, "Cluster.start(node) first"
        return self._node

    def _spawn(self, coro: Coroutine[Any, Any, object], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._spawned_done)

    def _spawned_done(self, task: asyncio.Task[Any]) -> None:
        """A short task (a forwarded cancel, a takeover) ended: a crash is logged
        at once, not as "exception never retrieved" when it is collected."""
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("task %s failed (a bug in bargein): %r", task.get_name(), exc, exc_info=exc)
