"""Delivery: one stream from the token log to one client, at the client's pace.

One :class:`Delivery` task per connection per stream. A reader task follows
the log from the last sent offset and queues entries; the sender awaits the
socket (``send`` returns once the frame is written), and whatever queued up
meanwhile goes out as one coalesced ``response.delta`` covering the whole
token range. Generation never waits for delivery: the engine writes to the
log, and a slow client only makes its deltas bigger.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from bargein.protocol import events as pe
from bargein.session.errors import StreamNotFound, StreamTruncated, TokenLogUnavailable
from bargein.session.log import EndError, LogEntry, StreamEnd, TokenLog
from bargein.session.observer import NullObserver, SessionObserver

logger = logging.getLogger(__name__)

SendEvent = Callable[[object], Awaitable[None]]
# Log entries read ahead of the socket; past it the reader waits, so a lagging
# client costs no memory beyond the log itself (whatever the log backend).
READ_AHEAD = 64


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


def done_event(response_id: str, stream_id: str, end: StreamEnd) -> pe.ResponseDone:
    """The ``response.done`` of a stream that ended with ``end``."""
    return pe.ResponseDone(
        response_id=response_id,
        stream_id=stream_id,
        end=end.end,
        finish_reason=end.finish_reason,
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
        on_delivered: called with each delta's text after it was sent.
        include_token_ids: put ``token_ids`` in the deltas.
        observer: told when delivery starts and ends and of each delta's size.

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
    ) -> None:
        self.log = log
        self.response_id = response_id
        self.stream_id = stream_id
        self.sent_end = from_offset  # offset after the last token sent
        self.finish: StreamEnd | None = None
        self._send = send
        self._on_delivered = on_delivered
        self._include_token_ids = include_token_ids
        self._observer: SessionObserver = observer or NullObserver()
        self._queue: asyncio.Queue[LogEntry | StreamEnd | BaseException] = asyncio.Queue(maxsize=READ_AHEAD)

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
        reader = asyncio.create_task(self._read(), name=f"read-{self.stream_id}")
        self._observer.delivery_started()
        try:
            await self._deliver()
        except StreamTruncated as exc:  # before StreamNotFound: a subclass of it
            await self._send(self._error(pe.ErrorCode.STREAM_TRUNCATED, truncated_message(exc), False))
        except StreamNotFound:
            await self._send(self._error(pe.ErrorCode.NOT_FOUND, "stream not found", False))
        except TokenLogUnavailable:
            await self._send(self._error(pe.ErrorCode.INTERNAL_ERROR, "token log unavailable", True))
        except Exception as exc:  # a bug: say so, and end this delivery explicitly
            logger.error(
                "delivery of stream %s failed (a bug in bargein): %r", self.stream_id, exc, exc_info=exc
            )
            await self._send(
                self._error(pe.ErrorCode.INTERNAL_ERROR, "delivery failed; resume the stream", True)
            )
        finally:
            self._observer.delivery_ended()
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _read(self) -> None:
        """Queue the log's items; any failure is queued too (the sender raises
        it), so a reader that stops never leaves the sender waiting."""
        try:
            async for item in self.log.read(self.stream_id, self.sent_end):
                await self._queue.put(item)
                if isinstance(item, StreamEnd):
                    return
            raise RuntimeError(f"the log's read of {self.stream_id} ended without its end")
        except Exception as exc:  # CancelledError is not caught: it stops the reader
            await self._queue.put(exc)

    async def _deliver(self) -> None:
        while self.finish is None:
            batch = [await self._queue.get()]
            while not self._queue.empty():  # what queued while the socket was busy
                batch.append(self._queue.get_nowait())
            entries = [i for i in batch if isinstance(i, LogEntry)]
            if entries:
                await self._send_delta(entries)
            for item in batch:
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, StreamEnd):
                    self.finish = item
        if (end_error := self.finish.error) is not None:
            code = relayed_code(end_error)
            error = self._error(code, end_error.message, code.retryable)
            await self._send(replace(error, retry_after_ms=end_error.retry_after_ms))
        await self._send(done_event(self.response_id, self.stream_id, self.finish))

    async def _send_delta(self, entries: list[LogEntry]) -> None:
        text = "".join(e.text for e in entries)
        token_ids = tuple(t for e in entries for t in e.token_ids)
        delta = pe.ResponseDelta(
            response_id=self.response_id,
            stream_id=self.stream_id,
            start=entries[0].start,
            end=entries[-1].end,
            text=text,
            token_ids=token_ids if self._include_token_ids else None,
        )
        self._observer.delta_sent(delta.end - delta.start)
        await self._send(delta)
        self.sent_end = entries[-1].end
        self._on_delivered(text)

    def _error(self, code: pe.ErrorCode, message: str, retryable: bool) -> pe.ErrorEvent:
        return pe.ErrorEvent(code=code, message=message, retryable=retryable, response_id=self.response_id)
