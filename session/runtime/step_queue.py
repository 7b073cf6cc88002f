"""The hand-off of engine steps from the engine thread to the event loop, bounded.

The engine runner calls its step listeners on its own thread, once per step,
with the step's outputs. :meth:`StepQueue.put` is such a listener: one
``call_soon_threadsafe`` per step puts the step on a queue of the event loop,
where the log writer (:mod:`bargein.session.runtime.log_writer`) takes the
steps in order. At most ``max_pending_steps`` steps wait for the writer: past
that the engine thread waits for room (backpressure), so a log slower than
the engine (a replica ``WAIT``, a slow Redis) slows generation down instead
of growing memory and delivery lag without bound.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

from bargein.engine.request import RequestOutput
from bargein.session.runtime.engine_handle import EngineHandle

# How often an engine thread waiting for the writer looks whether the service stopped.
_STOP_POLL_S = 0.1


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One engine step on its way to the log writer."""

    started_at: float  # monotonic seconds: when the engine step began
    outputs: list[RequestOutput]
    engine_wait_s: float  # the engine thread waited this long for room in the queue
    holds_slot: bool  # it took one of the queue's slots (given back by done())


class StepQueue:
    """Engine steps waiting for the log writer (see the module doc).

    Args:
        runner: the engine runner (``stats().last_step_s``: when a step began).
        max_pending_steps: steps that may wait before the engine thread does.
    """

    def __init__(self, runner: EngineHandle, max_pending_steps: int) -> None:
        self._runner = runner
        self._steps: asyncio.Queue[Step] = asyncio.Queue()
        # Room for steps between the engine thread and the writer: taken by the
        # engine thread (it waits when none is left), given back once written.
        self._slots = threading.BoundedSemaphore(max_pending_steps)
        self._stopping = threading.Event()  # an engine thread waiting for room gives up
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id: int | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hand steps to ``loop``, whose thread is the caller's (the service starts)."""
        self._loop = loop
        self._loop_thread_id = threading.get_ident()
        self._stopping.clear()

    def stop(self) -> None:
        """Nobody will take steps any more: an engine thread waiting for room goes on."""
        self._stopping.set()

    def put(self, outputs: list[RequestOutput]) -> None:
        """Step listener, on the engine thread: one hand-off to the loop per step.

        The step's start time travels along: the engine frees the blocks of
        aborted requests first thing in a step (the runner drains the aborts
        and hands their ends over before the forward pass), so interrupt
        latency is measured to it, not to when the busy event loop got round
        to the outputs.
        """
        assert self._loop is not None
        # Ends alone (no token) come from the runner's abort drain, sent before
        # the step's forward pass: their blocks were freed just now.
        ends_only = all(not out.new_token_ids for out in outputs)
        step_start = time.monotonic() - (0.0 if ends_only else self._runner.stats().last_step_s)
        waited_s, holds_slot = self._wait_for_room()
        step = Step(started_at=step_start, outputs=outputs, engine_wait_s=waited_s, holds_slot=holds_slot)
        self._loop.call_soon_threadsafe(self._steps.put_nowait, step)

    def _wait_for_room(self) -> tuple[float, bool]:
        """Take a slot of the queue, waiting while it is full (backpressure on
        the engine thread); ``(seconds waited, whether a slot was taken)``.

        Never waits on the event loop's own thread (a runner shut down from
        the loop hands its last outputs over there: the writer could not run),
        nor once the service stops: those steps go over the bound.
        """
        if self._slots.acquire(blocking=False):
            return 0.0, True
        if threading.get_ident() == self._loop_thread_id:
            return 0.0, False
        started = time.perf_counter()
        while not self._slots.acquire(timeout=_STOP_POLL_S):
            if self._stopping.is_set():
                return time.perf_counter() - started, False
        return time.perf_counter() - started, True

    async def get(self) -> Step:
        """The next step, in step order (waits for one)."""
        return await self._steps.get()

    def done(self, step: Step) -> None:
        """``step`` is written (or failed): its slot is free again."""
        if step.holds_slot:
            self._slots.release()

    def num_pending(self) -> int:
        """Steps handed over and not yet taken by the writer."""
        return self._steps.qsize()
