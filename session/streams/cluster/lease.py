"""Leases: which node generates a stream, kept in Redis.

A node that generates a stream holds the key ``<prefix>{<stream_id>}:lease``
(value: its node id, ``PX`` the lease time; the hash tag keeps it in the
stream's Redis Cluster slot). While it generates, it renews all its leases
every ``renew_every_s`` in ONE pipeline; it deletes them when its streams end.
A node that died stops renewing, and ``ttl_s`` later the key is gone.

Taking a lease is ``SET NX PX``: Redis runs it atomically, so of two nodes
racing for the lease of a dead stream exactly one gets it.

Fencing epochs: every take of a lease (a new stream's claim, a takeover)
increments the stream's epoch ``<prefix>{<stream_id>}:epoch`` in the same
script that sets the lease, and the taker keeps the number. Every write of the
stream is a script that first checks that the epoch is still the writer's
(session/streams/log/redis_format.py ``FENCED_STEP_LUA``), so a node that stalled past its
lease (SIGSTOP, a long GC pause, a partition) while another node took the
stream over can never append to it or end it when it wakes, however its
checks and writes interleave: Redis runs each script atomically. Renewing
and releasing check the epoch too, so a stalled node never takes back a
lease another node held meanwhile (and released), nor deletes one it holds.

Local validity on top: a node only writes a stream while its lease is
*locally* valid: ``VALID_FRACTION * ttl_s`` after the start of the last
renewal that succeeded. Redis set the key's expiry later than that start and
a quarter of the TTL later still, so the local view runs out first: a node
that finds its local view lapsed renews at once before it writes on
(session/streams/cluster/coordinator.py ``fence``) and learns there that it lost the stream,
without a refused write.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from bargein.session.streams.log.fence import Fence
from bargein.session.streams.log.redis_client import AnyRedis

# Take a free lease and count a new epoch. KEYS[1] lease, KEYS[2] epoch; ARGV[1] node
# id, ARGV[2] lease ttl ms, ARGV[3] epoch ttl ms. Returns the new epoch, 0 when held.
ACQUIRE_LUA = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
local epoch = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return epoch
"""

# Renew a lease this node holds; take it back if it vanished while the epoch is still
# ours (nobody took it since, so the log is still ours alone). KEYS[1] lease, KEYS[2]
# epoch; ARGV[1] node id, ARGV[2] ttl ms, ARGV[3] our epoch. Returns 1 when the node
# holds the lease afterwards, 0 when another node took it (maybe released since).
RENEW_LUA = """
if redis.call('GET', KEYS[2]) ~= ARGV[3] then return 0 end
local owner = redis.call('GET', KEYS[1])
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not owner then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""

# Delete a lease, and the stream keys KEYS[3..], only while the epoch is ours.
# KEYS[1] lease, KEYS[2] epoch; ARGV[1] node id, ARGV[2] our epoch.
RELEASE_LUA = """
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return 0 end
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
for i = 3, #KEYS do redis.call('DEL', KEYS[i]) end
return 1
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseConfig:
    """Lease timing.

    Attributes:
        ttl_s: a lease not renewed for this long expires: the time after a
            node's death before another node may continue its streams.
        renew_every_s: renewal period (well below ``ttl_s``: a late tick under
            load must not lose a lease).
    """

    ttl_s: float = 5.0
    renew_every_s: float = 1.0

    def __post_init__(self) -> None:
        if self.renew_every_s <= 0:
            raise ValueError(f"{self.renew_every_s=} must be > 0")
        if self.ttl_s < 2 * self.renew_every_s:
            raise ValueError(f"{self.ttl_s=} must be >= 2 * renew_every_s")


@dataclass(frozen=True, slots=True, kw_only=True)
class Renewal:
    """What one renewal tick found: leases now held elsewhere, streams flagged."""

    lost: tuple[str, ...]
    flagged: tuple[str, ...]


VALID_FRACTION = 0.75  # of the TTL after a renewal's start that the holder trusts its lease
NO_EPOCH = 0  # never an epoch Redis counted (INCR starts at 1): its checks always fail


def lease_key(prefix: str, stream_id: str) -> str:
    """The lease key of a stream (same hash slot as its log and metadata)."""
    return f"{prefix}{{{stream_id}}}:lease"


def epoch_key(prefix: str, stream_id: str) -> str:
    """The fencing epoch of a stream: how many times its lease was taken."""
    return f"{prefix}{{{stream_id}}}:epoch"


class Leases:
    """The leases one node holds, and taking, renewing and releasing them.

    Args:
        redis: a redis-py asyncio client (its own pool).
        node_id: the value written into the leases this node holds.
        key_prefix: the token log's key prefix.
        config: lease timing.
        clock: monotonic seconds (local lease validity).
        flag_key: the key of a per-stream flag read in the renewal pipeline
            (the cancel flag of session/streams/cluster/forward.py), or None.
        epoch_ttl_s: how long a stream's epoch outlives its last take; at
            least the life of the stream's keys, so that an epoch is never
            counted again from 1 while a stalled holder of an old one lives.
    """

    def __init__(
        self,
        redis: AnyRedis,
        node_id: str,
        *,
        key_prefix: str = "bargein:",
        config: LeaseConfig = LeaseConfig(),
        clock: Callable[[], float] = time.monotonic,
        flag_key: Callable[[str], str] | None = None,
        epoch_ttl_s: float = 7200.0,
    ) -> None:
        self.redis = redis
        self.node_id = node_id
        self.config = config
        self._prefix = key_prefix
        self._clock = clock
        self._flag_key = flag_key
        self._epoch_ttl_ms = int(epoch_ttl_s * 1000)
        self._valid_until: dict[str, float] = {}  # held leases: local expiry (monotonic s)
        self._epochs: dict[str, int] = {}  # held leases: the epoch each take got

    def key(self, stream_id: str) -> str:
        return lease_key(self._prefix, stream_id)

    def epoch_key(self, stream_id: str) -> str:
        return epoch_key(self._prefix, stream_id)

    def fence(self, stream_id: str) -> Fence | None:
        """What a write of ``stream_id`` must check, or None when this node
        does not hold its lease (such a write must not be made)."""
        epoch = self._epochs.get(stream_id)
        if epoch is None or stream_id not in self._valid_until:
            return None
        return Fence(
            lease_key=self.key(stream_id),
            epoch_key=self.epoch_key(stream_id),
            node_id=self.node_id,
            epoch=epoch,
        )

    @property
    def held(self) -> list[str]:
        """Streams whose lease this node holds (or held until a failed renewal)."""
        return list(self._valid_until)

    def holds(self, stream_id: str) -> bool:
        return stream_id in self._valid_until

    def valid(self, stream_id: str) -> bool:
        """This node holds the lease and no other node can have taken it yet."""
        until = self._valid_until.get(stream_id)
        return until is not None and self._clock() < until

    async def acquire(self, stream_id: str, *, set_also: tuple[str, bytes, int] | None = None) -> bool:
        """Take the lease if nobody holds it (``SET NX PX``, and a new epoch,
        in one script); True if taken.

        ``set_also``: ``(key, value, px_ms)`` written in the same pipeline
        first, taken or not (a new stream's generation record: one round
        trip for both). Raises redis errors.
        """
        started = self._clock()
        async with self.redis.pipeline(transaction=False) as pipe:
            if set_also is not None:
                key, value, px_ms = set_also
                pipe.set(key, value, px=px_ms)
            pipe.eval(
                ACQUIRE_LUA,
                2,
                self.key(stream_id),
                self.epoch_key(stream_id),
                self.node_id,
                int(self.config.ttl_s * 1000),
                self._epoch_ttl_ms,
            )
            epoch = int((await pipe.execute())[-1])
        if epoch:
            self._valid_until[stream_id] = started + VALID_FRACTION * self.config.ttl_s
            self._epochs[stream_id] = epoch
        return bool(epoch)

    async def owner(self, stream_id: str) -> str | None:
        """The node holding the lease of ``stream_id`` now, or None."""
        value = cast(bytes | None, await self.redis.get(self.key(stream_id)))  # no decode_responses
        return None if value is None else value.decode()

    async def owners(self, stream_ids: Sequence[str]) -> list[str | None]:
        """The holders of several leases, in one ``MGET`` per call.

        On a Redis Cluster the keys span slots: callers pass one stream at a
        time there (the client splits multi-slot commands itself otherwise).
        """
        if not stream_ids:
            return []
        values = cast(list[bytes | None], await self.redis.mget([self.key(s) for s in stream_ids]))
        return [None if v is None else v.decode() for v in values]  # bytes: no decode_responses

    async def renew(self, stream_ids: Iterable[str] | None = None) -> Renewal:
        """Renew the given held leases (default: all) in one pipeline.

        The streams whose lease another node holds now are forgotten here
        (their generation must stop); the flag of each renewed stream is read
        in the same pipeline. Raises redis errors (the leases then keep their
        local validity, which runs out on its own).
        """
        sids = [s for s in (self.held if stream_ids is None else stream_ids) if self.holds(s)]
        if not sids:
            return Renewal(lost=(), flagged=())
        started = self._clock()
        ttl_ms = int(self.config.ttl_s * 1000)
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in sids:  # EVAL, not EVALSHA: no SCRIPT EXISTS round trip per tick
                pipe.eval(
                    RENEW_LUA,
                    2,
                    self.key(sid),
                    self.epoch_key(sid),
                    self.node_id,
                    ttl_ms,
                    self._epochs.get(sid, NO_EPOCH),
                )
                if self._flag_key is not None:
                    pipe.exists(self._flag_key(sid))
            results: list[Any] = await pipe.execute()
        step = 1 if self._flag_key is None else 2
        lost, flagged = [], []
        for sid, ok, flag in zip(sids, results[::step], results[1::step] if step == 2 else sids):
            if sid not in self._valid_until:
                continue  # released meanwhile
            if not ok:
                self.forget(sid)
                lost.append(sid)
                continue
            self._valid_until[sid] = started + VALID_FRACTION * self.config.ttl_s
            if step == 2 and flag:
                flagged.append(sid)
        return Renewal(lost=tuple(lost), flagged=tuple(flagged))

    def forget(self, stream_id: str) -> None:
        """Stop renewing a lease without deleting it (it expires on its own)."""
        self._valid_until.pop(stream_id, None)
        self._epochs.pop(stream_id, None)

    async def release(
        self,
        stream_ids: Sequence[str],
        *,
        also_delete: Sequence[str] = (),
        with_lease: Callable[[str], Sequence[str]] | None = None,
    ) -> None:
        """Delete the leases of ended streams, and the keys ``also_delete``, in
        one pipeline.

        A lease is deleted only while its epoch is still this node's (a
        stalled node never deletes the lease of the node that took its
        stream over), and so are the keys ``with_lease(stream_id)`` of that
        stream (its generation record). Raises redis errors.
        """
        epochs = {sid: self._epochs.get(sid, NO_EPOCH) for sid in stream_ids}
        for sid in stream_ids:
            self.forget(sid)
        if not stream_ids and not also_delete:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in stream_ids:
                keys = [
                    self.key(sid),
                    self.epoch_key(sid),
                    *(with_lease(sid) if with_lease is not None else ()),
                ]
                pipe.eval(RELEASE_LUA, len(keys), *keys, self.node_id, epochs[sid])
            for key in also_delete:
                pipe.delete(key)
            await pipe.execute()
