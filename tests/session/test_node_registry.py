"""Node ids held on a real redis-server (session/streams/cluster/registry.py): a second
live node with the same id is refused at start; a dead one's id is free again."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from bargein.app.settings import PROCESS_NODE_ID, ServerConfig
from bargein.session.errors import NodeIdInUse
from bargein.session.streams.cluster.registry import NodeRegistry
from tests.waiting import wait_until_async

pytestmark = pytest.mark.redis
_prefixes = itertools.count()


class FakeClock:
    """Monotonic seconds moved by the registry's own (fake) sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
async def redis(redis_server: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server)
    yield client
    await client.aclose()


def registry(redis: Redis, prefix: str, ttl_s: float = 60.0, clock: FakeClock | None = None) -> NodeRegistry:
    clock = clock or FakeClock()
    return NodeRegistry(redis, "0.0.0.0:8000", ttl_s=ttl_s, key_prefix=prefix, clock=clock, sleep=clock.sleep)


async def test_a_second_live_node_with_the_same_id_is_refused(redis: Redis) -> None:
    prefix = f"t{next(_prefixes)}:"
    first = registry(redis, prefix)
    await first.register()
    with pytest.raises(NodeIdInUse, match="'0.0.0.0:8000' is held by another live node"):
        await registry(redis, prefix).register()  # waited 1.5 TTL of fake time: still held
    await first.renew()  # the first keeps its id
    assert await first.hold()


async def test_a_dead_nodes_id_is_taken_once_it_expires_and_a_released_one_at_once(redis: Redis) -> None:
    prefix = f"t{next(_prefixes)}:"
    dead = registry(redis, prefix)
    await dead.register()
    await redis.pexpire(dead.key, 50)  # the dead node's key runs out (Redis's own clock)
    clock = FakeClock()

    async def sleep(seconds: float) -> None:  # and the key runs out on Redis's clock
        clock.now += seconds

        async def expired() -> bool:
            return not await redis.exists(dead.key)

        await wait_until_async(expired, "Redis to expire the dead node's key")

    restarted = NodeRegistry(redis, dead.node_id, ttl_s=60.0, key_prefix=prefix, clock=clock, sleep=sleep)
    await restarted.register()
    await restarted.release()
    await registry(redis, prefix).register()  # a graceful shutdown frees the id at once


def test_the_default_node_id_is_unique_not_host_port() -> None:
    config = ServerConfig(host="0.0.0.0", port=8000)
    assert config.node_name == PROCESS_NODE_ID != "0.0.0.0:8000"
    assert ServerConfig(node_id="n1").node_name == "n1"
