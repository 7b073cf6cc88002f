"""Waiting in tests: for a state, never for a time.

A test that needs something to have happened (a message sent, a task ended,
a metric moved) waits for that state with :func:`wait_until` (on the event
loop), :func:`wait_until_async` (a condition that must itself await, such as
a Redis call) or :func:`wait_until_sync` (from a plain thread). Each polls the
condition and gives up after :data:`HANG_GUARD_S`.

The guard only turns a hang into a failure that names what never happened:
it is never a bound on how fast. It is generous enough that a loaded 2-core
machine running the whole suite never reaches it where the code is right.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

HANG_GUARD_S = 60.0
"""Seconds after which a wait for a state fails: a hang guard, not a timing assertion."""

POLL_S = 0.01
"""Seconds between two looks at a condition (on the loop: other tasks run meanwhile)."""


def _gave_up(what: str, guard_s: float) -> AssertionError:
    return AssertionError(f"still waiting for {what} after {guard_s:g} s (a hang guard)")


async def wait_until(
    condition: Callable[[], T], what: str, *, guard_s: float = HANG_GUARD_S, poll_s: float = POLL_S
) -> T:
    """Yield to the event loop until ``condition()`` is truthy; return that value.

    Args:
        condition: looked at every ``poll_s`` seconds, on the loop (it must not block).
        what: the state waited for, named in the failure ("the writer to report healthy").
        guard_s: the hang guard, seconds.
        poll_s: seconds between looks.

    Raises:
        AssertionError: ``condition()`` was still falsy after ``guard_s`` seconds.
    """
    deadline = time.monotonic() + guard_s
    while not (value := condition()):
        if time.monotonic() >= deadline:
            raise _gave_up(what, guard_s)
        await asyncio.sleep(poll_s)
    return value


async def wait_until_async(
    condition: Callable[[], Awaitable[T]],
    what: str,
    *,
    guard_s: float = HANG_GUARD_S,
    poll_s: float = POLL_S,
) -> T:
    """:func:`wait_until` for a condition that awaits (a Redis call, an HTTP request).

    Each look is bounded by the time the guard has left, so a look that hangs
    fails the test too.

    Raises:
        AssertionError: the condition was still falsy, or its look still
            running, ``guard_s`` seconds after the first look.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + guard_s
    while True:
        scope = asyncio.timeout_at(deadline)
        try:
            async with scope:
                value = await condition()
        except TimeoutError:
            if scope.expired():
                raise _gave_up(what, guard_s) from None
            raise  # the condition's own timeout: its error, not ours
        if value:
            return value
        if loop.time() >= deadline:
            raise _gave_up(what, guard_s)
        await asyncio.sleep(poll_s)


def wait_until_sync(
    condition: Callable[[], T], what: str, *, guard_s: float = HANG_GUARD_S, poll_s: float = POLL_S
) -> T:
    """:func:`wait_until` for code without an event loop (threads, subprocesses):
    sleeps the calling thread between looks.

    Raises:
        AssertionError: ``condition()`` was still falsy after ``guard_s`` seconds.
    """
    deadline = time.monotonic() + guard_s
    while not (value := condition()):
        if time.monotonic() >= deadline:
            raise _gave_up(what, guard_s)
        time.sleep(poll_s)
    return value
