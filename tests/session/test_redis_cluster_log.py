"""The token log on a real Redis Cluster with replicas (issue 23): streams on every
shard, read on another node through its per-shard doorbell readers, while a
primary is killed and its replica promoted."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from redis import Redis

from bargein.session.errors import TokenLogError
from bargein.session.streams.log import LogEntry, StreamEnd
from bargein.session.streams.log.redis_streams import RedisLogConfig, RedisTokenLog
from loadtests.redis_cluster import RedisClusterServers, redis_cli_binary
from loadtests.redis_server import RedisServer, redis_server_binary
from tests.needs import missing
from tests.session.log_helpers import chunks, collect, finish, live_info, write
from tests.waiting import HANG_GUARD_S, wait_until, wait_until_async

pytestmark = pytest.mark.redis

STREAMS = 12  # over three shards: each holds some
TOKENS = 60


@pytest.fixture
def cluster() -> Iterator[RedisClusterServers]:
    if redis_server_binary() is None or redis_cli_binary() is None:
        missing("redis-server and redis-cli are not installed (make test installs them)")
    servers = RedisClusterServers(primaries=3, replicas=1)
    servers.start()
    try:
        yield servers
    finally:
        servers.close()


async def test_a_primary_killed_mid_stream_every_reader_completes_exactly_or_hears_an_error(
    cluster: RedisClusterServers,
) -> None:
    config = RedisLogConfig(key_prefix="kill:", block_ms=500)
    writer = RedisTokenLog(cluster.url, node_id="w", config=config)
    reader = RedisTokenLog(cluster.url, node_id="r", config=config)
    sids = [f"s{i}" for i in range(STREAMS)]
    parts = chunks(list(range(TOKENS + 1)))
    victim = cluster.primary_of(writer._keys.log(sids[0]))
    on_victim = [s for s in sids if cluster.primary_of(writer._keys.log(s)) is victim]
    assert len(on_victim) < STREAMS, "every stream on one shard: the test would prove little"
    try:
        for sid in sids:
            await writer.create_stream(live_info(sid))
        readers = {sid: asyncio.create_task(collect(reader.read(sid, 0))) for sid in sids}
        # every reader follows (through its shard's doorbell)
        await wait_until(lambda: len(reader._tailer._subs) == STREAMS, "every reader to follow")
        broken: set[str] = set()
        for i, part in enumerate(parts):
            if i == TOKENS // 3:
                victim.kill()  # its replica takes over in about two seconds
            live = [s for s in sids if s not in broken]
            try:
                await writer.write_step([write(s, part) for s in live])
            except TokenLogError as exc:  # retried past retry_for_s: named, never silent
                broken.update(exc.stream_ids)
        live = [s for s in sids if s not in broken]
        await writer.write_step([write(s, None, finish(TOKENS)) for s in live])
        results = await asyncio.wait_for(
            asyncio.gather(*readers.values(), return_exceptions=True), HANG_GUARD_S
        )
    finally:
        await writer.close()
        await reader.close()
    assert victim not in cluster.primaries()
    for sid, result in zip(readers, results):
        if sid in broken:
            assert isinstance(result, (list, TokenLogError)), result
            continue
        assert not isinstance(result, BaseException), (sid, result)
        entries = [e for e in result if isinstance(e, LogEntry)]
        assert entries == parts, f"{sid}: entries skipped or duplicated"
        assert isinstance(result[-1], StreamEnd) and result[-1].end == TOKENS
    assert not broken & set(sids) - set(on_victim), "streams on healthy shards must not break"


async def test_readiness_needs_every_primary_not_every_replica(cluster: RedisClusterServers) -> None:
    log = RedisTokenLog(cluster.url, node_id="w", config=RedisLogConfig(key_prefix="ping:"))
    primary = cluster.primaries()[0]
    other_replica = next(
        s for s in cluster.servers if s is not primary and replica_of(s) not in (None, primary.port)
    )
    try:
        assert await log.ping()
        other_replica.kill()
        assert await log.ping(), "a dead replica must not make the node unready"
        primary.kill()
        assert not await log.ping(), "a shard without a primary cannot take its streams"
        # its replica is promoted within about two seconds
        await wait_until_async(log.ping, "the node to be ready after the failover", poll_s=0.1)
    finally:
        await log.close()


def replica_of(server: RedisServer) -> int | None:
    """The port of the primary ``server`` replicates, None for a primary."""
    with Redis(port=server.port) as r:
        info = r.info("replication")
    return None if info["role"] == "master" else int(info["master_port"])
