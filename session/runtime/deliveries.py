"""The deliveries of one connection: one task per stream it sends.

A connection delivers its own responses and the streams its client resumes
(``stream.resume``, any stream of the caller). :class:`Deliveries` starts
each one's :class:`~bargein.session.runtime.delivery.Delivery` as a task,
counts it as a reader of its stream on the service while it runs, holds a
response's announcement until the earlier ones ended (:meth:`drain`), and
cancels them all when the connection closes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import cast

from bargein.protocol import events as pe
from bargein.session.cancel import cancel_and_wait
from bargein.session.runtime.delivery import Delivery, DeliverySubscriber, SendEvent, done_event, text_before
from bargein.session.runtime.service import Service
from bargein.session.runtime.tool_events import ToolCallEvents

logger = logging.getLogger(__name__)

OnDelivered = Callable[[str, str], None]
"""``(stream_id, text)``: a delta of ``stream_id`` carrying ``text`` was sent."""


class Deliveries:
    """One connection's delivery tasks, by stream id.

    Args:
        service: the process's service (its log, its observer, its count of readers).
        send: writes one server event; returns once it is on the wire.
        on_delivered: told of each delta sent, after it was sent.
    """

    def __init__(self, service: Service, send: SendEvent, *, on_delivered: OnDelivered) -> None:
        self._service = service
        self._send = send
        self._on_delivered = on_delivered
        self._running: dict[str, tuple[Delivery, asyncio.Task[None]]] = {}

    def __contains__(self, stream_id: str) -> bool:
        return stream_id in self._running

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The running delivery tasks."""
        return [task for _, task in self._running.values()]

    def start(
        self,
        response_id: str,
        stream_id: str,
        from_offset: int,
        *,
        include_token_ids: bool,
        subscriber: DeliverySubscriber | None = None,
        tool_mode: pe.ToolMode | None = None,
        held_text: str = "",
    ) -> None:
        """Deliver ``stream_id`` from ``from_offset`` in a task of its own;
        ``subscriber`` (the response's speaker) is told what it sends;
        ``tool_mode`` and ``held_text`` as :class:`Delivery` takes them."""
        delivery = Delivery(
            self._service.log,
            response_id=response_id,
            stream_id=stream_id,
            from_offset=from_offset,
            send=self._send,
            on_delivered=lambda text: self._on_delivered(stream_id, text),
            include_token_ids=include_token_ids,
            observer=self._service.observer,
            subscribers=() if subscriber is None else (subscriber,),
            tool_mode=tool_mode,
            held_text=held_text,
        )
        task = asyncio.create_task(delivery.run(), name=f"deliver-{stream_id}")
        self._running[stream_id] = (delivery, task)
        self._service.reader_started(stream_id)

        def ended(_: object) -> None:
            self._running.pop(stream_id, None)
            self._service.reader_ended(stream_id)

        task.add_done_callback(ended)

    def stream_of(self, response_id: str, *, unless: Callable[[str], bool]) -> str | None:
        """The stream delivered here for ``response_id``, but not one that
        ``unless(stream_id)`` rules out; None if none."""
        for stream_id, (delivery, _) in self._running.items():
            if delivery.response_id == response_id and not unless(stream_id):
                return stream_id
        return None

    async def stop(self, response_id: str, stream_id: str) -> None:
        """A cancel of a response that no longer generates: a running delivery
        sends the rest of the log, then ``response.done``; otherwise its
        ``response.done`` is sent from the log's end (``not_found`` if the
        log has none). Raises TokenLogError."""
        if stream_id in self._running:
            return
        info = await self._service.log.info(stream_id)
        if info is None or info.finish is None:
            await self._send(
                pe.ErrorEvent(
                    code=pe.ErrorCode.NOT_FOUND,
                    retryable=False,
                    message="no such response",
                    response_id=response_id,
                )
            )
            return
        done = done_event(response_id, stream_id, info.finish)
        if info.tool_mode is not None:  # its calls, as its delivery listed them
            reader = ToolCallEvents(response_id, stream_id, cast(pe.ToolMode, info.tool_mode))
            reader.feed(await text_before(self._service.log, stream_id, info.end))
            done = replace(done, tool_calls=reader.finish()[1])
        await self._send(done)

    async def drain(self, stream_id: str, *, earlier: Callable[[str], bool], timeout_s: float) -> None:
        """Wait until the deliveries of the streams that ``earlier(stream_id)``
        names (the session's earlier responses) sent their ``response.done``,
        so no event of theirs follows the ``response.created`` of
        ``stream_id``; after ``timeout_s`` the laggards are stopped instead
        (a log that never ends them, or an engine too loaded to end an
        interrupted one in time). Each stopped one ends with an ``error``
        ``overloaded`` naming its response, so a client waiting for its
        ``response.done`` is told it will not come; it can still
        ``stream.resume`` it."""
        waiting = {
            task: delivery.response_id
            for sid, (delivery, task) in self._running.items()
            if sid != stream_id and earlier(sid)
        }
        if not waiting:
            return
        _, pending = await asyncio.wait(waiting, timeout=timeout_s)
        for task in pending:
            logger.warning("delivery %s did not end before the next response; stopped", task.get_name())
        await cancel_and_wait(pending)
        for task in pending:
            await self._send(
                pe.ErrorEvent(
                    code=pe.ErrorCode.OVERLOADED,
                    message=f"the response did not end within {timeout_s:g} s of the next one; "
                    "its delivery stopped here (resume it with stream.resume)",
                    retryable=True,
                    response_id=waiting[task],
                )
            )
