"""The token log on Redis deployments beyond one server (issue 23): URLs, Sentinel
failover, replica waits, and entries lost in a failover (never a silent gap)."""

from __future__ import annotations

import asyncio
import itertools
import signal
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis

from bargein.app.settings import ServerConfig
from bargein.session.errors import StreamFenced
from bargein.session.streams.cluster.lease import LeaseConfig, Leases
from bargein.session.streams.log import StreamEnd, open_token_log
from bargein.session.streams.log.durability import LogDurability, parse_durability
from bargein.session.streams.log.redis_streams import RedisLogConfig, RedisTokenLog
from bargein.session.streams.log.redis_url import RedisTarget, parse_redis_url, redact_url
from loadtests.redis_cluster import SentinelServers
from loadtests.redis_server import redis_server_binary
from tests.needs import missing
from tests.session.log_helpers import Follower, chunks, finish, live_info, write
from tests.waiting import HANG_GUARD_S, wait_until

_prefixes = itertools.count()


def test_urls_name_one_server_a_cluster_or_sentinel() -> None:
    assert parse_redis_url("redis://h:1/2") == RedisTarget(kind="single", url="redis://h:1/2")
    cluster = parse_redis_url("rediss+cluster://u:p%40ss@a:7000,b:7001,[::1]:7002/0")
    assert cluster.kind == "cluster" and cluster.tls and cluster.db == 0
    assert cluster.addresses == (("a", 7000), ("b", 7001), ("::1", 7002))
    assert (cluster.username, cluster.password) == ("u", "p@ss")
    sentinel = parse_redis_url("redis+sentinel://s1,s2:26380/mymaster/3")
    assert sentinel.addresses == (("s1", 26379), ("s2", 26380))
    assert (sentinel.master, sentinel.db, sentinel.password) == ("mymaster", 3, None)
    for bad in ("redis+sentinel://s1:26379", "redis+cluster://a:1/1", "redis+cluster://a:x", "http://a"):
        with pytest.raises(ValueError):
            parse_redis_url(bad)


PASSWORD = "s3cr3t-pa55"


@pytest.mark.parametrize(
    "url",
    [
        f"redis+sentinel://:{PASSWORD}@127.0.0.1:26379",  # the master name forgotten
        f"redis+cluster://u:{PASSWORD}@127.0.0.1:6379/3",  # a database on a cluster
        f"redis+cluster://:{PASSWORD}@127.0.0.1:x",  # a bad port
        f"redis+sentinal://:{PASSWORD}@127.0.0.1:26379/mymaster",  # a typo in the scheme
    ],
)
def test_a_refused_url_shows_where_it_is_wrong_but_never_its_password(url: str) -> None:
    with pytest.raises(ValueError) as refused:
        open_token_log(url)
    assert PASSWORD not in str(refused.value) and "[redacted]@127.0.0.1" in str(refused.value)


def test_redacted_urls_keep_all_but_the_password() -> None:
    assert redact_url("redis://user:p@ss@h:1/0?password=x&db=2") == (
        "redis://user:[redacted]@h:1/0?password=[redacted]&db=2"
    )
    assert redact_url("redis://h:1/0") == "redis://h:1/0"
    assert redact_url("redis://user@h:1/0") == "redis://user@h:1/0"
    assert PASSWORD not in repr(parse_redis_url(f"redis+cluster://:{PASSWORD}@a:1"))


def test_durability_choices_parse_and_decide_when_to_wait() -> None:
    assert parse_durability("none") == LogDurability()
    on_end = parse_durability("wait-on-end")
    assert on_end.due(ends_stream=True, since_last_ms=0) and not on_end.due(
        ends_stream=False, since_last_ms=1e9
    )
    every = parse_durability("wait-every-ms:50")
    assert every.due(ends_stream=False, since_last_ms=50) and not every.due(
        ends_stream=False, since_last_ms=49
    )
    assert not LogDurability().due(ends_stream=True, since_last_ms=1e9)
    for bad in ("wait-every-ms", "wait-every-ms:x", "wait-on-end:5", "always"):
        with pytest.raises(ValueError):
            parse_durability(bad)


@pytest.mark.redis
async def test_entries_lost_in_a_failover_are_never_written_over(redis_server: str) -> None:
    """A primary promoted without the last entries a writer logged: the writer's next
    step is refused (StreamFenced: its readers resume), its lease is dropped so a
    reader's node continues at once from what the log holds, and nothing is appended
    past the hole."""
    prefix = f"deploy{next(_prefixes)}:"
    redis = Redis.from_url(redis_server)
    log = RedisTokenLog(redis_server, node_id="w", config=RedisLogConfig(key_prefix=prefix))
    leases = Leases(redis, "w", key_prefix=prefix, config=LeaseConfig(ttl_s=60, renew_every_s=1))
    log.fence_with(leases.fence)
    try:
        await log.create_stream(live_info("s"))
        assert await leases.acquire("s")
        parts = chunks([0, 2, 4, 6])
        for part in parts:
            await log.write_step([write("s", part)])
        # What an asynchronous replica may miss: the newest entry.
        await redis.xdel(f"{prefix}{{s}}:log", "6-0")
        with pytest.raises(StreamFenced):
            await log.write_step([write("s", chunks([6, 8])[0])])
        assert await redis.get(leases.key("s")) is None, "the lease must go at once"
        newest = await redis.xrevrange(f"{prefix}{{s}}:log", "+", "-", count=1)
        assert newest[0][0] == b"4-0", "nothing may be written past the hole"
    finally:
        await log.close()
        await redis.aclose()


@pytest.fixture
def sentinel() -> Iterator[SentinelServers]:
    if redis_server_binary() is None:
        missing("redis-server is not installed (make test installs Debian's redis-server)")
    servers = SentinelServers(sentinels=1)
    servers.start()
    try:
        yield servers
    finally:
        servers.close()


@pytest.mark.redis
async def test_on_sentinel_a_failover_mid_stream_loses_nothing_and_waits_see_the_replica(
    sentinel: SentinelServers,
) -> None:
    config = RedisLogConfig(key_prefix="sentinel:", durability=LogDurability(mode="wait-on-end"))
    writer = RedisTokenLog(sentinel.url, node_id="w", config=config)
    reader = RedisTokenLog(sentinel.url, node_id="r", config=config)
    try:
        for sid in ("s", "t", "u"):
            await writer.create_stream(live_info(sid))
        await writer.write_step([write("u", None, finish(0))])
        assert writer.num_unreplicated == 0, "the end was acknowledged by the replica"
        parts = chunks(list(range(0, 81, 2)))
        for part in parts[:10]:
            await writer.write_step([write("s", part)])
        reading = Follower(reader.read("s", 0))
        await wait_until(lambda: len(reading.received) == 10, "the reader to replay the first ten steps")
        # The replica becomes primary, the old primary its replica, while the stream is
        # written and read: writes are retried until the pools reach the new primary.
        failing_over = asyncio.create_task(asyncio.to_thread(sentinel.failover))
        for part in parts[10:]:
            await writer.write_step([write("s", part)])
            await asyncio.sleep(0.05)  # the steps' pace spreads them over the failover: what is tested
        await failing_over
        await writer.write_step([write("s", None, finish(80))])
        events = await asyncio.wait_for(reading.task, HANG_GUARD_S)
        assert events[:-1] == parts and isinstance(events[-1], StreamEnd) and events[-1].end == 80
        # With the replica stopped, WAIT times out: counted, and the write still stands.
        unreplicated = writer.num_unreplicated
        old_primary = sentinel.primary
        assert old_primary._proc is not None
        old_primary._proc.send_signal(signal.SIGSTOP)
        try:
            await writer.write_step([write("t", None, finish(0))])
        finally:
            old_primary._proc.send_signal(signal.SIGCONT)
        assert writer.num_unreplicated == unreplicated + 1
        info = await reader.info("t")
        assert info is not None and info.status == "complete"
    finally:
        await writer.close()
        await reader.close()


def test_a_bad_durability_is_refused_at_startup() -> None:
    assert ServerConfig(token_log_durability="wait-every-ms:20").token_log_durability == "wait-every-ms:20"
    with pytest.raises(ValueError):
        ServerConfig(token_log_durability="wait-sometimes")
