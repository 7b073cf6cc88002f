"""Exceptions of the session package (token log, sessions, resume tokens)."""

from __future__ import annotations


class SessionError(Exception):
    """Base of every error the session package raises on purpose."""


class TokenLogError(SessionError):
    """Base of the token log's errors."""


class StreamNotFound(TokenLogError):
    """The stream is unknown, expired, or no longer holds the offsets asked for.

    Maps to the protocol's ``not_found``: a client never gets a silent gap.
    """

    def __init__(self, stream_id: str, reason: str = "unknown or expired") -> None:
        super().__init__(f"stream {stream_id!r}: {reason}")
        self.stream_id = stream_id
        self.reason = reason


class OffsetOutOfRange(StreamNotFound):
    """``from_offset`` lies beyond the final end of a complete stream.

    A subclass of :class:`StreamNotFound` so a caller that only maps
    ``not_found`` stays correct; a caller may map it to ``invalid_parameter``.
    """

    def __init__(self, stream_id: str, from_offset: int, end: int) -> None:
        super().__init__(stream_id, f"from={from_offset} is past the stream's end {end}")
        self.from_offset = from_offset
        self.end = end


class StreamTruncated(StreamNotFound):
    """The stream is known but its log no longer holds offsets a reader needs.

    Entries were lost while the stream's metadata remained: trimmed by an
    operator (``XTRIM``), evicted under ``maxmemory``, or the entries key
    expired or deleted. Maps to the protocol's ``stream_truncated`` (not
    retryable: the tokens will not come back); a caller that only knows
    :class:`StreamNotFound` still reports it as a refusal, never as a gap.

    Attributes:
        missing_from: the first offset the log should hold and does not.
        missing_to: the first offset it holds again, or None when nothing
            after ``missing_from`` is held.
    """

    def __init__(self, stream_id: str, missing_from: int, missing_to: int | None = None) -> None:
        held = "nothing after it is" if missing_to is None else f"the log resumes at {missing_to}"
        super().__init__(stream_id, f"log entries lost from offset {missing_from} ({held})")
        self.missing_from = missing_from
        self.missing_to = missing_to


class StreamExists(TokenLogError):
    """``create_stream`` was called with a stream id that already exists."""

    def __init__(self, stream_id: str) -> None:
        super().__init__(f"stream {stream_id!r} already exists")
        self.stream_id = stream_id


class StreamEnded(TokenLogError):
    """A write reached a stream that already has its finish."""

    def __init__(self, stream_id: str) -> None:
        super().__init__(f"stream {stream_id!r} has already ended")
        self.stream_id = stream_id


class TokenLogUnavailable(TokenLogError):
    """The backend could not be reached within the bounded retry time.

    Attributes:
        stream_ids: the streams whose write (or read) failed; their log is now
            incomplete, so the caller ends them with ``finish_reason="error"``
            and a retryable ``error`` event. Empty for a failure that is not
            tied to streams (``create_stream`` of one stream names it).
    """

    def __init__(self, message: str, stream_ids: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.stream_ids = stream_ids


class StreamFenced(TokenLogUnavailable):
    """Another node took these streams over (their lease has a newer epoch):
    this node's writes to them were refused and nothing of them was written.

    The caller stops generating them (frees their KV blocks); their readers
    here get a retryable error and resume, on any node, the stream the new
    owner writes. A subclass of :class:`TokenLogUnavailable`, so a caller
    that only handles that still stops the streams.
    """

    def __init__(self, stream_ids: tuple[str, ...]) -> None:
        super().__init__("another node continues these streams", stream_ids)


class NodeIdInUse(SessionError):
    """Another live node holds this node's ``--node-id`` on the shared Redis.

    Attributes:
        node_id: the id both nodes were given.
    """

    def __init__(self, node_id: str, waited_s: float) -> None:
        super().__init__(
            f"--node-id {node_id!r} is held by another live node on this Redis (still renewed after "
            f"{waited_s:.1f} s); give each node its own id, or leave --node-id unset for a unique one"
        )
        self.node_id = node_id
