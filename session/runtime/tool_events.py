"""A response read for function calls, as bargein's events (sans-I/O).

A response with tools in force (``tool_mode``) streams the model's answer
as it is: its ``response.delta`` text is the answer, calls included, in the
generic format (session/conversation/tools.py), so offsets, resume and the
log stay what they are for any answer. :class:`ToolCallEvents` reads that
text as it is delivered and says, beside it, what it holds:

- ``response.function_call_arguments.delta`` for each fragment of a call's
  arguments (the fragments concatenate to its arguments' JSON text);
- at the end, ``response.function_call_arguments.done`` for each call and
  the calls for ``response.done.tool_calls``;
- the answer's text that is no call, for what speaks it (a voice response
  never reads a call's JSON aloud).
"""

from __future__ import annotations

from dataclasses import dataclass

from bargein.protocol import events as pe
from bargein.session.conversation.tools import (
    ArgumentsDelta,
    CallStart,
    ContentDelta,
    ParserEvent,
    ToolCallParser,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadOut:
    """What some of an answer's text holds.

    Attributes:
        text: the part that is no call (to speak).
        events: the function-call events to send after the text's delta.
    """

    text: str
    events: tuple[pe.ServerEvent, ...]


class ToolCallEvents:
    """Reads one response's answer for calls (not thread-safe).

    Args:
        response_id, stream_id: the response (call ids are made from the stream,
            so every node and every replay names a call the same).
        mode: ``forced`` (the answer is calls) or ``auto`` (calls or text).
    """

    def __init__(self, response_id: str, stream_id: str, mode: pe.ToolMode) -> None:
        self._response_id = response_id
        self._stream_id = stream_id
        self._parser = ToolCallParser(stream_id, mode)
        self._names: dict[int, tuple[str, str]] = {}  # call index -> (call_id, name)

    def feed(self, text: str) -> ReadOut:
        """What ``text``, the answer's next characters, holds."""
        return self._read(self._parser.feed(text))

    def finish(self) -> tuple[ReadOut, tuple[pe.FunctionCall, ...] | None]:
        """What the rest holds (each call's ``done`` included), and the calls of
        the whole answer (None when it is text, or calls cut before they were
        whole)."""
        events, calls = self._parser.finish()
        out = self._read(events)
        if calls is None:
            return out, None
        done = tuple(
            pe.FunctionCallArgumentsDone(
                response_id=self._response_id,
                stream_id=self._stream_id,
                index=i,
                call_id=c.call_id,
                name=c.name,
                arguments=c.arguments,
            )
            for i, c in enumerate(calls)
        )
        made = tuple(pe.FunctionCall(call_id=c.call_id, name=c.name, arguments=c.arguments) for c in calls)
        return ReadOut(text=out.text, events=out.events + done), made

    def _read(self, events: list[ParserEvent]) -> ReadOut:
        text: list[str] = []
        out: list[pe.ServerEvent] = []
        for event in events:
            if isinstance(event, ContentDelta):
                text.append(event.text)
            elif isinstance(event, CallStart):
                self._names[event.index] = (event.call_id, event.name)
            elif isinstance(event, ArgumentsDelta):
                call_id, name = self._names[event.index]
                out.append(
                    pe.FunctionCallArgumentsDelta(
                        response_id=self._response_id,
                        stream_id=self._stream_id,
                        index=event.index,
                        call_id=call_id,
                        name=name,
                        delta=event.text,
                    )
                )
        return ReadOut(text="".join(text), events=tuple(out))


def spoken_text(text: str, mode: pe.ToolMode | None) -> str:
    """The part of an answer (so far) that is no call: what a voice speaks."""
    if mode is None:
        return text
    return ToolCallEvents("", "", mode).feed(text).text
