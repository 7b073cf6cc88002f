"""RedisTokenLog beyond the contract: round trips, key layout, fan-out, multiplexing, pool health."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError

from bargein.session.errors import StreamTruncated, TokenLogUnavailable
from bargein.session.streams.log import LogEntry, StreamEnd
from bargein.session.streams.log.redis_streams import RedisLogConfig, RedisTokenLog
from tests.session.log_helpers import Follower, chunks, collect, entry, finish, live_info, write
from tests.waiting import HANG_GUARD_S, wait_until, wait_until_async

pytestmark = pytest.mark.redis

_prefixes = itertools.count()
MakeLog = Callable[..., RedisTokenLog]


@pytest.fixture
async def raw(redis_server: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server)
    yield client
    await client.aclose()


@pytest.fixture
async def make_log(redis_server: str) -> AsyncIterator[MakeLog]:
    """Opens logs sharing one fresh key prefix (nodes of one deployment); closes them after."""
    prefix = f"redislog{next(_prefixes)}:"
    opened: list[RedisTokenLog] = []

    def make(node_id: str = "node-a", **config: object) -> RedisTokenLog:
        log = RedisTokenLog(redis_server, node_id=node_id, config=RedisLogConfig(key_prefix=prefix, **config))  # type: ignore[arg-type]
        opened.append(log)
        return log

    yield make
    for log in opened:
        await log.close()


async def blocked_on(reader: RedisTokenLog, raw: Redis, sids: list[str]) -> bool:
    """The reader's tailer follows exactly ``sids`` and its XREAD is blocked in Redis."""
    if set(reader._tailer._subs) != {reader._keys.log(sid) for sid in sids}:
        return False
    clients = await raw.client_list()
    return any(c["cmd"] == "xread" and "b" in c.get("flags", "") for c in clients)


async def command_calls(raw: Redis, command: str) -> int:
    """Calls of one command since the server started (INFO commandstats)."""
    stats = await raw.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_one_step_of_64_streams_is_one_round_trip(
    make_log: MakeLog, raw: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = make_log()
    sids = [f"s{i}" for i in range(64)]
    for sid in sids:
        await log.create_stream(live_info(sid))
    await log.write_step([write(sid, entry(0, 1)) for sid in sids])

    sends = 0
    real_send = AbstractConnection.send_packed_command

    async def counting_send(self: AbstractConnection, *args: object, **kwargs: object) -> None:
        nonlocal sends
        sends += 1
        await real_send(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting_send)
    xadds = await command_calls(raw, "xadd")
    sends = 0
    await log.write_step([write(sid, entry(1, 6)) for sid in sids])  # 5 tokens per stream
    assert sends == 1  # one pipeline for the whole step
    assert await command_calls(raw, "xadd") - xadds == 64  # one XADD per stream, not per token
    sends = 0
    await log.write_step([write(sid, entry(6, 7), finish(7)) for sid in sids])
    assert sends == 1


async def test_keys_share_a_slot_and_expire(make_log: MakeLog, raw: Redis) -> None:
    log = make_log(retention_s=30.0, live_ttl_s=300.0)
    await log.create_stream(live_info("slot-test"))
    await log.write_step([write("slot-test", entry(0, 2))])
    keys = sorted(k.decode() for k in await raw.keys("*{slot-test}*"))
    assert len(keys) == 2 and len({key_slot(k.encode()) for k in keys}) == 1
    assert all(250_000 < ttl <= 300_000 for ttl in [await raw.pttl(k) for k in keys])  # live TTL
    await log.write_step([write("slot-test", f=finish(2))])
    assert all(25_000 < ttl <= 30_000 for ttl in [await raw.pttl(k) for k in keys])  # from the end


async def test_local_readers_are_fed_without_redis_reads(make_log: MakeLog, raw: Redis) -> None:
    log = make_log()
    await log.create_stream(live_info("fan"))
    await log.write_step([write("fan", entry(0, 1))])
    # counted before the readers start: none of their reads, from the first, goes to Redis
    before = [await command_calls(raw, c) for c in ("xrange", "xread", "hgetall")]
    readers = [asyncio.create_task(collect(log.read("fan", 1))) for _ in range(10)]
    for e in chunks(list(range(1, 21))):
        await log.write_step([write("fan", e)])
    await log.write_step([write("fan", f=finish(20))])
    results = await asyncio.wait_for(asyncio.gather(*readers), HANG_GUARD_S)
    assert all(r == [*chunks(list(range(1, 21))), finish(20)] for r in results)
    assert [await command_calls(raw, c) for c in ("xrange", "xread", "hgetall")] == before


async def test_remote_readers_share_one_blocking_read(make_log: MakeLog, raw: Redis) -> None:
    writer, reader = make_log("node-a"), make_log("node-b")
    sids = [f"remote{i}" for i in range(20)]
    for sid in sids:
        await writer.create_stream(live_info(sid))
    tasks = [asyncio.create_task(collect(reader.read(sid, 0))) for sid in sids]

    async def all_wait_on_the_tailer() -> bool:
        return (
            sum(map(len, reader._tailer._subs.values())) == len(sids)
            and (await raw.info("clients"))["blocked_clients"] > 0
        )

    await wait_until_async(all_wait_on_the_tailer, "every reader to replay and wait on the tailer's XREAD")
    clients = await raw.client_list()
    assert sum(1 for c in clients if c["cmd"] == "xread") == 1  # not one per reader
    await writer.write_step([write(sid, entry(0, 3), finish(3)) for sid in sids])
    results = await asyncio.wait_for(asyncio.gather(*tasks), HANG_GUARD_S)
    assert all(r == [entry(0, 3), finish(3)] for r in results)


async def test_remote_reader_joins_a_blocked_read_at_once(make_log: MakeLog, raw: Redis) -> None:
    # XREAD BLOCK past the hang guard: a reader left to wait out the read in
    # progress fails the test, one that joins it gets its entries at once
    writer, reader = make_log("node-a"), make_log("node-b", block_ms=int(2 * HANG_GUARD_S * 1000))
    for sid in ("first", "second"):
        await writer.create_stream(live_info(sid))
    first = asyncio.create_task(collect(reader.read("first", 0)))
    await wait_until_async(lambda: blocked_on(reader, raw, ["first"]), 'the tailer to block on "first" only')
    second = asyncio.create_task(collect(reader.read("second", 0)))
    await wait_until_async(
        lambda: blocked_on(reader, raw, ["first", "second"]), "the tailer to block on both"
    )
    await writer.write_step([write("second", entry(0, 1), finish(1))])
    assert await asyncio.wait_for(second, HANG_GUARD_S) == [entry(0, 1), finish(1)]
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)


async def test_cancelled_readers_leave_the_pool_healthy(make_log: MakeLog) -> None:
    writer, reader = make_log("node-a"), make_log("node-b", replay_batch=16)
    await writer.create_stream(live_info("long"))
    for e in chunks(list(range(0, 2001, 5))):
        await writer.write_step([write("long", e)])
    for sid in ("p0", "p1", "p2"):
        await writer.create_stream(live_info(sid, principal=f"principal-{sid}"))
    rng = random.Random(5)
    for _ in range(40):  # cancel replays and live follows at random points
        task = asyncio.create_task(collect(reader.read("long", rng.randrange(0, 2000))))
        await asyncio.sleep(rng.uniform(0, 0.01))  # a random moment of the read: what is tested
        if task.cancel():
            await asyncio.wait([task], timeout=HANG_GUARD_S)
            assert task.cancelled()  # a cancellation is never swallowed
    infos = await asyncio.gather(*(reader.info(f"p{i % 3}") for i in range(60)))
    assert [i.principal for i in infos if i] == [f"principal-p{i % 3}" for i in range(60)]
    await writer.write_step([write("long", entry(2000, 2001), finish(2001))])
    events = await collect(reader.read("long", 1990))
    assert [e.end for e in events] == [1995, 2000, 2001, 2001]
    assert await reader.ping()


async def test_lost_stream_is_reported_and_cleaned(make_log: MakeLog, raw: Redis) -> None:
    log = make_log()
    for sid in ("kept", "lost"):
        await log.create_stream(live_info(sid))
    await log.write_step([write("kept", entry(0, 1)), write("lost", entry(0, 1))])
    follower = Follower(log.read("lost", 0))
    await wait_until(lambda: follower.received, "the reader to follow the stream")
    await raw.delete(*await raw.keys("*{lost}*"))  # what a restart without persistence does
    with pytest.raises(TokenLogUnavailable) as raised:
        await log.write_step([write("kept", entry(1, 2)), write("lost", entry(1, 2))])
    assert raised.value.stream_ids == ("lost",)
    with pytest.raises(TokenLogUnavailable):
        await asyncio.wait_for(follower.task, HANG_GUARD_S)  # its reader is told, not left waiting
    assert await raw.keys("*{lost}*") == []  # no partial keys left behind
    with pytest.raises(TokenLogUnavailable) as raised:  # the broken stream is refused ...
        await log.write_step([write("lost", entry(2, 3)), write("kept", entry(2, 3), finish(3))])
    assert raised.value.stream_ids == ("lost",)
    assert await collect(log.read("kept", 0)) == [*chunks([0, 1, 2, 3]), finish(3)]  # ... the rest written


async def test_a_resumed_reader_on_another_node_sees_every_token_once(make_log: MakeLog) -> None:
    writer, other = make_log("node-a"), make_log("node-b")
    await writer.create_stream(live_info("resume"))
    received: list[LogEntry | StreamEnd] = []
    bounds = list(range(0, 301, 3))

    async def produce() -> None:
        for e in chunks(bounds):
            await writer.write_step([write("resume", e)])
            await asyncio.sleep(0.001)  # a step's pace: the reader drops and resumes while it writes
        await writer.write_step([write("resume", f=finish(300))])

    producer = asyncio.create_task(produce())
    first = writer.read("resume", 0)
    async for event in first:  # a client on the writing node drops after 40 tokens
        received.append(event)
        if isinstance(event, LogEntry) and event.end >= 40:
            break
    await first.aclose()  # type: ignore[attr-defined]
    last_end = received[-1].end
    received += await collect(other.read("resume", last_end))
    await producer
    ends = [e.end for e in received if isinstance(e, LogEntry)]
    assert ends == bounds[1:] and received[-1] == finish(300)


async def test_a_step_retried_after_a_lost_reply_is_written_once(
    make_log: MakeLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = make_log()
    for sid in ("a", "b"):
        await log.create_stream(live_info(sid))
    await log.write_step([write("a", entry(0, 1)), write("b", entry(0, 1))])
    real_run_step = log._run_step
    calls = 0

    async def reply_lost_once(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        result = await real_run_step(*args)
        if calls == 1:  # the step landed, but its reply never came back
            raise RedisConnectionError("connection reset after the write")
        return result

    monkeypatch.setattr(log, "_run_step", reply_lost_once)
    await log.write_step([write("a", entry(1, 3), finish(3)), write("b", entry(1, 2))])
    assert calls == 2
    assert await collect(log.read("a", 0)) == [entry(0, 1), entry(1, 3), finish(3)]
    other = make_log("node-b")
    await log.write_step([write("b", f=finish(2))])
    assert await collect(other.read("b", 0)) == [entry(0, 1), entry(1, 2), finish(2)]


async def test_an_error_reply_reaches_readers_as_unavailable(make_log: MakeLog, raw: Redis) -> None:
    writer, reader = make_log("node-a"), make_log("node-b")
    for sid in ("clash", "other"):
        await writer.create_stream(live_info(sid))
    follower = asyncio.create_task(collect(reader.read("clash", 0)))
    await wait_until(lambda: reader._tailer._subs, "the reader to wait on the tailer's XREAD")
    log_key = next(k for k in await raw.keys("*{clash}*") if k.endswith(b":meta")).replace(b":meta", b":log")
    await raw.set(log_key, "not a stream")  # another program clobbered the key
    other = asyncio.create_task(collect(reader.read("other", 0)))  # wakes the tailer: its XREAD fails
    with pytest.raises(TokenLogUnavailable):  # the followers are told (all of the node's: which
        await asyncio.wait_for(follower, HANG_GUARD_S)  # key failed is not in the error), none left waiting
    with pytest.raises(TokenLogUnavailable):
        await asyncio.wait_for(other, HANG_GUARD_S)
    with pytest.raises(TokenLogUnavailable):
        await collect(reader.read("clash", 0))


async def test_a_follower_is_told_when_the_log_vanishes_under_it(make_log: MakeLog, raw: Redis) -> None:
    """The entries key deleted (evicted, expired, DEL) while the metadata stays and
    nothing more is written: the follower at the live end gets StreamTruncated
    from the tailer's check after an empty XREAD, instead of waiting for ever."""
    writer, reader = make_log("node-a"), make_log("node-b", block_ms=200)
    await writer.create_stream(live_info("gone"))
    await writer.write_step([write("gone", entry(0, 3))])
    follower = asyncio.create_task(collect(reader.read("gone", 3)))
    await wait_until(lambda: reader._tailer._subs, "the reader to wait on the tailer's XREAD")
    assert not follower.done()
    await raw.delete(reader._keys.log("gone"))
    with pytest.raises(StreamTruncated):
        await asyncio.wait_for(follower, HANG_GUARD_S)  # a hang guard, not a latency bound
    with pytest.raises(StreamTruncated):  # and a new reader is refused at once
        await asyncio.wait_for(collect(reader.read("gone", 3)), HANG_GUARD_S)


async def test_an_ended_stream_whose_log_stops_short_of_its_end_is_truncated(
    make_log: MakeLog, raw: Redis
) -> None:
    writer, reader = make_log("node-a"), make_log("node-b")
    await writer.create_stream(live_info("short"))
    for e in chunks([0, 2, 4, 6]):
        await writer.write_step([write("short", e)])
    await writer.write_step([write("short", f=finish(6))])
    await raw.xdel(reader._keys.log("short"), "6-0", "6-1")  # the meta still says end 6
    with pytest.raises(StreamTruncated) as raised:
        await asyncio.wait_for(collect(reader.read("short", 0)), HANG_GUARD_S)
    assert raised.value.missing_from == 4
    # With nothing missing for it, a reader is served the end the metadata holds.
    assert await collect(reader.read("short", 6)) == [finish(6)]
