"""Value rules of client events, checked after the types (``invalid_parameter``).

Only rules that hold for every server are here; limits a server announces in
``session.created`` (``max_tokens``, prompt length, ``max_input_audio_ms``) are the session's to
enforce, since the codec does not know them. Every offset and count is
bounded here by :data:`bargein.protocol.events.MAX_OFFSET`, so no layer below the
codec sees a number that does not fit the places it goes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from bargein.protocol.errors import ProtocolError
from bargein.protocol.events import (
    MAX_OFFSET,
    TURN_DETECTION_OFF,
    AudioSettings,
    ClientEvent,
    ErrorCode,
    FunctionTool,
    InputAudioAppend,
    InputItem,
    InterruptionSettings,
    NamedToolChoice,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
    StreamResume,
    ToolChoice,
    TurnDetectionSettings,
)

MAX_EVENT_ID_CHARS = 64
MAX_RESPONSE_ID_CHARS = 64
MAX_ITEM_ID_CHARS = 64
MAX_STOP_STRINGS = 4
MAX_SEED = 2**63 - 1  # fits an int64 everywhere (torch generators, Redis, msgpack)
MAX_VOICE_CHARS = 64
MAX_TURN_DETECTION_MS = 10_000  # prefix padding and silence window: 10 s is far past any use
# turn_detection.interruption (voice/interruption.py holds the same bounds; a test checks them)
MAX_INTERRUPTION_WORDS = 16
INTERRUPTION_PAUSE_MS = (100, 2000)
MAX_BACKCHANNELS = 64
MAX_BACKCHANNEL_CHARS = 64
PCM16_SAMPLE_BYTES = 2
MAX_TOOLS = 128  # OpenAI's limit on functions of one request
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's function names
MAX_CALL_ID_CHARS = 64


def check_event_id(event_id: str | None) -> None:
    """Raise ``invalid_parameter`` for an ``event_id`` over 64 chars."""
    if event_id is not None and len(event_id) > MAX_EVENT_ID_CHARS:
        raise _bad(f"'event_id' must be at most {MAX_EVENT_ID_CHARS} characters")


def check_rules(event: ClientEvent) -> None:
    """Raise ``ProtocolError(invalid_parameter)`` when a value breaks a rule."""
    check = _CHECKS.get(type(event))
    if check is not None:
        check(event)


def _check_sampling(params: Any, path: str) -> None:
    """Rules shared by ``response.create`` and ``session.defaults``."""
    p = f"{path}." if path else ""
    _check_count(params.max_tokens, f"{p}max_tokens", low=1)
    if params.temperature is not None and params.temperature < 0:
        raise _bad(f"'{p}temperature' must be >= 0")
    if params.top_p is not None and not 0 < params.top_p <= 1:
        raise _bad(f"'{p}top_p' must be in (0, 1]")
    _check_count(params.top_k, f"{p}top_k", low=0)
    if params.seed is not None and not 0 <= params.seed <= MAX_SEED:
        raise _bad(f"'{p}seed' must be in [0, 2**63 - 1]")
    if params.stop is not None:
        if len(params.stop) > MAX_STOP_STRINGS:
            raise _bad(f"'{p}stop' holds at most {MAX_STOP_STRINGS} strings")
        if not all(params.stop):
            raise _bad(f"'{p}stop' strings must be non-empty")


def _check_count(value: int | None, name: str, *, low: int) -> None:
    """An offset or count (None: not given) in ``[low, MAX_OFFSET]``."""
    if value is not None and not low <= value <= MAX_OFFSET:
        raise _bad(f"'{name}' must be in [{low}, {MAX_OFFSET}]")


def _check_create(event: ResponseCreate) -> None:
    _check_sampling(event, "")
    if event.response_id is not None and not 0 < len(event.response_id) <= MAX_RESPONSE_ID_CHARS:
        raise _bad(f"'response_id' must be 1 to {MAX_RESPONSE_ID_CHARS} characters")
    for i, item in enumerate(event.input or ()):
        if item.item_id is not None and not 0 < len(item.item_id) <= MAX_ITEM_ID_CHARS:
            raise _bad(f"'input[{i}].item_id' must be 1 to {MAX_ITEM_ID_CHARS} characters")
        _check_tool_item(item, f"input[{i}]")
    _check_tools(event.tools, event.tool_choice, "")
    if event.modalities is not None:
        # Audio is the text spoken: there is no audio without its text.
        if "text" not in event.modalities or len(set(event.modalities)) != len(event.modalities):
            raise _bad("'modalities' must be ['text'] or ['text', 'audio']")


def _check_tool_item(item: InputItem, path: str) -> None:
    """A tool result names its call; only an assistant item makes calls, and then holds no text."""
    if item.role == "tool" and item.tool_call_id is None:
        raise _bad(f"'{path}.tool_call_id' is required for role 'tool'")
    if item.role != "tool" and item.tool_call_id is not None:
        raise _bad(f"'{path}.tool_call_id' belongs to role 'tool' only")
    if item.tool_call_id is not None and not 0 < len(item.tool_call_id) <= MAX_CALL_ID_CHARS:
        raise _bad(f"'{path}.tool_call_id' must be 1 to {MAX_CALL_ID_CHARS} characters")
    if item.tool_calls is None:
        return
    if item.role != "assistant" or item.content:
        raise _bad(f"'{path}.tool_calls' belongs to an assistant item whose content is \"\"")
    for j, call in enumerate(item.tool_calls):
        if not TOOL_NAME.fullmatch(call.name):
            raise _bad(f"'{path}.tool_calls[{j}].name' must be 1 to 64 letters, digits, '_' or '-'")
        if not 0 < len(call.call_id) <= MAX_CALL_ID_CHARS:
            raise _bad(f"'{path}.tool_calls[{j}].call_id' must be 1 to {MAX_CALL_ID_CHARS} characters")


def _check_tools(tools: tuple[FunctionTool, ...] | None, choice: ToolChoice | None, path: str) -> None:
    """Function names (OpenAI's rule, each once), object schemas, and a named
    ``tool_choice`` among the tools (when both come in the same event). A
    schema keyword the grammar library cannot enforce is the session's to refuse."""
    p = f"{path}." if path else ""
    for i, tool in enumerate(tools or ()):
        if not TOOL_NAME.fullmatch(tool.name):
            raise _bad(f"'{p}tools[{i}].name' must be 1 to 64 letters, digits, '_' or '-'")
        schema = {} if tool.parameters is None else json.loads(tool.parameters)
        if schema.get("type", "object") != "object":
            raise _bad(f"'{p}tools[{i}].parameters' must be an object schema (its arguments are an object)")
    names = [t.name for t in tools or ()]
    if len(set(names)) != len(names):
        raise _bad(f"'{p}tools' names a function twice")
    if len(names) > MAX_TOOLS:
        raise _bad(f"'{p}tools' holds at most {MAX_TOOLS} functions")
    if isinstance(choice, NamedToolChoice):
        if not TOOL_NAME.fullmatch(choice.name):
            raise _bad(f"'{p}tool_choice.name' must be 1 to 64 letters, digits, '_' or '-'")
        if tools is not None and choice.name not in names:
            raise _bad(f"'{p}tool_choice' names {choice.name!r}, which is not in '{p}tools'")


def _check_update(event: SessionUpdate) -> None:
    _check_tools(event.session.tools, event.session.tool_choice, "session")
    if event.session.defaults is not None:
        _check_sampling(event.session.defaults, "session.defaults")
    if event.session.audio is not None:
        _check_audio(event.session.audio)


def _check_audio(audio: AudioSettings) -> None:
    """Rules of ``session.audio`` (sample rates and types are checked on the wire)."""
    if audio.input is not None and audio.input.turn_detection is not None:
        _check_turn_detection(audio.input.turn_detection, "session.audio.input.turn_detection")
    voice = audio.output.voice if audio.output is not None else None
    if voice is not None and not 0 < len(voice) <= MAX_VOICE_CHARS:
        raise _bad(f"'session.audio.output.voice' must be 1 to {MAX_VOICE_CHARS} characters")


# the fields of one detection type only (interrupt_response and create_response belong to both)
_SERVER_VAD_ONLY = ("threshold", "prefix_padding_ms", "silence_duration_ms")
_SEMANTIC_VAD_ONLY = ("eagerness",)


def _check_turn_detection(td: TurnDetectionSettings, path: str) -> None:
    if td.type == "none" and td != TURN_DETECTION_OFF:
        raise _bad(f"'{path}' with type 'none' (detection off) takes no other field")
    for kind, others, own in (
        ("semantic_vad", _SERVER_VAD_ONLY, "eagerness"),
        ("server_vad", _SEMANTIC_VAD_ONLY, "threshold, prefix_padding_ms and silence_duration_ms"),
    ):
        given = [name for name in others if getattr(td, name) is not None]
        if td.type == kind and given:
            raise _bad(f"'{path}.{given[0]}' does not apply to type '{kind}' (it takes {own})")
    if (
        td.type is None
        and td.eagerness is not None
        and any(getattr(td, name) is not None for name in _SERVER_VAD_ONLY)
    ):
        raise _bad(f"'{path}' mixes eagerness (semantic_vad) with server_vad's fields")
    if td.threshold is not None and not 0 < td.threshold < 1:
        raise _bad(f"'{path}.threshold' must be in (0, 1)")
    for name, value in (
        ("prefix_padding_ms", td.prefix_padding_ms),
        ("silence_duration_ms", td.silence_duration_ms),
    ):
        if value is not None and not 0 <= value <= MAX_TURN_DETECTION_MS:
            raise _bad(f"'{path}.{name}' must be in [0, {MAX_TURN_DETECTION_MS}] milliseconds")
    if td.interruption is not None:
        _check_interruption(td.interruption, f"{path}.interruption")


def _check_interruption(it: InterruptionSettings, path: str) -> None:
    if it.min_words is not None and not 1 <= it.min_words <= MAX_INTERRUPTION_WORDS:
        raise _bad(f"'{path}.min_words' must be in [1, {MAX_INTERRUPTION_WORDS}]")
    low, high = INTERRUPTION_PAUSE_MS
    if it.max_pause_ms is not None and not low <= it.max_pause_ms <= high:
        raise _bad(f"'{path}.max_pause_ms' must be in [{low}, {high}] milliseconds")
    if it.backchannels is not None:
        if len(it.backchannels) > MAX_BACKCHANNELS:
            raise _bad(f"'{path}.backchannels' holds at most {MAX_BACKCHANNELS} phrases")
        if any(not 0 < len(p.strip()) <= MAX_BACKCHANNEL_CHARS for p in it.backchannels):
            raise _bad(f"'{path}.backchannels' phrases must be 1 to {MAX_BACKCHANNEL_CHARS} characters")


def _check_cancel(event: ResponseCancel) -> None:
    _check_count(event.heard_chars, "heard_chars", low=0)
    _check_count(event.audio_end_ms, "audio_end_ms", low=0)


def _check_resume(event: StreamResume) -> None:
    _check_count(event.from_, "from", low=0)
    _check_count(event.audio_from_ms, "audio_from_ms", low=0)


def _check_append(event: InputAudioAppend) -> None:
    if len(event.audio) % PCM16_SAMPLE_BYTES:
        raise _bad(f"'audio' must be whole pcm16 samples (an even number of bytes), got {len(event.audio)}")


_CHECKS: dict[type, Callable[[Any], None]] = {
    ResponseCreate: _check_create,
    SessionUpdate: _check_update,
    ResponseCancel: _check_cancel,
    StreamResume: _check_resume,
    InputAudioAppend: _check_append,
}


def _bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_PARAMETER, message)
