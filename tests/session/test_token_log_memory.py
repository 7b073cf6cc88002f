"""MemoryTokenLog specifics (live TTL, the expiry heap, close) and the open_token_log factory."""

from __future__ import annotations

import asyncio

import pytest

from bargein.session.errors import StreamNotFound, TokenLogUnavailable
from bargein.session.streams.log import MemoryTokenLog, open_token_log
from bargein.session.streams.log.redis_streams import RedisTokenLog
from tests.session.log_helpers import (
    FakeClock,
    collect,
    entry,
    finish,
    live_info,
    write,
)
from tests.waiting import HANG_GUARD_S


async def test_a_stream_that_never_ends_is_dropped_after_its_live_ttl() -> None:
    clock = FakeClock()
    log = MemoryTokenLog(retention_s=10, live_ttl_s=100, clock=clock)
    await log.create_stream(live_info("orphan"))
    await log.write_step([write("orphan", entry(0, 1))])
    follower = asyncio.create_task(collect(log.read("orphan", 0)))
    clock.advance(99)
    assert await log.info("orphan") is not None
    clock.advance(2)
    assert await log.info("orphan") is None
    with pytest.raises(StreamNotFound):
        await asyncio.wait_for(follower, HANG_GUARD_S)  # its reader is told, not left waiting


async def test_saving_one_session_again_and_again_keeps_one_expiry_for_it() -> None:
    """200k saves of one session once left 200k expiry items, popped only when
    each expired; stale items are now compacted away as they pile up."""
    clock = FakeClock()
    log = MemoryTokenLog(retention_s=10, live_ttl_s=100, clock=clock)
    await log.create_stream(live_info("kept"))
    for i in range(20_000):
        await log.save_session("s", b"%d" % i)
        clock.advance(0.0001)  # two seconds in all: no save has expired yet
    assert log.num_expiry_entries <= 2 * 2 + 64 + 1  # O(live keys), not O(saves)
    clock.advance(9.9)  # the stream's live TTL is far; the session's retention is not
    assert await log.load_session("s") == b"19999", "expired from an older save"
    clock.advance(0.2)  # ten seconds after the last save
    assert await log.load_session("s") is None
    assert await log.info("kept") is not None


async def test_compaction_keeps_each_streams_latest_expiry() -> None:
    """A stream's end sets an expiry earlier than its live TTL: after a rebuild
    the ended streams still go at their retention, the live one at its TTL."""
    clock = FakeClock()
    log = MemoryTokenLog(retention_s=10, live_ttl_s=100, clock=clock)
    await log.create_stream(live_info("live"))
    for i in range(500):
        await log.create_stream(live_info(f"e{i}"))
        await log.write_step([write(f"e{i}", entry(0, 1), finish(1))])
    for i in range(200):  # pushes that trigger rebuilds while the streams are kept
        await log.save_session("s", b"%d" % i)
    assert log.num_expiry_entries <= 2 * 502 + 64 + 1
    clock.advance(10.5)
    assert await log.info("e0") is None and await log.info("e499") is None
    assert await log.info("live") is not None
    clock.advance(90)
    assert await log.info("live") is None and log.num_expiry_entries == 0


async def test_close_wakes_readers_and_refuses_calls() -> None:
    log = MemoryTokenLog()
    await log.create_stream(live_info("s"))
    follower = asyncio.create_task(collect(log.read("s", 0)))
    await asyncio.sleep(0)
    await log.close()
    with pytest.raises(TokenLogUnavailable):
        await asyncio.wait_for(follower, HANG_GUARD_S)
    assert not await log.ping()
    with pytest.raises(TokenLogUnavailable):
        await log.write_step([write("s", entry(0, 1))])
    with pytest.raises(TokenLogUnavailable):
        await log.create_stream(live_info("t"))


async def test_factory_picks_the_backend_from_the_url() -> None:
    assert isinstance(open_token_log(None), MemoryTokenLog)
    assert isinstance(open_token_log("memory://"), MemoryTokenLog)
    redis_log = open_token_log("redis://127.0.0.1:1/0", retention_s=5, node_id="n1")
    assert isinstance(redis_log, RedisTokenLog)
    await redis_log.close()  # nothing was connected
    with pytest.raises(ValueError):
        open_token_log("postgres://x")


def test_negative_offset_is_refused() -> None:
    with pytest.raises(ValueError):
        MemoryTokenLog().read("s", -1)
