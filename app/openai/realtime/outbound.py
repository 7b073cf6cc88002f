"""bargein's server events to OpenAI Realtime server events (GA schema).

:class:`Translator` is fed every event bargein's connection sends, in order,
and returns the OpenAI events to write instead (JSON objects, ``event_id``
included). One bargein response becomes OpenAI's sequence for a response
with one assistant message item of one content part::

    response.created, response.output_item.added, conversation.item.added,
    response.content_part.added, response.output_text.delta (or
    response.output_audio_transcript.delta and response.output_audio.delta)...,
    response.output_text.done (or output_audio.done, output_audio_transcript.done),
    response.content_part.done, response.output_item.done,
    conversation.item.done, response.done

With tools in force (bargein's ``response.created.tool_mode``) the answer
may be function calls, which bargein streams as the model writes them: JSON
in its generic format, read here with the same :class:`ToolCallParser` the
server uses (so call ids agree with bargein's). The message item is then
announced only once the answer is known to be text; each call is a
``function_call`` item instead::

    response.created, response.output_item.added (function_call),
    conversation.item.added, response.function_call_arguments.delta...,
    response.function_call_arguments.done, response.output_item.done,
    conversation.item.done (each call in turn), response.done

A call's item is the assistant item's id for the first call, with ``_<i>``
appended for call ``i`` after it; it ends ``incomplete`` unless the answer
ended by itself as whole calls (a cancel while its arguments streamed).
No call's JSON is ever sent as text.

``response.done``'s status comes from bargein's ``finish_reason``: ``stop`` is
``completed``; ``length`` is ``incomplete`` (``max_output_tokens``);
``interrupted`` is ``cancelled`` (``turn_detected`` when the user's speech
started while it was active, else ``client_cancelled``); ``cancelled`` is
``cancelled`` without a reason (the server's disconnect policy or shutdown),
or ``failed`` after an ``error`` of the response (dropped at its queue
deadline); ``error`` is ``failed``.

bargein's additions ride along as extra fields OpenAI clients ignore:
``session.created.session.bargein`` (``session_id``, ``session_token``,
``limits``), ``response.created.response.bargein`` (``stream_id``,
``resume_token``) and the text and arguments deltas' ``bargein`` (``start``, ``end``: token
offsets of the stream, for a resume). Sans-I/O.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bargein.app.openai.realtime.inbound import OPENAI_AUDIO_RATE, OpenAISession
from bargein.protocol import events as pe
from bargein.protocol._wire import to_wire
from bargein.session.conversation.actions import ItemAdded, ItemDeleted, ItemRetrieved, ItemTruncated, Message
from bargein.session.conversation.state import assistant_item_id
from bargein.session.conversation.tools import (
    ArgumentsDelta,
    CallStart,
    ContentDelta,
    ParserEvent,
    ToolCall,
    ToolCallParser,
    calls_of,
)
from bargein.session.runtime.admission import RateLimitLevel

_CLIENT_ERRORS = {
    pe.ErrorCode.INVALID_MESSAGE,
    pe.ErrorCode.UNKNOWN_TYPE,
    pe.ErrorCode.INVALID_PARAMETER,
    pe.ErrorCode.PROMPT_TOO_LONG,
    pe.ErrorCode.CONFLICT,
    pe.ErrorCode.NOT_FOUND,
    pe.ErrorCode.FORBIDDEN,
}


@dataclass(slots=True, kw_only=True)
class _Call:
    """One function call of a response, as its arguments stream."""

    item_id: str
    call_id: str
    name: str
    output_index: int
    arguments: str = ""


@dataclass(slots=True, kw_only=True)
class _Response:
    """One response being translated.

    Attributes:
        parser: with tools in force, reads the answer for calls (None: the
            answer is text, its message announced at once).
        previous: the conversation's last item when it started (the first
            output item follows it).
        outputs: the ids of its output items announced, in order.
        message_index: the message item's ``output_index`` once announced.
        held_from: the token offset of the first delta the parser held back
            (the ``bargein.start`` of the text it releases).
        mid_answer: a tool-mode answer resumed from an offset past its start
            (``bargein.resume``), which no parser can read from there: its
            text is held, and given at the end as bargein's
            ``response.done.tool_calls`` say (calls, or text).
        held: the text a ``mid_answer`` response holds.
        forced: its answer is calls by grammar (``tool_mode`` ``forced``):
            never text, even cut.
    """

    response_id: str
    stream_id: str
    audio: bool
    metadata: dict[str, str] | None
    max_output_tokens: int | None
    text: str = ""
    turn_detected: bool = False  # the user's speech started while it was active
    failed: dict[str, Any] | None = None  # the error that ended it
    parser: ToolCallParser | None = None
    previous: str | None = None
    outputs: list[str] = field(default_factory=list)
    calls: list[_Call] = field(default_factory=list)
    message_index: int | None = None
    held_from: int | None = None
    mid_answer: bool = False
    held: str = ""
    forced: bool = False


@dataclass(slots=True, kw_only=True)
class Translator:
    """One connection's server-side translation.

    Attributes:
        session: the OpenAI-only settings (shared with the inbound side).
        model: the served model's name.
        conversation: the session's items now (for ``previous_item_id``).
        rate_limits: the client's rate limits now (sent after each
            ``response.created``, as OpenAI does; none configured: an empty list).
    """

    session: OpenAISession
    model: str
    conversation: Callable[[], Sequence[Message]]
    rate_limits: Callable[[], Sequence[RateLimitLevel]] = tuple
    _created: pe.SessionCreated | None = None
    _announced: bool = False
    _responses: dict[str, _Response] = field(default_factory=dict)
    _done: list[str] = field(default_factory=list)  # recent finished response ids
    _spoken_items: set[str] = field(default_factory=set)  # assistant items that were audio
    _committed_ms: dict[str, int] = field(default_factory=dict)  # user turns' audio, until transcribed
    _empty_commits: set[str] = field(default_factory=set)  # commits of no audio, answered with error
    _partials: dict[str, str] = field(default_factory=dict)  # partial transcript sent per item, until final
    _settings: pe.SessionSettings | None = None

    def translate(self, event: object) -> list[dict[str, Any]]:
        """The OpenAI events that stand for one bargein server event (maybe none)."""
        handler = _HANDLERS.get(type(event))
        out = [] if handler is None else handler(self, event)
        for e in out:
            e.setdefault("event_id", f"event_{uuid.uuid4().hex[:24]}")
        return out

    def error(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        event_id: str | None = None,
        kind: str = "invalid_request_error",
    ) -> dict[str, Any]:
        """An OpenAI ``error`` event."""
        return {
            "type": "error",
            "event_id": f"event_{uuid.uuid4().hex[:24]}",
            "error": {"type": kind, "code": code, "message": message, "param": param, "event_id": event_id},
        }

    def open_responses(self) -> list[tuple[str, str]]:
        """``(response_id, stream_id)`` of the responses announced and not yet
        done on this connection, oldest first (a resumed stream's included)."""
        return [(r.response_id, r.stream_id) for r in self._responses.values()]

    # ---- session ---------------------------------------------------------------

    def _on_session_created(self, event: pe.SessionCreated) -> list[dict[str, Any]]:
        self._created = event  # announced with the settings, at the first session.updated
        return []

    def _on_session_updated(self, event: pe.SessionUpdated) -> list[dict[str, Any]]:
        self._settings = event.session
        session = self.session_object()
        if self._announced:
            return [{"type": "session.updated", "session": session}]
        self._announced = True
        created = self._created
        if created is not None:
            session["bargein"] = {
                "session_id": created.session_id,
                "session_token": created.session_token,
                "protocol": created.protocol,
                "limits": to_wire(created.limits, bytes_as_base64=True),
            }
        return [{"type": "session.created", "session": session}]

    def session_object(self) -> dict[str, Any]:
        """OpenAI's session resource for the settings in force."""
        s = self._settings or pe.SessionSettings()
        audio = s.audio
        speaks = audio is not None and audio.output is not None and audio.output.enabled
        td = None if audio is None or audio.input is None else audio.input.turn_detection
        turn_detection = None if td is None or td.type == "none" else _turn_detection(td)
        body: dict[str, Any] = {
            "type": "realtime",
            "object": "realtime.session",
            "id": f"sess_{self._created.session_id}" if self._created else "sess_",
            "model": self.model,
            "output_modalities": ["audio"] if speaks else ["text"],
            "instructions": s.instructions or "",
            "tools": [_tool(tool) for tool in s.tools or ()],
            "tool_choice": _tool_choice(s.tool_choice),
            "max_output_tokens": self.session.max_output_tokens or "inf",
            "tracing": None,
            "truncation": "auto",
            "prompt": None,
            "expires_at": 0,
            "include": None,
        }
        if self.session.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = self.session.parallel_tool_calls
        if audio is not None:
            inp = audio.input
            out = audio.output
            body["audio"] = {
                "input": {
                    "format": {
                        "type": "audio/pcm",
                        "rate": inp.sample_rate if inp and inp.sample_rate else OPENAI_AUDIO_RATE,
                    },
                    "transcription": self.session.transcription,
                    "noise_reduction": self.session.noise_reduction,
                    "turn_detection": turn_detection,
                },
                "output": {
                    "format": {"type": "audio/pcm", "rate": OPENAI_AUDIO_RATE},
                    "voice": out.voice if out is not None and out.voice else None,
                    "speed": 1.0,
                },
            }
        return body

    def _on_session_resumed(self, event: pe.SessionResumed) -> list[dict[str, Any]]:
        return [{**to_wire(event, bytes_as_base64=True), "type": "bargein.session.resumed"}]

    # ---- responses ---------------------------------------------------------------

    def _on_response_created(self, event: pe.ResponseCreated) -> list[dict[str, Any]]:
        asked = self.session.asked.pop(event.response_id, None)
        audio = event.modalities is not None and "audio" in event.modalities
        response = _Response(
            response_id=event.response_id,
            stream_id=event.stream_id,
            audio=audio,
            metadata=None if asked is None else asked.metadata,
            max_output_tokens=self.session.max_output_tokens if asked is None else asked.max_output_tokens,
        )
        if event.tool_mode is not None:
            response.parser = ToolCallParser(event.stream_id, event.tool_mode)
        turns = self.conversation()
        response.previous = turns[-1].item_id if turns else None
        self._responses[event.response_id] = response
        if audio:
            self._spoken_items.add(assistant_item_id(event.stream_id))
        body = self._response_object(response, "in_progress", None, None)
        body["bargein"] = {"stream_id": event.stream_id, "resume_token": event.resume_token}
        out: list[dict[str, Any]] = [{"type": "response.created", "response": body}]
        if response.parser is None:
            out += self._announce_message(response)
        out.append(
            {"type": "rate_limits.updated", "rate_limits": [asdict(level) for level in self.rate_limits()]}
        )
        return out

    def _announce_message(self, response: _Response) -> list[dict[str, Any]]:
        """The message item's announcement: its ``output_item.added``,
        ``conversation.item.added`` and ``content_part.added``."""
        item_id = assistant_item_id(response.stream_id)
        previous = self._next_output(response, item_id)
        response.message_index = len(response.outputs) - 1
        item = self._item(
            Message(role="assistant", content="", item_id=item_id), status="in_progress", empty=True
        )
        return [
            {
                "type": "response.output_item.added",
                "response_id": response.response_id,
                "output_index": response.message_index,
                "item": item,
            },
            {"type": "conversation.item.added", "previous_item_id": previous, "item": item},
            {"type": "response.content_part.added", **self._ids(response), "part": _part(response.audio, "")},
        ]

    def _next_output(self, response: _Response, item_id: str) -> str | None:
        """Adds an output item to ``response``; the id of the item it follows."""
        previous = response.outputs[-1] if response.outputs else response.previous
        response.outputs.append(item_id)
        return previous

    def _start_call(self, response: _Response, start: CallStart) -> list[dict[str, Any]]:
        """A call's ``function_call`` item announced, its arguments still to come."""
        first = assistant_item_id(response.stream_id)
        item_id = first if start.index == 0 else f"{first}_{start.index}"
        previous = self._next_output(response, item_id)
        call = _Call(
            item_id=item_id, call_id=start.call_id, name=start.name, output_index=len(response.outputs) - 1
        )
        response.calls.append(call)
        item = _call_item(call, "in_progress")
        return [
            {
                "type": "response.output_item.added",
                "response_id": response.response_id,
                "output_index": call.output_index,
                "item": item,
            },
            {"type": "conversation.item.added", "previous_item_id": previous, "item": item},
        ]

    def _parsed(self, response: _Response, events: list[ParserEvent], end: int) -> list[dict[str, Any]]:
        """The OpenAI events of what the parser read of a tool-mode answer
        (``end``: the token offset the answer has reached)."""
        out: list[dict[str, Any]] = []
        start = end if response.held_from is None else response.held_from
        for parsed in events:
            if isinstance(parsed, ContentDelta):
                if response.message_index is None:
                    out += self._announce_message(response)
                out.append(self._text_delta(response, parsed.text, start, end))
            elif isinstance(parsed, CallStart):
                out += self._start_call(response, parsed)
            else:
                out.append(self._arguments_delta(response, parsed, start, end))
        if out:
            response.held_from = None
        return out

    def _arguments_delta(
        self, response: _Response, delta: ArgumentsDelta, start: int, end: int
    ) -> dict[str, Any]:
        call = response.calls[delta.index]
        call.arguments += delta.text
        return {
            "type": "response.function_call_arguments.delta",
            "response_id": response.response_id,
            "item_id": call.item_id,
            "output_index": call.output_index,
            "call_id": call.call_id,
            "delta": delta.text,
            "bargein": {"start": start, "end": end},  # as the text deltas': for a resume
        }

    def _on_delta(self, event: pe.ResponseDelta) -> list[dict[str, Any]]:
        response = self._responses.get(event.response_id)
        if response is None or not event.text:
            return []
        parser = response.parser
        if parser is None and not response.mid_answer:
            return [self._text_delta(response, event.text, event.start, event.end)]
        if response.held_from is None:
            response.held_from = event.start
        if parser is None:  # mid-answer: held to its end
            response.held += event.text
            return []
        return self._parsed(response, parser.feed(event.text), event.end)

    def _text_delta(self, response: _Response, text: str, start: int, end: int) -> dict[str, Any]:
        response.text += text
        kind = "response.output_audio_transcript.delta" if response.audio else "response.output_text.delta"
        # the token offsets: what bargein.resume's stream.from takes after a drop
        offsets = {"start": start, "end": end}
        return {"type": kind, **self._ids(response), "delta": text, "bargein": offsets}

    def _on_audio_delta(self, event: pe.ResponseAudioDelta) -> list[dict[str, Any]]:
        response = self._responses.get(event.response_id)
        if response is None or response.message_index is None:
            # OpenAI's audio is a message's: an answer of calls has none (bargein's
            # --voice-tool-filler phrase is not sent), nor one held to its end
            return []
        audio = base64.b64encode(event.audio).decode("ascii")
        return [{"type": "response.output_audio.delta", **self._ids(response), "delta": audio}]

    def _on_audio_done(self, event: pe.ResponseAudioDone) -> list[dict[str, Any]]:
        response = self._responses.get(event.response_id)
        if response is None or response.message_index is None:
            return []  # no message, no audio part (above)
        return [{"type": "response.output_audio.done", **self._ids(response)}]

    def _on_done(self, event: pe.ResponseDone) -> list[dict[str, Any]]:
        response = self._responses.pop(event.response_id, None)
        if response is None:
            if event.response_id in self._done:
                # bargein answers a cancel of a finished response with its done
                # again (having cut its turn); OpenAI's answer is this error
                message = f"response {event.response_id!r} is already done"
                return [self.error("response_cancel_not_active", message)]
            return []  # of a response never announced
        self._done.append(event.response_id)
        del self._done[:-64]
        out: list[dict[str, Any]] = []
        whole_calls = False  # the answer is calls in the format, each whole
        if response.parser is not None:
            rest, calls = response.parser.finish()
            whole_calls = calls is not None
            if event.finish_reason != "stop":
                # what a cut answer held back may be a call's start: JSON is never sent as text
                rest = [parsed for parsed in rest if not isinstance(parsed, ContentDelta)]
            out += self._parsed(response, rest, event.end)
        elif response.mid_answer:
            whole_calls = event.tool_calls is not None
            out += self._held_answer(response, event)
        status, details = self._status(response, event.finish_reason)
        items: list[tuple[int, dict[str, Any]]] = []
        # a call is complete only if the answer also ended by itself (not cut after its JSON closed)
        call_status = "completed" if status == "completed" and whole_calls else "incomplete"
        for call in response.calls:
            item = _call_item(call, call_status)
            out += _call_done(response, call, item)
            items.append((call.output_index, item))
        if response.message_index is not None:
            item, events = self._message_done(
                response, "completed" if status == "completed" else "incomplete"
            )
            out += events
            items.append((response.message_index, item))
        body = self._response_object(response, status, details, event.usage)
        body["output"] = [item for _, item in sorted(items, key=lambda pair: pair[0])]
        out.append({"type": "response.done", "response": body})
        return out

    def _held_answer(self, response: _Response, done: pe.ResponseDone) -> list[dict[str, Any]]:
        """What a ``mid_answer`` response held, at its end: its calls, as
        bargein read them (each call's whole arguments in one delta), else its
        text, unless it may be a cut call's JSON."""
        start = done.end if response.held_from is None else response.held_from
        if done.tool_calls:
            out: list[dict[str, Any]] = []
            for index, call in enumerate(done.tool_calls):
                out += self._start_call(
                    response, CallStart(index=index, call_id=call.call_id, name=call.name)
                )
                whole = ArgumentsDelta(index=index, text=call.arguments)
                out.append(self._arguments_delta(response, whole, start, done.end))
            return out
        text = response.held
        if response.forced or not text or (done.finish_reason != "stop" and text.lstrip()[:1] in ("{", "[")):
            return []  # a cut forced call (held from its middle) is no text either
        return [*self._announce_message(response), self._text_delta(response, text, start, done.end)]

    def _message_done(self, response: _Response, status: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The message item, finished, and its done events."""
        ids = self._ids(response)
        item = self._item(
            Message(role="assistant", content=response.text, item_id=ids["item_id"]), status=status
        )
        if response.audio:
            text_done = {"type": "response.output_audio_transcript.done", **ids, "transcript": response.text}
        else:
            text_done = {"type": "response.output_text.done", **ids, "text": response.text}
        return item, [
            text_done,
            {"type": "response.content_part.done", **ids, "part": _part(response.audio, response.text)},
            {
                "type": "response.output_item.done",
                "response_id": response.response_id,
                "output_index": ids["output_index"],
                "item": item,
            },
            {"type": "conversation.item.done", "item": item},
        ]

    def _status(self, response: _Response, finish: str) -> tuple[str, dict[str, Any] | None]:
        if finish == "stop":
            return "completed", None
        if finish == "length":
            return "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
        if finish == "interrupted":
            reason = "turn_detected" if response.turn_detected else "client_cancelled"
            return "cancelled", {"type": "cancelled", "reason": reason}
        if finish == "cancelled" and response.failed is None:
            return "cancelled", {"type": "cancelled", "reason": None}
        error = response.failed or {
            "type": "server_error",
            "code": "internal_error",
            "message": "generation failed",
        }
        return "failed", {"type": "failed", "error": error}

    def _response_object(
        self, response: _Response, status: str, details: dict[str, Any] | None, usage: pe.Usage | None
    ) -> dict[str, Any]:
        return {
            "object": "realtime.response",
            "id": response.response_id,
            "status": status,
            "status_details": details,
            "output": [],
            "conversation_id": f"conv_{self._created.session_id}" if self._created else None,
            "output_modalities": ["audio"] if response.audio else ["text"],
            "max_output_tokens": response.max_output_tokens or "inf",
            "audio": {"output": {"format": {"type": "audio/pcm", "rate": OPENAI_AUDIO_RATE}, "voice": None}},
            "metadata": response.metadata,
            "usage": None
            if usage is None
            else {
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
                "input_tokens": usage.prompt_tokens,
                "output_tokens": usage.completion_tokens,
                "input_token_details": {
                    "cached_tokens": usage.cached_tokens,
                    "text_tokens": usage.prompt_tokens,
                    "audio_tokens": 0,
                    "image_tokens": 0,
                },
                "output_token_details": {"text_tokens": usage.completion_tokens, "audio_tokens": 0},
            },
        }

    def _ids(self, response: _Response) -> dict[str, Any]:
        return {
            "response_id": response.response_id,
            "item_id": assistant_item_id(response.stream_id),
            "output_index": response.message_index or 0,
            "content_index": 0,
        }

    def _on_stream_resumed(self, event: pe.StreamResumed) -> list[dict[str, Any]]:
        out = [{**to_wire(event, bytes_as_base64=True), "type": "bargein.stream.resumed"}]
        if event.response_id not in self._responses:
            # a new connection knows nothing of it: announce it, so the deltas have their item
            tool_mode = event.tool_mode  # the stream's own, kept in the log
            created = pe.ResponseCreated(
                response_id=event.response_id, stream_id=event.stream_id, resume_token="", tool_mode=tool_mode
            )
            out += self._on_response_created(created)
            if tool_mode is not None and event.from_ > 0:
                # the parser needs the answer from its start, which the other connection had
                response = self._responses[event.response_id]
                response.parser, response.mid_answer = None, True
                response.forced = tool_mode == "forced"
        return out

    def _on_error(self, event: pe.ErrorEvent) -> list[dict[str, Any]]:
        kind = "invalid_request_error" if event.code in _CLIENT_ERRORS else "server_error"
        code = event.code.value
        if event.code is pe.ErrorCode.CONFLICT and "already active" in event.message:
            code = "conversation_already_has_active_response"
        out = self.error(code, event.message, event_id=event.event_id, kind=kind)
        if event.retry_after_ms is not None:
            out["error"]["retry_after_ms"] = event.retry_after_ms
        if event.response_id is not None:
            out["error"]["response_id"] = event.response_id
            response = self._responses.get(event.response_id)
            if response is not None:
                response.failed = {"type": kind, "code": code, "message": event.message}
        return [out]

    # ---- input audio ---------------------------------------------------------

    def _on_speech_started(self, event: pe.InputAudioSpeechStarted) -> list[dict[str, Any]]:
        audio = None if self._settings is None else self._settings.audio
        td = None if audio is None or audio.input is None else audio.input.turn_detection
        if td is not None and td.interrupt_response:
            for response in self._responses.values():
                response.turn_detected = True  # the barge-in by voice cancels it: this is its reason
        return [
            {
                "type": "input_audio_buffer.speech_started",
                "audio_start_ms": event.audio_start_ms,
                "item_id": event.item_id,
            }
        ]

    def _on_audio_paused(self, event: pe.ResponseAudioPaused) -> list[dict[str, Any]]:
        response = self._responses.get(event.response_id)
        if response is None:
            return []
        return [{"type": "output_audio_buffer.paused", **self._ids(response), "audio_end_ms": event.end_ms}]

    def _on_audio_resumed(self, event: pe.ResponseAudioResumed) -> list[dict[str, Any]]:
        response = self._responses.get(event.response_id)
        if response is None:
            return []
        return [
            {"type": "output_audio_buffer.resumed", **self._ids(response), "audio_start_ms": event.from_ms}
        ]

    def _on_discarded(self, event: pe.InputAudioDiscarded) -> list[dict[str, Any]]:
        return [
            {
                "type": "input_audio_buffer.discarded",
                "item_id": event.item_id,
                "reason": event.reason,
                "transcript": event.transcript,
            }
        ]

    def _on_speech_stopped(self, event: pe.InputAudioSpeechStopped) -> list[dict[str, Any]]:
        return [
            {
                "type": "input_audio_buffer.speech_stopped",
                "audio_end_ms": event.audio_end_ms,
                "item_id": event.item_id,
            }
        ]

    def _on_committed(self, event: pe.InputAudioCommitted) -> list[dict[str, Any]]:
        if event.audio_end_ms <= event.audio_start_ms:
            # no audio: bargein adds no item (and says so with an empty final
            # transcript, dropped below); OpenAI refuses the commit
            self._empty_commits.add(event.item_id)
            return [self.error("input_audio_buffer_commit_empty", "the input audio buffer is empty")]
        self._committed_ms[event.item_id] = event.audio_end_ms - event.audio_start_ms
        while len(self._committed_ms) > 64:  # a transcript that never came
            self._committed_ms.pop(next(iter(self._committed_ms)))
        turns = self.conversation()
        previous = turns[-1].item_id if turns else None
        item = _spoken_user_item(event.item_id, None)
        return [
            {"type": "input_audio_buffer.committed", "item_id": event.item_id, "previous_item_id": previous},
            {"type": "conversation.item.added", "previous_item_id": previous, "item": item},
        ]

    def _on_transcript(self, event: pe.InputAudioTranscript) -> list[dict[str, Any]]:
        ids = {"item_id": event.item_id, "content_index": 0}
        if not event.final:
            return self._transcript_delta(event, ids)
        self._partials.pop(event.item_id, None)
        if event.item_id in self._empty_commits:
            self._empty_commits.discard(event.item_id)
            return []
        seconds = self._committed_ms.pop(event.item_id, 0) / 1000
        if event.error is not None:
            # the item announced at the commit never joins the conversation
            kind = "invalid_request_error" if event.error.code in _CLIENT_ERRORS else "server_error"
            error = {
                "type": kind,
                "code": event.error.code.value,
                "message": event.error.message,
                "param": None,
            }
            return [
                {"type": "conversation.item.input_audio_transcription.failed", **ids, "error": error},
                {"type": "conversation.item.deleted", "item_id": event.item_id},
            ]
        completed = {
            "type": "conversation.item.input_audio_transcription.completed",
            **ids,
            "transcript": event.text,
            "usage": {"type": "duration", "seconds": seconds},  # required by OpenAI's schema
        }
        if not event.text:
            # no words (silence, noise): bargein adds no item; the client was
            # told of one at the commit, so it hears that it is gone
            return [completed, {"type": "conversation.item.deleted", "item_id": event.item_id}]
        return [
            completed,
            {"type": "conversation.item.done", "item": _spoken_user_item(event.item_id, event.text)},
        ]

    def _transcript_delta(self, event: pe.InputAudioTranscript, ids: dict[str, Any]) -> list[dict[str, Any]]:
        """A partial transcript (the turn's whole text so far) as the delta
        that extends the text already sent: deltas never restate text. One
        that revises sent text is not sent (bargein's partials only extend
        the last one; ``.completed`` carries the final text)."""
        sent = self._partials.get(event.item_id, "")
        if len(event.text) <= len(sent) or not event.text.startswith(sent):
            return []
        self._partials[event.item_id] = event.text
        while len(self._partials) > 64:  # a final that never came
            self._partials.pop(next(iter(self._partials)))
        return [
            {
                "type": "conversation.item.input_audio_transcription.delta",
                **ids,
                "delta": event.text[len(sent) :],
            }
        ]

    # ---- items ---------------------------------------------------------------

    def _on_item_added(self, event: ItemAdded) -> list[dict[str, Any]]:
        item = self._item(event.item)
        return [
            {"type": "conversation.item.added", "previous_item_id": event.previous_item_id, "item": item},
            {"type": "conversation.item.done", "previous_item_id": event.previous_item_id, "item": item},
        ]

    def _on_item_deleted(self, event: ItemDeleted) -> list[dict[str, Any]]:
        return [{"type": "conversation.item.deleted", "item_id": event.item_id}]

    def _on_item_retrieved(self, event: ItemRetrieved) -> list[dict[str, Any]]:
        return [{"type": "conversation.item.retrieved", "item": self._item(event.item)}]

    def _on_item_truncated(self, event: ItemTruncated) -> list[dict[str, Any]]:
        truncated = {
            "type": "conversation.item.truncated",
            "item_id": event.item_id,
            "content_index": 0,
            "audio_end_ms": event.audio_end_ms or 0,
        }
        return [truncated]

    def _item(self, message: Message, *, status: str = "completed", empty: bool = False) -> dict[str, Any]:
        """OpenAI's conversation item for a bargein conversation item: a
        ``tool`` turn is a ``function_call_output``, an assistant turn that
        made calls a ``function_call`` (its first call's)."""
        if message.role == "tool":
            return {
                "id": message.item_id,
                "object": "realtime.item",
                "type": "function_call_output",
                "status": status,
                "call_id": message.call_id,
                "output": message.content,
            }
        spoken = message.item_id in self._spoken_items
        call = _first_call(message) if message.role == "assistant" and not empty else None
        if call is not None:
            return {
                "id": message.item_id,
                "object": "realtime.item",
                "type": "function_call",
                "status": status,
                "call_id": message.call_id or call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            }
        if empty:
            content: list[dict[str, Any]] = []
        elif message.role == "assistant":
            content = [
                {"type": "output_audio", "transcript": message.content}
                if spoken
                else {"type": "output_text", "text": message.content}
            ]
        else:
            content = [{"type": "input_text", "text": message.content}]
        return {
            "id": message.item_id,
            "object": "realtime.item",
            "type": "message",
            "role": message.role,
            "status": status,
            "content": content,
        }


def _spoken_user_item(item_id: str, transcript: str | None) -> dict[str, Any]:
    """The user item of a voice turn (its transcript None until transcribed)."""
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": [{"type": "input_audio", "transcript": transcript}],
    }


def _first_call(message: Message) -> ToolCall | None:
    """The first call an assistant turn made, if its text is calls in the
    generic format; its id is the one bargein gave it (made from the
    stream, which the item's id names)."""
    calls = calls_of(message.content, (message.item_id or "").removeprefix("item_"))
    return calls[0] if calls else None


def _call_item(call: _Call, status: str) -> dict[str, Any]:
    """The ``function_call`` item of a call of a response (its arguments so far)."""
    return {
        "id": call.item_id,
        "object": "realtime.item",
        "type": "function_call",
        "status": status,
        "call_id": call.call_id,
        "name": call.name,
        "arguments": call.arguments,
    }


def _call_done(response: _Response, call: _Call, item: dict[str, Any]) -> list[dict[str, Any]]:
    """A call's last events: its whole arguments (only for a whole call: a
    cut one's are no call to run), then its item done."""
    ids = {"response_id": response.response_id, "item_id": call.item_id, "output_index": call.output_index}
    arguments_done = {
        "type": "response.function_call_arguments.done",
        **ids,
        "call_id": call.call_id,
        "name": call.name,
        "arguments": call.arguments,
    }
    return [
        *([arguments_done] if item["status"] == "completed" else []),
        {
            "type": "response.output_item.done",
            "response_id": response.response_id,
            "output_index": call.output_index,
            "item": item,
        },
        {"type": "conversation.item.done", "item": item},
    ]


def _tool(tool: pe.FunctionTool) -> dict[str, Any]:
    """OpenAI's function tool for one of bargein's."""
    parameters = None if tool.parameters is None else json.loads(tool.parameters)
    return {"type": "function", "name": tool.name, "description": tool.description, "parameters": parameters}


def _tool_choice(choice: pe.ToolChoice | None) -> str | dict[str, str]:
    """OpenAI's ``tool_choice`` for the one in force (none set: ``auto``)."""
    if choice is None:
        return "auto"
    if isinstance(choice, pe.NamedToolChoice):
        return {"type": "function", "name": choice.name}
    return choice


def _part(audio: bool, text: str) -> dict[str, Any]:
    return {"type": "audio", "transcript": text} if audio else {"type": "text", "text": text}


_HANDLERS: dict[type, Callable[[Translator, Any], list[dict[str, Any]]]] = {
    pe.SessionCreated: Translator._on_session_created,
    pe.SessionUpdated: Translator._on_session_updated,
    pe.SessionResumed: Translator._on_session_resumed,
    pe.ResponseCreated: Translator._on_response_created,
    pe.ResponseDelta: Translator._on_delta,
    pe.ResponseAudioDelta: Translator._on_audio_delta,
    pe.ResponseAudioDone: Translator._on_audio_done,
    pe.ResponseDone: Translator._on_done,
    pe.StreamResumed: Translator._on_stream_resumed,
    pe.ErrorEvent: Translator._on_error,
    pe.InputAudioSpeechStarted: Translator._on_speech_started,
    pe.ResponseAudioPaused: Translator._on_audio_paused,
    pe.ResponseAudioResumed: Translator._on_audio_resumed,
    pe.InputAudioDiscarded: Translator._on_discarded,
    pe.InputAudioSpeechStopped: Translator._on_speech_stopped,
    pe.InputAudioCommitted: Translator._on_committed,
    pe.InputAudioTranscript: Translator._on_transcript,
    ItemAdded: Translator._on_item_added,
    ItemDeleted: Translator._on_item_deleted,
    ItemRetrieved: Translator._on_item_retrieved,
    ItemTruncated: Translator._on_item_truncated,
}  # pong: OpenAI has no ping; input_audio.clear is answered by the endpoint; bargein's
# function_call_arguments events are not translated: the parser reads the same answer from its deltas


def _turn_detection(td: pe.TurnDetectionSettings) -> dict[str, Any]:
    """OpenAI's ``turn_detection`` object for the detection in force (``server_vad``
    or ``semantic_vad``); bargein's ``interruption`` only when not OpenAI's
    ``immediate`` (a client that never asked for it sees OpenAI's object)."""
    if td.type == "semantic_vad":
        out: dict[str, Any] = {
            "type": "semantic_vad",
            "eagerness": td.eagerness,
            "create_response": td.create_response,
            "interrupt_response": td.interrupt_response,
        }
    else:
        out = {
            "type": "server_vad",
            "threshold": td.threshold,
            "prefix_padding_ms": td.prefix_padding_ms,
            "silence_duration_ms": td.silence_duration_ms,
            "create_response": td.create_response,
            "interrupt_response": td.interrupt_response,
            "idle_timeout_ms": None,
        }
    it = td.interruption
    if it is not None and it.mode != "immediate":
        out["interruption"] = {
            "mode": it.mode,
            "min_words": it.min_words,
            "backchannels": list(it.backchannels or ()),
            "max_pause_ms": it.max_pause_ms,
        }
    return out
