"""One contract suite for every TokenLog backend (memory, and Redis on a real redis-server)."""

from __future__ import annotations

import asyncio
import itertools
from bisect import bisect_right
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import replace

import pytest
from redis import Redis as SyncRedis

from bargein.session.errors import (
    OffsetOutOfRange,
    StreamEnded,
    StreamExists,
    StreamNotFound,
    StreamTruncated,
)
from bargein.session.streams.cluster.lease import epoch_key, lease_key
from bargein.session.streams.log import (
    EndError,
    LogEntry,
    MemoryTokenLog,
    StreamEnd,
    StreamInfo,
    StreamWrite,
    TokenLog,
)
from bargein.session.streams.log.fence import Fence
from bargein.session.streams.log.redis_client import open_client
from bargein.session.streams.log.redis_streams import RedisLogConfig, RedisTokenLog
from tests.session.log_helpers import (
    FakeClock,
    Follower,
    chunks,
    collect,
    entry,
    finish,
    live_info,
    write,
)
from tests.waiting import HANG_GUARD_S, wait_until


class Backend:
    """Opens logs of one backend and lets time pass for its retention."""

    def __init__(self) -> None:
        self.clock = FakeClock()

    def open(self, retention_s: float) -> TokenLog:
        return MemoryTokenLog(retention_s=retention_s, clock=self.clock)

    async def elapse(self, seconds: float) -> None:
        self.clock.advance(seconds)

    async def lose(self, log: TokenLog, stream_id: str, below: int | None) -> None:
        """What an operator's trim or an eviction does: drop the stream's entries
        ending at or before ``below`` (None: every entry), keeping its metadata."""
        assert isinstance(log, MemoryTokenLog)
        stream = log._streams[stream_id]
        num_lost = len(stream.ends) if below is None else bisect_right(stream.ends, below)
        del stream.entries[:num_lost], stream.ends[:num_lost]


class TwoNodes:
    """A TokenLog whose writes go to one node and reads to another (Redis readers elsewhere)."""

    def __init__(self, writer: RedisTokenLog, reader: RedisTokenLog) -> None:
        self.writer, self.reader = writer, reader

    async def create_stream(self, info: StreamInfo) -> None:
        await self.writer.create_stream(info)

    async def write_step(self, writes: Sequence[StreamWrite]) -> None:
        await self.writer.write_step(writes)

    async def info(self, stream_id: str) -> StreamInfo | None:
        return await self.reader.info(stream_id)

    def read(self, stream_id: str, from_offset: int) -> AsyncGenerator[LogEntry | StreamEnd, None]:
        return self.reader.read(stream_id, from_offset)

    async def save_session(self, session_id: str, state: bytes) -> None:
        await self.writer.save_session(session_id, state)

    async def load_session(self, session_id: str) -> bytes | None:
        return await self.reader.load_session(session_id)

    async def ping(self) -> bool:
        return await self.writer.ping() and await self.reader.ping()

    async def close(self) -> None:
        await self.writer.close()
        await self.reader.close()


_prefixes = itertools.count()


class FencedPerStream(TwoNodes):
    """A writer fenced per stream by the keys a node's lease uses (one hash slot with
    the stream's: what a Redis Cluster needs), each stream's epoch set when it is created."""

    def __init__(self, writer: RedisTokenLog, reader: RedisTokenLog, prefix: str) -> None:
        super().__init__(writer, reader)
        self._prefix = prefix
        writer.fence_with(
            lambda sid: Fence(
                lease_key=lease_key(prefix, sid), epoch_key=epoch_key(prefix, sid), node_id="node-a", epoch=1
            )
        )

    async def create_stream(self, info: StreamInfo) -> None:
        await self.writer._redis.set(epoch_key(self._prefix, info.stream_id), 1)
        await self.writer.create_stream(info)


class RedisBackend(Backend):
    """Real redis-server (or Redis Cluster); each log gets its own key prefix.
    ``two_nodes``: read from a second node; ``fenced``: write through the fence."""

    def __init__(self, url: str, *, two_nodes: bool, fenced: bool = False) -> None:
        super().__init__()
        self.url, self.two_nodes, self.fenced = url, two_nodes, fenced
        self._opened: list[str] = []  # the key prefixes of the logs opened

    def open(self, retention_s: float) -> TokenLog:
        # A 2-entry fan-out tail makes local readers fall back to Redis replays too.
        prefix = f"contract{next(_prefixes)}:"
        self._opened.append(prefix)
        config = RedisLogConfig(retention_s=retention_s, key_prefix=prefix, fanout_entries=2)
        writer = RedisTokenLog(self.url, node_id="node-a", config=config)
        if self.url.startswith("redis+cluster://"):
            reader = RedisTokenLog(self.url, node_id="node-b", config=config)
            return FencedPerStream(writer, reader, prefix) if self.fenced else TwoNodes(writer, reader)
        if self.fenced:  # every write through the fencing script, under an epoch that holds
            with SyncRedis.from_url(self.url) as redis:
                redis.set(f"{prefix}epoch", 1)
            fence = Fence(lease_key=f"{prefix}lease", epoch_key=f"{prefix}epoch", node_id="node-a", epoch=1)
            writer.fence_with(lambda sid: fence)
        if not self.two_nodes:
            return writer
        return TwoNodes(writer, RedisTokenLog(self.url, node_id="node-b", config=config))

    async def elapse(self, seconds: float) -> None:
        """Time passes for Redis's expiries, without waiting: every key of the
        logs opened here with a TTL has it shortened by ``seconds``, and is gone
        if it had less left. (A real wait would let a stall of a loaded box
        expire a key before the test read it.)"""
        shift_ms = int(seconds * 1000)
        async with open_client(self.url) as redis:
            for prefix in self._opened:
                async for key in redis.scan_iter(match=f"{prefix}*"):
                    left_ms = await redis.pttl(key)
                    if left_ms < 0:  # no expiry (-1), or gone meanwhile (-2)
                        continue
                    if left_ms <= shift_ms:
                        await redis.delete(key)
                    else:
                        await redis.pexpire(key, left_ms - shift_ms)

    async def lose(self, log: TokenLog, stream_id: str, below: int | None) -> None:
        # XTRIM MINID keeps ids >= <below>-1: the finish at <below>-1, and every later entry.
        writer = log.writer if isinstance(log, TwoNodes) else log
        assert isinstance(writer, RedisTokenLog)
        key = writer._keys.log(stream_id)
        if below is None:
            await writer._redis.delete(key)
        else:
            await writer._redis.xtrim(key, minid=f"{below}-1", approximate=False)


BACKENDS: dict[str, Callable[[pytest.FixtureRequest], Backend]] = {
    "memory": lambda request: Backend(),
    "redis": lambda request: RedisBackend(request.getfixturevalue("redis_server"), two_nodes=False),
    "redis-2nodes": lambda request: RedisBackend(request.getfixturevalue("redis_server"), two_nodes=True),
    "redis-fenced": lambda request: RedisBackend(
        request.getfixturevalue("redis_server"), two_nodes=True, fenced=True
    ),
    "redis-cluster": lambda request: RedisBackend(request.getfixturevalue("redis_cluster"), two_nodes=True),
    "redis-cluster-fenced": lambda request: RedisBackend(
        request.getfixturevalue("redis_cluster"), two_nodes=True, fenced=True
    ),
}


@pytest.fixture(
    params=[pytest.param(name, marks=[pytest.mark.redis] if name != "memory" else []) for name in BACKENDS]
)
def backend(request: pytest.FixtureRequest) -> Backend:
    return BACKENDS[request.param](request)


@pytest.fixture
async def log(backend: Backend) -> AsyncIterator[TokenLog]:
    token_log = backend.open(retention_s=600)
    yield token_log
    await token_log.close()


async def write_stream(log: TokenLog, sid: str, bounds: list[int], reason: str = "stop") -> None:
    """Create a stream and write it to the end, one entry per step."""
    await log.create_stream(live_info(sid))
    for e in chunks(bounds):
        await log.write_step([write(sid, e)])
    await log.write_step([write(sid, f=finish(bounds[-1], reason))])


async def test_create_then_info_is_live_at_zero(log: TokenLog) -> None:
    await log.create_stream(live_info("s1", principal="bob", node="n7"))
    info = await log.info("s1")
    assert info is not None
    assert (info.status, info.end, info.finish) == ("live", 0, None)
    assert (info.principal, info.owner_node, info.response_id, info.session_id) == (
        "bob",
        "n7",
        "resp-s1",
        "sess-s1",
    )
    with pytest.raises(StreamExists):
        await log.create_stream(live_info("s1"))


async def test_a_stream_keeps_how_its_answer_is_read_for_calls(log: TokenLog) -> None:
    await log.create_stream(replace(live_info("s1"), tool_mode="forced"))
    await log.create_stream(live_info("s2"))
    await log.write_step([write("s1", f=finish(0, "stop"))])
    first, second = await log.info("s1"), await log.info("s2")
    assert first is not None and first.tool_mode == "forced" and first.status == "complete"
    assert second is not None and second.tool_mode is None


async def test_full_read_returns_entries_then_end(log: TokenLog) -> None:
    await write_stream(log, "s1", [0, 1, 4, 5], reason="length")
    assert await collect(log.read("s1", 0)) == [*chunks([0, 1, 4, 5]), finish(5, "length")]
    info = await log.info("s1")
    assert info is not None
    assert (info.status, info.end, info.finish) == ("complete", 5, finish(5, "length"))


@pytest.mark.parametrize(
    ("from_offset", "first_start"),
    [(0, 0), (1, 1), (2, 1), (3, 1), (4, 4), (5, None)],
    ids=["zero", "boundary", "inside", "inside-last", "last-entry", "at-end"],
)
async def test_replay_from_offset(log: TokenLog, from_offset: int, first_start: int | None) -> None:
    await write_stream(log, "s1", [0, 1, 4, 5])
    events = await collect(log.read("s1", from_offset))
    assert events[-1] == finish(5)
    entries = [e for e in events if isinstance(e, LogEntry)]
    expected = [e for e in chunks([0, 1, 4, 5]) if e.end > from_offset]
    assert entries == expected
    assert (entries[0].start if entries else None) == first_start


async def test_from_past_final_end_is_out_of_range(log: TokenLog) -> None:
    await write_stream(log, "s1", [0, 3])
    with pytest.raises(OffsetOutOfRange) as raised:
        await collect(log.read("s1", 4))
    assert isinstance(raised.value, StreamNotFound)
    assert raised.value.end == 3


async def test_zero_token_stream_yields_only_end(log: TokenLog) -> None:
    await log.create_stream(live_info("s0"))
    await log.write_step([write("s0", f=finish(0, "interrupted"))])
    assert await collect(log.read("s0", 0)) == [finish(0, "interrupted")]


async def test_an_end_error_reaches_every_reader(log: TokenLog) -> None:
    # A request dropped from the queue at its deadline: a reader on any node
    # (a replay, a late info) must relay the same overloaded error.
    await log.create_stream(live_info("s0"))
    error = EndError(code="overloaded", message="no first token within 1.5 s", retry_after_ms=2400)
    end = replace(finish(0, "cancelled"), error=error)
    await log.write_step([write("s0", f=end)])
    assert await collect(log.read("s0", 0)) == [end]
    info = await log.info("s0")
    assert info is not None and info.finish == end
    # after tokens too (a finish written in the step of its last entry)
    await log.create_stream(live_info("s1"))
    late = replace(finish(2, "cancelled"), error=error)
    await log.write_step([write("s1", entry(0, 2), late)])
    assert await collect(log.read("s1", 1)) == [entry(0, 2), late]
    # an ordinary finish has none
    await log.create_stream(live_info("s2"))
    await log.write_step([write("s2", entry(0, 2), finish(2))])
    info = await log.info("s2")
    assert info is not None and info.finish is not None and info.finish.error is None


async def test_live_follow_gets_each_step_as_written(log: TokenLog) -> None:
    await log.create_stream(live_info("s1"))
    received: list[LogEntry | StreamEnd] = []
    arrived = asyncio.Event()

    async def follow() -> None:
        async for event in log.read("s1", 0):
            received.append(event)
            arrived.set()

    reader = asyncio.create_task(follow())
    for e in chunks([0, 2, 3, 6]):
        arrived.clear()
        await log.write_step([write("s1", e)])
        await asyncio.wait_for(arrived.wait(), HANG_GUARD_S)
        assert received[-1] == e  # delivered before the next step is written
    await log.write_step([write("s1", f=finish(6))])
    await asyncio.wait_for(reader, HANG_GUARD_S)
    assert received == [*chunks([0, 2, 3, 6]), finish(6)]


async def test_concurrent_readers_at_different_offsets(log: TokenLog) -> None:
    await log.create_stream(live_info("s1"))
    await log.write_step([write("s1", entry(0, 3))])
    offsets = [0, 2, 3, 5, 3, 0]
    readers = [Follower(log.read("s1", o)) for o in offsets]
    # the readers behind the end replayed it; those at or past it (no replay) started before them
    await wait_until(
        lambda: all(r.received for r, o in zip(readers, offsets) if o < 3),
        "the readers behind the end to replay",
    )
    for e in chunks([3, 5, 8]):
        await log.write_step([write("s1", e)])
    await log.write_step([write("s1", f=finish(8))])
    results = await asyncio.wait_for(asyncio.gather(*(r.task for r in readers)), HANG_GUARD_S)
    everything = [*chunks([0, 3, 5, 8]), finish(8)]
    for offset, events in zip(offsets, results):
        assert events == [e for e in everything if isinstance(e, StreamEnd) or e.end > offset]


async def test_one_step_writes_many_streams_entry_and_finish(log: TokenLog) -> None:
    for sid in ("a", "b", "c"):
        await log.create_stream(live_info(sid))
    await log.write_step([write("a", entry(0, 1)), write("b", entry(0, 2)), write("c", entry(0, 1))])
    await log.write_step(
        [
            write("a", entry(1, 2), finish(2)),
            write("b", f=finish(2, "interrupted")),
            write("c", entry(1, 2)),
            write("c", entry(2, 3), finish(3, "length")),
        ]
    )
    assert await collect(log.read("a", 0)) == [*chunks([0, 1, 2]), finish(2)]
    assert await collect(log.read("b", 0)) == [entry(0, 2), finish(2, "interrupted")]
    assert await collect(log.read("c", 1)) == [*chunks([1, 2, 3]), finish(3, "length")]


async def test_unknown_stream_is_not_found(log: TokenLog) -> None:
    assert await log.info("nope") is None
    with pytest.raises(StreamNotFound):
        await collect(log.read("nope", 0))
    with pytest.raises(StreamNotFound):
        await log.write_step([write("nope", entry(0, 1))])


async def test_bad_step_writes_nothing(log: TokenLog) -> None:
    await log.create_stream(live_info("a"))
    await log.create_stream(live_info("b"))
    bad_steps = [
        [write("a", entry(0, 1)), write("b", entry(1, 2))],  # gap in b
        [write("a", entry(0, 1)), write("b", entry(0, 0))],  # empty entry
        [write("a", entry(0, 2), finish(3))],  # finish end != stream end
        [write("a")],  # neither entry nor finish
    ]
    for step in bad_steps:
        with pytest.raises(ValueError):
            await log.write_step(step)
    info = await log.info("a")
    assert info is not None and info.end == 0
    await log.write_step([write("a", entry(0, 1))])
    assert (await log.info("a")).end == 1  # type: ignore[union-attr]


async def test_write_after_finish_raises(log: TokenLog) -> None:
    await write_stream(log, "s1", [0, 1])
    with pytest.raises(StreamEnded):
        await log.write_step([write("s1", entry(1, 2))])


async def test_from_past_live_end_waits_then_reads(log: TokenLog) -> None:
    await log.create_stream(live_info("s1"))
    reader = asyncio.create_task(collect(log.read("s1", 3)))
    probe = Follower(log.read("s1", 0))  # started after the reader, woken by the same writes
    await log.write_step([write("s1", entry(0, 2))])
    await wait_until(lambda: probe.received == [entry(0, 2)], "a reader from 0 to get the write")
    assert not reader.done()
    await log.write_step([write("s1", entry(2, 5))])
    await log.write_step([write("s1", f=finish(5))])
    assert await asyncio.wait_for(reader, HANG_GUARD_S) == [entry(2, 5), finish(5)]


async def test_live_stream_ending_before_from_is_out_of_range(log: TokenLog) -> None:
    await log.create_stream(live_info("s1"))
    reader = asyncio.create_task(collect(log.read("s1", 9)))
    probe = Follower(log.read("s1", 0))  # started after the reader, woken by the same writes
    await log.write_step([write("s1", entry(0, 1))])
    await wait_until(lambda: probe.received, "a reader from 0 to get the first write")
    assert not reader.done()  # it waits: the stream is live
    await log.write_step([write("s1", entry(1, 2), finish(2))])
    with pytest.raises(OffsetOutOfRange):
        await asyncio.wait_for(reader, HANG_GUARD_S)


async def test_text_and_ids_round_trip(log: TokenLog) -> None:
    e = LogEntry(start=0, end=3, text='héllo 🌍 \x00 "quoted"\n', token_ids=(0, 151_936, 2**31 - 1))
    await log.create_stream(live_info("s1"))
    await log.write_step([write("s1", e, finish(3))])
    assert await collect(log.read("s1", 0)) == [e, finish(3)]


async def test_cancelled_reader_leaves_log_usable(log: TokenLog) -> None:
    await log.create_stream(live_info("s1"))
    await log.write_step([write("s1", entry(0, 1))])
    followers = [Follower(log.read("s1", 0)) for _ in range(5)]
    await wait_until(lambda: all(f.received for f in followers), "the readers to read and wait for more")
    for follower in followers:
        follower.task.cancel()
    await asyncio.gather(*(f.task for f in followers), return_exceptions=True)
    await log.write_step([write("s1", entry(1, 2), finish(2))])
    assert await collect(log.read("s1", 0)) == [*chunks([0, 1, 2]), finish(2)]
    assert await log.ping()


async def test_reader_closed_early_leaves_log_usable(log: TokenLog) -> None:
    await write_stream(log, "s1", [0, 1, 2, 3])
    async with aclosing(log.read("s1", 0)) as events:
        async for _ in events:
            break
    assert len(await collect(log.read("s1", 0))) == 4


# Longer than any stall of a loaded box: the tests move time on with ``elapse``
# (a fake clock for the memory log, shortened TTLs for Redis), never by waiting.
RETENTION_S = 60.0


async def test_ended_stream_expires_after_retention(backend: Backend) -> None:
    log = backend.open(retention_s=RETENTION_S)
    try:
        await log.create_stream(live_info("done"))
        await log.create_stream(live_info("live"))
        await log.write_step([write("done", entry(0, 1), finish(1)), write("live", entry(0, 1))])
        await backend.elapse(0.3 * RETENTION_S)
        assert await collect(log.read("done", 0)) == [entry(0, 1), finish(1)]
        await backend.elapse(1.2 * RETENTION_S)
        assert await log.info("done") is None
        with pytest.raises(StreamNotFound):
            await collect(log.read("done", 0))
        live = await log.info("live")  # a live stream is kept past the retention
        assert live is not None and live.end == 1
    finally:
        await log.close()


async def test_sessions_saved_loaded_and_expire(backend: Backend) -> None:
    log = backend.open(retention_s=RETENTION_S)
    try:
        assert await log.load_session("x") is None
        await log.save_session("x", b"\x00state-1\xff")
        await log.save_session("x", b"\x00state-2\xff")
        assert await log.load_session("x") == b"\x00state-2\xff"
        await backend.elapse(1.5 * RETENTION_S)
        assert await log.load_session("x") is None
    finally:
        await log.close()


# ---- a log that lost entries (trimmed, evicted, expired) --------------------------


async def read_error(log: TokenLog, sid: str, from_offset: int) -> BaseException:
    """The error a read from ``from_offset`` ends with (none at all fails the test)."""
    try:
        events = await asyncio.wait_for(collect(log.read(sid, from_offset)), HANG_GUARD_S)
    except StreamNotFound as exc:
        return exc
    raise AssertionError(f"read from {from_offset} gave {events} despite the lost entries")


async def test_lost_head_of_an_ended_stream_is_truncated_never_skipped(
    backend: Backend, log: TokenLog
) -> None:
    await write_stream(log, "s1", [0, 2, 4, 6, 8])
    await backend.lose(log, "s1", 4)  # [0, 2) and [2, 4) are gone
    for from_offset in (0, 2, 3):
        error = await read_error(log, "s1", from_offset)
        assert isinstance(error, StreamTruncated)
        assert (error.missing_from, error.missing_to) == (from_offset, 4)
    # A reader that needs nothing of what was lost is served.
    assert await collect(log.read("s1", 4)) == [*chunks([4, 6, 8]), finish(8)]


async def test_ended_stream_whose_entries_are_all_gone_is_truncated(backend: Backend, log: TokenLog) -> None:
    await write_stream(log, "s1", [0, 3, 5])
    await backend.lose(log, "s1", None)  # the metadata still says it ended at 5
    for from_offset in (0, 4):
        error = await read_error(log, "s1", from_offset)
        assert isinstance(error, StreamTruncated) and error.missing_from == from_offset
    assert await collect(log.read("s1", 5)) == [finish(5)]  # nothing was needed


async def test_live_stream_that_lost_entries_is_truncated_not_waited_on(
    backend: Backend, log: TokenLog
) -> None:
    await log.create_stream(live_info("head"))
    await log.create_stream(live_info("all"))
    for e in chunks([0, 2, 4, 6]):
        await log.write_step([write("head", e), write("all", e)])
    await backend.lose(log, "head", 4)
    await backend.lose(log, "all", None)  # the entries key is gone, the metadata says live
    head = await read_error(log, "head", 0)
    assert isinstance(head, StreamTruncated) and (head.missing_from, head.missing_to) == (0, 4)
    assert isinstance(await read_error(log, "all", 0), StreamTruncated)
