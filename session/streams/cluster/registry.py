"""Node ids held in Redis: two live nodes on one Redis never share one.

Leases, forwarded cancels and readers' keys name nodes by id: two live nodes
with one id (``--node-id`` copied between containers) would each take the
other's streams for its own, and a cancel meant for one would never be
forwarded (it waits for the owner's next lease renewal instead of its next
step). So a node holds ``<prefix>node:<id>`` (value: a random token of this
process, ``PX`` the lease time) while it runs, renews it with its leases and
deletes it on a graceful shutdown. At start, a key held by another token is
waited on for one lease time (a node restarted after a crash finds its old
key, which then expires); one still renewed after that belongs to a live node,
and the start is refused (:class:`~bargein.session.errors.NodeIdInUse`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

from bargein.session.errors import NodeIdInUse
from bargein.session.streams.log.redis_client import AnyRedis

log = logging.getLogger(__name__)

# Take the id if free or ours, renewing it. KEYS[1] the node key; ARGV[1] our token,
# ARGV[2] ttl ms. Returns 1 when held by us afterwards, 0 when another token holds it.
HOLD_LUA = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
# Delete the id's key only while it is ours. KEYS[1] the node key; ARGV[1] our token.
RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def node_key(prefix: str, node_id: str) -> str:
    """The key a live node holds its id under."""
    return f"{prefix}node:{node_id}"


class NodeRegistry:
    """This node's hold on its id (see the module doc).

    Args:
        redis: a redis-py asyncio client.
        node_id: this node's id.
        ttl_s: how long the hold outlives the last renewal (the lease time).
        key_prefix: the token log's key prefix.
        clock: monotonic seconds.
        sleep: awaited between tries at start (tests pass a fake).
    """

    def __init__(
        self,
        redis: AnyRedis,
        node_id: str,
        *,
        ttl_s: float,
        key_prefix: str = "bargein:",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.redis = redis
        self.node_id = node_id
        self.key = node_key(key_prefix, node_id)
        self._token = secrets.token_hex(16)
        self._ttl_ms = int(ttl_s * 1000)
        self._clock = clock
        self._sleep = sleep

    async def hold(self) -> bool:
        """Take or renew the hold; False when another live node holds the id.

        Raises redis errors.
        """
        held = await self.redis.eval(HOLD_LUA, 1, self.key, self._token, self._ttl_ms)
        return bool(held)

    async def register(self) -> None:
        """Hold the id at start, waiting up to one TTL for a dead holder's key to expire.

        Raises:
            NodeIdInUse: the key is still renewed by another node after that.
            RedisError, OSError: Redis fails.
        """
        started = self._clock()
        deadline = started + self._ttl_ms / 1000 * 1.5  # a dead holder's key is gone by then
        while not await self.hold():
            if self._clock() >= deadline:
                raise NodeIdInUse(self.node_id, self._clock() - started)
            log.warning("node id %r is held on Redis: waiting for it to expire (a restart?)", self.node_id)
            await self._sleep(min(0.5, self._ttl_ms / 4000))

    async def renew(self) -> None:
        """Renew the hold (the lease tick); a hold another node took meanwhile is logged.

        Raises redis errors.
        """
        if not await self.hold():
            log.error(
                "node id %r is now held by another node on this Redis: two nodes share it "
                "(cancels between them are slow); give each its own --node-id",
                self.node_id,
            )

    async def release(self) -> None:
        """Give the id up (a graceful shutdown: a restart may take it at once).

        Raises redis errors.
        """
        await self.redis.eval(RELEASE_LUA, 1, self.key, self._token)
