"""Every event of the bargein v1 wire protocol (docs/protocol.md) as a dataclass.

Events are frozen, slotted, keyword-only dataclasses whose field names are the
wire names, with one exception: the wire field ``from`` (a Python keyword) is
the attribute ``from_``. Each event class has a ``type`` class attribute, the
wire ``type`` string. Optional fields default to ``None`` and are left out of
encoded frames when ``None``; ``None`` in a decoded event means "not given".
Sequences are tuples so events stay hashable and immutable.

Enumerated string values are :data:`typing.Literal` types (``Role``,
``OnDisconnect``, ``FinishReasonName``, ``StreamStatus``) except error codes,
a ``str`` enum because each carries a default ``retryable``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import ClassVar, Literal, TypeAlias

PROTOCOL_VERSION = "bargein.v1"
# The largest token offset, character or millisecond count, or token count a
# client may send (``from``, ``heard_chars``, ``audio_end_ms``, ``max_tokens``,
# ``top_k``; an SSE position). Far past anything a stream holds, and it fits
# an int32 everywhere a value travels (torch, msgpack, Redis stream ids), so
# no bigger number reaches those layers: it is refused where it comes in.
MAX_OFFSET = 2**31 - 1

Role = Literal["system", "user", "assistant"]
OnDisconnect = Literal["continue", "cancel"]
FinishReasonName = Literal["stop", "length", "interrupted", "cancelled", "error"]
StreamStatus = Literal["live", "complete"]


class ErrorCode(str, enum.Enum):
    """The ``code`` of an ``error`` event, with its default ``retryable``."""

    INVALID_MESSAGE = "invalid_message"
    UNKNOWN_TYPE = "unknown_type"
    INVALID_PARAMETER = "invalid_parameter"
    PROMPT_TOO_LONG = "prompt_too_long"
    CONFLICT = "conflict"
    NOT_FOUND = "not_found"
    STREAM_TRUNCATED = "stream_truncated"  # the log lost offsets a resume needs
    FORBIDDEN = "forbidden"
    RATE_LIMITED = "rate_limited"
    OVERLOADED = "overloaded"
    INTERNAL_ERROR = "internal_error"

    @property
    def retryable(self) -> bool:
        """Whether the same event may succeed if sent again later, unchanged."""
        return self in _RETRYABLE


_RETRYABLE = frozenset({ErrorCode.RATE_LIMITED, ErrorCode.OVERLOADED, ErrorCode.INTERNAL_ERROR})


class CloseCode(enum.IntEnum):
    """WebSocket close codes the server uses (an ``int``, usable as is)."""

    NORMAL = 1000
    GOING_AWAY = 1001  # server shutting down
    INVALID_UTF8 = 1007  # invalid UTF-8 in a text frame
    POLICY_VIOLATION = 1008  # origin, repeated abuse
    MESSAGE_TOO_BIG = 1009  # frame over max_frame_bytes
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013  # overloaded at connect
    CLIENT_TOO_SLOW = 4008  # the client can resume


# --- nested values ----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class InputItem:
    """One conversation item of ``response.create.input``."""

    role: Role
    content: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingDefaults:
    """Sampling defaults of a session (``session.defaults``); same rules as ``response.create``."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionSettings:
    """Session settings: a partial update in ``session.update``, all in force in ``session.updated``."""

    instructions: str | None = None
    defaults: SamplingDefaults | None = None
    on_disconnect: OnDisconnect | None = None
    include_token_ids: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Limits announced in ``session.created`` (bytes and tokens)."""

    max_frame_bytes: int
    max_prompt_tokens: int
    max_tokens: int
    max_context_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ActiveStream:
    """The response a resumed session still has in flight (``session.resumed.active``)."""

    response_id: str
    stream_id: str
    resume_token: str
    end: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Token counts of a finished response."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


# --- client to server -------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionUpdate:
    """Change the session; answered with ``session.updated``."""

    type: ClassVar[str] = "session.update"
    session: SessionSettings
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseCreate:
    """Generate the next assistant turn; ``input`` items are appended first."""

    type: ClassVar[str] = "response.create"
    response_id: str | None = None
    input: tuple[InputItem, ...] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    interrupt_active: bool | None = None
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseCancel:
    """Barge-in: stop a response; ``heard_chars`` cuts the kept assistant turn."""

    type: ClassVar[str] = "response.cancel"
    response_id: str
    heard_chars: int | None = None
    audio_end_ms: int | None = None
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamResume:
    """Replay a stream from token offset ``from_`` (wire ``from``), then follow it live."""

    type: ClassVar[str] = "stream.resume"
    stream_id: str
    resume_token: str
    from_: int = field(metadata={"wire": "from"})
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionResume:
    """Re-attach the conversation of an earlier connection."""

    type: ClassVar[str] = "session.resume"
    session_id: str
    session_token: str
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Ping:
    """Answered with ``pong``."""

    type: ClassVar[str] = "ping"
    event_id: str | None = None


ClientEvent: TypeAlias = SessionUpdate | ResponseCreate | ResponseCancel | StreamResume | SessionResume | Ping

# --- server to client -------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionCreated:
    """First event of a new connection."""

    type: ClassVar[str] = "session.created"
    session_id: str
    session_token: str
    model: str
    limits: Limits
    protocol: str = PROTOCOL_VERSION


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionUpdated:
    """The session settings now in force."""

    type: ClassVar[str] = "session.updated"
    session: SessionSettings


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionResumed:
    """Answer to ``session.resume``; ``active`` is sent as ``null`` when there is none."""

    type: ClassVar[str] = "session.resumed"
    session_id: str
    turns: int
    active: ActiveStream | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseCreated:
    """A response started; its stream can be resumed with ``resume_token``."""

    type: ClassVar[str] = "response.created"
    response_id: str
    stream_id: str
    resume_token: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseDelta:
    """Text completed by tokens ``[start, end)`` of the stream."""

    type: ClassVar[str] = "response.delta"
    response_id: str
    stream_id: str
    start: int
    end: int
    text: str
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseDone:
    """Last event of a response; ``end`` is the total number of tokens."""

    type: ClassVar[str] = "response.done"
    response_id: str
    stream_id: str
    end: int
    finish_reason: FinishReasonName
    usage: Usage


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamResumed:
    """Answer to ``stream.resume``; deltas from ``from_`` (wire ``from``) follow."""

    type: ClassVar[str] = "stream.resumed"
    stream_id: str
    response_id: str
    from_: int = field(metadata={"wire": "from"})
    status: StreamStatus


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorEvent:
    """The ``error`` event; the connection stays open."""

    type: ClassVar[str] = "error"
    code: ErrorCode
    message: str
    retryable: bool
    retry_after_ms: int | None = None
    event_id: str | None = None
    response_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Pong:
    """Answer to ``ping``."""

    type: ClassVar[str] = "pong"


ServerEvent: TypeAlias = (
    SessionCreated
    | SessionUpdated
    | SessionResumed
    | ResponseCreated
    | ResponseDelta
    | ResponseDone
    | StreamResumed
    | ErrorEvent
    | Pong
)

CLIENT_EVENTS: dict[str, type[ClientEvent]] = {
    c.type: c for c in (SessionUpdate, ResponseCreate, ResponseCancel, StreamResume, SessionResume, Ping)
}
SERVER_EVENTS: dict[str, type[ServerEvent]] = {
    c.type: c
    for c in (
        SessionCreated,
        SessionUpdated,
        SessionResumed,
        ResponseCreated,
        ResponseDelta,
        ResponseDone,
        StreamResumed,
        ErrorEvent,
        Pong,
    )
}

__all__ = [
    "PROTOCOL_VERSION",
    "MAX_OFFSET",
    "Role",
    "OnDisconnect",
    "FinishReasonName",
    "StreamStatus",
    "ErrorCode",
    "CloseCode",
    "InputItem",
    "SamplingDefaults",
    "SessionSettings",
    "Limits",
    "ActiveStream",
    "Usage",
    "SessionUpdate",
    "ResponseCreate",
    "ResponseCancel",
    "StreamResume",
    "SessionResume",
    "Ping",
    "ClientEvent",
    "SessionCreated",
    "SessionUpdated",
    "SessionResumed",
    "ResponseCreated",
    "ResponseDelta",
    "ResponseDone",
    "StreamResumed",
    "ErrorEvent",
    "Pong",
    "ServerEvent",
    "CLIENT_EVENTS",
    "SERVER_EVENTS",
]
