"""Takeover and forwarded cancels between nodes, on a real redis-server, without a model.

Each node is a :class:`bargein.session.streams.cluster.Cluster` with its own RedisTokenLog;
the service around it is a stand-in that records what the cluster asks of
it (the continuation request it would submit to its engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from redis.asyncio import Redis

from bargein.engine.request import EngineRequest, FinishReason, SamplingParams
from bargein.session.errors import TokenLogUnavailable
from bargein.session.streams.cluster import Cluster
from bargein.session.streams.cluster.lease import LeaseConfig
from bargein.session.streams.log import LogEntry, StreamEnd, StreamInfo, StreamWrite
from bargein.session.streams.log.redis_streams import RedisLogConfig, RedisTokenLog
from tests.waiting import HANG_GUARD_S, wait_until, wait_until_async

pytestmark = pytest.mark.redis

_prefixes = itertools.count()
# Ticks every 0.1 s (takeovers and reader exchanges are seen at once), but a
# lease that outlives any stall of a loaded box: no test waits for one to run
# out on its own. A test that needs a lease gone expires it in Redis itself.
LEASE = LeaseConfig(ttl_s=30.0, renew_every_s=0.1)
PROMPT = (7, 8, 9)


class LetterTokenizer:
    """Token i decodes to one letter (all the detokenizer needs is ``decode``)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)


@dataclass
class Runner:
    tokenizer: Any = field(default_factory=LetterTokenizer)
    submitted: list[EngineRequest] = field(default_factory=list)

    def abort(self, request_id: str, reason: FinishReason) -> None:
        pass


@dataclass
class StandIn:
    """What a Cluster uses of its Service."""

    log: RedisTokenLog
    runner: Runner = field(default_factory=Runner)
    max_model_len: int = 512
    clock: Callable[[], float] = time.monotonic
    continued: list[str] = field(default_factory=list)

    def is_generating(self, stream_id: str) -> bool:
        return stream_id in self.continued

    def abort(self, stream_id: str, reason: FinishReason, requested_at: float) -> None:
        pass

    def cache_salt(self, principal: str) -> str | None:
        return principal

    def continue_stream(self, request: EngineRequest, *, response_id: str, continuation: Any) -> None:
        self.runner.submitted.append(request)
        self.continued.append(request.request_id)


@pytest.fixture
async def deployment(redis_server: str) -> AsyncIterator[Callable[[str], Any]]:
    """``node(name)`` starts a cluster node on a fresh shared key prefix."""
    prefix = f"cluster{next(_prefixes)}:"
    started: list[tuple[Cluster, StandIn]] = []

    async def node(name: str) -> tuple[Cluster, StandIn]:
        log = RedisTokenLog(redis_server, node_id=name, config=RedisLogConfig(key_prefix=prefix))
        cluster = Cluster(redis_server, name, log, key_prefix=prefix, lease=LEASE)
        service = StandIn(log=log)
        await cluster.start(service)
        started.append((cluster, service))
        return cluster, service

    yield node
    for cluster, service in started:
        # Bounded (Cluster.stop is; the log's close is not yet): a redis-py
        # call can miss its cancellation on 3.11 (gh-86296) and hang teardown.
        await cluster.stop()
        await asyncio.wait_for(service.log.close(), timeout=15)


async def dead_stream(node: Callable[[str], Any], sid: str, params: SamplingParams) -> None:
    """Node ``dead`` claims a stream, logs tokens [0, 3), then stops (its lease expires)."""
    cluster, service = await node("dead")
    await cluster.claim(sid, PROMPT, params)
    await service.log.create_stream(
        StreamInfo(
            stream_id=sid,
            response_id=f"resp-{sid}",
            principal="p",
            session_id="s",
            owner_node="dead",
            status="live",
            end=0,
            finish=None,
        )
    )
    await service.log.write_step(
        [
            StreamWrite(
                stream_id=sid, finish=None, entry=LogEntry(start=0, end=3, text="bcd", token_ids=(1, 2, 3))
            )
        ]
    )
    cluster.leases.forget(sid)  # stops renewing: as if killed
    await expire_lease(cluster, sid)  # ... and its TTL ran out


async def expire_lease(cluster: Cluster, sid: str) -> None:
    """The lease of ``sid`` runs out in Redis now (PEXPIRE 1 ms), as it would
    ``ttl_s`` after its last renewal; back once Redis dropped it."""
    key = cluster.leases.key(sid)
    assert await cluster.redis.pexpire(key, 1)

    async def gone() -> bool:
        return not await cluster.redis.exists(key)

    await wait_until_async(gone, f"Redis to drop {key}")


async def test_of_two_nodes_racing_to_continue_a_dead_stream_exactly_one_does(
    deployment: Callable[[str], Any],
) -> None:
    await dead_stream(deployment, "s1", SamplingParams(max_tokens=10, temperature=0))
    (b, on_b), (c, on_c) = await deployment("b"), await deployment("c")
    outcomes = await asyncio.gather(b.follow("s1"), c.follow("s1"))
    requests = on_b.runner.submitted + on_c.runner.submitted
    assert len(requests) == 1, outcomes
    assert requests[0].prompt_token_ids == PROMPT + (1, 2, 3)
    assert requests[0].params.max_tokens == 7 and requests[0].params.temperature == 0
    assert b.num_takeovers + c.num_takeovers == 1
    winner = b if b.num_takeovers else c
    assert await winner.leases.owner("s1") == winner.node_id


async def test_a_cancel_for_a_stream_whose_node_died_ends_it_as_interrupted(
    deployment: Callable[[str], Any],
) -> None:
    await dead_stream(deployment, "s2", SamplingParams(max_tokens=10))
    b, on_b = await deployment("b")
    b.abort_elsewhere("s2", FinishReason.INTERRUPTED)
    end = await asyncio.wait_for(last_event(on_b.log, "s2"), HANG_GUARD_S)
    assert isinstance(end, StreamEnd)
    assert (end.end, end.finish_reason, end.prompt_tokens) == (3, "interrupted", len(PROMPT))
    assert on_b.runner.submitted == []

    async def released() -> bool:
        return await b.leases.owner("s2") is None

    await wait_until_async(
        released, "the lease of the ended stream to be released (at the tick after the end)"
    )


async def test_a_watched_stream_is_taken_over_when_its_lease_expires(
    deployment: Callable[[str], Any],
) -> None:
    dead, on_dead = await deployment("dead")
    await dead.claim("s3", PROMPT, SamplingParams(max_tokens=5))
    await on_dead.log.create_stream(
        StreamInfo(
            stream_id="s3",
            response_id="r3",
            principal="p",
            session_id="s",
            owner_node="dead",
            status="live",
            end=0,
            finish=None,
        )
    )
    b, on_b = await deployment("b")
    checks = count_watch_checks(b)
    await b.follow("s3")  # the owner still renews: nothing to do
    # Counted, not timed: b checks the watched lease at several ticks while the
    # owner's renewals keep resetting it in Redis (each time most of its TTL
    # is spent, a renewal gives it a whole TTL again).
    key, ttl_ms = dead.leases.key("s3"), int(LEASE.ttl_s * 1000)
    for _ in range(3):
        seen = checks[0]
        assert await dead.redis.pexpire(key, ttl_ms // 3)
        await wait_until_async(lambda: _renewed(dead, key, ttl_ms // 3), "the owner to renew its lease")
        # one wholly after PEXPIRE
        await wait_until(lambda seen=seen: checks[0] >= seen + 2, "two more checks of the watched lease")
    assert on_b.runner.submitted == []
    dead.leases.forget("s3")  # the owner dies ...
    await expire_lease(dead, "s3")  # ... and its lease runs out
    await wait_until(lambda: on_b.runner.submitted, "b to take the stream over")
    assert [r.prompt_token_ids for r in on_b.runner.submitted] == [PROMPT]


def count_watch_checks(cluster: Cluster) -> list[int]:
    """How many times ``cluster`` checked its watched streams' leases (at its
    ticks), in a one-item list that the wrapped check updates."""
    checks = [0]
    check = cluster._check_watched

    async def counted() -> None:
        await check()
        checks[0] += 1

    cluster._check_watched = counted  # type: ignore[method-assign]
    return checks


async def _renewed(cluster: Cluster, key: str, below_ms: int) -> bool:
    return await cluster.redis.pttl(key) > below_ms


async def last_event(log: RedisTokenLog, sid: str) -> LogEntry | StreamEnd | None:
    item = None
    with contextlib.suppress(StopAsyncIteration):
        async with contextlib.aclosing(log.read(sid, 0)) as items:
            async for item in items:  # noqa: B007 - the last one is returned
                pass
    return item


async def test_the_generating_node_knows_while_another_node_delivers_its_stream(
    deployment: Callable[[str], Any],
) -> None:
    owner, _ = await deployment("owner")
    reader, _ = await deployment("reader")
    await owner.claim("s4", PROMPT, SamplingParams(max_tokens=5))
    reader.reader_started("s4")
    await wait_until(lambda: owner.read_elsewhere("s4"), "the owner to learn of the reader")
    reader.reader_ended("s4")
    # its key lives three ticks
    await wait_until(lambda: not owner.read_elsewhere("s4"), "the owner to learn the reader left")


async def raw_stream(cluster: Cluster, sid: str) -> tuple[list[Any], dict[bytes, bytes]]:
    """The stream's log entries and metadata hash as Redis holds them."""
    base = cluster.leases.key(sid).removesuffix(":lease")
    return (await cluster.redis.xrange(f"{base}:log"), await cluster.redis.hgetall(f"{base}:meta"))


async def test_a_write_whose_lease_was_taken_after_the_fence_check_is_refused(
    deployment: Callable[[str], Any],
) -> None:
    """The zombie's race: the fence passes, the node stalls, the lease expires and
    another node takes the stream over, then the stalled write reaches Redis."""
    a, on_a = await deployment("a")
    await a.claim("s5", PROMPT, SamplingParams(max_tokens=10))
    await on_a.log.create_stream(
        StreamInfo(
            stream_id="s5",
            response_id="r5",
            principal="p",
            session_id="s",
            owner_node="a",
            status="live",
            end=0,
            finish=None,
        )
    )
    await on_a.log.write_step(
        await a.fence(
            [
                StreamWrite(
                    stream_id="s5",
                    finish=None,
                    entry=LogEntry(start=0, end=3, text="bcd", token_ids=(1, 2, 3)),
                )
            ]
        )
    )
    late = [
        StreamWrite(
            stream_id="s5",
            entry=LogEntry(start=3, end=4, text="e", token_ids=(4,)),
            finish=StreamEnd(
                end=4, finish_reason="length", prompt_tokens=3, completion_tokens=4, cached_tokens=0
            ),
        )
    ]
    assert await a.fence(late) == late  # a's lease is locally valid: the check passes
    # ... and a stalls here: its lease expires in Redis and b takes the stream over.
    await a.redis.delete(a.leases.key("s5"))
    b, _ = await deployment("b")
    assert await b.leases.acquire("s5")
    before = await raw_stream(a, "s5")
    with pytest.raises(TokenLogUnavailable):
        await on_a.log.write_step(late)
    assert await raw_stream(a, "s5") == before, "the stale write reached the stream"
    assert await b.leases.owner("s5") == "b"


async def test_fenced_writes_go_through_after_redis_forgot_the_script(
    deployment: Callable[[str], Any],
) -> None:
    a, on_a = await deployment("a")
    await a.claim("s6", PROMPT, SamplingParams(max_tokens=10))
    await on_a.log.create_stream(
        StreamInfo(
            stream_id="s6",
            response_id="r6",
            principal="p",
            session_id="s",
            owner_node="a",
            status="live",
            end=0,
            finish=None,
        )
    )
    await a.redis.script_flush()  # a restarted Redis knows no scripts
    await on_a.log.write_step(
        [
            StreamWrite(
                stream_id="s6", finish=None, entry=LogEntry(start=0, end=2, text="bc", token_ids=(1, 2))
            )
        ]
    )
    assert [rid for rid, _ in (await raw_stream(a, "s6"))[0]] == [b"2-0"]


# ---- fault injection: the tick and the abort listener (issue 24) --------------------


def crash_once(monkeypatch: pytest.MonkeyPatch, obj: object, name: str) -> list[int]:
    """Make ``obj.name`` (a coroutine method) raise RuntimeError on its first call;
    returns a list that holds one item once it did."""
    real, crashed = getattr(obj, name), []

    async def once(*args: Any, **kwargs: Any) -> Any:
        if not crashed:
            crashed.append(1)
            raise RuntimeError(f"injected: {name} is broken")
        return await real(*args, **kwargs)

    monkeypatch.setattr(obj, name, once)
    return crashed


async def test_a_tick_that_crashes_restarts_and_renews_the_leases(
    deployment: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = await deployment("a")
    await a.claim("s6", PROMPT, SamplingParams(max_tokens=5))
    crashed = crash_once(monkeypatch, a.leases, "renew")
    await wait_until(lambda: crashed, "the renewal to crash")
    key, ttl_ms = a.leases.key("s6"), int(LEASE.ttl_s * 1000)
    assert await a.redis.pexpire(key, ttl_ms // 3)  # only a later tick renews it again
    await wait_until_async(lambda: _renewed(a, key, ttl_ms // 3), "a later tick to renew the lease")
    await wait_until(lambda: not a.health.not_ready(), "the ticks to report healthy")


async def test_a_tick_that_crashes_in_the_readers_exchange_keeps_exchanging(
    deployment: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, _ = await deployment("owner")
    reader, _ = await deployment("reader")
    await owner.claim("s7", PROMPT, SamplingParams(max_tokens=5))
    crashed = crash_once(monkeypatch, reader, "_exchange_readers")
    await wait_until(lambda: crashed, "the readers' exchange to crash")
    reader.reader_started("s7")
    await wait_until(lambda: owner.read_elsewhere("s7"), "the owner to learn of the reader")


async def test_a_tick_that_crashes_in_the_watched_check_still_takes_over(
    deployment: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    await dead_stream(deployment, "s8", SamplingParams(max_tokens=10))
    b, on_b = await deployment("b")
    b._watched.add("s8")  # followed here (follow() would take it over at once)
    crashed = crash_once(monkeypatch, b, "_check_watched")
    await wait_until(lambda: crashed, "the watched check to crash")
    await wait_until(lambda: on_b.runner.submitted, "a later tick's check to continue the stream")


async def test_an_abort_that_fails_to_apply_leaves_the_listener_listening(
    deployment: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A listener that left the channel on such a failure lost the aborts sent
    before it resubscribed: a PUBLISH may still count a closing subscriber,
    so their sender took them as delivered."""
    owner, on_owner = await deployment("owner")
    asker, _ = await deployment("asker")
    await asyncio.wait_for(owner.forwarder.subscribed.wait(), HANG_GUARD_S)
    aborted: list[str] = []
    calls = itertools.count()

    def on_abort(stream_id: str, reason: FinishReason) -> None:
        if next(calls) == 0:
            raise RuntimeError("injected: the service's abort is broken")
        aborted.append(stream_id)

    monkeypatch.setattr(owner.forwarder, "_on_abort", on_abort)
    assert await asker.forwarder.forward("s9", FinishReason.INTERRUPTED, "owner") == 1
    assert await asker.forwarder.forward("s10", FinishReason.INTERRUPTED, "owner") == 1
    await wait_until(lambda: aborted == ["s10"], "the next abort to reach the owner")
    assert "abort of stream s9 failed" in caplog.text
    assert not owner.health.not_ready()


async def test_an_abort_listener_whose_connection_is_killed_resubscribes(
    deployment: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch, redis_server: str
) -> None:
    owner, on_owner = await deployment("owner")
    asker, _ = await deployment("asker")
    await asyncio.wait_for(owner.forwarder.subscribed.wait(), HANG_GUARD_S)
    aborted: list[str] = []
    monkeypatch.setattr(owner.forwarder, "_on_abort", lambda stream_id, reason: aborted.append(stream_id))
    raw = Redis.from_url(redis_server)
    try:
        await raw.client_kill_filter(_type="pubsub")  # the server drops the subscriptions at once
    finally:
        await raw.aclose()
    # resent until the listener is subscribed again (0: nobody got it)
    await wait_until_async(
        lambda: asker.forwarder.forward("s10", FinishReason.INTERRUPTED, "owner"),
        "the abort listener to come back",
        poll_s=0.05,
    )
    await wait_until(lambda: aborted == ["s10"], "the resent abort to reach the owner")
    await wait_until(lambda: not owner.health.not_ready(), "the listener to report healthy")
