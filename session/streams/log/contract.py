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
  :class:`~bargein.session.errors.OffsetOutOfRange` (a :class:`StreamNotFound`), as it
  does at once for a complete stream.
- No silent gaps: a reader that finds offsets missing from the log (entries
  trimmed, evicted or expired while the stream's metadata remains) raises
  :class:`~bargein.session.errors.StreamTruncated` (a :class:`StreamNotFound`)
  instead of skipping them: an entry that starts past the reader's position,
  a finish that the entries do not reach, a log that lost every entry. Both
  backends apply one :class:`ReadCursor`. A stream that cannot go on because
  its log lost entries (its node died and the takeover found the prefix it
  would continue from incomplete) is ended with a finish that says so
  (:attr:`StreamEnd.truncated`): every reader then raises ``StreamTruncated``
  instead of waiting for tokens nobody will write.
- Retention: an ended stream (and a saved session) is kept ``retention_s``
  seconds after its end (after its last save), then it is gone:
  ``info`` returns ``None`` and ``read`` raises ``StreamNotFound``. A stream
  that never ends (its writer died) is dropped ``live_ttl_s`` after creation.
- The memory backend is for one event loop (not thread-safe); the app hands
  each engine step to the loop before writing.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from bargein.protocol.events import ErrorCode
from bargein.session.errors import (
    OffsetOutOfRange,
    StreamEnded,
    StreamTruncated,
)

DEFAULT_RETENTION_S = 600.0
DEFAULT_LIVE_TTL_S = 3600.0
# The EndError code of a stream ended because its log lost entries (docs/protocol.md section 6).
TRUNCATED_CODE = ErrorCode.STREAM_TRUNCATED.value


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

    code: str  # an error code of docs/protocol.md
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

    @property
    def truncated(self) -> bool:
        """Whether the stream was ended because its log lost entries: a reader
        raises StreamTruncated instead of yielding this end."""
        return self.error is not None and self.error.code == TRUNCATED_CODE


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
    # how its answer is read for function calls ("auto", "forced"; None: not),
    # so a resume on any connection or node reads it as it was generated
    tool_mode: str | None = None


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

    def read(self, stream_id: str, from_offset: int) -> AsyncGenerator[LogEntry | StreamEnd, None]:
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
                raise ValueError(
                    f"entry of {self.stream_id!r} has {len(entry.token_ids)} ids "
                    f"for {entry.end - entry.start} tokens"
                )
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

        Raises StreamTruncated when the entries stop short of it or the stream
        was ended for its lost entries (whatever the reader asked), else
        OffsetOutOfRange when the reader asked past the stream's end.
        """
        if end.truncated:
            raise StreamTruncated(self.stream_id, self.pos)
        if self.from_offset > end.end:
            raise OffsetOutOfRange(self.stream_id, self.from_offset, end.end)
        self.reached(end.end)
        return end

    def reached(self, end: int) -> None:
        """Assert that the entries read so far reach ``end``, the offset the log
        says the stream got to. Raises StreamTruncated if they stop short."""
        if self.pos < end:
            raise StreamTruncated(self.stream_id, self.pos)


def check_writes(writes: Sequence[StreamWrite], cursor_of: Callable[[str], StreamCursor]) -> None:
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
