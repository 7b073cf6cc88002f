"""cancel_and_wait: children are cancelled and awaited; the caller's own cancellation is never swallowed."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from bargein.session.cancel import cancel_and_wait
from tests.waiting import wait_until


async def _forever() -> None:
    await asyncio.Event().wait()


async def _slow_to_stop(stopping: asyncio.Event, release: asyncio.Event) -> None:
    """A child whose clean-up takes a while after its cancellation."""
    try:
        await asyncio.Event().wait()
    finally:
        stopping.set()
        await release.wait()


async def test_children_are_cancelled_and_awaited() -> None:
    children = [asyncio.create_task(_forever()) for _ in range(3)]
    await asyncio.sleep(0)
    await cancel_and_wait(children)
    assert all(task.cancelled() for task in children)


async def test_the_callers_own_cancellation_propagates() -> None:
    stopping, release = asyncio.Event(), asyncio.Event()
    child = asyncio.create_task(_slow_to_stop(stopping, release))
    await asyncio.sleep(0)
    after: list[str] = []

    async def closer() -> None:
        await cancel_and_wait([child])
        after.append("ran on")  # what the old suppress(CancelledError) idiom let happen

    closing = asyncio.create_task(closer())
    await stopping.wait()  # the closer waits for the child's clean-up
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert closing.cancelled() and after == []
    release.set()
    await asyncio.wait([child])
    assert child.cancelled()


async def test_the_old_idiom_swallowed_it() -> None:
    """The defect this module replaces (issue 36, item 10), shown on the same child."""
    stopping, release = asyncio.Event(), asyncio.Event()
    child = asyncio.create_task(_slow_to_stop(stopping, release))
    await asyncio.sleep(0)

    async def closer() -> str:
        child.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await child
        return "ran on"

    closing = asyncio.create_task(closer())
    await stopping.wait()
    closing.cancel()
    release.set()
    assert await closing == "ran on"  # its cancellation was lost


async def test_a_timeout_around_the_close_fires() -> None:
    stopping, release = asyncio.Event(), asyncio.Event()
    child = asyncio.create_task(_slow_to_stop(stopping, release))
    await asyncio.sleep(0)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await cancel_and_wait([child])
    release.set()
    await asyncio.wait([child])


async def test_a_child_that_failed_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def broken() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            raise RuntimeError("bug in clean-up")  # noqa: B012 - the point of the test

    async def failed_before() -> None:
        raise ValueError("failed earlier")

    child = asyncio.create_task(broken(), name="broken")
    earlier = asyncio.create_task(failed_before(), name="earlier")
    done = asyncio.create_task(asyncio.sleep(0))
    # all three ran: the child waits on its event, the others are over
    await wait_until(lambda: earlier.done() and done.done(), "the other children to end")
    with caplog.at_level(logging.ERROR, logger="bargein.session.cancel"):
        await cancel_and_wait([child, earlier, done])
    assert done.done() and not done.cancelled()
    assert {r.getMessage() for r in caplog.records} == {
        "task broken failed while being stopped",
        "task earlier failed while being stopped",
    }


async def test_nothing_to_wait_for() -> None:
    await cancel_and_wait([])


async def test_a_bounded_wait_returns_while_a_child_ignores_its_cancellation() -> None:
    """``timeout_s``: a child stuck past its cancellation (a redis-py call on
    3.11, gh-86296) does not hang the caller; it is left to end on its own."""
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                pass  # the misbehaving child under test

    child = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await cancel_and_wait([child], timeout_s=0.01)
    assert not child.done()
    release.set()
    await child
