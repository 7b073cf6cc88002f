"""Every event of the bargein v1 wire protocol (docs/protocol.md) as a dataclass.

Events are frozen, slotted, keyword-only dataclasses whose field names are the
wire names, with one exception: the wire field ``from`` (a Python keyword) is
the attribute ``from_``. Each event class has a ``type`` class attribute, the
wire ``type`` string. Optional fields default to ``None`` and are left out of
encoded frames when ``None``; ``None`` in a decoded event means "not given".
Sequences are tuples so events stay hashable and immutable.

Enumerated values are :data:`typing.Literal` types (``Role``,
``OnDisconnect``, ``FinishReasonName``, ``StreamStatus``, ``Modality``,
``TurnDetectionType``, ``Eagerness``, ``SampleRate``) except error codes, a ``str`` enum
because each carries a default ``retryable``.

Audio (docs/protocol.md section 8). Audio is pcm16: 16-bit little-endian mono
PCM. An audio field is ``bytes`` here (the samples themselves); the codec
writes it as a base64 string in JSON frames and as msgpack ``bin`` in msgpack
frames. Positions in audio are integer milliseconds counted from samples.

Two wire nulls mean something other than "not given", so they decode to a
value of their own instead of ``None``:

- ``turn_detection: null`` (detection off) is :data:`TURN_DETECTION_OFF`,
  ``TurnDetectionSettings(type="none")``: the same value the wire form
  ``{"type": "none"}`` decodes to, so "off" has one representation.
- ``output: null`` (text only) is :data:`AUDIO_OUTPUT_OFF`,
  ``AudioOutputSettings(enabled=False)``. ``enabled`` is not a wire field: it
  only marks this value, which takes no other field.

Both are written back as ``null``. As ``SessionSettings``, the audio settings
are a partial update in ``session.update`` (``None``: unchanged) and complete
in ``session.updated`` (every field given; the two values above for "off").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import ClassVar, Literal, TypeAlias

PROTOCOL_VERSION = "bargein.v1"
# The largest token offset, character or millisecond count, or token count a
# client may send (``from``, ``heard_chars``, ``audio_end_ms``,
# ``audio_from_ms``, ``max_tokens``, ``top_k``; an SSE position). Far past
# anything a stream holds, and it fits an int32 everywhere a value travels
# (torch, msgpack, Redis stream ids), so no bigger number reaches those
# layers: it is refused where it comes in.
MAX_OFFSET = 2**31 - 1

Role = Literal["system", "user", "assistant", "tool"]
OnDisconnect = Literal["continue", "cancel"]
FinishReasonName = Literal["stop", "length", "interrupted", "cancelled", "error"]
StreamStatus = Literal["live", "complete"]
Modality = Literal["text", "audio"]
TurnDetectionType = Literal["server_vad", "semantic_vad", "none"]
Eagerness = Literal["low", "medium", "high", "auto"]  # semantic_vad: how soon a turn ends
InterruptionMode = Literal["immediate", "confirm"]  # how speech over a spoken answer interrupts it
DiscardReason = Literal["backchannel", "no_words", "echo"]  # why speech over an answer was no turn
SampleRate = Literal[16000, 24000]  # samples per second of pcm16 audio
ToolChoiceMode = Literal["auto", "none", "required"]  # whether the model may, must not or must call
ToolMode = Literal["auto", "forced"]  # how an answer is read for calls: maybe calls, or calls for sure


class JsonText(str):
    """A JSON object carried as its compact JSON text (keys in their order), so
    an event holding one stays hashable; on the wire it is the object itself."""


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
class FunctionCall:
    """One call the model made (or a client replays in ``input``).

    Attributes:
        call_id: the call's id (``call_...``); a tool item answers it.
        name: the function.
        arguments: the arguments' JSON text, as the model wrote it.
    """

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True, kw_only=True)
class InputItem:
    """One conversation item of ``response.create.input``; ``item_id`` names it
    (default: the server makes one).

    Attributes:
        tool_call_id: ``role: "tool"`` only (and required there): the call
            whose result ``content`` is.
        tool_calls: ``role: "assistant"`` only: the calls the turn made (its
            ``content`` then ``""``).
    """

    role: Role
    content: str
    item_id: str | None = None
    tool_call_id: str | None = None
    tool_calls: tuple[FunctionCall, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionTool:
    """A function the model may call (OpenAI Realtime's flat tool form).

    Attributes:
        type: always ``"function"``.
        name: 1 to 64 letters, digits, ``_`` or ``-``.
        description: what it does, for the model.
        parameters: the JSON schema of its arguments (an object schema;
            default: no arguments).
    """

    type: Literal["function"] = "function"
    name: str
    description: str | None = None
    parameters: JsonText | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NamedToolChoice:
    """``tool_choice`` naming the one function the model must call."""

    type: Literal["function"] = "function"
    name: str


ToolChoice: TypeAlias = ToolChoiceMode | NamedToolChoice


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
class InterruptionSettings:
    """How speech over a spoken answer interrupts it (``turn_detection.interruption``, docs/protocol.md 8.7).

    Attributes:
        mode: ``confirm``: the answer's audio pauses and the speech's words
            decide (cut, or resume from the paused millisecond);
            ``immediate``: the answer is interrupted as soon as speech starts.
        min_words: words of the user's own (not backchannels, not the
            answer's echo) that make a real interruption, in [1, 16].
        backchannels: phrases that never interrupt ("mm-hm", "yeah"); the
            list replaces the server's.
        max_pause_ms: the longest the answer stays paused before the words
            decide, milliseconds of the user's audio, in [100, 2000].
    """

    mode: InterruptionMode | None = None
    min_words: int | None = None
    backchannels: tuple[str, ...] | None = None
    max_pause_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnDetectionSettings:
    """How the server finds the user's turns in the input audio (``session.audio.input.turn_detection``).

    ``type="none"`` alone (:data:`TURN_DETECTION_OFF`, wire ``null`` or
    ``{"type": "none"}``) turns detection off: the client ends each turn with
    ``input_audio.commit``.

    Attributes:
        type: ``"server_vad"`` (voice activity detection: a turn ends after a
            fixed silence), ``"semantic_vad"`` (a turn ends when a model judges
            the user done, docs/protocol.md 8.3) or ``"none"``.
        threshold: ``server_vad`` only: speech probability above which a frame is speech, in (0, 1).
        prefix_padding_ms: ``server_vad`` only: audio kept before the detected start of speech, milliseconds.
        silence_duration_ms: ``server_vad`` only: silence that ends a turn, milliseconds.
        interrupt_response: the start of speech interrupts an active response (barge-in by voice).
        create_response: the end of a turn starts a response.
        eagerness: ``semantic_vad`` only: how soon a turn ends (``low`` waits
            longest for the user to go on, ``high`` answers soonest; ``auto``
            is ``medium``).
        interruption: how speech over a spoken answer interrupts it (with
            ``interrupt_response``); merged field by field.
    """

    type: TurnDetectionType | None = None
    threshold: float | None = None
    prefix_padding_ms: int | None = None
    silence_duration_ms: int | None = None
    interrupt_response: bool | None = None
    create_response: bool | None = None
    eagerness: Eagerness | None = None
    interruption: InterruptionSettings | None = None


TURN_DETECTION_OFF = TurnDetectionSettings(type="none")


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioInputSettings:
    """The user's audio (``session.audio.input``).

    Attributes:
        sample_rate: samples per second of the ``input_audio.append`` audio.
        turn_detection: :data:`TURN_DETECTION_OFF` for the wire's ``null``.
    """

    sample_rate: SampleRate | None = None
    turn_detection: TurnDetectionSettings | None = field(default=None, metadata={"null": TURN_DETECTION_OFF})


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioOutputSettings:
    """The server's spoken responses (``session.audio.output``).

    Attributes:
        enabled: ``False`` only in :data:`AUDIO_OUTPUT_OFF` (the wire's
            ``null``, text only); not a wire field.
        sample_rate: samples per second of the ``response.audio.delta`` audio.
        voice: the server's name of the speaking voice.
    """

    enabled: bool = field(default=True, metadata={"wire": None})
    sample_rate: SampleRate | None = None
    voice: str | None = None

    def __post_init__(self) -> None:
        assert self.enabled or (self.sample_rate is None and self.voice is None), "text only takes no field"


AUDIO_OUTPUT_OFF = AudioOutputSettings(enabled=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioSettings:
    """Audio settings of a session (``session.audio``): partial in an update, complete in force.

    Attributes:
        input: the user's audio.
        output: the spoken responses; :data:`AUDIO_OUTPUT_OFF` for the wire's ``null``.
    """

    input: AudioInputSettings | None = None
    output: AudioOutputSettings | None = field(default=None, metadata={"null": AUDIO_OUTPUT_OFF})


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionSettings:
    """Session settings: a partial update in ``session.update``, all in force in ``session.updated``."""

    instructions: str | None = None
    defaults: SamplingDefaults | None = None
    on_disconnect: OnDisconnect | None = None
    include_token_ids: bool | None = None
    audio: AudioSettings | None = None
    tools: tuple[FunctionTool, ...] | None = None
    tool_choice: ToolChoice | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Limits announced in ``session.created`` (bytes, tokens, milliseconds).

    ``max_input_audio_ms`` and ``max_voice_turns`` are announced only by a
    server with audio: the most uncommitted input audio it holds, and the most
    turns of one connection being transcribed at once.
    """

    max_frame_bytes: int
    max_prompt_tokens: int
    max_tokens: int
    max_context_tokens: int
    # most UTF-8 bytes of text one conversation holds (None: a server from before it was announced)
    max_conversation_bytes: int | None = None
    max_input_audio_ms: int | None = None
    max_voice_turns: int | None = None


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
    modalities: tuple[Modality, ...] | None = None  # ("text",) or ("text", "audio"); None: the session's
    instructions: str | None = None  # this response's system prompt, in place of the session's
    tools: tuple[FunctionTool, ...] | None = None  # in place of the session's
    tool_choice: ToolChoice | None = None  # in place of the session's
    parallel_tool_calls: bool | None = None  # a forced answer may hold several calls (default true)
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
    """Replay a stream from token offset ``from_`` (wire ``from``), then follow it live.

    ``audio_from_ms``: replay the response's audio too, from this millisecond
    of its output timeline (None: no audio).
    """

    type: ClassVar[str] = "stream.resume"
    stream_id: str
    resume_token: str
    from_: int = field(metadata={"wire": "from"})
    audio_from_ms: int | None = None
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


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioAppend:
    """Append pcm16 samples (``bytes``, an even number) to the user's input audio."""

    type: ClassVar[str] = "input_audio.append"
    audio: bytes
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioCommit:
    """End the user's turn now: its uncommitted audio becomes a user item."""

    type: ClassVar[str] = "input_audio.commit"
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioClear:
    """Drop the uncommitted input audio (the input timeline goes on)."""

    type: ClassVar[str] = "input_audio.clear"
    event_id: str | None = None


ClientEvent: TypeAlias = (
    SessionUpdate
    | ResponseCreate
    | ResponseCancel
    | StreamResume
    | SessionResume
    | Ping
    | InputAudioAppend
    | InputAudioCommit
    | InputAudioClear
)

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
    input_item_id: str | None = None  # the user item of the voice turn that started it
    modalities: tuple[Modality, ...] | None = None  # on a server with audio: whether it is spoken
    tool_mode: ToolMode | None = None  # with tools in force: how its answer is read for calls


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
    tool_calls: tuple[FunctionCall, ...] | None = None  # the calls its answer made, if it made some


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamResumed:
    """Answer to ``stream.resume``; deltas from ``from_`` (wire ``from``) follow."""

    type: ClassVar[str] = "stream.resumed"
    stream_id: str
    response_id: str
    from_: int = field(metadata={"wire": "from"})
    status: StreamStatus
    tool_mode: ToolMode | None = None  # a response read for function calls (docs/protocol.md section 12)


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


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioSpeechStarted:
    """Server VAD heard speech start at ``audio_start_ms`` of the input timeline (prefix padding included).

    ``item_id``: the user item this turn will become, when known.
    """

    type: ClassVar[str] = "input_audio.speech_started"
    audio_start_ms: int
    item_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioSpeechStopped:
    """Server VAD heard speech end at ``audio_end_ms`` of the input timeline (before the silence window)."""

    type: ClassVar[str] = "input_audio.speech_stopped"
    audio_end_ms: int
    item_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioCommitted:
    """A turn ended: input ``[audio_start_ms, audio_end_ms)`` became the user item ``item_id``."""

    type: ClassVar[str] = "input_audio.committed"
    item_id: str
    audio_start_ms: int
    audio_end_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TranscriptionError:
    """Why a turn's audio has no transcript (``input_audio.transcript.error``)."""

    code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioTranscript:
    """The transcript of user item ``item_id`` so far (whole, not a delta); ``final`` is the last one.

    ``error``: the transcription failed (then ``text`` is empty, ``final`` is
    true and no item joins the conversation).
    """

    type: ClassVar[str] = "input_audio.transcript"
    item_id: str
    text: str
    final: bool
    error: TranscriptionError | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseAudioDelta:
    """Spoken audio ``[start_ms, end_ms)`` of the response's output timeline.

    Attributes:
        audio: pcm16 samples at the session's output sample rate.
        start_ms: position of the first sample, milliseconds (the previous delta's ``end_ms``).
        end_ms: position after the last sample, milliseconds (rounded down).
        text_end: code points of the response text spoken by ``end_ms``.
    """

    type: ClassVar[str] = "response.audio.delta"
    response_id: str
    stream_id: str
    audio: bytes
    start_ms: int
    end_ms: int
    text_end: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseAudioDone:
    """The response's audio ended at ``end_ms``; comes before its ``response.done``."""

    type: ClassVar[str] = "response.audio.done"
    response_id: str
    stream_id: str
    end_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseAudioPaused:
    """Speech started over the response's audio (``confirm`` interruptions):
    no ``response.audio.delta`` of it follows until ``response.audio.resumed``
    or its end; ``end_ms`` is the end of its audio sent so far. The client
    pauses playback, keeping what it has not played."""

    type: ClassVar[str] = "response.audio.paused"
    response_id: str
    stream_id: str
    end_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseAudioResumed:
    """The speech over the response was no interruption: its audio goes on
    from ``from_ms`` (the paused ``end_ms``); the client resumes playback."""

    type: ClassVar[str] = "response.audio.resumed"
    response_id: str
    stream_id: str
    from_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioDiscarded:
    """The speech ``item_id`` (its ``input_audio.speech_started``) paused an
    answer and was judged no interruption: it is no turn (no committed
    event, no final transcript, nothing in the conversation).

    Attributes:
        reason: ``backchannel`` ("mm-hm", or fewer words than ``min_words``),
            ``no_words`` (a cough, a knock, music) or ``echo`` (the answer's
            own words, heard back).
        transcript: what was heard, for display or logs.
    """

    type: ClassVar[str] = "input_audio.discarded"
    item_id: str
    reason: DiscardReason
    transcript: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionCallArgumentsDelta:
    """More of the arguments of call ``index`` of a response read for calls
    (``tool_mode``): ``delta`` fragments concatenate to its ``arguments``."""

    type: ClassVar[str] = "response.function_call_arguments.delta"
    response_id: str
    stream_id: str
    index: int
    call_id: str
    name: str
    delta: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionCallArgumentsDone:
    """Call ``index`` is whole: its ``arguments`` JSON text, as the model wrote it."""

    type: ClassVar[str] = "response.function_call_arguments.done"
    response_id: str
    stream_id: str
    index: int
    call_id: str
    name: str
    arguments: str


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
    | InputAudioSpeechStarted
    | InputAudioSpeechStopped
    | InputAudioCommitted
    | InputAudioTranscript
    | ResponseAudioDelta
    | ResponseAudioDone
    | ResponseAudioPaused
    | ResponseAudioResumed
    | InputAudioDiscarded
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
)

CLIENT_EVENTS: dict[str, type[ClientEvent]] = {
    c.type: c
    for c in (
        SessionUpdate,
        ResponseCreate,
        ResponseCancel,
        StreamResume,
        SessionResume,
        Ping,
        InputAudioAppend,
        InputAudioCommit,
        InputAudioClear,
    )
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
        InputAudioSpeechStarted,
        InputAudioSpeechStopped,
        InputAudioCommitted,
        InputAudioTranscript,
        ResponseAudioDelta,
        ResponseAudioDone,
        ResponseAudioPaused,
        ResponseAudioResumed,
        InputAudioDiscarded,
        FunctionCallArgumentsDelta,
        FunctionCallArgumentsDone,
    )
}

__all__ = [
    "PROTOCOL_VERSION",
    "MAX_OFFSET",
    "Role",
    "OnDisconnect",
    "FinishReasonName",
    "StreamStatus",
    "Modality",
    "TurnDetectionType",
    "Eagerness",
    "InterruptionMode",
    "DiscardReason",
    "SampleRate",
    "ToolChoiceMode",
    "ToolMode",
    "JsonText",
    "FunctionCall",
    "FunctionTool",
    "NamedToolChoice",
    "ToolChoice",
    "ErrorCode",
    "CloseCode",
    "InputItem",
    "SamplingDefaults",
    "InterruptionSettings",
    "TurnDetectionSettings",
    "TURN_DETECTION_OFF",
    "AudioInputSettings",
    "AudioOutputSettings",
    "AUDIO_OUTPUT_OFF",
    "AudioSettings",
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
    "InputAudioAppend",
    "InputAudioCommit",
    "InputAudioClear",
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
    "InputAudioSpeechStarted",
    "InputAudioSpeechStopped",
    "InputAudioCommitted",
    "TranscriptionError",
    "InputAudioTranscript",
    "ResponseAudioDelta",
    "ResponseAudioDone",
    "ResponseAudioPaused",
    "ResponseAudioResumed",
    "InputAudioDiscarded",
    "FunctionCallArgumentsDelta",
    "FunctionCallArgumentsDone",
    "ServerEvent",
    "CLIENT_EVENTS",
    "SERVER_EVENTS",
]
