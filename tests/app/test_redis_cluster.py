"""Two ``bargein serve`` processes on a real local Redis Cluster (issue 23).

Three primaries with one replica each (tests/redis_cluster.py). Node A
generates; node B serves resumes and cancels of A's streams. A primary killed
mid-stream is replaced by its replica: every reader either completes its
stream exactly (resuming after a retryable error) or ends with an explicit
error, never a silent gap or duplicate. Last, A is SIGKILLed and B continues
its stream exactly. fp32 (the nodes of tests/app/test_multinode.py): a
takeover's continuation equals what the dead node would have generated.
"""

from __future__ import annotations

import asyncio
import json
import signal
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis.cluster import ClusterNode, RedisCluster
from websockets.exceptions import ConnectionClosed

from tests.app.test_multinode import (
    MAX_TOKENS,
    Node,
    Reader,
    contiguous,
    create,
    resume,
    start_node,
    stop_nodes,
    wait_ready,
)
from tests.needs import missing
from tests.redis_cluster import RedisClusterServers, redis_cli_binary
from tests.redis_server import redis_server_binary

pytestmark = [pytest.mark.slow, pytest.mark.redis]


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterServers]:
    if redis_server_binary() is None or redis_cli_binary() is None:
        missing("redis-server and redis-cli are not installed (make test installs them)")
    servers = RedisClusterServers(primaries=3, replicas=1)
    servers.start()
    try:
        yield servers
    finally:
        servers.close()


@pytest.fixture(scope="module")
def nodes(cluster: RedisClusterServers) -> Iterator[dict[str, Node]]:
    with tempfile.TemporaryDirectory(prefix="bargein-cluster-") as log_dir:
        started = {name: start_node(name, cluster.url, log_dir) for name in ("a", "b")}
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


def last_logged_offset(cluster: RedisClusterServers, stream_id: str) -> int:
    """End offset of the newest entry of the stream's log, read through the cluster."""
    seeds = [ClusterNode("127.0.0.1", s.port) for s in cluster.servers if s.ping()]
    with RedisCluster(startup_nodes=seeds) as redis:
        newest = redis.xrevrange(log_key(stream_id), "+", "-", count=1)
    return int(newest[0][0].split(b"-")[0]) if newest else 0


async def test_a_resume_on_another_node_is_byte_for_byte_and_generates_nothing(
    nodes: dict[str, Node], reference: Reader
) -> None:
    a, b = nodes["a"], nodes["b"]
    on_a, created = await create(a.ws_url)
    await on_a.until_end(10)
    generated_on_b = b.engine()["num_generated_tokens"]
    on_b = await resume(b.ws_url, created, 3)
    done_b, done_a = await asyncio.gather(on_b.until_done(), on_a.until_done())
    assert on_a.text == reference.text
    assert contiguous(on_b.deltas, 3)
    assert on_b.end == on_a.end == done_b["end"] == done_a["end"] == reference.end
    assert reference.text.endswith(on_b.text)
    assert b.engine()["num_generated_tokens"] == generated_on_b, "B generated tokens"
    await on_a.ws.close()
    await on_b.ws.close()


async def test_a_cancel_on_another_node_reaches_the_owner_through_sharded_pubsub(
    nodes: dict[str, Node],
) -> None:
    a, b = nodes["a"], nodes["b"]
    on_a, created = await create(a.ws_url)
    await on_a.until_end(5)
    on_b = await resume(b.ws_url, created, on_a.end)
    started = time.monotonic()
    await on_b.ws.send(json.dumps({"type": "response.cancel", "response_id": created["response_id"]}))
    done_b, done_a = await asyncio.gather(on_b.until_done(), on_a.until_done())
    assert done_b["finish_reason"] == done_a["finish_reason"] == "interrupted"
    assert done_b["end"] == done_a["end"] < MAX_TOKENS
    # Through the message, not the renewal tick that would also find the flag.
    assert time.monotonic() - started < 0.4 * 2.0
    stats = a.engine()
    assert stats["num_running"] == 0 and stats["num_free_blocks"] == stats["num_total_blocks"]
    await on_a.ws.close()
    await on_b.ws.close()


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
        await asyncio.sleep(0.3)
        reader = await resume(node_urls[len(errors) % len(node_urls)], created, offset)


async def test_a_primary_killed_mid_stream_loses_nothing_silently(
    nodes: dict[str, Node], reference: Reader, cluster: RedisClusterServers
) -> None:
    a, b = nodes["a"], nodes["b"]
    on_a, created = await create(a.ws_url)
    await on_a.until_end(10)
    on_b = await resume(b.ws_url, created, 0)
    await on_b.until_end(12)
    primary = cluster.primary_of(log_key(created["stream_id"]))
    primary.kill()
    results = await asyncio.gather(
        read_through([a.ws_url, b.ws_url], on_a, created),
        read_through([b.ws_url, a.ws_url], on_b, created),
    )
    cluster.wait_healthy()
    for text, done, errors in results:
        assert text == reference.text, (errors, text, reference.text)
        assert done["end"] == reference.end and done["finish_reason"] == reference.done["finish_reason"]
    assert primary not in cluster.primaries()


async def test_when_the_owner_is_killed_the_resuming_node_continues_the_stream_exactly(
    nodes: dict[str, Node], reference: Reader, cluster: RedisClusterServers
) -> None:
    a, b = nodes["a"], nodes["b"]
    takeovers = b.debug()["cluster"]["takeovers"]
    on_a, created = await create(a.ws_url)
    await on_a.until_end(25)
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(timeout=10)
    seen_end, seen_text = on_a.end, on_a.text
    last_logged = last_logged_offset(cluster, created["stream_id"])
    assert seen_end <= last_logged < reference.end, "A must die mid-answer"
    generated_on_b = b.engine()["num_generated_tokens"]
    on_b = await resume(b.ws_url, created, seen_end)
    done = await on_b.until_done()
    assert seen_text + on_b.text == reference.text
    assert contiguous(on_b.deltas, seen_end)
    assert done["end"] == reference.end and done["finish_reason"] == reference.done["finish_reason"]
    assert b.engine()["num_generated_tokens"] - generated_on_b == reference.end - last_logged
    assert b.debug()["cluster"]["takeovers"] == takeovers + 1
    await on_a.ws.close()
    await on_b.ws.close()
