"""The in-process token log: the embedded default and the test oracle."""

from __future__ import annotations

import asyncio
import heapq
import time
from bisect import bisect_right
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import replace
from typing import Literal

from bargein.session.errors import (
    StreamExists,
    StreamNotFound,
    TokenLogUnavailable,
)
from bargein.session.streams.log.contract import (
    DEFAULT_LIVE_TTL_S,
    DEFAULT_RETENTION_S,
    LogEntry,
    ReadCursor,
    StreamCursor,
    StreamEnd,
    StreamInfo,
    StreamWrite,
    check_writes,
)

_MIN_COMPACT = 64  # stale expiry items the memory log tolerates before any rebuild


class _MemStream:
    """One stream of the memory backend."""

    __slots__ = ("info", "cursor", "entries", "ends", "finish", "changed", "expires_at", "gone", "abandoned")

    def __init__(self, info: StreamInfo, expires_at: float) -> None:
        self.info = info
        self.cursor = StreamCursor(info.stream_id)
        self.entries: list[LogEntry] = []
        self.ends: list[int] = []  # entry ends, ascending: bisect finds a replay start
        self.finish: StreamEnd | None = None
        # Replaced after every change: a reader awaits the one it saw (no lost wake-up).
        self.changed = asyncio.Event()
        self.expires_at = expires_at
        self.gone = False  # dropped by its live TTL or close(): readers must stop
        self.abandoned = False  # dropped by abandon_stream: its readers may retry

    def notify(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()


class MemoryTokenLog:
    """In-process :class:`TokenLog`: the embedded default and the test oracle.

    Args:
        retention_s: seconds an ended stream and a saved session are kept.
        live_ttl_s: seconds after creation a stream that never ends is dropped.
        clock: monotonic seconds; tests pass a fake one. Expiry is checked
            lazily on every call, so a fake clock needs no timer.
    """

    def __init__(
        self,
        *,
        retention_s: float = DEFAULT_RETENTION_S,
        live_ttl_s: float = DEFAULT_LIVE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if retention_s <= 0 or live_ttl_s <= 0:
            raise ValueError(f"{retention_s=} and {live_ttl_s=} must be > 0")
        self._retention_s = retention_s
        self._live_ttl_s = live_ttl_s
        self._clock = clock
        self._streams: dict[str, _MemStream] = {}
        self._sessions: dict[str, tuple[bytes, float]] = {}
        # (expires_at, is_session, key); an item is stale once its key got a
        # later expiry (a save again, a stream's end) and is skipped when popped.
        # Stale items are compacted away before they outnumber live keys, so a
        # session saved a million times holds O(1) items, not a million.
        self._expiry: list[tuple[float, bool, str]] = []
        self._closed = False

    async def create_stream(self, info: StreamInfo) -> None:
        self._sweep()
        if self._closed:
            raise TokenLogUnavailable("token log closed", (info.stream_id,))
        if info.stream_id in self._streams:
            raise StreamExists(info.stream_id)
        expires_at = self._clock() + self._live_ttl_s
        info = replace(info, status="live", end=0, finish=None)
        self._streams[info.stream_id] = _MemStream(info, expires_at)
        self._push_expiry(expires_at, False, info.stream_id)

    async def write_step(self, writes: Sequence[StreamWrite]) -> None:
        self._sweep()
        check_writes(writes, lambda sid: self._stream(sid).cursor)
        touched: dict[str, _MemStream] = {}
        for write in writes:
            stream = touched[write.stream_id] = self._streams[write.stream_id]
            stream.cursor.advance(write)
            if write.entry is not None:
                stream.entries.append(write.entry)
                stream.ends.append(write.entry.end)
            if write.finish is not None:
                self._end(stream, write.finish)
        for stream in touched.values():
            stream.notify()

    async def info(self, stream_id: str) -> StreamInfo | None:
        self._sweep()
        stream = self._streams.get(stream_id)
        if stream is None:
            return None
        status: Literal["live", "complete"] = "live" if stream.finish is None else "complete"
        return replace(stream.info, status=status, end=stream.cursor.end, finish=stream.finish)

    def read(self, stream_id: str, from_offset: int) -> AsyncGenerator[LogEntry | StreamEnd, None]:
        if from_offset < 0:
            raise ValueError(f"{from_offset=} must be >= 0")
        return self._read(stream_id, from_offset)

    async def save_session(self, session_id: str, state: bytes) -> None:
        self._sweep()
        expires_at = self._clock() + self._retention_s
        self._sessions[session_id] = (bytes(state), expires_at)
        self._push_expiry(expires_at, True, session_id)

    async def load_session(self, session_id: str) -> bytes | None:
        self._sweep()
        saved = self._sessions.get(session_id)
        return None if saved is None else saved[0]

    async def ping(self) -> bool:
        return not self._closed

    async def close(self) -> None:
        self._closed = True
        for stream in self._streams.values():
            stream.gone = True
            stream.notify()
        self._streams.clear()
        self._sessions.clear()
        self._expiry.clear()

    def abandon_stream(self, stream_id: str) -> None:
        """Drop a live stream its writer gave up on (the log refused even its
        error end; session/runtime/service.py): readers get a retryable TokenLogUnavailable."""
        stream = self._streams.get(stream_id)
        if stream is not None and stream.finish is None:
            del self._streams[stream_id]
            stream.gone = stream.abandoned = True
            stream.notify()

    async def _read(self, stream_id: str, from_offset: int) -> AsyncGenerator[LogEntry | StreamEnd, None]:
        self._sweep()
        stream = self._stream(stream_id)
        cursor = ReadCursor(stream_id, from_offset)
        i = bisect_right(stream.ends, from_offset)  # first entry with end > from_offset
        while True:
            changed = stream.changed
            while i < len(stream.entries):  # a write during a yield extends the list
                i += 1
                if cursor.take(stream.entries[i - 1]):
                    yield stream.entries[i - 1]
            if stream.finish is not None:
                yield cursor.finish(stream.finish)
                return
            if stream.gone:
                raise self._gone_error(stream_id, stream.abandoned)
            if from_offset < stream.cursor.end:  # not past the live end: nothing may be missing
                cursor.reached(stream.cursor.end)
            await changed.wait()
            i = max(i, bisect_right(stream.ends, cursor.pos))

    def _gone_error(self, stream_id: str, abandoned: bool = False) -> Exception:
        if abandoned:
            return TokenLogUnavailable("its writer gave up on this stream", (stream_id,))
        if self._closed:
            return TokenLogUnavailable("token log closed", (stream_id,))
        return StreamNotFound(stream_id, "expired while live (its writer never ended it)")

    def _stream(self, stream_id: str) -> _MemStream:
        if self._closed:
            raise TokenLogUnavailable("token log closed", (stream_id,))
        stream = self._streams.get(stream_id)
        if stream is None:
            raise StreamNotFound(stream_id)
        return stream

    def _end(self, stream: _MemStream, finish: StreamEnd) -> None:
        stream.finish = finish
        stream.expires_at = self._clock() + self._retention_s
        self._push_expiry(stream.expires_at, False, stream.info.stream_id)

    @property
    def num_expiry_entries(self) -> int:
        """Items in the expiry heap, stale ones included (at most about twice
        the streams and sessions kept, whatever the number of saves)."""
        return len(self._expiry)

    def _push_expiry(self, expires_at: float, is_session: bool, key: str) -> None:
        """Schedule ``key``'s expiry; the item it had goes stale.

        Once the items outnumber twice the live keys (plus a floor, so small
        logs never rebuild), the heap is rebuilt from the live expiries: one
        O(n) rebuild per n pushes, O(1) amortised, and the heap stays within
        about twice the keys kept.
        """
        heapq.heappush(self._expiry, (expires_at, is_session, key))
        if len(self._expiry) > 2 * (len(self._streams) + len(self._sessions)) + _MIN_COMPACT:
            self._expiry = [(stream.expires_at, False, sid) for sid, stream in self._streams.items()]
            self._expiry += [(saved[1], True, sid) for sid, saved in self._sessions.items()]
            heapq.heapify(self._expiry)

    def _sweep(self) -> None:
        """Drop everything whose expiry has passed (amortised O(log n) each)."""
        now = self._clock()
        while self._expiry and self._expiry[0][0] <= now:
            _, is_session, key = heapq.heappop(self._expiry)
            if is_session:
                saved = self._sessions.get(key)
                if saved is not None and saved[1] <= now:
                    del self._sessions[key]
                continue
            stream = self._streams.get(key)
            if stream is not None and stream.expires_at <= now:
                del self._streams[key]
                stream.gone = True
                stream.notify()
