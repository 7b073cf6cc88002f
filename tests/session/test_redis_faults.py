"""RedisTokenLog when redis-server dies, hangs or restarts (each test owns its server)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from bargein.session.errors import TokenLogUnavailable
from bargein.session.streams.cluster import Cluster
from bargein.session.streams.cluster.lease import LeaseConfig
from bargein.session.streams.log.redis_streams import RedisLogConfig, RedisTokenLog
from loadtests.redis_server import RedisServer, redis_server_binary
from tests.needs import missing
from tests.session.log_helpers import Follower, chunks, collect, entry, finish, live_info, write
from tests.waiting import HANG_GUARD_S, wait_until, wait_until_async

pytestmark = pytest.mark.redis

BOUND_S = 1.0  # retry_for_s of the logs under test


@pytest.fixture
def server() -> Iterator[RedisServer]:
    if redis_server_binary() is None:  # skips, or fails in CI (tests/needs.py)
        missing("redis-server is not installed (make test installs Debian's redis-server)")
    own = RedisServer()
    own.start()
    yield own
    own.close()


@pytest.fixture
async def logs(server: RedisServer) -> AsyncIterator[list[RedisTokenLog]]:
    """Two nodes (writer, reader) on the server, with a 1 s retry bound."""
    config = RedisLogConfig(retry_for_s=BOUND_S, socket_timeout_s=0.3, block_ms=500)
    opened = [RedisTokenLog(server.url, node_id=f"node-{i}", config=config) for i in range(2)]
    yield opened
    for log in opened:
        await log.close()


async def wait_ready(log: RedisTokenLog) -> None:
    await wait_until_async(log.ping, "the log to recover after redis came back", poll_s=0.1)


async def test_writes_fail_after_the_bound_then_service_recovers(
    server: RedisServer, logs: list[RedisTokenLog]
) -> None:
    log = logs[0]
    await log.create_stream(live_info("a"))
    await log.write_step([write("a", entry(0, 1))])
    follower = Follower(log.read("a", 0))
    await wait_until(lambda: follower.received, "the reader to follow the stream")
    server.kill()
    started = time.monotonic()
    with pytest.raises(TokenLogUnavailable) as raised:
        await asyncio.wait_for(log.write_step([write("a", entry(1, 2))]), HANG_GUARD_S)
    # Retried for the whole bound (a lower bound: load can only lengthen it) ...
    assert time.monotonic() - started >= BOUND_S
    assert raised.value.stream_ids == ("a",)
    with pytest.raises(TokenLogUnavailable) as told:
        await asyncio.wait_for(follower.task, HANG_GUARD_S)  # its live reader is told, not left waiting
    # ... then given up on a connection failure (not refused by Redis, not closed)
    assert "write_step: redis unreachable" in str(told.value)
    assert not await log.ping()

    server.start()  # same port, empty
    await wait_ready(log)
    xadds = await _xadd_calls(server)
    with pytest.raises(TokenLogUnavailable) as again:  # the broken stream stays broken
        await asyncio.wait_for(log.write_step([write("a", entry(1, 2))]), HANG_GUARD_S)
    # ... at once: refused from the node's own record of broken streams, without
    # a write to Redis (that could be retried, or append after the gap)
    assert again.value.stream_ids == ("a",) and again.value.__cause__ is None
    assert await _xadd_calls(server) == xadds
    await log.create_stream(live_info("b"))
    await log.write_step([write("b", entry(0, 2), finish(2))])
    assert await _xadd_calls(server) > xadds  # the count does see a write that is made
    assert await collect(logs[1].read("b", 0)) == [entry(0, 2), finish(2)]


async def _xadd_calls(server: RedisServer) -> int:
    """XADD commands the server ran since it started (INFO commandstats)."""
    raw = Redis.from_url(server.url)
    try:
        stats = await raw.info("commandstats")
    finally:
        await raw.aclose()
    return int(stats.get("cmdstat_xadd", {}).get("calls", 0))


async def test_a_hang_shorter_than_the_bound_is_absorbed(
    server: RedisServer, logs: list[RedisTokenLog]
) -> None:
    log = RedisTokenLog(server.url, config=RedisLogConfig(retry_for_s=5.0, socket_timeout_s=0.3))
    try:
        await log.create_stream(live_info("a"))
        await log.write_step([write("a", entry(0, 1))])
        server.pause()
        asyncio.get_running_loop().call_later(0.5, server.resume)
        started = time.monotonic()
        # retried until redis answers again (raising would mean the bound passed)
        await asyncio.wait_for(log.write_step([write("a", entry(1, 2))]), HANG_GUARD_S)
        assert time.monotonic() - started >= 0.4  # it did wait out the hang
        await log.write_step([write("a", entry(2, 3), finish(3))])
        assert await collect(logs[1].read("a", 0)) == [*chunks([0, 1, 2, 3]), finish(3)]
    finally:
        await log.close()


async def test_restart_within_the_bound_reports_the_lost_stream(
    server: RedisServer, logs: list[RedisTokenLog]
) -> None:
    log = logs[0]
    await log.create_stream(live_info("a"))
    await log.write_step([write("a", entry(0, 1))])
    server.stop()
    asyncio.get_running_loop().call_later(0.3, server.start)  # back empty: no persistence
    with pytest.raises(TokenLogUnavailable) as raised:
        await log.write_step([write("a", entry(1, 2))])
    assert raised.value.stream_ids == ("a",)
    raw = Redis.from_url(server.url)
    try:
        assert await raw.keys("*{a}*") == []  # the write did not leave a headless stream
    finally:
        await raw.aclose()
    await log.create_stream(live_info("c"))
    await log.write_step([write("c", entry(0, 1), finish(1))])
    assert await collect(log.read("c", 0)) == [entry(0, 1), finish(1)]


async def test_remote_reader_is_told_when_redis_stays_down(
    server: RedisServer, logs: list[RedisTokenLog]
) -> None:
    writer, reader = logs
    await writer.create_stream(live_info("a"))
    await writer.write_step([write("a", entry(0, 1))])
    follower = Follower(reader.read("a", 0))
    await wait_until(
        lambda: follower.received and reader._tailer._subs,
        "the reader to replay, then follow in the tailer's XREAD",
    )
    server.kill()
    started = time.monotonic()
    with pytest.raises(TokenLogUnavailable) as told:
        await asyncio.wait_for(follower.task, HANG_GUARD_S)
    # by the tailer, once Redis stayed unreachable for the bound (a lower bound)
    assert "redis unreachable" in str(told.value)
    assert time.monotonic() - started >= BOUND_S
    server.start()
    await wait_ready(writer)
    await writer.create_stream(live_info("b"))
    tail = asyncio.create_task(collect(reader.read("b", 0)))
    await wait_until(
        lambda: reader._keys.log("b") in reader._tailer._subs, "the new reader to follow in the tailer"
    )
    await writer.write_step([write("b", entry(0, 1), finish(1))])
    assert await asyncio.wait_for(tail, HANG_GUARD_S) == [entry(0, 1), finish(1)]


async def kill_client_connections(server: RedisServer) -> None:
    """``CLIENT KILL TYPE normal`` from a connection of its own: every pooled one dies."""
    admin = Redis.from_url(server.url)
    try:
        assert await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes") > 0
    finally:
        await admin.aclose()


@pytest.mark.parametrize("fault", ["client_kill", "restart"])
async def test_dead_pooled_connections_are_replaced_not_reported(
    server: RedisServer, logs: list[RedisTokenLog], fault: str
) -> None:
    """After Redis drops every client connection, each client's next calls go
    through on fresh connections (retried once), not one failure per dead one."""
    log = logs[0]
    cluster = Cluster(server.url, "node-c", log, lease=LeaseConfig(ttl_s=5.0, renew_every_s=1.0))
    try:
        # Four connections in each pool, all idle when Redis drops them.
        await asyncio.gather(
            *(log.save_session(f"s{i}", b"x") for i in range(4)),
            *(cluster.leases.owner(f"warm{i}") for i in range(4)),
        )
        if fault == "client_kill":
            await kill_client_connections(server)
        else:
            server.restart()  # same port, empty
        for i in range(4):  # as many calls as dead connections: none may fail
            assert await log.ping()
            assert await cluster.leases.acquire(f"lease{i}")
            assert await cluster.leases.owner(f"lease{i}") == "node-c"
            assert await cluster.forwarder.cancel_reason(f"lease{i}") is None
        await log.create_stream(live_info("after"))
        await log.write_step([write("after", entry(0, 2), finish(2))])
        assert await collect(logs[1].read("after", 0)) == [entry(0, 2), finish(2)]
    finally:
        await cluster.redis.aclose()
