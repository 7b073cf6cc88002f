"""Delivery from the token log to a (fake, slow) socket: coalescing and offsets."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from bargein.protocol import events as pe
from bargein.session.errors import TokenLogUnavailable
from bargein.session.runtime.delivery import Batch, Delivery, feed
from bargein.session.runtime.observer import NullObserver
from bargein.session.streams.log import EndError, LogEntry, MemoryTokenLog, StreamEnd, StreamInfo, StreamWrite
from tests.waiting import HANG_GUARD_S, wait_until

WORDS = ["Paris", " is", " the", " capital", " of", " France", "."]


async def new_stream(log: MemoryTokenLog, stream_id: str = "s1") -> None:
    await log.create_stream(
        StreamInfo(
            stream_id=stream_id,
            response_id="r1",
            principal="p",
            session_id="sess",
            owner_node="n",
            status="live",
            end=0,
            finish=None,
        )
    )


def step(i: int, stream_id: str = "s1") -> list[StreamWrite]:
    entry = LogEntry(start=i, end=i + 1, text=WORDS[i], token_ids=(100 + i,))
    return [StreamWrite(stream_id=stream_id, entry=entry, finish=None)]


def finish(end: int) -> list[StreamWrite]:
    done = StreamEnd(end=end, finish_reason="stop", prompt_tokens=9, completion_tokens=end, cached_tokens=0)
    return [StreamWrite(stream_id="s1", entry=None, finish=done)]


class SlowSocket:
    """Records events; each send blocks until the test releases it."""

    def __init__(self) -> None:
        self.events: list[object] = []
        self.gate = asyncio.Event()

    async def send(self, event: object) -> None:
        self.events.append(event)
        await self.gate.wait()


async def test_tokens_written_while_the_socket_is_busy_go_out_as_one_delta() -> None:
    log = MemoryTokenLog()
    await new_stream(log)
    socket = SlowSocket()
    delivered: list[str] = []
    delivery = Delivery(
        log,
        response_id="r1",
        stream_id="s1",
        from_offset=0,
        send=socket.send,
        on_delivered=delivered.append,
        include_token_ids=True,
    )
    task = asyncio.create_task(delivery.run())
    await log.write_step(step(0))
    await wait_until(lambda: socket.events, "the first delta on the (blocked) wire")
    for i in range(1, len(WORDS)):  # the engine goes on meanwhile
        await log.write_step(step(i))
    await log.write_step(finish(len(WORDS)))
    socket.gate.set()
    await asyncio.wait_for(task, HANG_GUARD_S)
    first, second, done = socket.events
    assert first == pe.ResponseDelta(
        response_id="r1", stream_id="s1", start=0, end=1, text="Paris", token_ids=(100,)
    )
    assert isinstance(second, pe.ResponseDelta)
    assert (second.start, second.end, second.text) == (1, 7, " is the capital of France.")
    assert second.token_ids == tuple(range(101, 107))
    assert isinstance(done, pe.ResponseDone)
    assert (done.end, done.finish_reason, done.usage.completion_tokens) == (7, "stop", 7)
    assert "".join(delivered) == "".join(WORDS)


async def test_delivery_from_an_offset_sends_only_the_rest() -> None:
    log = MemoryTokenLog()
    await new_stream(log)
    for i in range(len(WORDS)):
        await log.write_step(step(i))
    await log.write_step(finish(len(WORDS)))
    socket = SlowSocket()
    socket.gate.set()
    await Delivery(log, response_id="r1", stream_id="s1", from_offset=3, send=socket.send).run()
    deltas = [e for e in socket.events if isinstance(e, pe.ResponseDelta)]
    assert "".join(d.text for d in deltas) == " capital of France."
    assert deltas[0].start == 3 and deltas[-1].end == 7
    assert all(d.token_ids is None for d in deltas)  # not asked for
    assert isinstance(socket.events[-1], pe.ResponseDone)


@pytest.mark.parametrize(
    ("code", "sent"),
    [("overloaded", pe.ErrorCode.OVERLOADED), ("from_a_newer_node", pe.ErrorCode.INTERNAL_ERROR)],
)
async def test_an_error_in_the_end_goes_out_before_the_done(code: str, sent: pe.ErrorCode) -> None:
    log = MemoryTokenLog()
    await new_stream(log)
    dropped = StreamEnd(
        end=0,
        finish_reason="cancelled",
        prompt_tokens=9,
        completion_tokens=0,
        cached_tokens=0,
        error=EndError(code=code, message="no first token", retry_after_ms=1200),
    )
    await log.write_step([StreamWrite(stream_id="s1", entry=None, finish=dropped)])
    socket = SlowSocket()
    socket.gate.set()
    await Delivery(log, response_id="r1", stream_id="s1", from_offset=0, send=socket.send).run()
    error, done = socket.events
    assert error == pe.ErrorEvent(
        code=sent, message="no first token", retryable=True, response_id="r1", retry_after_ms=1200
    )
    assert isinstance(done, pe.ResponseDone) and done.finish_reason == "cancelled"


async def test_unknown_stream_is_answered_with_not_found() -> None:
    socket = SlowSocket()
    socket.gate.set()
    await Delivery(
        MemoryTokenLog(), response_id="r1", stream_id="nope", from_offset=0, send=socket.send
    ).run()
    (error,) = socket.events
    assert isinstance(error, pe.ErrorEvent) and error.code is pe.ErrorCode.NOT_FOUND


# ---- fault injection: the delivery's reader (issue 24) ----------------------------


class BrokenReadLog(MemoryTokenLog):
    """A log whose reads yield ``good`` entries, then raise (a bug in a backend)."""

    def __init__(self, exc: BaseException | None) -> None:
        super().__init__()
        self.exc = exc

    async def _broken(self, stream_id: str, from_offset: int):  # type: ignore[no-untyped-def]
        async for item in super().read(stream_id, from_offset):
            yield item
            if self.exc is not None:
                raise self.exc
            return  # the end never comes: the read just stops

    def read(self, stream_id: str, from_offset: int):  # type: ignore[no-untyped-def]
        return self._broken(stream_id, from_offset)


@pytest.mark.parametrize("exc", [RuntimeError("injected"), ValueError("a bad cursor"), None])
async def test_a_reader_that_fails_ends_the_delivery_with_a_retryable_error(
    exc: BaseException | None,
) -> None:
    log = BrokenReadLog(exc)
    await new_stream(log)
    await log.write_step(step(0))
    socket = SlowSocket()
    socket.gate.set()
    delivery = Delivery(log, response_id="r1", stream_id="s1", from_offset=0, send=socket.send)
    await asyncio.wait_for(delivery.run(), HANG_GUARD_S)  # used to wait forever
    delta, error = socket.events
    assert isinstance(delta, pe.ResponseDelta) and delta.text == WORDS[0]
    assert isinstance(error, pe.ErrorEvent) and error.code is pe.ErrorCode.INTERNAL_ERROR
    assert error.retryable and error.response_id == "r1"  # the client resumes from 1


async def test_a_failing_send_side_ends_the_delivery_with_an_error() -> None:
    log = MemoryTokenLog()
    await new_stream(log)
    await log.write_step(step(0))
    await log.write_step(finish(1))
    socket = SlowSocket()
    socket.gate.set()

    def broken(text: str) -> None:
        raise RuntimeError("injected: the session refused the delivered text")

    await asyncio.wait_for(
        Delivery(
            log, response_id="r1", stream_id="s1", from_offset=0, send=socket.send, on_delivered=broken
        ).run(),
        HANG_GUARD_S,
    )
    assert isinstance(socket.events[-1], pe.ErrorEvent)
    assert socket.events[-1].code is pe.ErrorCode.INTERNAL_ERROR


class CountingObserver(NullObserver):
    def __init__(self) -> None:
        self.started = self.ended = 0
        self.batch_sizes: list[int] = []

    def delivery_started(self) -> None:
        self.started += 1

    def delivery_ended(self) -> None:
        self.ended += 1

    def delta_sent(self, num_tokens: int) -> None:
        self.batch_sizes.append(num_tokens)


class HandingLog(MemoryTokenLog):
    """Counts the items its reads have handed out."""

    def __init__(self) -> None:
        super().__init__()
        self.handed = 0

    async def _counted(self, stream_id: str, from_offset: int):  # type: ignore[no-untyped-def]
        async for item in super().read(stream_id, from_offset):
            self.handed += 1
            yield item

    def read(self, stream_id: str, from_offset: int):  # type: ignore[no-untyped-def]
        return self._counted(stream_id, from_offset)


async def test_a_feed_coalesces_within_its_read_ahead_and_counts_what_it_hands_over() -> None:
    """The one delivery path of every transport: what queued comes as one
    batch, but never more than the read-ahead is queued for a slow consumer."""
    log = HandingLog()
    await new_stream(log)
    for i in range(len(WORDS)):
        await log.write_step(step(i))
    await log.write_step(finish(len(WORDS)))
    observer = CountingObserver()
    items = feed(log, "s1", 0, observer=observer, read_ahead=3)
    got = []
    num_items, seen = len(WORDS) + 1, 0  # the entries and the end
    async with contextlib.aclosing(items):
        async for item in items:
            got.append(item)
            seen += len(item.entries) if isinstance(item, Batch) else 1
            # A slow consumer: it takes the next item once the reader filled the
            # read-ahead (3 queued, and a 4th read, waiting for room) or read all.
            full = min(seen + 3 + 1, num_items)
            await wait_until(lambda full=full: log.handed >= full, "the reader to fill the read-ahead")
    batches = [b for b in got if isinstance(b, Batch)]
    assert isinstance(got[-1], StreamEnd) and got[-1].end == len(WORDS)
    assert "".join(b.text for b in batches) == "".join(WORDS)
    assert [b.start for b in batches[1:]] == [b.end for b in batches[:-1]]  # contiguous
    assert all(len(b.entries) <= 3 for b in batches)  # bounded by the read-ahead
    assert any(len(b.entries) > 1 for b in batches)  # and coalesced
    assert observer.batch_sizes == [b.end - b.start for b in batches]
    assert (observer.started, observer.ended) == (1, 1)


async def test_a_feed_closed_early_stops_its_reader() -> None:
    log = MemoryTokenLog()
    await new_stream(log)
    await log.write_step(step(0))
    observer = CountingObserver()
    items = feed(log, "s1", 0, observer=observer)
    async with contextlib.aclosing(items):
        first = await anext(items)
    assert isinstance(first, Batch) and first.text == WORDS[0]
    assert observer.ended == 1
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "read-s1"]


async def test_a_feed_hands_over_what_it_read_before_the_log_failed() -> None:
    log = MemoryTokenLog()
    await new_stream(log)
    await log.write_step(step(0))
    items = feed(log, "s1", 0)
    got: list[object] = []
    with pytest.raises(TokenLogUnavailable):
        async with contextlib.aclosing(items):
            async for item in items:
                got.append(item)
                log.abandon_stream("s1")
    assert [b.text for b in got if isinstance(b, Batch)] == [WORDS[0]]
