"""OpenAI Realtime client events (GA schema) to bargein's session events.

:class:`Inbound` turns one decoded JSON object of an OpenAI client into the
events bargein's :class:`bargein.session.runtime.connection.Connection` applies: the
protocol's own (``session.update``, ``response.create``, ``response.cancel``,
``input_audio.*``, ``session.resume``, ``stream.resume``) and the item events
of :mod:`bargein.session.conversation.actions` (``conversation.item.*``). Nothing is
implemented twice: the conversation, its limits and its errors are the
session's. What cannot be mapped is refused with :class:`RealtimeError`,
naming the event or the field: never dropped in silence.

Function calling maps onto bargein's tools: ``tools`` and ``tool_choice``
of the session and of a response, ``function_call`` items (an assistant turn
holding the call in bargein's generic format, :func:`calls_text`) and
``function_call_output`` items (a ``tool`` turn naming its call).

Sans-I/O: the only state is what OpenAI's session keeps and bargein's does not
(the output modalities, ``max_output_tokens``, ``parallel_tool_calls``), and
the metadata of the responses asked for, which the outbound side echoes
(:class:`bargein.app.openai.realtime.outbound.Translator`).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from bargein.protocol import events as pe
from bargein.protocol._rules import check_rules
from bargein.protocol.errors import ProtocolError
from bargein.session.conversation.actions import AddItem, DeleteItem, Message, RetrieveItem, TruncateItem
from bargein.session.conversation.tools import calls_text

# OpenAI's voice names: a client that asks for one gets the server's default voice.
OPENAI_VOICES = frozenset(
    {"alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar"}
)
OPENAI_AUDIO_RATE: Final = 24000  # the only rate of OpenAI's audio/pcm
_TEXT_CONTENT = {"input_text", "text", "output_text"}


class RealtimeError(Exception):
    """A client event that cannot be applied: becomes an OpenAI ``error`` event.

    Attributes:
        code: OpenAI-style error code (``unknown_parameter``, ``invalid_value``,
            ``unsupported``, ``missing_required_parameter``, ``invalid_json``,
            ``response_cancel_not_active``...).
        message: for people.
        param: the offending field's dotted path, when there is one.
    """

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param


@dataclass(slots=True, kw_only=True)
class ResponseAsked:
    """What a ``response.create`` asked for that the outbound side echoes."""

    audio: bool | None = None  # None: the session's modalities
    metadata: dict[str, str] | None = None
    max_output_tokens: int | None = None


@dataclass(slots=True, kw_only=True)
class OpenAISession:
    """The OpenAI session settings bargein's session has no field for.

    Attributes:
        audio_output: whether responses are spoken (``output_modalities``
            ``["audio"]``) by default.
        max_output_tokens: the session's default (None: ``"inf"``, the
            server's limit).
        transcription: the ``audio.input.transcription`` the client set (the
            server transcribes with its own model whatever it names).
        noise_reduction: the ``audio.input.noise_reduction`` the client set
            (echoed; the server applies none: its VAD and Whisper take the
            microphone's audio as it comes).
        parallel_tool_calls: the session's default for its responses (None:
            the server's).
        asked: per response id, what its ``response.create`` asked for.
    """

    audio_output: bool
    max_output_tokens: int | None = None
    transcription: dict[str, Any] | None = field(default_factory=lambda: {"model": "whisper-1"})
    noise_reduction: dict[str, str] | None = None
    parallel_tool_calls: bool | None = None
    asked: dict[str, ResponseAsked] = field(default_factory=dict)


Handler = Callable[[Mapping[str, Any], str | None], list[object]]


class Inbound:
    """One connection's client-side translation.

    Args:
        session: the OpenAI-only settings (shared with the outbound side).
        has_voice: whether the server runs the voice pipeline.
        active_response_id: the session's active response now (for a
            ``response.cancel`` naming none).
        voices: the server's voice names.
        max_tokens: the server's largest ``max_tokens``: a larger
            ``max_output_tokens`` (OpenAI allows 4096) is clamped to it, as
            ``"inf"`` is.
    """

    def __init__(
        self,
        session: OpenAISession,
        *,
        has_voice: bool,
        active_response_id: Callable[[], str | None],
        voices: tuple[str, ...] = (),
        max_tokens: int | None = None,
    ) -> None:
        self.session = session
        self._has_voice = has_voice
        self._max_tokens = max_tokens
        self._active = active_response_id
        self._voices = voices
        self._handlers: dict[str, Handler] = {
            "session.update": self._session_update,
            "response.create": self._response_create,
            "response.cancel": self._response_cancel,
            "conversation.item.create": self._item_create,
            "conversation.item.retrieve": self._item_retrieve,
            "conversation.item.delete": self._item_delete,
            "conversation.item.truncate": self._item_truncate,
            "input_audio_buffer.append": self._audio_append,
            "input_audio_buffer.commit": self._audio_commit,
            "input_audio_buffer.clear": self._audio_clear,
            "bargein.resume": self._resume,
        }

    def translate(self, data: Any) -> tuple[str | None, list[object]]:
        """``(event_id, bargein events)`` of one decoded client frame.

        Raises:
            RealtimeError: the event is unknown, unsupported or invalid; its
                ``event_id`` is in :attr:`last_event_id`.
        """
        self.last_event_id = None
        if not isinstance(data, dict):
            raise RealtimeError("invalid_json", "a client event must be a JSON object")
        event_id = data.get("event_id")
        if event_id is not None and (not isinstance(event_id, str) or len(event_id) > 64):
            raise RealtimeError(
                "invalid_value", "'event_id' must be a string of at most 64 characters", "event_id"
            )
        self.last_event_id = event_id
        kind = data.get("type")
        if not isinstance(kind, str):
            raise RealtimeError("missing_required_parameter", "missing 'type'", "type")
        handler = self._handlers.get(kind)
        if handler is None:
            raise RealtimeError(
                "unknown_event", f"event type {kind!r} is not supported by this server", "type"
            )
        events = handler(data, event_id)
        for event in events:
            if isinstance(
                event,
                pe.ResponseCreate
                | pe.SessionUpdate
                | pe.ResponseCancel
                | pe.StreamResume
                | pe.InputAudioAppend,
            ):
                try:
                    check_rules(event)
                except ProtocolError as exc:
                    raise RealtimeError("invalid_value", exc.message) from exc
        return event_id, events

    # ---- session ---------------------------------------------------------------

    def _session_update(self, data: Mapping[str, Any], event_id: str | None) -> list[object]:
        _only(data, {"type", "event_id", "session"}, "")
        session = _object(data.get("session"), "session")
        _only(
            session,
            {
                "type",
                "model",
                "instructions",
                "output_modalities",
                "max_output_tokens",
                "audio",
                "tools",
                "tool_choice",
                "parallel_tool_calls",
                "tracing",
                "truncation",
                "include",
                "prompt",
            },
            "session.",
        )
        if session.get("type", "realtime") != "realtime":
            raise RealtimeError(
                "unsupported",
                "only 'realtime' sessions are served (no transcription-only sessions)",
                "session.type",
            )
        tools = _tools(session.get("tools"), "session.tools")
        tool_choice = _tool_choice(session.get("tool_choice"), "session.tool_choice")
        parallel = _optional_bool(session, "parallel_tool_calls", "session.")
        for name, allowed in (
            ("tracing", (None, "auto")),
            ("truncation", (None, "auto")),
            ("prompt", (None,)),
            ("include", (None,)),
        ):
            if session.get(name) not in allowed:
                raise RealtimeError(
                    "unsupported",
                    f"session.{name} other than {allowed[-1]!r} is not supported",
                    f"session.{name}",
                )
        instructions = _optional_str(session, "instructions", "session.")
        audio_output: bool | None = None
        if "output_modalities" in session:
            audio_output = _modalities(session["output_modalities"], "session.output_modalities")
            if audio_output and not self._has_voice:
                raise RealtimeError(
                    "unsupported",
                    "this server has no voice pipeline: output_modalities must be ['text']",
                    "session.output_modalities",
                )
        max_tokens_given = "max_output_tokens" in session
        max_tokens = self._clamped(
            _max_output_tokens(session.get("max_output_tokens"), "session.max_output_tokens")
        )
        audio = self._audio_settings(session.get("audio"), audio_output)
        if max_tokens_given:
            self.session.max_output_tokens = max_tokens
        if audio_output is not None:
            self.session.audio_output = audio_output
        if parallel is not None:
            self.session.parallel_tool_calls = parallel
        defaults = pe.SamplingDefaults(max_tokens=self.session.max_output_tokens)
        update = pe.SessionSettings(
            instructions=instructions, defaults=defaults, audio=audio, tools=tools, tool_choice=tool_choice
        )
        return [pe.SessionUpdate(session=update, event_id=event_id)]

    def _audio_settings(self, value: Any, audio_output: bool | None) -> pe.AudioSettings | None:
        """bargein's ``session.audio`` from OpenAI's ``session.audio`` and ``output_modalities``."""
        if value is None and audio_output is None:
            return None
        audio = {} if value is None else _object(value, "session.audio")
        _only(audio, {"input", "output"}, "session.audio.")
        if not self._has_voice and audio:
            raise RealtimeError(
                "unsupported",
                "this server has no voice pipeline: session.audio is not served",
                "session.audio",
            )
        inp: pe.AudioInputSettings | None = None
        if audio.get("input") is not None:
            raw = _object(audio["input"], "session.audio.input")
            _only(
                raw, {"format", "turn_detection", "transcription", "noise_reduction"}, "session.audio.input."
            )
            if "noise_reduction" in raw:
                self.session.noise_reduction = _noise_reduction(raw["noise_reduction"])
            if "transcription" in raw:
                self.session.transcription = _transcription(raw["transcription"])
            rate = _pcm_rate(raw.get("format"), "session.audio.input.format", (16000, 24000))
            kwargs: dict[str, Any] = {}
            if rate is not None:
                kwargs["sample_rate"] = rate
            if "turn_detection" in raw:
                kwargs["turn_detection"] = _turn_detection(raw["turn_detection"])
            inp = pe.AudioInputSettings(**kwargs) if kwargs else None
        out: pe.AudioOutputSettings | None = None
        raw_out = audio.get("output")
        if raw_out is not None:
            raw = _object(raw_out, "session.audio.output")
            _only(raw, {"format", "voice", "speed"}, "session.audio.output.")
            if raw.get("speed", 1.0) != 1.0:
                raise RealtimeError("unsupported", "only speed 1.0 is served", "session.audio.output.speed")
            _pcm_rate(raw.get("format"), "session.audio.output.format", (OPENAI_AUDIO_RATE,))
            voice = self._voice(raw.get("voice"), "session.audio.output.voice")
            speaks = self.session.audio_output if audio_output is None else audio_output
            if speaks:  # a voice for a text-only session waits until it speaks
                out = pe.AudioOutputSettings(sample_rate=OPENAI_AUDIO_RATE, voice=voice)
        if audio_output is True and out is None:
            out = pe.AudioOutputSettings(sample_rate=OPENAI_AUDIO_RATE)
        if audio_output is False and self._has_voice:  # without voice, text only is all there is
            out = pe.AUDIO_OUTPUT_OFF
        if inp is None and out is None:
            return None
        return pe.AudioSettings(input=inp, output=out)

    def _clamped(self, max_tokens: int | None) -> int | None:
        if max_tokens is None or self._max_tokens is None:
            return max_tokens
        return min(max_tokens, self._max_tokens)

    def _voice(self, value: Any, param: str) -> str | None:
        if value is None:
            return None
        if isinstance(value, dict):
            value = value.get("id")
        if not isinstance(value, str):
            raise RealtimeError("invalid_type", "a voice is a name", param)
        if value in OPENAI_VOICES:
            return None  # the server's default voice speaks for all of OpenAI's
        if value not in self._voices:
            raise RealtimeError(
                "invalid_value",
                f"voice {value!r} is not one of {sorted(OPENAI_VOICES | set(self._voices))}",
                param,
            )
        return value

    # ---- responses ---------------------------------------------------------------

    def _response_create(self, data: Mapping[str, Any], event_id: str | None) -> list[object]:
        _only(data, {"type", "event_id", "response"}, "")
        raw = {} if data.get("response") is None else _object(data["response"], "response")
        _only(
            raw,
            {
                "output_modalities",
                "instructions",
                "max_output_tokens",
                "conversation",
                "input",
                "metadata",
                "audio",
                "tools",
                "tool_choice",
                "parallel_tool_calls",
                "temperature",
                "prompt",
            },
            "response.",
        )
        tools = _tools(raw.get("tools"), "response.tools")
        tool_choice = _tool_choice(raw.get("tool_choice"), "response.tool_choice")
        parallel = _optional_bool(raw, "parallel_tool_calls", "response.")
        if raw.get("conversation", "auto") != "auto":
            raise RealtimeError(
                "unsupported",
                "only responses in the default conversation ('auto') are served",
                "response.conversation",
            )
        if raw.get("input") is not None:
            raise RealtimeError(
                "unsupported",
                "response.input is not supported: add items with conversation.item.create",
                "response.input",
            )
        if raw.get("prompt") is not None:
            raise RealtimeError("unsupported", "prompt templates are not supported", "response.prompt")
        audio: bool | None = None
        if "output_modalities" in raw:
            audio = _modalities(raw["output_modalities"], "response.output_modalities")
            if audio and not self._has_voice:
                raise RealtimeError(
                    "unsupported",
                    "this server has no voice pipeline: output_modalities must be ['text']",
                    "response.output_modalities",
                )
        if raw.get("audio") is not None:
            out = _object(raw["audio"], "response.audio")
            _only(out, {"output"}, "response.audio.")
            if out.get("output") is not None:
                o = _object(out["output"], "response.audio.output")
                _only(o, {"format", "voice"}, "response.audio.output.")
                _pcm_rate(o.get("format"), "response.audio.output.format", (OPENAI_AUDIO_RATE,))
                if self._voice(o.get("voice"), "response.audio.output.voice") is not None:
                    raise RealtimeError(
                        "unsupported",
                        "a response speaks with the session's voice",
                        "response.audio.output.voice",
                    )
        metadata = raw.get("metadata")
        if metadata is not None and (
            not isinstance(metadata, dict)
            or len(metadata) > 16
            or not all(
                isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
                for k, v in metadata.items()
            )
        ):
            raise RealtimeError(
                "invalid_value",
                "metadata is at most 16 string pairs (keys 64, values 512 characters)",
                "response.metadata",
            )
        max_tokens = (
            self._clamped(_max_output_tokens(raw["max_output_tokens"], "response.max_output_tokens"))
            if "max_output_tokens" in raw
            else self.session.max_output_tokens
        )
        temperature = _optional_number(raw.get("temperature"), "response.temperature")
        response_id = f"resp_{uuid.uuid4().hex}"
        self.session.asked[response_id] = ResponseAsked(
            audio=audio, metadata=metadata, max_output_tokens=max_tokens
        )
        while len(self.session.asked) > 64:  # responses refused never come back for theirs
            self.session.asked.pop(next(iter(self.session.asked)))
        modalities: tuple[pe.Modality, ...] | None = (
            None if audio is None else (("text", "audio") if audio else ("text",))
        )
        return [
            pe.ResponseCreate(
                response_id=response_id,
                max_tokens=max_tokens,
                temperature=temperature,
                modalities=modalities,
                instructions=_optional_str(raw, "instructions", "response."),
                tools=tools,
                tool_choice=tool_choice,
                parallel_tool_calls=self.session.parallel_tool_calls if parallel is None else parallel,
                event_id=event_id,
            )
        ]

    def _response_cancel(self, data: Mapping[str, Any], event_id: str | None) -> list[object]:
        _only(data, {"type", "event_id", "response_id"}, "")
        response_id = _optional_str(data, "response_id", "") or self._active()
        if response_id is None:
            raise RealtimeError("response_cancel_not_active", "there is no active response to cancel")
        return [pe.ResponseCancel(response_id=response_id, event_id=event_id)]

    # ---- items ---------------------------------------------------------------

    def _item_create(self, data: Mapping[str, Any], event_id: str | None) -> list[object]:
        _only(data, {"type", "event_id", "item", "previous_item_id"}, "")
        item = _object(data.get("item"), "item")
        previous = _optional_str(data, "previous_item_id", "")
        kind = item.get("type", "message")
        if kind == "function_call":
            return [AddItem(item=_function_call(item), previous_item_id=previous, event_id=event_id)]
        if kind == "function_call_output":
            return [AddItem(item=_function_call_output(item), previous_item_id=previous, event_id=event_id)]
        if kind != "message":
            raise RealtimeError(
                "unsupported",
                f"items of type {kind!r} are not supported (message, function_call, function_call_output)",
                "item.type",
            )
        _only(item, {"id", "type", "object", "role", "content", "status"}, "item.")
        role = item.get("role")
        if role not in ("user", "assistant", "system"):
            raise RealtimeError(
                "invalid_value", "item.role must be 'user', 'assistant' or 'system'", "item.role"
            )
        item_id = _item_id(item)
        content = item.get("content")
        if not isinstance(content, list) or not content:
            raise RealtimeError("invalid_value", "item.content must be a non-empty list", "item.content")
        audio = self._audio_content(content, role)
        if audio is not None:
            message = Message(role=role, content="", item_id=item_id)
            return [AddItem(item=message, previous_item_id=previous, audio=audio, event_id=event_id)]
        texts = [self._content_text(part, f"item.content[{i}]") for i, part in enumerate(content)]
        message = Message(role=role, content="".join(texts), item_id=item_id)
        return [AddItem(item=message, previous_item_id=previous, event_id=event_id)]

    def _audio_content(self, content: list[Any], role: str) -> bytes | None:
        """The pcm16 of a user item made of one ``input_audio`` part without a
        transcript (transcribed by the server), else None."""
        if len(content) != 1 or not isinstance(content[0], dict):
            return None
        part = content[0]
        if (
            part.get("type") != "input_audio"
            or part.get("transcript") is not None
            or part.get("audio") is None
        ):
            return None
        _only(part, {"type", "audio", "transcript"}, "item.content[0].")
        if role != "user":
            raise RealtimeError("invalid_value", "only user items hold input_audio", "item.content[0].type")
        self._need_voice("input_audio content")
        try:
            return base64.b64decode(_required_str(part, "audio", "item.content[0]."), validate=True)
        except binascii.Error as exc:
            raise RealtimeError("invalid_value", "audio must be base64", "item.content[0].audio") from exc

    def _content_text(self, part: Any, param: str) -> str:
        part = _object(part, param)
        kind = part.get("type")
        if kind in _TEXT_CONTENT:
            _only(part, {"type", "text"}, f"{param}.")
            text = part.get("text")
            if not isinstance(text, str):
                raise RealtimeError("invalid_type", f"{param}.text must be a string", f"{param}.text")
            return text
        if kind in ("input_audio", "output_audio"):
            _only(part, {"type", "audio", "transcript"}, f"{param}.")
            transcript = part.get("transcript")
            if isinstance(transcript, str):
                return transcript  # what the model reads of an audio item is its words
            raise RealtimeError(
                "unsupported",
                "audio content without a transcript is transcribed only as a user item's one part",
                f"{param}.transcript",
            )
        raise RealtimeError(
            "unsupported", f"content of type {kind!r} is not supported (text and audio only)", f"{param}.type"
        )

    def _item_retrieve(self, data: Mapping[str, Any], event_id: str | None) -> list[object]:
        _only(data, {"type", "event_id", "item_id"}, "")
        return [RetrieveItem(item_id=_required_str(data, "item_id"), event_id=event_id)]

    def _item_delete(self, data: Mapping[str, Any], event_id: str | None) -> list[object]:
        _only(data, {"type", "event_id", "item_id"}, "")
        return [DeleteItem(item_id=_required_str(data, "item_id"), event_id=event_id)]

    def _item_truncate(self, data: Mapping[str, Any], event_id: str | None) -> list[object]:
        _only(data, {"type", "event_id", "item_id", "content_index", "audio_end_ms"}, "")
        if data.get("content_index", 0) != 0:
            raise RealtimeError(
                "invalid_value", "content_index must be 0 (an item has one content part)", "content_index"
            )
        audio_end_ms = data.get("audio_end_ms")
        if (
            isinstance(audio_end_ms, bool)
            or not isinstance(audio_end_ms, int)
            or not 0 <= audio_end_ms <= pe.MAX_OFFSET
        ):
            raise RealtimeError(
                "invalid_value", f"audio_end_ms must be an integer in [0, {pe.MAX_OFFSET}]", "audio_end_ms"
            )
        return [
            TruncateItem(item_id=_required_str(data, "item_id"), audio_end_ms=audio_end_ms, event_id=event_id)
        ]

    # ---- input audio ---------------------------------------------------------

    def _audio_append(self, data: Mapping[str, Any], event_id: str | None) -> list[object]:
        _only(data, {"type", "event_id", "audio"}, "")
        self._need_voice("input_audio_buffer.append")
        try:
            audio = base64.b64decode(_required_str(data, "audio"), validate=True)
        except binascii.Error as exc:
            raise RealtimeError("invalid_value", "audio must be base64", "audio") from exc
        return [pe.InputAudioAppend(audio=audio, event_id=event_id)]

    def _audio_commit(self, data: Mapping[str, Any], event_id: str | None) -> list[object]:
        _only(data, {"type", "event_id"}, "")
        self._need_voice("input_audio_buffer.commit")
        return [pe.InputAudioCommit(event_id=event_id)]

    def _audio_clear(self, data: Mapping[str, Any], event_id: str | None) -> list[object]:
        _only(data, {"type", "event_id"}, "")
        self._need_voice("input_audio_buffer.clear")
        return [pe.InputAudioClear(event_id=event_id)]

    def _need_voice(self, kind: str) -> None:
        if not self._has_voice:
            raise RealtimeError(
                "unsupported", f"{kind}: this server has no voice pipeline (text only)", "type"
            )

    # ---- bargein's extension -------------------------------------------------

    def _resume(self, data: Mapping[str, Any], event_id: str | None) -> list[object]:
        """``bargein.resume``: re-attach a session, and/or replay a stream from an offset."""
        _only(data, {"type", "event_id", "session_id", "session_token", "stream"}, "")
        events: list[object] = []
        if data.get("session_id") is not None:
            events.append(
                pe.SessionResume(
                    session_id=_required_str(data, "session_id"),
                    session_token=_required_str(data, "session_token"),
                    event_id=event_id,
                )
            )
        if data.get("stream") is not None:
            stream = _object(data["stream"], "stream")
            _only(stream, {"stream_id", "resume_token", "from", "audio_from_ms"}, "stream.")
            offset = stream.get("from", 0)
            audio_from = stream.get("audio_from_ms")
            for name, value in (("from", offset), ("audio_from_ms", audio_from)):
                if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                    raise RealtimeError("invalid_type", f"stream.{name} is an integer", f"stream.{name}")
            events.append(
                pe.StreamResume(
                    stream_id=_required_str(stream, "stream_id", "stream."),
                    resume_token=_required_str(stream, "resume_token", "stream."),
                    from_=offset,
                    audio_from_ms=audio_from,
                    event_id=event_id,
                )
            )
        if not events:
            raise RealtimeError(
                "missing_required_parameter", "bargein.resume needs session_id or stream", "session_id"
            )
        return events


# ---- function call items -------------------------------------------------------


def _function_call(item: Mapping[str, Any]) -> Message:
    """A ``function_call`` item: the assistant turn that made the call, as
    the model would have answered it (the generic format); its ``call_id``
    kept on the turn (one made up if the client gave none: the output that
    answers it names it)."""
    _only(item, {"id", "type", "object", "status", "call_id", "name", "arguments"}, "item.")
    name = _required_str(item, "name", "item.")
    arguments = item.get("arguments")
    if arguments is None:
        raise RealtimeError("missing_required_parameter", "missing 'item.arguments'", "item.arguments")
    if not isinstance(arguments, str):
        raise RealtimeError("invalid_type", "'item.arguments' must be a JSON string", "item.arguments")
    call = _optional_str(item, "call_id", "item.") or f"call_{uuid.uuid4().hex[:24]}"
    return Message(
        role="assistant", content=calls_text([(name, arguments)]), item_id=_item_id(item), call_id=call
    )


def _function_call_output(item: Mapping[str, Any]) -> Message:
    """A ``function_call_output`` item: a ``tool`` turn holding the result, naming its call."""
    _only(item, {"id", "type", "object", "status", "call_id", "output"}, "item.")
    output = item.get("output")
    if not isinstance(output, str):
        raise RealtimeError("invalid_type", "'item.output' must be a string", "item.output")
    return Message(
        role="tool", content=output, item_id=_item_id(item), call_id=_required_str(item, "call_id", "item.")
    )


def _item_id(item: Mapping[str, Any]) -> str | None:
    item_id = _optional_str(item, "id", "item.")
    if item_id is not None and not 0 < len(item_id) <= 64:
        raise RealtimeError("invalid_value", "item.id must be 1 to 64 characters", "item.id")
    return item_id


# ---- field helpers -----------------------------------------------------------


def _only(value: Mapping[str, Any], allowed: set[str], prefix: str) -> None:
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise RealtimeError(
            "unknown_parameter",
            f"unknown or unsupported parameter '{prefix}{unknown[0]}'",
            f"{prefix}{unknown[0]}",
        )


def _object(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RealtimeError("invalid_type", f"{param} must be an object", param)
    return value


def _required_str(value: Mapping[str, Any], name: str, prefix: str = "") -> str:
    got = value.get(name)
    if got is None:
        raise RealtimeError("missing_required_parameter", f"missing '{prefix}{name}'", f"{prefix}{name}")
    if not isinstance(got, str) or not got:
        raise RealtimeError("invalid_type", f"'{prefix}{name}' must be a non-empty string", f"{prefix}{name}")
    return got


def _optional_str(value: Mapping[str, Any], name: str, prefix: str) -> str | None:
    got = value.get(name)
    if got is not None and not isinstance(got, str):
        raise RealtimeError("invalid_type", f"'{prefix}{name}' must be a string", f"{prefix}{name}")
    return got


def _optional_bool(value: Mapping[str, Any], name: str, prefix: str) -> bool | None:
    got = value.get(name)
    if got is not None and not isinstance(got, bool):
        raise RealtimeError("invalid_type", f"'{prefix}{name}' must be a boolean", f"{prefix}{name}")
    return got


def _tools(value: Any, param: str) -> tuple[pe.FunctionTool, ...] | None:
    """bargein's tools from OpenAI's ``tools`` list (None: not given; ``[]``
    clears them). Only functions are served: an MCP server or any other
    kind is refused by name rather than left uncalled."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise RealtimeError("invalid_type", f"{param} must be a list", param)
    return tuple(_function_tool(tool, f"{param}[{i}]") for i, tool in enumerate(value))


def _function_tool(value: Any, param: str) -> pe.FunctionTool:
    """One function of OpenAI's flat form (``type`` may be left out, as the SDK's schema allows)."""
    raw = _object(value, param)
    kind = raw.get("type", "function")
    if kind != "function":
        raise RealtimeError(
            "unsupported", f"tools of type {kind!r} are not supported (functions only)", f"{param}.type"
        )
    _only(raw, {"type", "name", "description", "parameters"}, f"{param}.")
    return pe.FunctionTool(
        name=_required_str(raw, "name", f"{param}."),
        description=_optional_str(raw, "description", f"{param}."),
        parameters=_schema(raw.get("parameters"), f"{param}.parameters"),
    )


def _schema(value: Any, param: str) -> pe.JsonText | None:
    """A parameters schema as bargein carries it: its compact JSON text.

    Raises:
        RealtimeError: not an object, or holding a number no JSON text
            holds (``1e999`` parses as infinity).
    """
    if value is None:
        return None
    try:
        text = json.dumps(_object(value, param), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        raise RealtimeError("invalid_value", f"{param} must hold finite numbers only", param) from exc
    return pe.JsonText(text)


def _tool_choice(value: Any, param: str) -> pe.ToolChoice | None:
    """bargein's ``tool_choice`` from OpenAI's: a mode, or ``{"type":
    "function", "name"}`` (None: not given)."""
    if value is None:
        return None
    if value in ("auto", "none", "required"):
        mode: pe.ToolChoiceMode = value
        return mode
    if not isinstance(value, dict):
        raise RealtimeError(
            "invalid_value", "tool_choice must be 'auto', 'none', 'required' or a function", param
        )
    if value.get("type") != "function":
        raise RealtimeError("unsupported", "tool_choice names functions only (no MCP tools)", f"{param}.type")
    _only(value, {"type", "name"}, f"{param}.")
    return pe.NamedToolChoice(name=_required_str(value, "name", f"{param}."))


def _optional_number(value: Any, param: str) -> float | None:
    """A JSON number as a finite float (None: not given).

    JSON integers have no size limit, and ``1e999`` parses as infinity: both
    are refused here rather than overflow (``OverflowError``) or reach the
    sampler.

    Raises:
        RealtimeError: ``invalid_type`` for a non-number, ``invalid_value``
            for one no float holds.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RealtimeError("invalid_type", f"{param} must be a number", param)
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise RealtimeError("invalid_value", f"{param} must be a finite number", param)
    return number


def _transcription(value: Any) -> dict[str, str] | None:
    """``audio.input.transcription``, kept to echo: OpenAI's three string
    fields only, so that what is echoed is as small and flat as OpenAI's."""
    param = "session.audio.input.transcription"
    if value is None:
        return None
    raw = _object(value, param)
    _only(raw, {"model", "language", "prompt"}, f"{param}.")
    for name in raw:
        _optional_str(raw, name, f"{param}.")
    return {name: text for name, text in raw.items() if text is not None}


def _noise_reduction(value: Any) -> dict[str, str] | None:
    param = "session.audio.input.noise_reduction"
    if value is None:
        return None
    raw = _object(value, param)
    _only(raw, {"type"}, f"{param}.")
    if raw.get("type") not in ("near_field", "far_field"):
        raise RealtimeError(
            "invalid_value", "noise_reduction type must be 'near_field' or 'far_field'", f"{param}.type"
        )
    return {"type": raw["type"]}


def _modalities(value: Any, param: str) -> bool:
    """Whether ``output_modalities`` asks for audio (``["audio"]``) or text (``["text"]``)."""
    if value in (["audio"], ["text", "audio"], ["audio", "text"]):
        return True
    if value == ["text"]:
        return False
    raise RealtimeError("invalid_value", "output_modalities must be ['text'] or ['audio']", param)


def _max_output_tokens(value: Any, param: str) -> int | None:
    if value is None or value == "inf":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RealtimeError("invalid_value", "max_output_tokens must be an integer >= 1 or 'inf'", param)
    return value


def _pcm_rate(value: Any, param: str, rates: tuple[int, ...]) -> int | None:
    """The rate of an ``audio/pcm`` format object (None: not given)."""
    if value is None:
        return None
    fmt = _object(value, param)
    _only(fmt, {"type", "rate"}, f"{param}.")
    if fmt.get("type", "audio/pcm") != "audio/pcm":
        raise RealtimeError(
            "unsupported", f"only audio/pcm is served, not {fmt.get('type')!r}", f"{param}.type"
        )
    rate = fmt.get("rate", OPENAI_AUDIO_RATE)
    if rate not in rates:
        raise RealtimeError("invalid_value", f"rate must be one of {list(rates)}", f"{param}.rate")
    return int(rate)


_SERVER_VAD_FIELDS = {"threshold", "prefix_padding_ms", "silence_duration_ms", "idle_timeout_ms"}
# interruption: bargein's extension (docs/protocol.md 11.x); OpenAI has no such field
_SHARED_FIELDS = {"type", "create_response", "interrupt_response", "interruption"}
_INTERRUPTION_FIELDS = {"mode": (str,), "min_words": (int,), "backchannels": (list,), "max_pause_ms": (int,)}
_EAGERNESS = ("low", "medium", "high", "auto")


def _turn_detection(value: Any) -> pe.TurnDetectionSettings:
    """bargein's turn detection from OpenAI's ``server_vad`` or ``semantic_vad`` object (or ``null``)."""
    param = "session.audio.input.turn_detection"
    if value is None:
        return pe.TURN_DETECTION_OFF
    raw = _object(value, param)
    kind = raw.get("type")
    if kind not in ("server_vad", "semantic_vad"):
        raise RealtimeError(
            "invalid_value",
            "turn_detection type must be 'server_vad' or 'semantic_vad' (or null)",
            f"{param}.type",
        )
    _only(raw, _SHARED_FIELDS | (_SERVER_VAD_FIELDS if kind == "server_vad" else {"eagerness"}), f"{param}.")
    if raw.get("idle_timeout_ms") is not None:
        raise RealtimeError("unsupported", "idle_timeout_ms is not supported", f"{param}.idle_timeout_ms")
    kinds = {
        "prefix_padding_ms": (int,),
        "silence_duration_ms": (int,),
        "create_response": (bool,),
        "interrupt_response": (bool,),
    }
    for name, types in kinds.items():
        got = raw.get(name)
        if got is not None and (not isinstance(got, types) or (bool not in types and isinstance(got, bool))):
            raise RealtimeError("invalid_type", f"{param}.{name} has the wrong type", f"{param}.{name}")
    interruption = _interruption(raw.get("interruption"), f"{param}.interruption")
    if kind == "semantic_vad":
        eagerness = raw.get("eagerness")
        if eagerness is not None and eagerness not in _EAGERNESS:
            raise RealtimeError(
                "invalid_value", f"eagerness must be one of {', '.join(_EAGERNESS)}", f"{param}.eagerness"
            )
        return pe.TurnDetectionSettings(
            type="semantic_vad",
            eagerness=eagerness,
            create_response=raw.get("create_response"),
            interrupt_response=raw.get("interrupt_response"),
            interruption=interruption,
        )
    return pe.TurnDetectionSettings(
        type="server_vad",
        threshold=_optional_number(raw.get("threshold"), f"{param}.threshold"),
        prefix_padding_ms=raw.get("prefix_padding_ms"),
        silence_duration_ms=raw.get("silence_duration_ms"),
        create_response=raw.get("create_response"),
        interrupt_response=raw.get("interrupt_response"),
        interruption=interruption,
    )


def _interruption(value: Any, param: str) -> pe.InterruptionSettings | None:
    """bargein's ``interruption`` extension of ``turn_detection`` (None: not given)."""
    if value is None:
        return None
    raw = _object(value, param)
    _only(raw, set(_INTERRUPTION_FIELDS), f"{param}.")
    for name, types in _INTERRUPTION_FIELDS.items():
        got = raw.get(name)
        if got is not None and (not isinstance(got, types) or isinstance(got, bool)):
            raise RealtimeError("invalid_type", f"{param}.{name} has the wrong type", f"{param}.{name}")
    if raw.get("mode") not in (None, "immediate", "confirm"):
        raise RealtimeError("invalid_value", "mode must be 'immediate' or 'confirm'", f"{param}.mode")
    phrases = raw.get("backchannels")
    if phrases is not None and not all(isinstance(p, str) for p in phrases):
        raise RealtimeError("invalid_type", f"{param}.backchannels must be strings", f"{param}.backchannels")
    return pe.InterruptionSettings(
        mode=raw.get("mode"),
        min_words=raw.get("min_words"),
        backchannels=None if phrases is None else tuple(phrases),
        max_pause_ms=raw.get("max_pause_ms"),
    )
