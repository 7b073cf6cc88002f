"""OpenAI chat-completions and (legacy) completions shapes: request validation
and response bodies (pure).

Requests are checked field by field against the OpenAI API reference
(https://platform.openai.com/docs/api-reference/chat/create) for the fields
bargein supports; a bad value raises :class:`ApiError`, which the app
answers with HTTP 400 and OpenAI's error body before anything is scheduled.
Fields OpenAI defines that would change the answer's meaning and that bargein
does not implement (``n`` other than 1, tools, logprobs, JSON response
formats, penalties, logit bias) are refused the same way instead of being
ignored; fields unknown to both are ignored, as OpenAI does. Two of vLLM's
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

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from bargein.engine.request import SamplingParams
from bargein.session.conversation.config import SessionConfig
from bargein.session.conversation.state import Message
from bargein.session.streams.log import StreamEnd

MAX_STOP_STRINGS = 4  # as OpenAI, and as the WebSocket's response.create
MAX_SEED = 2**63 - 1  # as the WebSocket: an int64 everywhere (torch, Redis, msgpack)
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
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
    """

    messages: tuple[Message, ...]
    params: SamplingParams
    stream: bool
    include_usage: bool
    on_disconnect: OnDisconnect | None
    user: str | None


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
    return ChatRequest(messages=_messages(body.get("messages"), config), **_common(body, config))


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
        "tools": lambda v: bool(v),
        "functions": lambda v: bool(v),
        "logprobs": lambda v: v is True,
        "top_logprobs": lambda v: bool(v),
        "logit_bias": lambda v: bool(v),
        "presence_penalty": lambda v: v not in (0, 0.0),
        "frequency_penalty": lambda v: v not in (0, 0.0),
        "response_format": lambda v: not (isinstance(v, dict) and v.get("type") == "text"),
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
    return Message(role=ROLES[role], content=_content(item.get("content"), f"{where}.content"))


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


# ---- response bodies ---------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """What every body of one completion repeats: its id, creation time and model."""

    completion_id: str
    created: int  # Unix seconds
    model: str
    include_usage: bool = False
    kind: Literal["chat", "text"] = "chat"  # text: a legacy completion


def origin_session_id(created: int, include_usage: bool) -> str:
    """The ``session_id`` an HTTP stream is logged under (HTTP streams have no
    session): it keeps ``created`` and ``include_usage`` for resumes on any node."""
    return f"{_ORIGIN_PREFIX}{created}:{int(include_usage)}"


def parse_origin(session_id: str) -> tuple[int, bool] | None:
    """``(created, include_usage)`` of an HTTP stream; None for another stream."""
    if not session_id.startswith(_ORIGIN_PREFIX):
        return None
    created, _, usage = session_id[len(_ORIGIN_PREFIX) :].partition(":")
    if not created.isdecimal() or usage not in ("0", "1"):
        return None
    return int(created), usage == "1"


def usage_body(end: StreamEnd) -> dict[str, Any]:
    """OpenAI's ``usage`` of a finished stream."""
    return {
        "prompt_tokens": end.prompt_tokens,
        "completion_tokens": end.completion_tokens,
        "total_tokens": end.prompt_tokens + end.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": end.cached_tokens},
    }


def completion_body(c: Completion, text: str, end: StreamEnd) -> dict[str, Any]:
    """The ``chat.completion`` object of a non-streamed answer."""
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "logprobs": None,
        "finish_reason": end.finish_reason,
    }
    return {
        "id": c.completion_id,
        "object": "chat.completion",
        "created": c.created,
        "model": c.model,
        "system_fingerprint": None,
        "choices": [choice],
        "usage": usage_body(end),
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


def chunk_body(c: Completion, delta: Mapping[str, str], finish_reason: str | None = None) -> dict[str, Any]:
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
