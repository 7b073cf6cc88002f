"""Every way a Redis stream can lose entries, against a real redis-server: a
read answers with an explicit error at once, never a gap and never a wait.

The arrangements are what an operator or Redis itself can do to a stream's
two keys (session/streams/log/redis_format.py): ``XTRIM MAXLEN`` to a few entries or
to none, ``XTRIM MINID``, ``XDEL`` of one entry in the middle, the entries
key gone (expired, evicted) while the metadata stays, and the reverse. A
reader on the writing node and one on another node are both checked.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from redis.asyncio import Redis

from bargein.session.errors import StreamNotFound, StreamTruncated
from bargein.session.streams.log import TRUNCATED_CODE, EndError, MemoryTokenLog, StreamEnd, TokenLog
from bargein.session.streams.log.redis_streams import RedisLogConfig, RedisTokenLog
from tests.session.log_helpers import chunks, collect, finish, live_info, write
from tests.waiting import HANG_GUARD_S

pytestmark = pytest.mark.redis

BOUNDS = [0, 2, 4, 6, 8, 10]
_prefixes = itertools.count()

Arrange = Callable[[Redis, str, str], Awaitable[object]]

# name -> (what it does to the log key and the meta key, the error of a read from 0)
ARRANGEMENTS: dict[str, tuple[Arrange, type[StreamNotFound]]] = {
    "xtrim-maxlen-2": (lambda r, log, meta: r.xtrim(log, maxlen=2, approximate=False), StreamTruncated),
    "xtrim-maxlen-0": (lambda r, log, meta: r.xtrim(log, maxlen=0, approximate=False), StreamTruncated),
    "xtrim-minid": (lambda r, log, meta: r.xtrim(log, minid="6-0", approximate=False), StreamTruncated),
    "xdel-middle": (lambda r, log, meta: r.xdel(log, "6-0"), StreamTruncated),
    "entries-expired": (lambda r, log, meta: r.delete(log), StreamTruncated),
    "metadata-expired": (lambda r, log, meta: r.delete(meta), StreamNotFound),
}


@pytest.fixture
async def logs(redis_server: str) -> AsyncIterator[tuple[RedisTokenLog, RedisTokenLog, Redis]]:
    """A writer node, a reader node, and a raw client, on one key prefix."""
    config = RedisLogConfig(key_prefix=f"lost{next(_prefixes)}:", fanout_entries=2, block_ms=500)
    writer = RedisTokenLog(redis_server, node_id="node-a", config=config)
    reader = RedisTokenLog(redis_server, node_id="node-b", config=config)
    raw = Redis.from_url(redis_server)
    yield writer, reader, raw
    await writer.close()
    await reader.close()
    await raw.aclose()


async def read_error(log: TokenLog, sid: str, from_offset: int) -> StreamNotFound:
    try:
        events = await asyncio.wait_for(collect(log.read(sid, from_offset)), HANG_GUARD_S)
    except StreamNotFound as exc:
        return exc
    raise AssertionError(f"read from {from_offset} gave {events} despite the lost entries")


@pytest.mark.parametrize("name", list(ARRANGEMENTS))
async def test_an_ended_stream_that_lost_entries_is_refused_on_every_node(
    name: str, logs: tuple[RedisTokenLog, RedisTokenLog, Redis]
) -> None:
    writer, reader, raw = logs
    arrange, expected = ARRANGEMENTS[name]
    await writer.create_stream(live_info("s"))
    for e in chunks(BOUNDS):
        await writer.write_step([write("s", e)])
    await writer.write_step([write("s", f=finish(10))])
    await arrange(raw, writer._keys.log("s"), writer._keys.meta("s"))
    for log in (writer, reader):
        assert isinstance(await read_error(log, "s", 0), expected)


@pytest.mark.parametrize("name", list(ARRANGEMENTS))
async def test_a_live_stream_that_lost_entries_is_refused_on_another_node(
    name: str, logs: tuple[RedisTokenLog, RedisTokenLog, Redis]
) -> None:
    """A reader that needs a lost offset is refused at once, while the stream
    is still live (no finish to wait for)."""
    writer, reader, raw = logs
    arrange, expected = ARRANGEMENTS[name]
    await writer.create_stream(live_info("s"))
    for e in chunks(BOUNDS):
        await writer.write_step([write("s", e)])
    await arrange(raw, writer._keys.log("s"), writer._keys.meta("s"))
    assert isinstance(await read_error(reader, "s", 0), expected)


async def test_a_stream_ended_for_its_lost_entries_refuses_every_reader(redis_server: str) -> None:
    """The end a takeover writes when it cannot continue a stream (its prefix
    is lost): every reader raises StreamTruncated, from any offset, on both
    backends, never the end itself nor OffsetOutOfRange."""
    lost = StreamEnd(
        end=6,
        finish_reason="error",
        prompt_tokens=7,
        completion_tokens=6,
        cached_tokens=0,
        error=EndError(code=TRUNCATED_CODE, message="lost", retry_after_ms=0),
    )
    assert lost.truncated and not finish(6).truncated
    config = RedisLogConfig(key_prefix=f"lost{next(_prefixes)}:")
    for log in (MemoryTokenLog(), RedisTokenLog(redis_server, node_id="node-a", config=config)):
        try:
            await log.create_stream(live_info("s"))
            for e in chunks([0, 2, 4, 6]):
                await log.write_step([write("s", e)])
            await log.write_step([write("s", f=lost)])
            for from_offset in (0, 4, 6, 9):
                assert isinstance(await read_error(log, "s", from_offset), StreamTruncated)
        finally:
            await log.close()
