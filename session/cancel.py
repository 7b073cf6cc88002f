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


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and return once every one of them is done.

    A child that ends cancelled, or had already returned, is what the caller
    asked for. A child that raised something else, now or before (a bug in
    it), is logged at
    ``error`` level with its traceback and does not stop the caller, which is
    closing: what is left to close (sockets, saves, admission slots) still
    gets closed.

    Raises:
        asyncio.CancelledError: the calling task itself was cancelled while
            waiting (the children are cancelled already and end on their own).
    """
    children = list(tasks)
    pending = [task for task in children if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)
    for task in children:
        if not task.cancelled() and task.exception() is not None:
            name = task.get_name() if isinstance(task, asyncio.Task) else repr(task)
            logger.error("task %s failed while being stopped", name, exc_info=task.exception())
