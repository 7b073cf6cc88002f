"""The OpenAI-compatible HTTP API, on the same engine and token log as ``/v1/realtime``.

Routes (:func:`openai_routes`):

- ``POST /v1/chat/completions``: OpenAI chat completions, streamed (SSE) or not.
  The request becomes one stream of the token log, exactly like a
  ``response.create``; a streamed answer is read back out of the log.
- ``POST /v1/completions``: the legacy completions API on the same path, its
  prompt generated from as is (no chat template); ``text_completion`` bodies.
- ``GET /v1/models``: the one served model.
- ``GET /v1/streams/{stream_id}/events``: replay a stream from the
  ``Last-Event-ID`` header (or ``?from=<offset>``), follow it live, end with
  ``data: [DONE]``. Nothing is generated again.
- ``POST /v1/streams/{stream_id}/cancel``: barge-in over HTTP; the engine
  aborts at its next step and the stream ends with ``finish_reason``
  ``"interrupted"``.

Both answers read the stream through the service's feed
(:meth:`bargein.session.runtime.service.Service.feed`), the one delivery path the
WebSocket uses too: at most a bounded read-ahead is queued, and what queued
while the client was busy goes out together. SSE events carry
``id: <stream_id>:<end>`` (:mod:`bargein.app.openai.sse`): one chunk per batch
(one engine step's tokens when the client keeps up), so a resume from an id
continues right after the text the client had; batches whose tokens complete
no text yet are skipped (the next id covers their tokens). The closing events (the chunk with ``finish_reason``,
the usage chunk, ``[DONE]``) add no token and carry no ``id:`` field: they
keep the stream's last id, so resuming from it replays just them.

Only the principal that created a stream can read or cancel it (anyone else
gets the same 404 as for an unknown stream): ``"anonymous"``, or a hash of
the bearer key when one is sent. Rate limits and caps count against the
request's limit key instead (app/auth.py: the key with API keys configured,
else the client's address).

Disconnect: when the client of a streamed or non-streamed completion goes
away before the end, the request's ``bargein_on_disconnect`` (or the server's
``--on-disconnect``) applies: ``continue`` lets it run into the log for a
resume, ``cancel`` aborts it (``finish_reason`` ``"cancelled"``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bargein.app.event_stream import EventStreamResponse, unless_disconnected
from bargein.app.logging import client_logger
from bargein.app.openai.schema import (
    ApiError,
    ChatRequest,
    Completion,
    CompletionRequest,
    check_content_type,
    chunk_body,
    completion_body,
    decode_json,
    dumps,
    origin_session_id,
    parse_chat_request,
    parse_completion_request,
    parse_origin,
    text_chunk_body,
    text_completion_body,
    usage_body,
    usage_chunk,
)
from bargein.app.openai.sse import event_id, format_event, parse_event_id, parse_offset
from bargein.engine.request import FinishReason
from bargein.protocol import events as pe
from bargein.session.conversation.config import SessionConfig
from bargein.session.conversation.state import Message, Submit, SubmitFailed
from bargein.session.conversation.tools import (
    ArgumentsDelta,
    CallStart,
    ContentDelta,
    ParserEvent,
    ToolCallParser,
)
from bargein.session.errors import OffsetOutOfRange, StreamNotFound, StreamTruncated, TokenLogUnavailable
from bargein.session.runtime.delivery import Batch, relayed_code, truncated_message
from bargein.session.runtime.service import Owner, Service
from bargein.session.streams.log import EndError, StreamEnd, StreamInfo

DONE = format_event("[DONE]")
CANCEL_WAIT_S = 10.0  # a cancel answers once the engine confirmed (one step), or after this
# A resume's status waits this long for its replay to start: a log that lost the offsets is a
# 410 then; later (a slow Redis), the same error ends the stream as an error event.
FIRST_EVENT_WAIT_S = 1.0
DEFAULT_RETRY_AFTER_S = 1  # a 503 without an estimate of its own (the log or engine failing, loading)


def principal_of(headers: Mapping[str, str]) -> str:
    """Who is calling: ``"anonymous"``, or ``key:<sha256 prefix>`` of a bearer key.

    The key itself is never stored (the principal is logged with each stream).
    """
    scheme, _, key = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return "anonymous"
    return "key:" + hashlib.sha256(key.strip().encode("utf-8")).hexdigest()[:32]


def openai_routes() -> list[Route]:
    """The routes of the OpenAI-compatible API, for ``create_app``."""
    created = int(time.time())

    async def list_models(request: Request) -> Response:
        """``GET /v1/models``: OpenAI's list shape with the served model."""
        model = {
            "id": _service(request).model_name,
            "object": "model",
            "created": created,
            "owned_by": "bargein",
        }
        return JSONResponse({"object": "list", "data": [model]})

    return [
        Route("/v1/chat/completions", _answering(chat_completions), methods=["POST"]),
        Route("/v1/completions", _answering(completions), methods=["POST"]),
        Route("/v1/models", _answering(list_models), methods=["GET"]),
        Route("/v1/streams/{stream_id}/events", _answering(stream_events), methods=["GET"]),
        Route("/v1/streams/{stream_id}/cancel", _answering(cancel_stream), methods=["POST"]),
    ]


Endpoint = Callable[[Request], Awaitable[Response]]


def _answering(endpoint: Endpoint) -> Endpoint:
    """Wrap an endpoint so an :class:`ApiError` becomes OpenAI's error response."""

    @functools.wraps(endpoint)
    async def answer(request: Request) -> Response:
        try:
            return await endpoint(request)
        except ApiError as exc:
            request.app.state.bargein.observer.http_error(exc.status, exc.code)
            return JSONResponse(exc.body(), status_code=exc.status, headers=_with_retry_after(exc))
        except ClientDisconnect:  # it left while sending its body: nobody reads an answer
            client_logger.debug("client left before sending its whole request body")
            return Response(status_code=499)

    return answer


def _with_retry_after(exc: ApiError) -> dict[str, str] | None:
    """The answer's headers: every 429 and 503 says when to retry (RFC 9110
    section 10.2.3), ``DEFAULT_RETRY_AFTER_S`` where the refusal knows no better."""
    if exc.status not in (429, 503) or any(k.lower() == "retry-after" for k in exc.headers or {}):
        return exc.headers
    return {**(exc.headers or {}), "Retry-After": str(DEFAULT_RETRY_AFTER_S)}


def _service(request: Request) -> Service:
    service: Service | None = request.app.state.bargein.service
    if service is None:
        raise ApiError(
            "the model is still loading; retry shortly",
            status=503,
            code="model_loading",
            type_="server_error",
        )
    return service


async def _read_json(request: Request, limit: int) -> Any:
    """The JSON document of the request body.

    Raises ApiError: 415 for a body declared as something else than JSON,
    413 past ``limit`` bytes (before reading it, when ``Content-Length`` says
    so), 400 for a body that is not JSON.
    """
    check_content_type(request.headers.get("content-type"))
    declared = request.headers.get("content-length", "")
    if declared.isdecimal() and int(declared) > limit:
        raise _too_large(limit)
    return decode_json(await _read_body(request, limit))


def _too_large(limit: int) -> ApiError:
    return ApiError(f"the request body is larger than {limit} bytes", status=413, code="request_too_large")


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 past ``limit`` bytes."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


# ---- POST /v1/chat/completions ---------------------------------------------------


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions``: validate, submit, answer (JSON or SSE)."""
    return await _complete(request, parse_chat_request)


async def completions(request: Request) -> Response:
    """``POST /v1/completions`` (legacy): the same, from a prompt without a template."""
    return await _complete(request, parse_completion_request)


AnyRequest = ChatRequest | CompletionRequest


async def _complete(request: Request, parse: Callable[[Any, SessionConfig], AnyRequest]) -> Response:
    """Validate with ``parse``, submit, answer (JSON or SSE)."""
    service = _service(request)
    body = await _read_json(request, service.config.max_frame_bytes)
    chat = parse(body, service.config)
    owner = Owner(
        principal=principal_of(request.headers),
        session_id="",
        limit_key=request.scope.get("state", {}).get("limit_key"),
        connection=_connection_of(request),
    )
    completion, stream_id = await _submit(service, chat, owner)
    policy = chat.on_disconnect or service.config.on_disconnect

    def on_disconnect() -> None:
        # As a WebSocket's close: "cancel" aborts; "continue" releases the
        # stream, so the abandon grace cancels it unless someone resumes it.
        if policy == "cancel":
            service.abort(stream_id, FinishReason.CANCELLED, service.clock())
        else:
            service.release(stream_id)

    if chat.stream:
        events = sse_events(service, stream_id, completion, from_offset=0, role=True)
        return EventStreamResponse(
            events, on_disconnect=on_disconnect, headers={"X-Bargein-Stream-Id": stream_id}
        )
    collect = _collect(service, stream_id, completion)
    body_or_gone = await unless_disconnected(request.receive, collect)
    if body_or_gone is None:
        on_disconnect()
        return Response(status_code=499)  # nobody reads it: the client is gone
    return JSONResponse(body_or_gone, headers={"X-Bargein-Stream-Id": stream_id})


def _connection_of(request: Request) -> str:
    """The TCP connection a request came on (its peer address and port): it
    tokenizes one prompt at a time, as a WebSocket connection does."""
    client = request.scope.get("client")
    return f"http:{client[0]}:{client[1]}" if client else f"http:{uuid.uuid4().hex}"


async def _submit(service: Service, chat: AnyRequest, caller: Owner) -> tuple[Completion, str]:
    """Create the stream and submit its request for ``caller`` (its principal and
    limit key), as a ``response.create`` would.

    Raises ApiError: the prompt does not fit (400 ``context_length_exceeded``),
    admission refused it (``rate_limited``: 429, ``overloaded``: 503, both with
    ``Retry-After``) or the engine is not running (503).
    """
    stream_id = uuid.uuid4().hex
    messages: tuple[Message, ...]
    if isinstance(chat, CompletionRequest):  # legacy: its prompt as is, "cmpl-" ids
        legacy, prefix, messages, prompt = True, "cmpl", (), chat.prompt
    else:
        legacy, prefix, messages, prompt = False, "chatcmpl", chat.messages, None
    completion = Completion(
        completion_id=f"{prefix}-{stream_id}",
        created=int(time.time()),
        model=service.model_name,
        include_usage=chat.include_usage,
        kind="text" if legacy else "chat",
        tool_mode=None if isinstance(chat, CompletionRequest) else chat.tool_mode,
    )
    action = Submit(
        response_id=completion.completion_id,
        stream_id=stream_id,
        messages=messages,
        params=chat.params,
        prompt=prompt,
    )
    owner = dataclasses.replace(
        caller, session_id=origin_session_id(completion.created, chat.include_usage, completion.tool_mode)
    )
    result = await service.submit(action, owner, service.clock())
    if isinstance(result, SubmitFailed):
        if result.code is pe.ErrorCode.PROMPT_TOO_LONG:
            raise ApiError(
                result.message, param="prompt" if legacy else "messages", code="context_length_exceeded"
            )
        if result.retry_after_ms is not None:
            raise _retry_later(result.code, result.message, result.retry_after_ms)
        raise ApiError(result.message, status=503, code=result.code.value, type_="server_error")
    return completion, stream_id


def _retry_later(code: pe.ErrorCode, message: str, retry_after_ms: int) -> ApiError:
    """``rate_limited`` (429) or ``overloaded`` (503), with ``Retry-After``."""
    limited = code is pe.ErrorCode.RATE_LIMITED
    return ApiError(
        message,
        status=429 if limited else 503,
        code=code.value,
        type_="rate_limit_error" if limited else "server_error",
        headers={
            "Retry-After": str(-(-retry_after_ms // 1000)),
            "X-Bargein-Retry-After-Ms": str(retry_after_ms),
        },
    )


def _end_error(error: EndError) -> ApiError:
    """The answer for a stream whose end carries an error (a request dropped
    from the queue at its deadline: ``overloaded``)."""
    return _retry_later(relayed_code(error), error.message, error.retry_after_ms)


async def _collect(service: Service, stream_id: str, completion: Completion) -> dict[str, Any]:
    """The ``chat.completion`` body of a stream, once it ended.

    Raises ApiError: 500 when generation failed or the log could not be read,
    503 with ``Retry-After`` when the request was dropped from the queue at
    its deadline (``overloaded``).
    """
    parts: list[str] = []
    try:
        async with contextlib.aclosing(service.feed(stream_id, 0)) as items:
            async for item in items:
                if isinstance(item, Batch):
                    parts.append(item.text)
                elif item.finish_reason == FinishReason.ERROR.value:
                    raise ApiError(
                        "generation failed", status=500, code="internal_error", type_="server_error"
                    )
                elif item.error is not None:
                    raise _end_error(item.error)
                else:
                    return _whole_body(completion, stream_id, "".join(parts), item)
    except (StreamNotFound, TokenLogUnavailable) as exc:
        raise ApiError(
            "the token log could not be read", status=500, code="internal_error", type_="server_error"
        ) from exc
    raise AssertionError("a feed ends with its StreamEnd")


def _whole_body(completion: Completion, stream_id: str, text: str, end: StreamEnd) -> dict[str, Any]:
    """The non-streamed answer, in its kind's shape; read for tool calls by
    the same parser as a streamed one, so both give the same calls."""
    if completion.kind == "text":
        return text_completion_body(completion, text, end)
    if completion.tool_mode is None:
        return completion_body(completion, text, end)
    parser = ToolCallParser(stream_id, completion.tool_mode)
    parser.feed(text)
    _, calls = parser.finish()
    return completion_body(completion, text, end, calls)


# ---- SSE ---------------------------------------------------------------------------


async def sse_events(
    service: Service, stream_id: str, completion: Completion, *, from_offset: int, role: bool
) -> AsyncGenerator[bytes, None]:
    """The SSE events of a stream from ``from_offset``: chunks, then ``[DONE]``.

    ``role``: start with the chunk that announces the assistant role (id
    ``<stream_id>:0``), as OpenAI streams do; a resume from an id has had it.
    A stream that cannot be read (expired meanwhile, log down), or whose
    request was dropped from the queue at its deadline (``overloaded``), ends
    with an OpenAI error event instead of ``[DONE]``. It reads through the
    service's feed, so it is one of the stream's readers while it runs (the
    abandon grace does not cancel a stream someone reads over SSE) and the
    observer counts it among the streams being delivered.

    A stream read for tool calls (``completion.tool_mode``) is read from 0
    whatever ``from_offset``: the parser needs the whole answer, and the
    entries up to ``from_offset`` only feed it, so a resume continues the
    calls' chunks right after what the client had.
    """
    if role and completion.kind == "chat":  # legacy streams start with text
        first = chunk_body(completion, {"role": "assistant", "content": ""})
        yield format_event(dumps(first), event_id=event_id(stream_id, 0))
    chunks = _Chunker(completion, stream_id, from_offset)
    try:
        async with contextlib.aclosing(service.feed(stream_id, chunks.read_from)) as items:
            async for item in items:
                if isinstance(item, Batch):
                    if (chunk := chunks.batch(item)) is not None:
                        yield format_event(dumps(chunk), event_id=event_id(stream_id, item.end))
                elif item.error is not None:
                    yield format_event(dumps(_end_error(item.error).body()))
                    return
                else:
                    for body in chunks.closing(item):
                        yield format_event(dumps(body))
    except (StreamNotFound, TokenLogUnavailable) as exc:
        yield format_event(dumps(_read_error(exc).body()))
        return
    yield DONE


class _Chunker:
    """The chunks of one SSE answer: text, or, for a stream read for tool
    calls, its parser's events as OpenAI streams them (one chunk per batch,
    so each event id covers all of its batch)."""

    def __init__(self, completion: Completion, stream_id: str, from_offset: int) -> None:
        self.completion = completion
        self.from_offset = from_offset
        mode = completion.tool_mode if completion.kind == "chat" else None
        self.parser = None if mode is None else ToolCallParser(stream_id, mode)
        self.read_from = from_offset if self.parser is None else 0

    def batch(self, batch: Batch) -> dict[str, Any] | None:
        """The chunk of ``batch`` (None: it completes nothing to send)."""
        if self.parser is None:
            return _content_chunk(self.completion, batch.text) if batch.text else None
        seen = "".join(e.text for e in batch.entries if e.end <= self.from_offset)
        new = "".join(e.text for e in batch.entries if e.end > self.from_offset)
        self.parser.feed(seen)  # what the client had: it only moves the parser on
        return _tool_chunk(self.completion, self.parser.feed(new)) if new else None

    def closing(self, end: StreamEnd) -> list[dict[str, Any]]:
        """The last chunks: what the parser still held, the finish reason, the usage."""
        finish_reason = end.finish_reason
        bodies = []
        if self.parser is not None:
            events, calls = self.parser.finish()
            if (chunk := _tool_chunk(self.completion, events)) is not None:
                bodies.append(chunk)
            if calls and finish_reason == "stop":
                finish_reason = "tool_calls"
        if self.completion.kind == "text":
            bodies.append(text_chunk_body(self.completion, "", finish_reason=finish_reason))
        else:
            bodies.append(chunk_body(self.completion, {}, finish_reason=finish_reason))
        if self.completion.include_usage:
            bodies.append(usage_chunk(self.completion, end))
        return bodies


def _tool_chunk(completion: Completion, events: list[ParserEvent]) -> dict[str, Any] | None:
    """One chunk of a tool-call parser's events: ``content`` text, and
    ``tool_calls`` entries (a call's first with its ``id``, ``type`` and
    ``name``; then ``arguments`` fragments), one entry per call."""
    if not events:
        return None
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    entries: dict[int, dict[str, Any]] = {}
    for event in events:
        if isinstance(event, CallStart):
            entries[event.index] = {
                "index": event.index,
                "id": event.call_id,
                "type": "function",
                "function": {"name": event.name, "arguments": ""},
            }
        elif isinstance(event, ArgumentsDelta):
            entry = entries.setdefault(event.index, {"index": event.index, "function": {"arguments": ""}})
            entry["function"]["arguments"] += event.text
    delta: dict[str, Any] = {}
    if content:
        delta["content"] = content
    if entries:
        delta["tool_calls"] = list(entries.values())
    return chunk_body(completion, delta) if delta else None


def _read_error(exc: StreamNotFound | TokenLogUnavailable) -> ApiError:
    """What a reader is told when its stream cannot be read any further."""
    if isinstance(exc, OffsetOutOfRange):
        return ApiError(
            f"position {exc.from_offset} is past the stream's end {exc.end}", code="offset_out_of_range"
        )
    if isinstance(exc, StreamTruncated):
        return ApiError(truncated_message(exc), status=410, code="stream_truncated")
    if isinstance(exc, StreamNotFound):
        return ApiError("the stream expired", code="stream_not_found")
    return ApiError(
        "the token log is unavailable; resume later", code="internal_error", status=503, type_="server_error"
    )


def _content_chunk(completion: Completion, text: str) -> dict[str, Any]:
    """The chunk that carries ``text``, in its kind's shape."""
    if completion.kind == "text":
        return text_chunk_body(completion, text)
    return chunk_body(completion, {"content": text})


# ---- GET /v1/streams/{stream_id}/events and POST .../cancel ---------------------


async def _owned_stream(request: Request, service: Service) -> StreamInfo:
    """The stream named in the path, if it exists and the caller created it.

    Raises ApiError 404 otherwise (the same answer for both, so stream ids
    of other principals cannot be probed).
    """
    stream_id = request.path_params["stream_id"]
    try:
        info = await service.stream_info(stream_id)
    except TokenLogUnavailable as exc:
        raise ApiError(
            "the token log is unavailable; retry later",
            status=503,
            code="internal_error",
            type_="server_error",
        ) from exc
    if info is None or info.principal != principal_of(request.headers):
        raise ApiError(
            f"stream {stream_id!r} not found: unknown, expired (streams are "
            "kept for a while after they end), or not yours",
            status=404,
            code="stream_not_found",
            param="stream_id",
        )
    return info


def _resume_position(request: Request, stream_id: str) -> tuple[int, bool]:
    """``(from_offset, role)`` of a resume: ``Last-Event-ID`` wins over ``?from=``.

    ``role`` is true when the client has nothing yet (no id, from 0).
    Raises ApiError 400 for a malformed id or offset, or an id of another stream.
    """
    last = request.headers.get("last-event-id")
    if last is not None:
        try:
            last_stream, end = parse_event_id(last)
        except ValueError as exc:
            raise ApiError(str(exc), param="Last-Event-ID") from exc
        if last_stream != stream_id:
            raise ApiError(
                f"Last-Event-ID names stream {last_stream!r}, not {stream_id!r}", param="Last-Event-ID"
            )
        return end, False
    try:
        from_offset = parse_offset(request.query_params.get("from", "0"), "'from'")
    except ValueError as exc:
        raise ApiError(str(exc), param="from") from exc
    return from_offset, from_offset == 0


async def stream_events(request: Request) -> Response:
    """``GET /v1/streams/{stream_id}/events``: replay from a position, follow live.

    A position past the end of a finished stream is a 400; an unknown or
    expired stream (nothing retained to replay) a 404; a stream whose log
    lost tokens the client needs (trimmed, evicted) a 410
    ``stream_truncated``: never a silent gap.
    """
    service = _service(request)
    stream_id = request.path_params["stream_id"]
    from_offset, role = _resume_position(request, stream_id)
    info = await _owned_stream(request, service)
    past_end = info.finish is not None and not info.finish.truncated and from_offset > info.end
    if past_end:  # a stream ended for its lost entries is a 410 from any position, below
        raise ApiError(
            f"position {from_offset} is past the stream's end {info.end}",
            param="Last-Event-ID" if "last-event-id" in request.headers else "from",
            code="offset_out_of_range",
        )
    if info.status == "live":
        await service.follow(stream_id)  # continued here if its node died
    lost = await service.read_error_soon(stream_id, from_offset, FIRST_EVENT_WAIT_S)
    if isinstance(lost, StreamTruncated):
        raise _read_error(lost)
    events = sse_events(service, stream_id, _completion_of(info, service), from_offset=from_offset, role=role)
    return EventStreamResponse(events, on_disconnect=lambda: None, headers={"X-Bargein-Stream-Id": stream_id})


def _completion_of(info: StreamInfo, service: Service) -> Completion:
    """The ids a stream's chunks carry, as when it was created (any node)."""
    created, include_usage, tool_mode = parse_origin(info.session_id) or (int(time.time()), False, None)
    legacy = info.response_id.startswith("cmpl-")  # see _submit
    return Completion(
        completion_id=info.response_id,
        created=created,
        model=service.model_name,
        include_usage=include_usage,
        kind="text" if legacy else "chat",
        tool_mode=tool_mode,
    )


async def cancel_stream(request: Request) -> Response:
    """``POST /v1/streams/{stream_id}/cancel``: barge-in.

    Answers once the stream ended (the engine aborts at its next step) with
    its final ``finish_reason`` and usage: ``interrupted``, or how it had
    already ended. 202 with ``status: "live"`` if it did not end in time.
    """
    service = _service(request)
    info = await _owned_stream(request, service)
    if info.status == "live":
        service.abort(info.stream_id, FinishReason.INTERRUPTED, service.clock())
    end = info.finish or await service.wait_end(info.stream_id, info.end, CANCEL_WAIT_S)
    body: dict[str, Any] = {
        "object": "bargein.stream",
        "id": info.stream_id,
        "status": "live" if end is None else "complete",
    }
    if end is not None:
        body |= {"finish_reason": end.finish_reason, "end": end.end, "usage": usage_body(end)}
    return JSONResponse(body, status_code=202 if end is None else 200)
