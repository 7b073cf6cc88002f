"""Three ``bargein serve`` processes on Redis deployments beyond one server (issue 23).

Each test runs twice: on a real local Redis Cluster of three primaries with
one replica each (``redis+cluster://``), and on one primary with one replica
behind a Sentinel (``redis+sentinel://``): loadtests/redis_cluster.py. Node A
generates; nodes B and C serve resumes and cancels of A's streams. A primary that
fails mid-stream (killed on the Cluster: its replica is promoted;
``SENTINEL FAILOVER`` on Sentinel) loses nothing silently: every reader
completes its stream exactly, resuming after each retryable error. Last, A is
SIGKILLed and B continues its stream exactly, in the default format (the
nodes of tests/app/test_multinode.py; issue 37): a takeover's continuation
equals what the dead node would have generated.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from redis import Redis
from redis.cluster import ClusterNode, RedisCluster
from websockets.exceptions import ConnectionClosed

from loadtests.redis_cluster import RedisClusterServers, SentinelServers, redis_cli_binary
from loadtests.redis_server import redis_server_binary
from tests.app.test_multinode import (
    MAX_TOKENS,
    Node,
    Reader,
    check_killed_owner_is_continued,
    contiguous,
    create,
    resume,
    start_node,
    stop_nodes,
    wait_ready,
)
from tests.needs import missing
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.redis]


class Deployment:
    """The Redis under test, and how its primary of a key fails."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.servers: RedisClusterServers | SentinelServers = (
            RedisClusterServers(primaries=3, replicas=1)
            if kind == "cluster"
            else SentinelServers(sentinels=1)
        )

    @property
    def url(self) -> str:
        return self.servers.url

    def fail_primary(self, key: str) -> None:
        """The primary holding ``key`` goes: killed (Cluster), or failed over (Sentinel)."""
        if isinstance(self.servers, RedisClusterServers):
            victim = self.servers.primary_of(key)
            victim.kill()
            self.servers.wait_healthy()
            assert victim not in self.servers.primaries()
        else:
            self.servers.failover()

    def client(self) -> Any:
        """A sync client of the primary now."""
        if isinstance(self.servers, RedisClusterServers):
            seeds = [ClusterNode("127.0.0.1", s.port) for s in self.servers.servers if s.ping()]
            return RedisCluster(startup_nodes=seeds)
        for server in (self.servers.primary, self.servers.replica):
            with Redis(port=server.port) as r:
                if r.info("replication")["role"] == "master":
                    return Redis(port=server.port)
        raise RuntimeError("no primary")


@pytest.fixture(scope="module", params=["cluster", "sentinel"])
def deployment(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    if redis_server_binary() is None or redis_cli_binary() is None:
        missing("redis-server and redis-cli are not installed (make test installs them)")
    chosen = Deployment(request.param)
    chosen.servers.start()
    try:
        yield chosen
    finally:
        chosen.servers.close()


@pytest.fixture(scope="module")
def nodes(deployment: Deployment) -> Iterator[dict[str, Node]]:
    with tempfile.TemporaryDirectory(prefix="bargein-scaleout-") as log_dir:
        started = {name: start_node(name, deployment.url, log_dir) for name in ("a", "b", "c")}
        try:
            for node in started.values():
                wait_ready(node)
            yield started
        finally:
            stop_nodes(started.values())


@pytest.fixture(scope="module")
def reference(nodes: dict[str, Node]) -> Reader:
    """The prompt's answer on B, uninterrupted (greedy)."""

    async def answer() -> Reader:
        reader, _ = await create(nodes["b"].ws_url)
        await reader.until_done()
        await reader.ws.close()
        return reader

    reader = asyncio.run(answer())
    assert reader.end > 60, "the reference answer is too short to stop anything mid-answer"
    return reader


def log_key(stream_id: str) -> str:
    return f"bargein:{{{stream_id}}}:log"


def last_logged_offset(deployment: Deployment, stream_id: str) -> int:
    """End offset of the newest entry of the stream's log, read on its primary."""
    with deployment.client() as redis:
        newest = redis.xrevrange(log_key(stream_id), "+", "-", count=1)
    return int(newest[0][0].split(b"-")[0]) if newest else 0


async def test_a_resume_on_another_node_is_byte_for_byte_and_generates_nothing(
    nodes: dict[str, Node], reference: Reader
) -> None:
    a, b, c = nodes["a"], nodes["b"], nodes["c"]
    on_a, created = await create(a.ws_url)
    await on_a.until_end(10)
    generated = {n.name: n.engine()["num_generated_tokens"] for n in (b, c)}
    on_b = await resume(b.ws_url, created, 3)
    on_c = await resume(c.ws_url, created, 0)
    done_b, done_c, done_a = await asyncio.gather(on_b.until_done(), on_c.until_done(), on_a.until_done())
    assert on_a.text == reference.text == on_c.text
    assert contiguous(on_b.deltas, 3) and contiguous(on_c.deltas, 0)
    assert (
        on_b.end == on_c.end == on_a.end == done_b["end"] == done_c["end"] == done_a["end"] == reference.end
    )
    assert reference.text.endswith(on_b.text)
    for node in (b, c):
        assert node.engine()["num_generated_tokens"] == generated[node.name], f"{node.name} generated tokens"
    for reader in (on_a, on_b, on_c):
        await reader.ws.close()


async def test_a_cancel_on_another_node_reaches_the_owner(
    nodes: dict[str, Node], deployment: Deployment
) -> None:
    a, b, c = nodes["a"], nodes["b"], nodes["c"]
    channel = "bargein:node:{a}:abort"
    if isinstance(deployment.servers, RedisClusterServers):  # sharded pub/sub, on the channel's shard
        with Redis(port=deployment.servers.primary_of(channel).port) as shard:
            assert shard.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1] == 1
    on_a, created = await create(a.ws_url)
    await on_a.until_end(5)
    on_b = await resume(b.ws_url, created, on_a.end)
    on_c = await resume(c.ws_url, created, on_a.end)  # the cancel comes from a third node
    await on_c.ws.send(json.dumps({"type": "response.cancel", "response_id": created["response_id"]}))
    done_b, done_c, done_a = await asyncio.gather(on_b.until_done(), on_c.until_done(), on_a.until_done())
    assert done_b["finish_reason"] == done_c["finish_reason"] == done_a["finish_reason"] == "interrupted"
    assert done_b["end"] == done_c["end"] == done_a["end"] < MAX_TOKENS
    stats = a.engine()
    assert stats["num_running"] == 0 and stats["num_free_blocks"] == stats["num_total_blocks"]
    for reader in (on_a, on_b, on_c):
        await reader.ws.close()


async def read_through(
    node_urls: list[str], first: Reader, created: dict[str, Any]
) -> tuple[str, dict[str, Any], list[str]]:
    """Read a stream from 0 to its end through ``first``, resuming on the next node of
    ``node_urls`` after each error (a retryable one, or a dropped socket); returns the
    joined text, the ``response.done`` and the errors seen. Asserts no gap, no duplicate."""
    reader, text, offset, errors = first, "", 0, []
    while True:
        try:
            done: dict[str, Any] | None = await reader.until_done()
        except (AssertionError, ConnectionClosed) as exc:
            errors.append(repr(exc))
            done = None
        assert contiguous(reader.deltas, offset), (offset, reader.deltas[:2])
        text += reader.text
        offset = reader.end if reader.deltas else offset
        if done is not None:
            await reader.ws.close()
            return text, done, errors
        assert len(errors) < 6, errors
        await reader.ws.close()
        await asyncio.sleep(0.3)  # a client's backoff before it resumes: not a wait for a state
        reader = await resume(node_urls[len(errors) % len(node_urls)], created, offset)


async def test_a_primary_failing_mid_stream_loses_nothing_silently(
    nodes: dict[str, Node], reference: Reader, deployment: Deployment
) -> None:
    a, b = nodes["a"], nodes["b"]
    on_a, created = await create(a.ws_url)
    await on_a.until_end(10)
    on_b = await resume(b.ws_url, created, 0)
    await on_b.until_end(12)
    failing = asyncio.create_task(asyncio.to_thread(deployment.fail_primary, log_key(created["stream_id"])))
    results = await asyncio.gather(
        read_through([a.ws_url, b.ws_url], on_a, created),
        read_through([b.ws_url, a.ws_url], on_b, created),
    )
    await failing
    for text, done, errors in results:
        assert text == reference.text, (errors, text, reference.text)
        assert done["end"] == reference.end and done["finish_reason"] == reference.done["finish_reason"]
    if isinstance(deployment.servers, RedisClusterServers):  # both listen for cancels again
        for name in ("a", "b"):
            await subscribed_again(deployment.servers, f"bargein:node:{{{name}}}:abort")


async def subscribed_again(cluster: RedisClusterServers, channel: str) -> None:
    """Until the shard serving ``channel`` has its one sharded subscriber (the hang guard fails the test)."""

    def subscribed() -> bool:
        with Redis(port=cluster.primary_of(channel).port) as shard:
            return bool(shard.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1] == 1)

    await wait_until(subscribed, f"one sharded subscriber of {channel} again", poll_s=0.2)


async def test_when_the_owner_is_killed_the_resuming_node_continues_the_stream_exactly(
    nodes: dict[str, Node], reference: Reader, deployment: Deployment
) -> None:
    await check_killed_owner_is_continued(
        nodes["a"], nodes["b"], reference, lambda stream_id: last_logged_offset(deployment, stream_id)
    )
