"""Supervision of a node's long-lived tasks: a crash is never a silent stop.

A long-lived task (the token log writer, the cluster tick, the abort
listener, the Redis tailer) that raises an unexpected exception has hit a bug
in bargein. Run under :func:`supervised`, such a crash

1. is logged once at ``error`` level with its traceback;
2. calls the task's ``on_crash`` hook, which ends what the task was doing
   explicitly (its streams end with an error, their KV blocks and admission
   slots are given back), so no client waits for it forever;
3. marks the task failing in a :class:`TaskHealth`, which ``/readyz`` reports
   (503, naming the task) until the task says it works again
   (:meth:`TaskHealth.working`);
4. restarts the task after a backoff that doubles up to ``max_backoff_s``.

Cancellation is never caught: cancelling the supervising task stops it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)

OnCrash = Callable[[Exception], Awaitable[None]]
MAX_REASON_CHARS = 200  # of an exception's text in /readyz (a repr can be huge)


class TaskHealth:
    """Which supervised tasks are failing now, and why (for ``/readyz``)."""

    def __init__(self) -> None:
        self._failing: dict[str, str] = {}  # task name -> the last crash, as text

    def crashed(self, name: str, exc: BaseException) -> None:
        """``name`` failed with ``exc``: not ready until it works again."""
        self._failing[name] = f"{type(exc).__name__}: {exc}"[:MAX_REASON_CHARS]

    def working(self, name: str) -> None:
        """``name`` did its work once more (cheap: called on every step)."""
        if self._failing:
            self._failing.pop(name, None)

    def is_failing(self, name: str) -> bool:
        return name in self._failing

    def not_ready(self) -> list[str]:
        """One line per failing task, as ``/readyz`` lists them."""
        return [f"{name}: crashed ({why})" for name, why in sorted(self._failing.items())]


def supervised(
    factory: Callable[[], Awaitable[None]],
    *,
    name: str,
    on_crash: OnCrash | None = None,
    health: TaskHealth | None = None,
    backoff_s: float = 0.1,
    max_backoff_s: float = 5.0,
) -> asyncio.Task[None]:
    """Run ``factory()`` in a task that restarts it whenever it raises.

    Args:
        factory: makes the task's coroutine, once per (re)start.
        name: the task's name (in the log, in ``/readyz``).
        on_crash: awaited with the exception after each crash, before the
            restart: ends what the crashed run left half done.
        health: marked failing at each crash (the task clears it itself).
        backoff_s, max_backoff_s: wait before a restart, doubled after each
            crash, back to ``backoff_s`` after a run that lasted longer
            than ``max_backoff_s``.

    The task ends when ``factory()``'s coroutine returns, or when cancelled.
    """
    return asyncio.create_task(
        _supervise(factory, name, on_crash, health, backoff_s, max_backoff_s), name=name
    )


async def _supervise(
    factory: Callable[[], Awaitable[None]],
    name: str,
    on_crash: OnCrash | None,
    health: TaskHealth | None,
    backoff_s: float,
    max_backoff_s: float,
) -> None:
    loop = asyncio.get_running_loop()
    delay = backoff_s
    while True:
        started = loop.time()
        try:
            await factory()
            return
        except Exception as exc:  # CancelledError is a BaseException: it stops us
            logger.error("task %s crashed (a bug in bargein): %r; restarting it", name, exc, exc_info=exc)
            if health is not None:
                health.crashed(name, exc)
            await _clean_up(name, on_crash, exc)
        if loop.time() - started > max_backoff_s:
            delay = backoff_s  # it ran a good while: a new fault, not a crash loop
        await asyncio.sleep(delay)
        delay = min(2 * delay, max_backoff_s)


async def _clean_up(name: str, on_crash: OnCrash | None, exc: Exception) -> None:
    """Run ``on_crash``; its own failure is logged, and the restart goes on."""
    if on_crash is None:
        return
    try:
        await on_crash(exc)
    except Exception:
        logger.exception("cleaning up after task %s crashed failed", name)
