"""The token log: the seam between generation and delivery.

Each response writes one *stream*: an append-only list of :class:`LogEntry`
(token offsets ``[start, end)``, their ids and the text they complete),
closed by one :class:`StreamEnd`. The engine side writes every stream of one
engine step with one :meth:`TokenLog.write_step`; delivery reads a stream from
any offset with :meth:`TokenLog.read` (replay, then live, then the end).

Contract (both backends, one test suite: tests/session/test_token_log_contract.py):

- ``create_stream`` then any number of ``write_step`` calls; entries of one
  stream are contiguous (``entry.start`` equals the stream's end so far) and
  never empty (``end > start``): an offset alone must tell a resuming client
  what it already has, so a zero-width entry could be neither replayed nor
  skipped safely. A finish is the stream's last write; its ``end`` equals the
  stream's end.
- ``read(stream_id, from_offset)`` yields every entry with ``end > from_offset``
  (the first may start before ``from_offset``), follows a live stream, then
  yields the :class:`StreamEnd` and stops. ``from_offset`` equal to the final
  end yields only the ``StreamEnd``. Past the current end of a live stream it
  waits; if the stream then ends below ``from_offset`` it raises
  :class:`~session.errors.OffsetOutOfRange` (a :class:`StreamNotFound`), as it
  does at once for a complete stream.
- No silent gaps: a reader that finds offsets missing from the log (entries
  trimmed, evicted or expired while the stream's metadata remains) raises
  :class:`~session.errors.StreamTruncated` (a :class:`StreamNotFound`)
  instead of skipping them: an entry that starts past the reader's position,
  a finish that the entries do not reach, a log that lost every entry. Both
  backends apply one :class:`ReadCursor`.
- Retention: an ended stream (and a saved session) is kept ``retention_s``
  seconds after its end (after its last save), then it is gone:
  ``info`` returns ``None`` and ``read`` raises ``StreamNotFound``. A stream
  that never ends (its writer died) is dropped ``live_ttl_s`` after creation.
- The memory backend is for one event loop (not thread-safe); the app hands
  each engine step to the loop before writing.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from bisect import bisect_right
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from session.errors import (
    OffsetOutOfRange,
    StreamEnded,
    StreamExists,
    StreamNotFound,
    StreamTruncated,
    TokenLogUnavailable,
)

DEFAULT_RETENTION_S = 600.0
DEFAULT_LIVE_TTL_S = 3600.0
_MIN_COMPACT = 64  # stale expiry items the memory log tolerates before any rebuild


@dataclass(frozen=True, slots=True, kw_only=True)
class LogEntry:
    """Tokens ``[start, end)`` of a stream and the text they complete.

    ``token_ids`` has ``end - start`` ids; ``text`` may be empty (held back
    while it could begin a stop string) and is UTF-8 whole.
    """

    start: int
    end: int
    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class EndError:
    """A retryable error that every reader of a stream relays before its end.

    Today one case: a request dropped from the queue at its deadline
    (``code`` ``overloaded``). It lives in the log, not in the node that
    generated, so a client resuming the stream on any node hears it too.
    """

    code: str  # a PROTOCOL.md error code
    message: str
    retry_after_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamEnd:
    """The last event of a stream: total tokens, why it ended, usage, and the
    error to relay first, if any."""

    end: int
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    error: EndError | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamInfo:
    """What the log knows about one stream.

    ``create_stream`` takes one with ``status="live"``, ``end=0`` and
    ``finish=None``; ``info`` returns the current status, end and finish.
    """

    stream_id: str
    response_id: str
    principal: str
    session_id: str
    owner_node: str
    status: Literal["live", "complete"]
    end: int
    finish: StreamEnd | None


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamWrite:
    """One stream's part of one engine step: new tokens, a finish, or both.

    With both, the entry is written before the finish.
    """

    stream_id: str
    entry: LogEntry | None
    finish: StreamEnd | None


class TokenLog(Protocol):
    """Append-only per-response token streams with replay and live follow."""

    async def create_stream(self, info: StreamInfo) -> None:
        """Register a new live stream. Raises StreamExists."""
        ...

    async def write_step(self, writes: Sequence[StreamWrite]) -> None:
        """Append one engine step for all its streams in one backend write.

        Raises ValueError for a non-contiguous or empty entry (nothing is
        written then), StreamNotFound, StreamEnded, TokenLogUnavailable
        (its ``stream_ids`` are incomplete in the log and refused from then
        on; the step's other streams were written).
        """
        ...

    async def info(self, stream_id: str) -> StreamInfo | None:
        """The stream's current info, or None if unknown or expired."""
        ...

    def read(self, stream_id: str, from_offset: int) -> AsyncIterator[LogEntry | StreamEnd]:
        """Entries with ``end > from_offset``, live ones as written, then the StreamEnd.

        Raises (while iterating) StreamNotFound, OffsetOutOfRange,
        TokenLogUnavailable.
        """
        ...

    async def save_session(self, session_id: str, state: bytes) -> None:
        """Store a session's opaque state for ``retention_s`` from now."""
        ...

    async def load_session(self, session_id: str) -> bytes | None:
        """The last saved state, or None if unknown or expired."""
        ...

    async def ping(self) -> bool:
        """True when the backend answers now (for /readyz)."""
        ...

    async def close(self) -> None:
        """Release connections; pending readers raise TokenLogUnavailable."""
        ...


class StreamCursor:
    """Write-side validation of one stream: its end so far and whether it ended."""

    __slots__ = ("stream_id", "end", "ended")

    def __init__(self, stream_id: str, end: int = 0, ended: bool = False) -> None:
        self.stream_id = stream_id
        self.end = end
        self.ended = ended

    def check(self, write: StreamWrite) -> None:
        """Raise if ``write`` does not continue this stream; changes nothing.

        Raises ValueError (misuse) or StreamEnded.
        """
        if self.ended:
            raise StreamEnded(self.stream_id)
        if write.entry is None and write.finish is None:
            raise ValueError(f"write to {self.stream_id!r} has neither entry nor finish")
        end = self.end
        if (entry := write.entry) is not None:
            if entry.start != end or entry.end <= entry.start:
                raise ValueError(
                    f"entry [{entry.start}, {entry.end}) of {self.stream_id!r} must be "
                    f"non-empty and start at the stream's end {end}"
                )
            if len(entry.token_ids) != entry.end - entry.start:
                raise ValueError(f"entry of {self.stream_id!r} has {len(entry.token_ids)} ids "
                                 f"for {entry.end - entry.start} tokens")
            end = entry.end
        if write.finish is not None and write.finish.end != end:
            raise ValueError(f"finish end {write.finish.end} of {self.stream_id!r} != {end}")

    def advance(self, write: StreamWrite) -> None:
        """Apply a write that :meth:`check` accepted."""
        if write.entry is not None:
            self.end = write.entry.end
        if write.finish is not None:
            self.ended = True


class ReadCursor:
    """Read-side continuity of one reader: the offsets it has covered, and no gap past them.

    Every backend's reader passes each entry it found through :meth:`take`
    and the finish through :meth:`finish`, so a log that lost entries is
    refused the same way whatever lost them.
    """

    __slots__ = ("stream_id", "from_offset", "pos")

    def __init__(self, stream_id: str, from_offset: int) -> None:
        self.stream_id = stream_id
        self.from_offset = from_offset
        self.pos = from_offset  # offsets below it are the client's already, or yielded

    def take(self, entry: LogEntry) -> bool:
        """Whether to yield ``entry``: False for one wholly below the position
        (already covered: a reader past the live end skips up to its offset).

        Raises StreamTruncated when ``entry`` starts past the position: the
        offsets between were lost.
        """
        if entry.end <= self.pos:
            return False
        if entry.start > self.pos:
            raise StreamTruncated(self.stream_id, self.pos, entry.start)
        self.pos = entry.end
        return True

    def finish(self, end: StreamEnd) -> StreamEnd:
        """The finish to yield, once the entries before it were taken.

        Raises OffsetOutOfRange when the reader asked past the stream's end,
        StreamTruncated when the entries stop short of it.
        """
        if self.from_offset > end.end:
            raise OffsetOutOfRange(self.stream_id, self.from_offset, end.end)
        self.reached(end.end)
        return end

    def reached(self, end: int) -> None:
        """Assert that the entries read so far reach ``end``, the offset the log
        says the stream got to. Raises StreamTruncated if they stop short."""
        if self.pos < end:
            raise StreamTruncated(self.stream_id, self.pos)


def check_writes(
    writes: Sequence[StreamWrite], cursor_of: Callable[[str], StreamCursor]
) -> None:
    """Validate a whole step before any of it is written (all or nothing).

    A stream may appear more than once in a step; each write is checked
    against the ones before it. Raises like :meth:`StreamCursor.check` and
    whatever ``cursor_of`` raises (StreamNotFound).
    """
    shadows: dict[str, StreamCursor] = {}
    for write in writes:
        shadow = shadows.get(write.stream_id)
        if shadow is None:
            real = cursor_of(write.stream_id)
            shadow = shadows[write.stream_id] = StreamCursor(real.stream_id, real.end, real.ended)
        shadow.check(write)
        shadow.advance(write)


class _MemStream:
    """One stream of the memory backend."""

    __slots__ = ("info", "cursor", "entries", "ends", "finish", "changed", "expires_at", "gone",
                 "abandoned")

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

    def read(self, stream_id: str, from_offset: int) -> AsyncIterator[LogEntry | StreamEnd]:
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
        error end; session/service.py): readers get a retryable TokenLogUnavailable."""
        stream = self._streams.get(stream_id)
        if stream is not None and stream.finish is None:
            del self._streams[stream_id]
            stream.gone = stream.abandoned = True
            stream.notify()

    async def _read(self, stream_id: str, from_offset: int) -> AsyncIterator[LogEntry | StreamEnd]:
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
            self._expiry = [(stream.expires_at, False, sid)
                            for sid, stream in self._streams.items()]
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


def open_token_log(
    url: str | None,
    *,
    retention_s: float = DEFAULT_RETENTION_S,
    node_id: str = "node-0",
    clock: Callable[[], float] = time.monotonic,
) -> TokenLog:
    """The token log a server runs on.

    Args:
        url: ``None`` or ``"memory://"`` for :class:`MemoryTokenLog`;
            ``redis://``, ``rediss://`` or ``unix://`` for
            :class:`session.redis_log.RedisTokenLog` (no connection is made
            here: the first call connects, and ``ping`` reports health).
        retention_s: seconds an ended stream and a saved session are kept.
        node_id: this server's name, recorded as owner of the streams it writes.
        clock: monotonic seconds for the memory backend (Redis keeps its own time).

    Raises ValueError for another URL scheme.
    """
    if url is None or url == "memory://":
        return MemoryTokenLog(retention_s=retention_s, clock=clock)
    if url.startswith(("redis://", "rediss://", "unix://")):
        from session.redis_log import RedisLogConfig, RedisTokenLog  # redis only when used

        return RedisTokenLog(url, node_id=node_id, config=RedisLogConfig(retention_s=retention_s))
    raise ValueError(f"token log url {url!r} must be memory://, redis://, rediss:// or unix://")
