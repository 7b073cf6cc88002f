"""Function calling for chat templates that know no tools: bargein's generic format (pure).

The bundled SmolLM2's chat template has no tool syntax, so bargein uses a
format of its own (llama.cpp's server does the same for such templates):

- **The prompt.** A system message, before the conversation's own, lists
  the functions, one JSON object a line (``{"name", "description",
  "parameters"}``), and says how to call them (:func:`tools_prompt`).
- **A call.** The model answers with only JSON: ``{"name": <function>,
  "arguments": {...}}`` for one call, or a JSON array of such objects for
  several. Any other answer is text.
- **Forced calls.** With ``tool_choice`` ``required`` or a named function
  the answer is constrained by a grammar (:func:`tool_call_schema`, a JSON
  schema the engine enforces): it is always a valid call to one of the
  given functions, its arguments valid against that function's
  ``parameters``; an array only when parallel calls are allowed.
- **History.** An assistant turn that made calls is rendered as the JSON it
  would have answered (:func:`calls_text`); a tool's result is a turn of
  role ``tool`` holding the result's text, in the order of the calls.

:class:`ToolCallParser` reads an answer as it streams and reports the calls
as OpenAI streams them: a call's name once it is complete, then its
``arguments`` as raw text fragments that concatenate to the arguments' JSON
exactly as the model wrote it. The same parser makes the non-streamed
answer, so both agree. It knows no transport: the HTTP API uses it, and
the Realtime endpoints can.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bargein.engine.grammar_spec import GrammarSpec
from bargein.session.conversation.actions import Message

ToolMode = Literal["auto", "forced"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Tool:
    """One function the model may call.

    Attributes:
        name: the function's name (OpenAI: ``[a-zA-Z0-9_-]{1,64}``).
        description: what it does, for the model ("" if none).
        parameters: JSON text of the JSON schema of its arguments object.
    """

    name: str
    description: str
    parameters: str

    def schema(self) -> dict[str, Any]:
        """The parameters schema as a dict (an object schema)."""
        parsed: dict[str, Any] = json.loads(self.parameters)
        return parsed


def tools_prompt(tools: Sequence[Tool]) -> str:
    """The system message that lists ``tools`` and the call format."""
    lines = ["You can call these functions. Each line is one function with the JSON schema of its arguments:"]
    for tool in tools:
        entry = {"name": tool.name, "description": tool.description, "parameters": tool.schema()}
        lines.append(json.dumps(entry, separators=(",", ":"), ensure_ascii=False))
    lines.append(
        'To call a function, answer with only a JSON object {"name": <function name>, "arguments": '
        "<its arguments object>}; to call several, a JSON array of such objects. To answer the user "
        "instead, write text."
    )
    return "\n".join(lines)


def with_system_text(messages: Sequence[Message], text: str) -> tuple[Message, ...]:
    """``messages`` with ``text`` (the tools' prompt) in the system turn first:
    after the conversation's own system text, in the same turn, when it has one."""
    if messages and messages[0].role == "system":
        return (Message(role="system", content=f"{messages[0].content}\n\n{text}"), *messages[1:])
    return (Message(role="system", content=text), *messages)


def tool_call_schema(tools: Sequence[Tool], *, parallel: bool) -> GrammarSpec:
    """The grammar of a forced call: one call to one of ``tools`` (or, with
    ``parallel``, also an array of at least one), ``name`` first, then its
    ``arguments`` valid against the function's schema."""
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, "arguments": tool.schema()},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    one: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema = {"anyOf": [one, {"type": "array", "items": one, "minItems": 1}]} if parallel else one
    return GrammarSpec.json_schema(schema)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """One call, as the model made it.

    Attributes:
        call_id: the call's id (``call_...``), a function of the stream and
            the call's index, so a replay gives the same.
        name: the function.
        arguments: the arguments' JSON text, as the model wrote it.
    """

    call_id: str
    name: str
    arguments: str


def call_id(stream_id: str, index: int) -> str:
    """The id of call ``index`` of a stream: the same on every replay."""
    return f"call_{stream_id[:24]}_{index}"


def calls_text(calls: Sequence[tuple[str, str]]) -> str:
    """The answer that makes ``calls`` (``(name, arguments JSON)`` pairs), in
    the generic format: one object, or an array of several. Arguments that
    are not JSON stay a string."""
    objects = []
    for name, arguments in calls:
        try:
            parsed: Any = json.loads(arguments)
        except ValueError:
            parsed = arguments
        objects.append({"name": name, "arguments": parsed})
    body: Any = objects[0] if len(objects) == 1 else objects
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def calls_of(text: str, stream_id: str = "") -> list[ToolCall] | None:
    """The calls of a whole answer in the generic format (ids made from
    ``stream_id``), or None when it is not calls (text, or calls cut short)."""
    if not text.lstrip().startswith(("{", "[")):
        return None  # no JSON at all: not worth a parse
    parser = ToolCallParser(stream_id, "forced")
    parser.feed(text)
    return parser.calls()


UNANSWERED_CALL = "cancelled: the conversation went on before this call's result came"


def settled_calls(messages: Sequence[Message]) -> tuple[Message, ...]:
    """``messages`` with every call answered: an assistant turn that made
    calls is followed by one ``tool`` turn per call, in order; the calls the
    client gave no result for before the conversation went on (the user
    spoke while it ran the tool, a barge-in) get a ``tool`` turn saying so
    (:data:`UNANSWERED_CALL`), so the prompt holds what happened and the
    model never sees a call without its outcome. The conversation itself
    is not changed: a late result still comes after, as the client sent it."""
    missing: dict[int, int] = {}  # index of the turn the cancelled results follow -> how many
    for i, message in enumerate(messages):
        calls = calls_of(message.content) if message.role == "assistant" else None
        if calls is None:
            continue
        answered = 0
        for later in messages[i + 1 :]:
            if later.role != "tool":
                break
            answered += 1
        # calls that are the last turns (with their results so far) may get the rest yet
        if answered < len(calls) and i + answered + 1 < len(messages):
            missing[i + answered] = len(calls) - answered
    out: list[Message] = []
    for i, message in enumerate(messages):
        out.append(message)
        out += [Message(role="tool", content=UNANSWERED_CALL)] * missing.get(i, 0)
    return tuple(out)


# ---- reading an answer ---------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CallStart:
    """A call's first chunk: its index among the answer's calls, id and name."""

    index: int
    call_id: str
    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ArgumentsDelta:
    """More of call ``index``'s arguments text."""

    index: int
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ContentDelta:
    """Text of an answer that is not a call."""

    text: str


ParserEvent = CallStart | ArgumentsDelta | ContentDelta


@dataclass(slots=True)
class _PartialCall:
    name: str | None = None
    args_start: int | None = None
    args_end: int | None = None


class ToolCallParser:
    """Reads an answer in the generic format as it streams (not thread-safe).

    Args:
        stream_id: names the calls' ids (:func:`call_id`).
        mode: ``forced``: the answer is a call (a grammar made it so);
            ``auto``: an answer whose first non-blank character is ``{`` or
            ``[`` is read as calls, anything else is text, streamed as it
            comes.

    :meth:`feed` returns what the new text completes; :meth:`finish` what is
    left once the answer ended. An answer read as calls that turns out not
    to be one (``auto``: ``{"a": 1}``, or JSON that never closed) is given
    as text at the end if no call was reported yet.
    """

    def __init__(self, stream_id: str, mode: ToolMode) -> None:
        self._stream_id = stream_id
        self._mode = mode
        self._text = ""
        self._is_calls: bool | None = True if mode == "forced" else None
        self._num_started = 0
        self._sent_args: list[int] = []

    @property
    def text(self) -> str:
        """The answer so far."""
        return self._text

    def feed(self, text: str) -> list[ParserEvent]:
        """The events ``text`` (the answer's next characters) completes."""
        self._text += text
        if self._is_calls is None:
            stripped = self._text.lstrip()
            if not stripped:
                return []
            self._is_calls = stripped[0] in "{["
            if not self._is_calls:
                return [ContentDelta(text=self._text)]
            return self._call_events()
        if not self._is_calls:
            return [ContentDelta(text=text)] if text else []
        return self._call_events()

    def finish(self) -> tuple[list[ParserEvent], list[ToolCall] | None]:
        """The last events, and the answer's calls (None: the answer is text).

        Calls need the whole answer to be JSON in the format; an answer read
        as calls that is not comes back as one :class:`ContentDelta` (only
        if no call was reported while it streamed).
        """
        if self._is_calls is None:  # blanks only: text, held back until now
            self._is_calls = False
            return ([ContentDelta(text=self._text)] if self._text else []), None
        if not self._is_calls:
            return [], None
        events = self._call_events()
        calls = self.calls()
        if calls is None and self._num_started == 0:
            events.append(ContentDelta(text=self._text))
        return events, calls

    def calls(self) -> list[ToolCall] | None:
        """The calls of the whole answer so far, if it is complete JSON in the format."""
        try:
            body = json.loads(self._text)
        except ValueError:
            return None
        objects = body if isinstance(body, list) else [body]
        if not objects or not all(_is_call(o) for o in objects):
            return None
        partials = _scan(self._text)
        if len(partials) != len(objects):
            return None
        return [
            ToolCall(
                call_id=call_id(self._stream_id, i),
                name=str(o["name"]),
                arguments=self._text[p.args_start : p.args_end],
            )
            for i, (o, p) in enumerate(zip(objects, partials, strict=True))
        ]

    def _call_events(self) -> list[ParserEvent]:
        events: list[ParserEvent] = []
        for index, partial in enumerate(_scan(self._text)):
            if index >= self._num_started:
                if partial.name is None or index != self._num_started:
                    break  # calls start in order, once the name is whole
                events.append(
                    CallStart(index=index, call_id=call_id(self._stream_id, index), name=partial.name)
                )
                self._num_started += 1
                self._sent_args.append(0)
            if partial.args_start is None:
                continue
            if partial.args_end is not None:
                args = self._text[partial.args_start : partial.args_end]
            else:  # still open: trailing blanks may yet be followed by nothing of it
                args = self._text[partial.args_start :].rstrip()
            if len(args) > self._sent_args[index]:
                events.append(ArgumentsDelta(index=index, text=args[self._sent_args[index] :]))
                self._sent_args[index] = len(args)
        return events


def _is_call(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and isinstance(value.get("name"), str)
        and isinstance(value.get("arguments"), Mapping)
        and set(value) <= {"name", "arguments"}
    )


def _scan(text: str) -> list[_PartialCall]:
    """The calls of a (possibly unfinished) answer: each call object's name,
    once its string closed, and the span of its ``arguments`` value (its
    end None while the value is open). Call objects are the top-level object,
    or the objects directly inside a top-level array."""
    calls: list[_PartialCall] = []
    stack: list[str] = []  # open containers: "{" or "["
    call_depth = 0
    current: _PartialCall | None = None
    key: str | None = None  # the last key read in the current call object
    expect_key = False
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in " \t\r\n":
            i += 1
            continue
        if ch == '"':
            end = _string_end(text, i)
            if end is None:
                return calls  # the string is still open
            if current is not None and len(stack) == call_depth:
                raw = text[i : end + 1]
                if expect_key:
                    key = json.loads(raw)
                elif key == "name":
                    current.name = json.loads(raw)
                    key = None
            i = end + 1
            continue
        if ch in "{[":
            if not stack:
                call_depth = 1 if ch == "{" else 2
            stack.append(ch)
            if ch == "{" and len(stack) == call_depth:
                current = _PartialCall()
                calls.append(current)
                expect_key, key = True, None
            i += 1
            continue
        if ch in "}]":
            if current is not None and len(stack) == call_depth and current.args_start is not None:
                if current.args_end is None:
                    current.args_end = _trim_end(text, i)
            if stack:
                stack.pop()
            if len(stack) == call_depth and current is not None and key == "arguments":
                current.args_end = i + 1  # the arguments' object or array closed
                key = None
            elif len(stack) < call_depth:
                current = None
            i += 1
            continue
        if ch == ":":
            if current is not None and len(stack) == call_depth:
                expect_key = False
                if key == "arguments":
                    current.args_start = _skip_blank(text, i + 1)
            i += 1
            continue
        if ch == ",":
            if current is not None and len(stack) == call_depth:
                if key == "arguments" and current.args_end is None:
                    current.args_end = _trim_end(text, i)
                expect_key, key = True, None
            i += 1
            continue
        i += 1  # a number, true, false, null: part of a value
    return calls


def _string_end(text: str, start: int) -> int | None:
    """Index of the quote that closes the string opening at ``start``."""
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i
        i += 1
    return None


def _skip_blank(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _trim_end(text: str, i: int) -> int:
    """``i`` moved left past blanks: where a scalar value before it ends."""
    while i > 0 and text[i - 1] in " \t\r\n":
        i -= 1
    return i
