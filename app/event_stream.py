"""Streaming HTTP responses that notice the client leaving (ASGI).

An ASGI server reports a client that went away as an ``http.disconnect``
message on ``receive``; it may also raise ``OSError`` from ``send`` (ASGI
spec 2.4). Starlette's ``StreamingResponse`` stops on either, but it neither
tells the application nor closes the event iterator when the client left
while a write was pending; :class:`EventStreamResponse` does both, so a
disconnect policy can act on it at once (not at some later garbage
collection).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import TypeVar

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
T = TypeVar("T")


async def wait_disconnect(receive: Receive) -> None:
    """Return when the ASGI server reports that the client went away
    (after the request body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T | None:
    """``await work``, or None if the client disconnects first (``work`` is then cancelled).

    Raises whatever ``work`` raises.
    """
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(wait_disconnect(receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, gone):
            pending.cancel()
        await asyncio.gather(task, gone, return_exceptions=True)
    if task.cancelled():
        return None
    return task.result()


class EventStreamResponse(StreamingResponse):
    """A ``text/event-stream`` response that notices a client leaving.

    The events are written as they come while a second task waits for the
    ASGI ``http.disconnect``; whichever ends first ends the response. If the
    client left before the last event, ``on_disconnect`` is called (once),
    then the event generator is closed (its ``finally`` blocks run).

    Args:
        events: the encoded SSE events, in order.
        on_disconnect: called when the client left before the end.
        headers: more response headers (no-cache headers are always sent).
    """

    def __init__(
        self,
        events: AsyncGenerator[bytes, None],
        *,
        on_disconnect: Callable[[], None],
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(events, headers={**SSE_HEADERS, **(headers or {})}, media_type="text/event-stream")
        self._events = events
        self._on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        completed = await unless_disconnected(receive, self._write(send))
        if not completed:
            self._on_disconnect()
        await self._events.aclose()

    async def _write(self, send: Send) -> bool:
        """Write every event; True when the last one went out, False if the client left."""
        try:
            async for event in self._events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # ASGI 2.4 servers raise it for a client that left
            return False
        return True
