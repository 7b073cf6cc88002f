"""MemoryTokenLog specifics (live TTL, close) and the open_token_log factory."""

from __future__ import annotations

import asyncio

import pytest

from session.errors import StreamNotFound, TokenLogUnavailable
from session.redis_log import RedisTokenLog
from session.token_log import MemoryTokenLog, open_token_log
from tests.session.log_helpers import FakeClock, collect, entry, live_info, write


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
        await asyncio.wait_for(follower, 1)  # its reader is told, not left waiting


async def test_close_wakes_readers_and_refuses_calls() -> None:
    log = MemoryTokenLog()
    await log.create_stream(live_info("s"))
    follower = asyncio.create_task(collect(log.read("s", 0)))
    await asyncio.sleep(0)
    await log.close()
    with pytest.raises(TokenLogUnavailable):
        await asyncio.wait_for(follower, 1)
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
