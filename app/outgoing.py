"""One connection's outgoing frames: in order, bounded in bytes, with a slow-client watchdog.

:class:`Outgoing` is the one writer task of a ``/v1/realtime`` connection.
``send`` returns once the frame is handed to the transport, so every sender
(the read loop's answers, one delivery per stream) has at most one frame
waiting: a lagging client makes deliveries wait, and they coalesce what the
log gained meanwhile into one bigger delta (:mod:`bargein.session.runtime.delivery`), reading
the log at their own pace. Below the writer, uvicorn stops taking frames once
the socket's user-space buffer passes asyncio's high-water mark (64 KiB).

So a connection's outgoing data is bounded by the transport's high-water mark
plus ``max_bytes`` of queued frames. The connection is *over its bound* while
the transport refuses more data (a write has not returned) or the queued
frames pass ``max_bytes``; one that stays over it for ``slow_timeout_s`` is
closed with 4008 (it can reconnect and ``stream.resume`` from the log).
The 4008 close frame itself may not get through a full buffer: the close
waits at most ``CLOSE_TIMEOUT_S``, then the handler ends anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from bargein.protocol import Format, encode
from bargein.session.cancel import cancel_and_wait

CLOSE_TIMEOUT_S = 5.0


class Outgoing:
    """The writer task of one WebSocket connection.

    Args:
        ws: the accepted WebSocket.
        fmt: ``"json"`` or ``"msgpack"``.
        max_bytes: most bytes of encoded frames waiting for the transport.
        slow_timeout_s: longest time over the bound before close 4008 (0: never).
        clock: monotonic seconds.
        encoder: makes the frame of an event (default: bargein's codec in ``fmt``).

    Attributes:
        too_slow: set when the client stayed over its bound too long; from
            then on ``send`` returns at once and sends nothing.
    """

    def __init__(
        self,
        ws: WebSocket,
        fmt: Format,
        *,
        max_bytes: int = 1 << 20,
        slow_timeout_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        encoder: Callable[[Any], str | bytes] | None = None,
    ) -> None:
        self._ws = ws
        self._encode = encoder or (lambda event: encode(event, fmt))
        self.max_bytes = max_bytes
        self.slow_timeout_s = slow_timeout_s
        self._clock = clock
        self._queue: asyncio.Queue[tuple[str | bytes, asyncio.Future[None]]] = asyncio.Queue()
        self.queued_bytes = 0
        self._writing_since: float | None = None
        self._writing: asyncio.Future[None] | None = None  # the frame being written
        self._over_since: float | None = None
        self._closed = False
        self.too_slow = asyncio.Event()
        self.task = asyncio.create_task(self._run(), name="ws-writer")
        self._watchdog = (
            asyncio.create_task(self._watch(), name="ws-slow-watchdog") if slow_timeout_s > 0 else None
        )

    async def send(self, event: Any) -> None:
        """Queue ``event``; return once it was handed to the transport (at
        once when the socket is closed)."""
        if self._closed:
            return
        frame = self._encode(event)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.queued_bytes += len(frame)
        self._queue.put_nowait((frame, done))
        await done

    def over_bound(self) -> bool:
        """The transport refuses more data now, or too many bytes wait."""
        return self._writing_since is not None or self.queued_bytes > self.max_bytes

    async def _run(self) -> None:
        try:
            while True:
                frame, done = await self._queue.get()
                self._writing_since, self._writing = self._clock(), done
                if isinstance(frame, str):
                    await self._ws.send_text(frame)
                else:
                    await self._ws.send_bytes(frame)
                self._writing_since, self._writing = None, None
                self.queued_bytes -= len(frame)
                if not done.done():
                    done.set_result(None)
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass  # the socket is gone; the reader sees it too
        finally:
            self._release()

    def _release(self) -> None:
        """Closed: wake every waiting sender, forget queued frames."""
        self._closed = True
        if self._writing is not None and not self._writing.done():
            self._writing.set_result(None)
        while not self._queue.empty():
            _, done = self._queue.get_nowait()
            if not done.done():
                done.set_result(None)
        self.queued_bytes = 0

    async def _watch(self) -> None:
        """Set ``too_slow`` once the connection stayed over its bound too long.

        A frame whose write started less than a tick ago is not "over": a
        write normally returns at once.
        """
        tick = max(0.01, self.slow_timeout_s / 8)
        while not self._closed:
            await asyncio.sleep(tick)
            now = self._clock()
            stalled = self._writing_since is not None and now - self._writing_since >= tick
            if not (stalled or self.queued_bytes > self.max_bytes):
                self._over_since = None
                continue
            self._over_since = self._over_since if self._over_since is not None else now
            if now - self._over_since >= self.slow_timeout_s:
                self.too_slow.set()
                self._release()  # senders blocked on this client (the read loop too) go on
                return

    async def close(self, code: int) -> None:
        """Stop writing and close the socket with ``code`` (once); waits at
        most ``CLOSE_TIMEOUT_S`` for the close frame to be taken."""
        await cancel_and_wait(task for task in (self.task, self._watchdog) if task is not None)
        self._release()
        with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect, TimeoutError):
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self._ws.close(code)
