"""Cancel child tasks and wait for them, without swallowing the caller's own cancellation.

The idiom ``task.cancel(); with suppress(CancelledError): await task`` is
wrong: ``await task`` raises ``CancelledError`` both when the child ended
cancelled (wanted) and when the *awaiting* coroutine is cancelled meanwhile
(a shutdown, a timeout around the close); the ``suppress`` swallows the
second too, so the closing coroutine runs on as if nobody had asked it to
stop (asyncio's ``Task.cancelling()`` stays raised, and an enclosing
``asyncio.timeout`` never fires). :func:`cancel_and_wait` waits with
:func:`asyncio.wait`, which never raises a child's outcome, only the caller's
own cancellation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger(__name__)


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]], *, timeout_s: float | None = None) -> None:
    """Cancel ``tasks`` and return once every one of them is done.

    A child that ends cancelled, or had already returned, is what the caller
    asked for. A child that raised something else, now or before (a bug in
    it), is logged at
    ``error`` level with its traceback and does not stop the caller, which is
    closing: what is left to close (sockets, saves, admission slots) still
    gets closed.

    ``timeout_s``: return after that many seconds even if some children are
    still running (they end on their own). For tasks inside a redis-py call,
    which can miss their cancellation (CPython gh-86296 on 3.11): a shutdown
    must not hang on one.

    Raises:
        asyncio.CancelledError: the calling task itself was cancelled while
            waiting (the children are cancelled already and end on their own).
    """
    children = list(tasks)
    pending = [task for task in children if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=timeout_s)
    for task in children:
        if task.done() and not task.cancelled() and task.exception() is not None:
            name = task.get_name() if isinstance(task, asyncio.Task) else repr(task)
            logger.error("task %s failed while being stopped", name, exc_info=task.exception())
