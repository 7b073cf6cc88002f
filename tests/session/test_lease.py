"""Leases and forwarded cancels on a real redis-server (session/streams/cluster/lease.py, forward.py)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection

from bargein.engine.request import FinishReason
from bargein.session.streams.cluster.forward import Forwarder
from bargein.session.streams.cluster.lease import VALID_FRACTION, LeaseConfig, Leases
from tests.waiting import HANG_GUARD_S, wait_until_async

pytestmark = pytest.mark.redis

_prefixes = itertools.count()
# Leases that outlive any stall of a loaded box: no test here waits for one to
# run out on its own. Where expiry is what is tested, the test moves the
# holder's local clock (a fake clock) and Redis's expiry (PEXPIRE) itself.
LONG = LeaseConfig(ttl_s=60.0, renew_every_s=1.0)
TTL_MS = int(LONG.ttl_s * 1000)


class FakeClock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def redis(redis_server: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server)
    yield client
    await client.aclose()


@pytest.fixture
def prefix() -> str:
    return f"lease{next(_prefixes)}:"


async def test_of_nodes_racing_for_a_dead_streams_lease_exactly_one_wins(
    redis_server: str, prefix: str
) -> None:
    clients = [Redis.from_url(redis_server) for _ in range(3)]
    nodes = [Leases(c, f"node-{i}", key_prefix=prefix, config=LONG) for i, c in enumerate(clients)]
    try:
        for round_ in range(50):
            sid = f"dead-{round_}"
            won = await asyncio.gather(*(n.acquire(sid) for n in nodes))
            assert sum(won) == 1, won
            winner = nodes[won.index(True)]
            assert await nodes[0].owner(sid) == winner.node_id
            assert [n.valid(sid) for n in nodes] == won
    finally:
        for client in clients:
            await client.aclose()


async def test_a_lease_not_renewed_expires_and_the_next_node_takes_it(redis: Redis, prefix: str) -> None:
    """No wall-clock waits: the holder's local view runs on a fake clock, and
    the passing of time in Redis is a ``PEXPIRE`` the test sets itself."""
    clock = FakeClock()
    a = Leases(redis, "a", key_prefix=prefix, config=LONG, clock=clock)
    b = Leases(redis, "b", key_prefix=prefix, config=LONG)
    assert await a.acquire("s")
    assert 0 < await redis.pttl(a.key("s")) <= TTL_MS  # taken with an expiry (PX)
    assert not await b.acquire("s")
    for _ in range(5):  # renewed past its TTL (5 x 0.4 TTL): still a's
        clock.now += 0.4 * LONG.ttl_s
        await redis.pexpire(a.key("s"), TTL_MS // 10)  # most of its time in Redis spent
        assert (await a.renew()).lost == ()
        assert await redis.pttl(a.key("s")) > TTL_MS // 2, "renewal reset Redis's expiry"
        assert a.valid("s"), "renewal extended the local view"
    assert not await b.acquire("s")
    # a stops renewing (a dead node). Its local view runs out at VALID_FRACTION
    # of the TTL after its last renewal, while Redis still keeps the lease (the
    # renewal set a full TTL there): the local view runs out first.
    clock.now += VALID_FRACTION * LONG.ttl_s - 0.001
    assert a.valid("s")
    clock.now += 0.002
    assert not a.valid("s"), "the old owner's local view ran out first"
    assert await a.owner("s") == "a" and await redis.pttl(a.key("s")) > 0
    await redis.pexpire(a.key("s"), 1)  # ... and then the lease expires in Redis
    await _until_gone(redis, a.key("s"))
    assert await b.acquire("s")
    renewal = await a.renew()  # a wakes up: it must learn it lost the stream
    assert renewal.lost == ("s",)
    assert not a.holds("s") and await a.owner("s") == "b"


async def _until_gone(redis: Redis, key: str) -> None:
    """Until Redis expired ``key`` (it was given 1 ms)."""

    async def gone() -> bool:
        return not await redis.exists(key)

    await wait_until_async(gone, f"Redis to expire {key}")


async def test_a_vanished_lease_is_taken_back_by_its_holder_on_renewal(redis: Redis, prefix: str) -> None:
    a = Leases(redis, "a", key_prefix=prefix, config=LONG)
    assert await a.acquire("s")
    await redis.delete(a.key("s"))  # e.g. expired while Redis was unreachable
    assert (await a.renew()).lost == ()
    assert await a.owner("s") == "a"


async def test_release_deletes_only_the_holders_lease(redis: Redis, prefix: str) -> None:
    a = Leases(redis, "a", key_prefix=prefix, config=LONG)
    b = Leases(redis, "b", key_prefix=prefix, config=LONG)
    assert await b.acquire("s")
    a._valid_until["s"] = 0.0  # a believes it held it once (stale)
    await a.release(["s"])
    assert await a.owner("s") == "b"
    await b.release(["s"], also_delete=[f"{prefix}other"])
    assert await a.owner("s") is None


async def test_renewal_renews_every_stream_in_one_pipeline_and_reads_flags(
    redis: Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    forwarder = Forwarder(redis, "a", lambda sid, reason: None, key_prefix=prefix)
    a = Leases(redis, "a", key_prefix=prefix, config=LONG, flag_key=forwarder.flag_key)
    for i in range(20):
        assert await a.acquire(f"s{i}")
    await forwarder.forward("s7", FinishReason.INTERRUPTED, owner=None)
    before = await _calls(redis, "eval")
    # Sends to the server, counted on the client: twenty awaited EVALs would
    # run the same twenty EVALs server-side, but as twenty round trips.
    sends = 0
    real_send = AbstractConnection.send_packed_command

    async def counting_send(self: AbstractConnection, *args: Any, **kwargs: Any) -> None:
        nonlocal sends
        sends += 1
        await real_send(self, *args, **kwargs)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting_send)
    renewal = await a.renew()
    monkeypatch.undo()
    assert sends == 1, f"{sends} round trips for one renewal"
    assert await _calls(redis, "eval") - before == 20  # one EVAL per stream, in that one
    assert renewal == type(renewal)(lost=(), flagged=("s7",))
    assert await forwarder.cancel_reason("s7") is FinishReason.INTERRUPTED


async def test_a_cancel_reaches_the_owner_node_through_its_channel(redis_server: str, prefix: str) -> None:
    received: asyncio.Queue[tuple[str, FinishReason]] = asyncio.Queue()
    owner_client, asker_client = Redis.from_url(redis_server), Redis.from_url(redis_server)
    owner = Forwarder(owner_client, "owner", lambda s, r: received.put_nowait((s, r)), key_prefix=prefix)
    asker = Forwarder(asker_client, "asker", lambda s, r: None, key_prefix=prefix)
    await owner.start()
    try:
        await asyncio.wait_for(owner.subscribed.wait(), HANG_GUARD_S)
        assert await asker.forward("s1", FinishReason.INTERRUPTED, "owner") == 1
        assert await asyncio.wait_for(received.get(), HANG_GUARD_S) == ("s1", FinishReason.INTERRUPTED)
        assert await asker.forward("s2", FinishReason.INTERRUPTED, "nobody") == 0
    finally:
        await owner.stop()
        await owner_client.aclose()
        await asker_client.aclose()


async def _calls(redis: Redis, command: str) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_a_new_streams_record_is_written_with_its_lease(redis: Redis, prefix: str) -> None:
    a = Leases(redis, "a", key_prefix=prefix, config=LONG)
    assert await a.acquire("s", set_also=(f"{prefix}record", b"r", 60_000))
    assert await redis.get(f"{prefix}record") == b"r" and await redis.pttl(f"{prefix}record") > 0
    assert not await a.acquire("s", set_also=(f"{prefix}record", b"again", 60_000))


async def test_a_stalled_holder_never_takes_back_a_lease_another_node_held_meanwhile(
    redis: Redis, prefix: str
) -> None:
    a = Leases(redis, "a", key_prefix=prefix, config=LONG)
    b = Leases(redis, "b", key_prefix=prefix, config=LONG)
    assert await a.acquire("s")
    first = a.fence("s")
    await redis.delete(a.key("s"))  # a stalls: its lease expires in Redis
    assert await b.acquire("s")  # b takes the stream over (a newer epoch) ...
    await b.release(["s"])  # ... ends it and lets the lease go
    assert (await a.renew()).lost == ("s",), "a took back a lease b had held"
    assert await a.owner("s") is None and a.fence("s") is None
    assert await b.acquire("s")
    second = b.fence("s")
    assert first is not None and second is not None and second.epoch > first.epoch
    a._valid_until["s"], a._epochs["s"] = 0.0, first.epoch  # a believes it still holds it
    await a.release(["s"], with_lease=lambda sid: [f"{prefix}record"])
    assert await a.owner("s") == "b", "a stale holder deleted the new holder's lease"
