"""OpenAI chat-completions and (legacy) completions shapes: request validation
and response bodies (pure).

Requests are checked field by field against the OpenAI API reference
(https://platform.openai.com/docs/api-reference/chat/create) for the fields
bargein supports; a bad value raises :class:`ApiError`, which the app
answers with HTTP 400 and OpenAI's error body before anything is scheduled.
Fields OpenAI defines that would change the answer's meaning and that bargein
does not implement (``n`` other than 1, logprobs, penalties, logit bias,
the legacy ``functions``) are refused the same way instead of being
ignored; fields unknown to both are ignored, as OpenAI does.

Structured outputs and tools (:mod:`bargein.session.conversation.tools`
has the generic tool-call format): ``response_format`` ``json_object`` or
``json_schema`` becomes a grammar the engine enforces (``strict`` or not);
``tools`` are listed in a system message, ``tool_choice`` ``required`` or a
named function constrains the answer to a valid call by grammar, ``auto``
lets the model choose and the answer is parsed for calls. A JSON schema
keyword the grammar library cannot enforce is a 400 naming it
(``unsupported_schema``), never ignored. Two of vLLM's
extra parameters are honoured, so benchmarks can fix output lengths across
servers: ``ignore_eos`` (generate past EOS) and ``min_tokens`` (in
``[0, max_tokens]``: no EOS, stop token or stop string ends the answer
before that many tokens).

The legacy ``POST /v1/completions`` (what ``vllm bench serve`` and lm-eval
drive by default) takes one prompt string (or a list of one) and generates
from it as is, without the chat template; ``echo``, ``logprobs``,
``suffix``, ``best_of`` and ``n`` other than 1 are refused.

``finish_reason`` is ``stop`` or ``length`` as in OpenAI, or one of bargein's
own: ``interrupted`` (``POST /v1/streams/{id}/cancel``, barge-in),
``cancelled`` (the client disconnected under the ``cancel`` policy, or the
server stopped it) and ``error``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bargein.engine.errors import GrammarError
from bargein.engine.grammar import check_grammar
from bargein.engine.grammar_spec import MAX_SCHEMA_DEPTH, GrammarKind, GrammarSpec, nested_too_deep
from bargein.engine.request import SamplingParams
from bargein.session.conversation.config import SessionConfig
from bargein.session.conversation.state import Message
from bargein.session.conversation.tools import (
    Tool,
    ToolCall,
    ToolMode,
    calls_text,
    tool_call_schema,
    tools_prompt,
    with_system_text,
)
from bargein.session.streams.log import StreamEnd

MAX_STOP_STRINGS = 4  # as OpenAI, and as the WebSocket's response.create
MAX_SEED = 2**63 - 1  # as the WebSocket: an int64 everywhere (torch, Redis, msgpack)
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_TOOLS = 128  # as OpenAI
_TOOL_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
OnDisconnect = Literal["continue", "cancel"]
_ORIGIN_PREFIX = "openai-http:"


class ApiError(Exception):
    """A request bargein answers with an OpenAI error body instead of a completion.

    Attributes:
        message: what is wrong, for people (no internals).
        param: the offending parameter (``messages[1].content``), or None.
        code: machine-readable reason (``invalid_value``, ``context_length_exceeded``...).
        status: the HTTP status to answer with.
        type_: OpenAI's error type (``invalid_request_error``, ``server_error``).
        headers: extra response headers (``Retry-After``).
    """

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = "invalid_value",
        status: int = 400,
        type_: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.headers = headers
        self.message = message
        self.param = param
        self.code = code
        self.status = status
        self.type_ = type_

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        return error_body(self.message, type_=self.type_, param=self.param, code=self.code)


def error_body(
    message: str, *, type_: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatRequest:
    """A validated ``POST /v1/chat/completions``.

    Attributes:
        messages: the conversation (``developer`` turns become ``system``).
        params: sampling, within the server's ``max_tokens`` limit.
        stream: answer with SSE chunks instead of one JSON body.
        include_usage: ``stream_options.include_usage``: one last chunk with usage.
        on_disconnect: ``bargein_on_disconnect``; None takes the server's default.
        user: OpenAI's end-user id (not used for anything yet).
        tools: the functions the model may call (listed in the prompt).
        tool_mode: how the answer is read for calls: ``forced`` (a grammar
            makes it a call), ``auto`` (a call if it is one), None (text).
    """

    messages: tuple[Message, ...]
    params: SamplingParams
    stream: bool
    include_usage: bool
    on_disconnect: OnDisconnect | None
    user: str | None
    tools: tuple[Tool, ...] = ()
    tool_mode: ToolMode | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionRequest:
    """A validated legacy ``POST /v1/completions``: ``prompt`` is generated from
    as is (no chat template); the other fields as in :class:`ChatRequest`."""

    prompt: str
    params: SamplingParams
    stream: bool
    include_usage: bool
    on_disconnect: OnDisconnect | None
    user: str | None


def check_content_type(value: str | None) -> None:
    """Accept a body declared as JSON, or not declared at all (as FastAPI does).

    ``application/json`` and ``application/<anything>+json`` pass, with any
    parameters, in any case. Anything else is refused: ``text/plain``, form
    and multipart bodies are what a web page can send to a local server
    cross-origin without a CORS preflight.

    Raises ApiError 415 ``unsupported_media_type``.
    """
    if value is None or not value.strip():
        return
    media_type = value.split(";", 1)[0].strip().lower()
    main, _, sub = media_type.partition("/")
    if main == "application" and (sub == "json" or sub.endswith("+json")):
        return
    raise ApiError(
        f"the request body must be JSON (Content-Type: application/json), not {value[:80]!r}",
        status=415,
        code="unsupported_media_type",
    )


def decode_json(raw: bytes) -> Any:
    """The JSON document of a request body (NaN and Infinity refused).

    Raises ApiError when the body is not UTF-8 JSON, holds a number Python
    will not parse (over 4,300 digits) or is nested deeper than the parser's
    recursion limit (about a thousand levels).
    """

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    try:
        return json.loads(raw, parse_constant=refuse)
    except RecursionError as exc:  # a hostile body, not a bug: a 400, not a traceback
        raise ApiError(
            "the request body is not valid JSON: it is nested too deeply", code="invalid_json"
        ) from exc
    except UnicodeDecodeError as exc:
        raise ApiError(
            "the request body is not valid JSON: it is not UTF-8 text", code="invalid_json"
        ) from exc
    except ValueError as exc:
        raise ApiError(f"the request body is not valid JSON: {str(exc)[:200]}", code="invalid_json") from exc


def parse_chat_request(body: Any, config: SessionConfig) -> ChatRequest:
    """Validate a chat-completions request body against ``config``'s limits.

    Raises:
        ApiError: a field is missing, mistyped, out of range or asks
            for something bargein does not do; ``param`` names it.
    """
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object", code="invalid_type")
    _optional(body, "model", str, "a string")
    _check_unsupported(body)
    common = _common(body, config)
    messages = _messages(body.get("messages"), config)
    tools = _tools(body)
    choice = _tool_choice(body, tools)
    if not tools or choice == "none":
        return ChatRequest(messages=messages, **common)
    if common["params"].grammar is not None:
        raise ApiError(
            "'response_format' cannot be combined with 'tools' unless 'tool_choice' is 'none'",
            param="response_format",
            code="unsupported_value",
        )
    messages = with_system_text(messages, tools_prompt(tools))
    if choice == "auto":
        return ChatRequest(messages=messages, tools=tools, tool_mode="auto", **common)
    called = tools if choice == "required" else tuple(t for t in tools if t.name == choice)
    parallel = _optional(body, "parallel_tool_calls", bool, "a boolean")
    grammar = _checked(tool_call_schema(called, parallel=parallel is not False), "tools")
    common["params"] = dataclasses.replace(common["params"], grammar=grammar)
    return ChatRequest(messages=messages, tools=tools, tool_mode="forced", **common)


def parse_completion_request(body: Any, config: SessionConfig) -> CompletionRequest:
    """Validate a legacy completions request body against ``config``'s limits.

    Raises:
        ApiError: as :func:`parse_chat_request`; ``echo`` and ``logprobs``
            (lm-eval's loglikelihood requests) are refused, not ignored.
    """
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object", code="invalid_type")
    _optional(body, "model", str, "a string")
    _check_unsupported_legacy(body)
    return CompletionRequest(prompt=_prompt(body.get("prompt")), **_common(body, config))


def _common(body: Mapping[str, Any], config: SessionConfig) -> dict[str, Any]:
    """The fields chat and legacy completions share: sampling, streaming, policy."""
    stream = _optional(body, "stream", bool, "a boolean") or False
    include_usage = _stream_options(body, stream)
    on_disconnect = _optional(body, "bargein_on_disconnect", str, "a string")
    if on_disconnect not in (None, "continue", "cancel"):
        raise ApiError(
            "'bargein_on_disconnect' must be 'continue' or 'cancel'", param="bargein_on_disconnect"
        )
    return {
        "params": _sampling(body, config),
        "stream": stream,
        "include_usage": include_usage,
        "on_disconnect": on_disconnect,
        "user": _optional(body, "user", str, "a string"),
    }


def _prompt(value: Any) -> str:
    """The one prompt of a legacy request: a non-empty string or a list of one."""
    if value is None:
        raise ApiError("'prompt' is required", param="prompt", code="missing_required_parameter")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    elif isinstance(value, list) and len(value) > 1:
        raise ApiError(
            "'prompt' holds one prompt here: bargein generates one choice per "
            "request (send several requests)",
            param="prompt",
            code="unsupported_value",
        )
    if not isinstance(value, str) or not value:
        raise ApiError(
            "'prompt' must be a non-empty string (token id arrays are not supported)",
            param="prompt",
            code="invalid_type",
        )
    return value


def _check_unsupported_legacy(body: Mapping[str, Any]) -> None:
    """Refuse legacy fields whose value asks for something bargein does not do."""
    for name in ("n", "best_of"):
        value = _optional(body, name, int, "an integer")
        if value is not None and value != 1:
            raise ApiError(
                f"'{name}' must be 1: bargein generates one choice per request, got {value}",
                param=name,
                code="unsupported_value",
            )
    asks = {
        "echo": lambda v: v is not False,
        "logprobs": lambda v: True,
        "suffix": lambda v: True,
        "logit_bias": lambda v: bool(v),
        "presence_penalty": lambda v: v not in (0, 0.0),
        "frequency_penalty": lambda v: v not in (0, 0.0),
    }
    for name, asks_for in asks.items():
        value = body.get(name)
        if value is not None and asks_for(value):
            raise ApiError(f"'{name}' is not supported by bargein", param=name, code="unsupported_parameter")


def _optional(body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    """``body[name]`` if present and not null, checked to be a ``kind`` (bool is no int)."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ApiError(f"'{name}' must be {what}, not {_json_type(value)}", param=name, code="invalid_type")
    return value


def _json_type(value: Any) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
    }
    return names.get(type(value), "null" if value is None else type(value).__name__)


def _number(
    body: Mapping[str, Any], name: str, low: float, high: float, low_open: bool = False
) -> float | None:
    value = _optional(body, name, (int, float), "a number")
    if value is None:
        return None
    # An int is compared as is: float() of a 400-digit int overflows, and the
    # comparisons below are exact for ints of any size.
    finite = isinstance(value, int) or math.isfinite(value)
    if not finite or value < low or value > high or (low_open and value == low):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise ApiError(f"'{name}' must be in {interval}, got {str(value)[:40]}", param=name)
    return float(value)


def _integer(body: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    value = _optional(body, name, int, "an integer")
    if value is not None and not low <= value <= high:
        raise ApiError(f"'{name}' must be in [{low}, {high}], got {str(value)[:40]}", param=name)
    return value


def _stream_options(body: Mapping[str, Any], stream: bool) -> bool:
    """``stream_options.include_usage`` (only allowed with ``stream``, as OpenAI)."""
    options = _optional(body, "stream_options", dict, "an object")
    if options is None:
        return False
    if not stream:
        raise ApiError("'stream_options' is only allowed when 'stream' is true", param="stream_options")
    include = options.get("include_usage")
    if include is not None and not isinstance(include, bool):
        raise ApiError(
            "'stream_options.include_usage' must be a boolean",
            param="stream_options.include_usage",
            code="invalid_type",
        )
    return bool(include)


def _check_unsupported(body: Mapping[str, Any]) -> None:
    """Refuse OpenAI fields whose value asks for something bargein does not do."""
    n = _optional(body, "n", int, "an integer")
    if n is not None and n != 1:
        raise ApiError(
            f"'n' must be 1: bargein generates one choice per request, got {n}",
            param="n",
            code="unsupported_value",
        )
    asks = {
        "functions": lambda v: bool(v),
        "logprobs": lambda v: v is True,
        "top_logprobs": lambda v: bool(v),
        "logit_bias": lambda v: bool(v),
        "presence_penalty": lambda v: v not in (0, 0.0),
        "frequency_penalty": lambda v: v not in (0, 0.0),
    }
    for name, asks_for in asks.items():
        value = body.get(name)
        if value is not None and asks_for(value):
            raise ApiError(f"'{name}' is not supported by bargein", param=name, code="unsupported_parameter")


def _sampling(body: Mapping[str, Any], config: SessionConfig) -> SamplingParams:
    """SamplingParams from the body; ``max_completion_tokens`` wins over ``max_tokens``."""
    max_tokens, name = min(config.default_max_tokens, config.max_tokens), "max_tokens"
    for field in ("max_tokens", "max_completion_tokens"):
        value = _integer(body, field, 1, 2**31 - 1)
        if value is not None:
            max_tokens, name = value, field
    if max_tokens > config.max_tokens:
        raise ApiError(
            f"'{name}' is {max_tokens}, above this server's limit of {config.max_tokens} tokens per response",
            param=name,
        )
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0, low_open=True)
    return SamplingParams(
        grammar=_response_format(body),
        max_tokens=max_tokens,
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        seed=_integer(body, "seed", 0, MAX_SEED),
        stop=_stop(body),
        ignore_eos=_optional(body, "ignore_eos", bool, "a boolean") or False,
        min_tokens=_min_tokens(body, max_tokens),
    )


def _min_tokens(body: Mapping[str, Any], max_tokens: int) -> int:
    """vLLM's ``min_tokens``: an integer in ``[0, max_tokens]`` (0 when absent)."""
    value = _optional(body, "min_tokens", int, "an integer")
    if value is None:
        return 0
    if not 0 <= value <= max_tokens:
        raise ApiError(
            f"'min_tokens' must be in [0, max_tokens={max_tokens}], got {str(value)[:40]}", param="min_tokens"
        )
    return value


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError("'stop' must be a string or an array of strings", param="stop", code="invalid_type")
    if len(stops) > MAX_STOP_STRINGS or not all(stops):
        raise ApiError(f"'stop' holds 1 to {MAX_STOP_STRINGS} non-empty strings", param="stop")
    return tuple(stops)


def _messages(value: Any, config: SessionConfig) -> tuple[Message, ...]:
    if value is None:
        raise ApiError("'messages' is required", param="messages", code="missing_required_parameter")
    if not isinstance(value, list) or not value:
        raise ApiError("'messages' must be a non-empty array", param="messages")
    if len(value) > config.max_input_items:
        raise ApiError(f"'messages' holds more than {config.max_input_items} items", param="messages")
    return tuple(_message(item, f"messages[{i}]") for i, item in enumerate(value))


def _message(item: Any, where: str) -> Message:
    if not isinstance(item, dict):
        raise ApiError(f"'{where}' must be an object", param=where, code="invalid_type")
    role = item.get("role")
    if not isinstance(role, str) or role not in ROLES:  # a list would not even hash
        raise ApiError(
            f"'{where}.role' must be one of {', '.join(ROLES)}; got {repr(role)[:60]}", param=f"{where}.role"
        )
    if role == "tool" and not isinstance(item.get("tool_call_id"), str):
        raise ApiError(
            f"'{where}.tool_call_id' must be the id of the call this is the result of",
            param=f"{where}.tool_call_id",
        )
    if role == "assistant" and item.get("tool_calls"):
        calls = calls_text(_input_calls(item["tool_calls"], f"{where}.tool_calls"))
        text = item.get("content")
        content = calls if not text else f"{_content(text, f'{where}.content')}\n{calls}"
        return Message(role="assistant", content=content)
    return Message(role=ROLES[role], content=_content(item.get("content"), f"{where}.content"))


def _input_calls(value: Any, where: str) -> list[tuple[str, str]]:
    """``(name, arguments)`` of an assistant message's ``tool_calls``."""
    if not isinstance(value, list):
        raise ApiError(f"'{where}' must be an array", param=where, code="invalid_type")
    calls = []
    for i, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        arguments = function.get("arguments", "{}") if isinstance(function, dict) else None
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise ApiError(
                f'\'{where}[{i}]\' must be {{"type": "function", "function": {{"name": ..., '
                f'"arguments": "<JSON text>"}}}}',
                param=f"{where}[{i}]",
            )
        calls.append((name, arguments))
    return calls


def _content(content: Any, where: str) -> str:
    """A message's text: a string, or an array of text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        strings = [t for t in texts if isinstance(t, str)]
        if len(strings) == len(content):  # every part is a text part with a string
            return "\n".join(strings)
    raise ApiError(
        f'\'{where}\' must be a string or an array of text parts ({{"type": "text", "text": ...}})',
        param=where,
    )


# ---- structured outputs and tools --------------------------------------------


def _response_format(body: Mapping[str, Any]) -> GrammarSpec | None:
    """The grammar ``response_format`` asks for (None for ``text`` or none)."""
    value = _optional(body, "response_format", dict, "an object")
    if value is None or value.get("type") == "text":
        return None
    kind = value.get("type")
    if kind == "json_object":
        return GrammarSpec(kind=GrammarKind.JSON_OBJECT)
    if kind != "json_schema":
        raise ApiError(
            "'response_format.type' must be 'text', 'json_object' or 'json_schema'",
            param="response_format.type",
        )
    spec = value.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ApiError(
            "'response_format.json_schema' must be an object with a 'name' and a 'schema'",
            param="response_format.json_schema",
        )
    if not isinstance(schema, dict):
        raise ApiError(
            "'response_format.json_schema.schema' must be a JSON schema object",
            param="response_format.json_schema.schema",
            code="invalid_type",
        )
    return _checked(
        _schema_spec(schema, "response_format.json_schema.schema"), "response_format.json_schema.schema"
    )


def _schema_spec(schema: dict[str, Any], param: str) -> GrammarSpec:
    """The spec of a JSON schema nested at most ``MAX_SCHEMA_DEPTH`` levels (arrays and objects).

    Raises ApiError 400 ``invalid_schema`` for a deeper one.
    """
    if not nested_too_deep(schema):
        return GrammarSpec.json_schema(schema)
    raise ApiError(
        f"the JSON schema is nested deeper than {MAX_SCHEMA_DEPTH} levels", param=param, code="invalid_schema"
    )


def _checked(spec: GrammarSpec, param: str) -> GrammarSpec:
    """``spec``, once the grammar library said it can enforce it.

    Raises ApiError 400 ``unsupported_schema`` naming the keyword it cannot
    enforce, or ``invalid_schema`` for another fault.
    """
    try:
        check_grammar(spec)
    except GrammarError as exc:
        if exc.keyword is not None:
            raise ApiError(
                f"the JSON schema keyword '{exc.keyword}' is not supported by bargein's grammar engine "
                f"(llguidance); remove it or use another keyword ({exc})",
                param=param,
                code="unsupported_schema",
            ) from exc
        raise ApiError(
            f"the JSON schema cannot be enforced: {exc}", param=param, code="invalid_schema"
        ) from exc
    return spec


def _tools(body: Mapping[str, Any]) -> tuple[Tool, ...]:
    """The ``tools`` array: functions with a name, a description and a parameters schema."""
    value = _optional(body, "tools", list, "an array")
    if not value:
        return ()
    if len(value) > MAX_TOOLS:
        raise ApiError(f"'tools' holds at most {MAX_TOOLS} functions", param="tools")
    tools = []
    for i, item in enumerate(value):
        where = f"tools[{i}]"
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(item, dict) or item.get("type") != "function" or not isinstance(function, dict):
            raise ApiError(f'\'{where}\' must be {{"type": "function", "function": {{...}}}}', param=where)
        name = function.get("name")
        if not isinstance(name, str) or not 1 <= len(name) <= 64 or not set(name) <= _TOOL_NAME_CHARS:
            raise ApiError(
                f"'{where}.function.name' must be 1 to 64 letters, digits, '_' or '-'",
                param=f"{where}.function.name",
            )
        description = function.get("description") or ""
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(description, str) or not isinstance(parameters, dict):
            raise ApiError(
                f"'{where}.function' needs a string 'description' and an object 'parameters'",
                param=f"{where}.function",
                code="invalid_type",
            )
        param = f"{where}.function.parameters"
        spec = _checked(_schema_spec(parameters, param), param)
        tools.append(Tool(name=name, description=description, parameters=spec.source))
    if len({t.name for t in tools}) != len(tools):
        raise ApiError("'tools' has two functions of the same name", param="tools")
    return tuple(tools)


def _tool_choice(body: Mapping[str, Any], tools: tuple[Tool, ...]) -> str:
    """``none``, ``auto``, ``required`` or the name of the function to call."""
    value = body.get("tool_choice")
    if value is None:
        return "auto" if tools else "none"
    if isinstance(value, str) and value in ("none", "auto", "required"):
        choice = value
    else:
        function = value.get("function") if isinstance(value, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or value.get("type") != "function":
            raise ApiError(
                "'tool_choice' must be 'none', 'auto', 'required' or "
                '{"type": "function", "function": {"name": ...}}',
                param="tool_choice",
            )
        choice = name
    if choice != "none" and not any(choice in ("auto", "required", t.name) for t in tools):
        what = "'tools' is empty" if not tools else f"no function in 'tools' is named {choice!r}"
        raise ApiError(f"'tool_choice' is {choice!r} but {what}", param="tool_choice")
    return choice


# ---- response bodies ---------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """What every body of one completion repeats: its id, creation time and model."""

    completion_id: str
    created: int  # Unix seconds
    model: str
    include_usage: bool = False
    kind: Literal["chat", "text"] = "chat"  # text: a legacy completion
    tool_mode: ToolMode | None = None  # how the answer is read for tool calls (ChatRequest.tool_mode)


def origin_session_id(created: int, include_usage: bool, tool_mode: ToolMode | None = None) -> str:
    """The ``session_id`` an HTTP stream is logged under (HTTP streams have no
    session): it keeps ``created``, ``include_usage`` and how the answer is
    read for tool calls, for resumes on any node."""
    base = f"{_ORIGIN_PREFIX}{created}:{int(include_usage)}"
    return base if tool_mode is None else f"{base}:{tool_mode}"


def parse_origin(session_id: str) -> tuple[int, bool, ToolMode | None] | None:
    """``(created, include_usage, tool_mode)`` of an HTTP stream; None for another stream."""
    if not session_id.startswith(_ORIGIN_PREFIX):
        return None
    created, _, rest = session_id[len(_ORIGIN_PREFIX) :].partition(":")
    usage, _, mode = rest.partition(":")
    if not created.isdecimal() or usage not in ("0", "1") or mode not in ("", "auto", "forced"):
        return None
    tool_mode: ToolMode | None = "auto" if mode == "auto" else "forced" if mode == "forced" else None
    return int(created), usage == "1", tool_mode


def usage_body(end: StreamEnd) -> dict[str, Any]:
    """OpenAI's ``usage`` of a finished stream."""
    return {
        "prompt_tokens": end.prompt_tokens,
        "completion_tokens": end.completion_tokens,
        "total_tokens": end.prompt_tokens + end.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": end.cached_tokens},
    }


def completion_body(
    c: Completion, text: str, end: StreamEnd, calls: Sequence[ToolCall] | None = None
) -> dict[str, Any]:
    """The ``chat.completion`` object of a non-streamed answer: ``text``, or
    the ``calls`` the answer made (``content`` null, ``finish_reason``
    ``tool_calls`` where the answer ended by itself)."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    finish_reason = end.finish_reason
    if calls:
        message = {"role": "assistant", "content": None, "tool_calls": [tool_call_body(c) for c in calls]}
        finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
    return {
        "id": c.completion_id,
        "object": "chat.completion",
        "created": c.created,
        "model": c.model,
        "system_fingerprint": None,
        "choices": [choice],
        "usage": usage_body(end),
    }


def tool_call_body(call: ToolCall) -> dict[str, Any]:
    """One entry of a message's ``tool_calls``."""
    return {
        "id": call.call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def text_completion_body(c: Completion, text: str, end: StreamEnd) -> dict[str, Any]:
    """The ``text_completion`` object of a non-streamed legacy answer."""
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": end.finish_reason}
    return {
        "id": c.completion_id,
        "object": "text_completion",
        "created": c.created,
        "model": c.model,
        "system_fingerprint": None,
        "choices": [choice],
        "usage": usage_body(end),
    }


def text_chunk_body(c: Completion, text: str, finish_reason: str | None = None) -> dict[str, Any]:
    """One streamed ``text_completion`` chunk (legacy streams have no role chunk)."""
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    body = {
        "id": c.completion_id,
        "object": "text_completion",
        "created": c.created,
        "model": c.model,
        "system_fingerprint": None,
        "choices": [choice],
    }
    if c.include_usage:
        body["usage"] = None
    return body


def chunk_body(c: Completion, delta: Mapping[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk`` with one choice (``usage`` null when it will come)."""
    choice = {"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish_reason}
    body = {
        "id": c.completion_id,
        "object": "chat.completion.chunk",
        "created": c.created,
        "model": c.model,
        "system_fingerprint": None,
        "choices": [choice],
    }
    if c.include_usage:
        body["usage"] = None
    return body


def usage_chunk(c: Completion, end: StreamEnd) -> dict[str, Any]:
    """The last chunk with ``include_usage``: no choices, the usage."""
    kind = "text_completion" if c.kind == "text" else "chat.completion.chunk"
    return {
        "id": c.completion_id,
        "object": kind,
        "created": c.created,
        "model": c.model,
        "system_fingerprint": None,
        "choices": [],
        "usage": usage_body(end),
    }


def dumps(body: Any) -> str:
    """Compact JSON of a body (UTF-8 text kept as is)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))
