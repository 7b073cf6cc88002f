"""Delivery: one stream from the token log to one client, at the client's pace.

:func:`feed` is the one way a stream leaves the log for a client, whatever
the transport: it reads from an offset in a task of its own, keeps at most
``READ_AHEAD`` entries queued ahead of the consumer, hands over whatever
queued meanwhile as one :class:`Batch` each time the consumer is ready (so a
slow client gets bigger batches, never a longer queue), and counts what it
hands over (the observer's deliveries and delta sizes). Generation never
waits for delivery: the engine writes to the log whatever the readers do.

Its consumers: :class:`Delivery` (one task per WebSocket connection per
stream: ``response.delta`` events, then ``response.done``), and the OpenAI
HTTP answers through :meth:`bargein.session.runtime.service.Service.feed` (an SSE
chunk per batch, or one JSON body).

A :class:`Delivery` publishes what it sends to its :class:`DeliverySubscriber`
objects, downstream of it as a pipecat processor is of the one before: the
voice side subscribes a speaker that speaks each delta's text once it is
sent. Delivery itself knows nothing of audio.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, cast

from bargein.protocol import events as pe
from bargein.session.cancel import cancel_and_wait
from bargein.session.errors import StreamNotFound, StreamTruncated, TokenLogUnavailable
from bargein.session.runtime.observer import NullObserver, SessionObserver
from bargein.session.runtime.tool_events import ReadOut, ToolCallEvents
from bargein.session.streams.log import EndError, LogEntry, StreamEnd, TokenLog

logger = logging.getLogger(__name__)

SendEvent = Callable[[object], Awaitable[None]]
# Log entries read ahead of the consumer; past it the reader waits, so a lagging
# client costs no memory beyond the log itself (whatever the log backend).
READ_AHEAD = 64


class DeliverySubscriber(Protocol):
    """Told what one :class:`Delivery` sends, in order (the voice side's
    speaker is one: it speaks the text as it is delivered)."""

    def on_delta(self, text: str) -> None:
        """A ``response.delta`` carrying ``text`` was sent (``text`` may be empty)."""

    def on_calls(self) -> None:
        """The answer made function calls (a response read for calls): the
        client is to run them. Called once, before :meth:`on_end`."""

    async def on_end(self) -> None:
        """The stream's text is all sent: called before its ``error`` (an end
        that carries one) and ``response.done``; returns once the subscriber's
        own events of the response are sent, so none follows the response's end."""

    async def on_failure(self) -> None:
        """The delivery failed (the log, or a bug): called before the ``error``
        that ends it; returns once the subscriber's own events are sent."""

    async def on_close(self) -> None:
        """The delivery is over, however it ended (cancelled too): nothing more
        comes, and nothing of the subscriber's should go on."""


@dataclass(frozen=True, slots=True)
class Batch:
    """Contiguous log entries of one stream that queued up while the consumer
    was busy: one ``response.delta`` or SSE chunk covers them all.

    Attributes:
        entries: at least one; ``entries[i].end == entries[i + 1].start``.
    """

    entries: tuple[LogEntry, ...]

    @property
    def start(self) -> int:
        """Offset of the first token."""
        return self.entries[0].start

    @property
    def end(self) -> int:
        """Offset after the last token."""
        return self.entries[-1].end

    @property
    def text(self) -> str:
        """The text the batch's tokens complete (may be empty: a character split
        over tokens shows once its last byte is in)."""
        return "".join(e.text for e in self.entries)

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The batch's token ids, ``end - start`` of them."""
        return tuple(t for e in self.entries for t in e.token_ids)


async def feed(
    log: TokenLog,
    stream_id: str,
    from_offset: int,
    *,
    observer: SessionObserver | None = None,
    read_ahead: int = READ_AHEAD,
) -> AsyncGenerator[Batch | StreamEnd, None]:
    """The stream from ``from_offset``: batches of what queued, then its end.

    Args:
        log: the token log holding the stream.
        stream_id: the stream.
        from_offset: first token offset wanted (the first batch may start
            before it, as the log's first entry may).
        observer: told when the feed starts and ends and of each batch's size.
        read_ahead: entries queued ahead of the consumer at most.

    Yields :class:`Batch` items, then the :class:`StreamEnd`, and stops.
    Raises what the log's read raises (StreamNotFound, StreamTruncated,
    TokenLogUnavailable, ...), after every batch read before the failure.
    Close it (``contextlib.aclosing``) to stop reading early.
    """
    observed: SessionObserver = observer or NullObserver()
    queue: asyncio.Queue[LogEntry | StreamEnd | BaseException] = asyncio.Queue(maxsize=read_ahead)

    async def read() -> None:
        # Any failure is queued too (the consumer raises it), so a reader that
        # stops never leaves the consumer waiting.
        try:
            async for item in log.read(stream_id, from_offset):
                await queue.put(item)
                if isinstance(item, StreamEnd):
                    return
            raise RuntimeError(f"the log's read of {stream_id} ended without its end")
        except Exception as exc:  # CancelledError is not caught: it stops the reader
            await queue.put(exc)

    reader = asyncio.create_task(read(), name=f"read-{stream_id}")
    observed.delivery_started()
    try:
        while True:
            items = [await queue.get()]
            while not queue.empty():  # what queued while the consumer was busy
                items.append(queue.get_nowait())
            entries = tuple(i for i in items if isinstance(i, LogEntry))
            if entries:
                observed.delta_sent(entries[-1].end - entries[0].start)
                yield Batch(entries)
            for item in items:
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, StreamEnd):
                    yield item
                    return
    finally:
        observed.delivery_ended()
        await cancel_and_wait([reader])


def relayed_code(error: EndError) -> pe.ErrorCode:
    """The protocol code of an error read from the log; ``internal_error`` for a
    code this node does not know (written by a newer node in a rolling deploy)."""
    try:
        return pe.ErrorCode(error.code)
    except ValueError:
        return pe.ErrorCode.INTERNAL_ERROR


def truncated_message(exc: StreamTruncated) -> str:
    """What a client is told when the log lost offsets it needs (no internals)."""
    return (
        f"the stream's log lost its tokens from offset {exc.missing_from} (trimmed, "
        "evicted or expired); they cannot be replayed"
    )


async def text_before(log: TokenLog, stream_id: str, offset: int) -> str:
    """The text of the stream's log entries that end at or before ``offset``:
    what a client resuming from ``offset`` holds (a resume replays the entry
    that holds ``offset`` whole). ``offset`` must be at most the logged end,
    so the read never waits for generation. Raises TokenLogError."""
    parts: list[str] = []
    if offset > 0:
        async with contextlib.aclosing(log.read(stream_id, 0)) as items:
            async for item in items:
                if isinstance(item, StreamEnd) or item.end > offset:
                    break
                parts.append(item.text)
                if item.end == offset:
                    break
    return "".join(parts)


def done_event(response_id: str, stream_id: str, end: StreamEnd) -> pe.ResponseDone:
    """The ``response.done`` of a stream that ended with ``end``."""
    return pe.ResponseDone(
        response_id=response_id,
        stream_id=stream_id,
        end=end.end,
        # The log holds what the engine's FinishReason wrote (a protocol name).
        finish_reason=cast(pe.FinishReasonName, end.finish_reason),
        usage=pe.Usage(
            prompt_tokens=end.prompt_tokens,
            completion_tokens=end.completion_tokens,
            cached_tokens=end.cached_tokens,
        ),
    )


class Delivery:
    """Sends one stream's deltas from ``from_offset`` on, then its ``response.done``.

    Args:
        log: the token log holding the stream.
        response_id, stream_id: the stream and the response it answers.
        from_offset: first token offset the client wants.
        send: writes one server event and returns once it is on the wire.
        on_delivered: called with each delta's text after it was sent (the
            conversation's count of what its client holds).
        include_token_ids: put ``token_ids`` in the deltas.
        observer: told when delivery starts and ends and of each delta's size.
        subscribers: told of each delta after ``on_delivered``, and of the
            end before ``response.done`` (or of a failure before the
            ``error`` that ends the delivery); see :class:`DeliverySubscriber`.
            With ``tool_mode``, they are told only the text that is no call.
        tool_mode: read the answer for function calls
            (session/runtime/tool_events.py): their events follow the deltas
            that complete them, and ``response.done`` lists the calls.
        held_text: with ``tool_mode``, the stream's text before ``from_offset``
            (a resume): read first, its events not sent again.

    Every entry of the log is sent before ``response.done``, also after a
    cancel: the service logs nothing once a cancel is accepted, so the
    deltas a client got, the ``end`` of ``response.done`` and a replay of
    the stream are the same tokens. A stream whose end carries an error (a
    request dropped from the queue at its deadline) gets that ``error``
    event, then its ``response.done``.
    """

    def __init__(
        self,
        log: TokenLog,
        *,
        response_id: str,
        stream_id: str,
        from_offset: int,
        send: SendEvent,
        on_delivered: Callable[[str], None] = lambda text: None,
        include_token_ids: bool = False,
        observer: SessionObserver | None = None,
        subscribers: Sequence[DeliverySubscriber] = (),
        tool_mode: pe.ToolMode | None = None,
        held_text: str = "",
    ) -> None:
        self.log = log
        self.subscribers = tuple(subscribers)
        self.response_id = response_id
        self.stream_id = stream_id
        self.sent_end = from_offset  # offset after the last token sent
        self.finish: StreamEnd | None = None
        self._send = send
        self._on_delivered = on_delivered
        self._include_token_ids = include_token_ids
        self._observer: SessionObserver = observer or NullObserver()
        self._calls = None if tool_mode is None else ToolCallEvents(response_id, stream_id, tool_mode)
        if self._calls is not None:
            self._calls.feed(held_text)  # what the client holds: its events were sent before

    async def run(self) -> None:
        """Deliver until the stream's end has been sent.

        A stream that is unknown or expired is answered with ``error``
        ``not_found``; one whose log lost offsets this client still needs
        (trimmed, evicted), with ``stream_truncated`` (not retryable); a log
        that cannot be read, with a retryable ``internal_error`` (the client
        may resume later). Any other failure of the reader or of the sending
        (a bug) is logged and answered the same way: the client is never
        left waiting for a stream this delivery no longer follows.
        """
        try:
            await self._deliver()
        except StreamTruncated as exc:  # before StreamNotFound: a subclass of it
            await self._failed()
            await self._send(self._error(pe.ErrorCode.STREAM_TRUNCATED, truncated_message(exc), False))
        except StreamNotFound:
            await self._failed()
            await self._send(self._error(pe.ErrorCode.NOT_FOUND, "stream not found", False))
        except TokenLogUnavailable:
            await self._failed()
            await self._send(self._error(pe.ErrorCode.INTERNAL_ERROR, "token log unavailable", True))
        except Exception as exc:  # a bug: say so, and end this delivery explicitly
            logger.error(
                "delivery of stream %s failed (a bug in bargein): %r", self.stream_id, exc, exc_info=exc
            )
            await self._failed()
            await self._send(
                self._error(pe.ErrorCode.INTERNAL_ERROR, "delivery failed; resume the stream", True)
            )
        finally:
            for subscriber in self.subscribers:
                await subscriber.on_close()  # a cancelled delivery leaves nothing of theirs behind

    async def _failed(self) -> None:
        """A failed delivery: the subscribers end their part before its ``error``."""
        for subscriber in self.subscribers:
            await subscriber.on_failure()

    async def _deliver(self) -> None:
        items = feed(self.log, self.stream_id, self.sent_end, observer=self._observer)
        async with contextlib.aclosing(items):
            async for item in items:
                if isinstance(item, Batch):
                    await self._send_delta(item)
                else:
                    self.finish = item
        assert self.finish is not None, "a feed ends with its StreamEnd"
        calls = None
        if self._calls is not None:
            out, calls = self._calls.finish()
            await self._send_read_out(out)
            for subscriber in self.subscribers if calls else ():
                subscriber.on_calls()
        for subscriber in self.subscribers:
            await subscriber.on_end()
        if (end_error := self.finish.error) is not None:
            code = relayed_code(end_error)
            error = self._error(code, end_error.message, code.retryable)
            await self._send(replace(error, retry_after_ms=end_error.retry_after_ms))
        await self._send(replace(done_event(self.response_id, self.stream_id, self.finish), tool_calls=calls))

    async def _send_delta(self, batch: Batch) -> None:
        text = batch.text
        delta = pe.ResponseDelta(
            response_id=self.response_id,
            stream_id=self.stream_id,
            start=batch.start,
            end=batch.end,
            text=text,
            token_ids=batch.token_ids if self._include_token_ids else None,
        )
        await self._send(delta)
        self.sent_end = batch.end
        self._on_delivered(text)
        if self._calls is None:
            for subscriber in self.subscribers:
                subscriber.on_delta(text)
        else:
            await self._send_read_out(self._calls.feed(text))

    async def _send_read_out(self, out: ReadOut) -> None:
        """A tool-mode answer's events, and its text that is no call to the subscribers."""
        for event in out.events:
            await self._send(event)
        for subscriber in self.subscribers:
            subscriber.on_delta(out.text)

    def _error(self, code: pe.ErrorCode, message: str, retryable: bool) -> pe.ErrorEvent:
        return pe.ErrorEvent(code=code, message=message, retryable=retryable, response_id=self.response_id)
