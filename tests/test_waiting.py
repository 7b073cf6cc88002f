"""The waiting helpers: they return the state waited for and fail, naming it, at the guard."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests.waiting import wait_until, wait_until_async, wait_until_sync


async def test_wait_until_returns_the_truthy_value_once_another_task_makes_it() -> None:
    box: list[int] = []
    loop = asyncio.get_running_loop()
    loop.call_soon(box.append, 7)
    assert await wait_until(lambda: box, "the box filled") == [7]


async def test_wait_until_fails_naming_the_state_at_the_guard() -> None:
    with pytest.raises(AssertionError, match="still waiting for the impossible"):
        await wait_until(lambda: False, "the impossible", guard_s=0.05)


async def test_wait_until_async_bounds_a_look_that_hangs() -> None:
    async def hangs() -> bool:
        await asyncio.Event().wait()
        return True

    with pytest.raises(AssertionError, match="still waiting for a reply"):
        await wait_until_async(hangs, "a reply", guard_s=0.05)


async def test_wait_until_async_lets_the_conditions_own_timeout_through() -> None:
    async def times_out() -> bool:
        raise TimeoutError("the condition's own")

    with pytest.raises(TimeoutError, match="the condition's own"):
        await wait_until_async(times_out, "a reply")


def test_wait_until_sync_sees_another_threads_work() -> None:
    done = threading.Event()
    threading.Thread(target=done.set).start()
    assert wait_until_sync(done.is_set, "the thread's event") is True
    with pytest.raises(AssertionError, match="still waiting for nothing"):
        wait_until_sync(lambda: None, "nothing", guard_s=0.05)
