"""Supervised long-lived tasks (issue 24): a crash is logged, cleaned up and restarted,
never a silent stop; and the Redis tailer, supervised, ends its readers explicitly."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bargein.session.errors import TokenLogUnavailable
from bargein.session.streams.log import LogEntry, StreamEnd
from bargein.session.streams.log.redis_streams import RedisLogConfig, RedisTokenLog
from bargein.session.supervise import TaskHealth, supervised
from tests.session.log_helpers import entry, finish, live_info, write
from tests.waiting import HANG_GUARD_S, wait_until


async def test_a_crash_is_logged_cleaned_up_reported_and_restarted(caplog: pytest.LogCaptureFixture) -> None:
    health, runs, crashes = TaskHealth(), [], []
    done = asyncio.Event()

    async def work() -> None:
        runs.append(1)
        if len(runs) < 3:
            raise RuntimeError(f"injected {len(runs)}")
        health.working("worker")
        done.set()
        await asyncio.Event().wait()  # a long-lived task: runs until cancelled

    async def on_crash(exc: Exception) -> None:
        crashes.append(str(exc))
        assert health.is_failing("worker")  # marked before the clean-up runs

    task = supervised(work, name="worker", on_crash=on_crash, health=health, backoff_s=0.01)
    await asyncio.wait_for(done.wait(), HANG_GUARD_S)
    assert crashes == ["injected 1", "injected 2"]
    assert health.not_ready() == []
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and all(r.exc_info for r in errors)  # one line, with its traceback
    assert "worker" in errors[0].getMessage()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):  # never swallowed
        await task


async def test_a_failing_task_is_named_until_it_works_again() -> None:
    health = TaskHealth()
    health.crashed("token-log-writer", RuntimeError("boom"))
    assert health.not_ready() == ["token-log-writer: crashed (RuntimeError: boom)"]
    health.working("token-log-writer")
    assert health.not_ready() == []


async def test_a_clean_up_that_fails_does_not_stop_the_restart() -> None:
    runs: list[int] = []
    done = asyncio.Event()

    async def work() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("injected")
        done.set()

    async def broken_clean_up(exc: Exception) -> None:
        raise ValueError("the clean-up is broken too")

    task = supervised(work, name="w", on_crash=broken_clean_up, backoff_s=0.01)
    await asyncio.wait_for(done.wait(), HANG_GUARD_S)
    await asyncio.wait_for(task, HANG_GUARD_S)  # a coroutine that returns ends the task


# ---- the Redis tailer --------------------------------------------------------------

_prefixes = itertools.count()


@pytest.fixture
async def two_nodes(redis_server: str) -> AsyncIterator[tuple[RedisTokenLog, RedisTokenLog]]:
    """A writing node's log and a reading node's log on one fresh key prefix."""
    prefix = f"supervise{next(_prefixes)}:"
    logs = tuple(
        RedisTokenLog(redis_server, node_id=node, config=RedisLogConfig(key_prefix=prefix, block_ms=200))
        for node in ("writer", "reader")
    )
    yield logs  # type: ignore[misc]
    for log in logs:
        await asyncio.wait_for(log.close(), 15)


async def next_item(items: Any) -> LogEntry | StreamEnd:
    return await asyncio.wait_for(anext(items), HANG_GUARD_S)  # type: ignore[no-any-return]


@pytest.mark.redis
async def test_a_crashed_tailer_ends_its_readers_then_serves_new_ones(
    two_nodes: tuple[RedisTokenLog, RedisTokenLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, reader = two_nodes
    await writer.create_stream(live_info("s"))
    await writer.write_step([write("s", entry(0, 1))])
    tailer = reader._tailer
    deliver, calls = tailer._deliver, itertools.count()

    def crash_once(key: str, entries: Any) -> None:
        if next(calls) == 0:
            raise RuntimeError("injected: the tailer's delivery is broken")
        deliver(key, entries)

    monkeypatch.setattr(tailer, "_deliver", crash_once)
    items = reader.read("s", 0)  # another node's stream: followed through the tailer
    assert await next_item(items) == entry(0, 1)
    follow = asyncio.ensure_future(next_item(items))
    await wait_until(lambda: bool(tailer._subs), "the reader to follow through the tailer")
    await writer.write_step([write("s", entry(1, 2))])
    with pytest.raises(TokenLogUnavailable):  # an explicit, retryable end: never a hang
        await follow
    assert reader.health.not_ready()[0].startswith("redis-tailer: crashed (RuntimeError")
    # A reader that resumes is served by the restarted tailer, and the node is ready again.
    items = reader.read("s", 1)
    assert await next_item(items) == entry(1, 2)
    follow = asyncio.ensure_future(next_item(items))
    await wait_until(lambda: bool(tailer._subs), "the reader to follow through the tailer")
    await writer.write_step([write("s", None, finish(2))])
    assert await follow == finish(2)
    await wait_until(lambda: not reader.health.not_ready(), "the tailer to report healthy")
