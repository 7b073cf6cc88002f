"""The starlette app: ``/v1/realtime``, health, ``/metrics`` and the static client.

Thin by design: the WebSocket handler decodes frames (:mod:`protocol`), hands
the events to its :class:`~bargein.session.runtime.connection.Connection` and lets one writer
task per connection put server events on the wire. The model loads in a
worker thread after startup (``/readyz`` says 503 until it is loaded); the
engine runs on its own thread, never on the event loop. Exceptions become
close codes in one place, :func:`close_code_for`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket

from bargein import static
from bargein.app.auth import ANY_HOST, OPEN_PATHS, AuthConfig, AuthMiddleware, load_api_keys, normalize_origin
from bargein.app.logging import client_logger, quiet_client_faults, set_ids
from bargein.app.metrics import Metrics, create_metrics
from bargein.app.observer import Observer
from bargein.app.openai.fallback import fallback_routes, internal_error
from bargein.app.openai.realtime.endpoint import OPENAI_SUBPROTOCOL, OpenAIRealtime, wants_openai
from bargein.app.openai.realtime.endpoint import encode as encode_openai
from bargein.app.openai.routes import openai_routes
from bargein.app.outgoing import Outgoing
from bargein.app.settings import ServerConfig, Settings
from bargein.protocol import CloseCode, Decoder, select_subprotocol
from bargein.protocol.errors import FrameTooLarge, ProtocolError
from bargein.session.errors import NodeIdInUse, TokenLogUnavailable
from bargein.session.runtime.admission import Admission
from bargein.session.runtime.connection import Connection
from bargein.session.runtime.service import Service
from bargein.session.streams.log import TokenLog, open_token_log
from bargein.session.streams.peers import NoPeers
from bargein.session.voice_runtime.channel import plug
from bargein.session.voice_runtime.runtime import VoiceRuntime
from bargein.session.voice_runtime.settings import VOICES
from bargein.voice.interruption import DEFAULT_INTERRUPTION, IMMEDIATE_INTERRUPTION
from bargein.voice.models import VoiceUnavailable, load_voice_models

if TYPE_CHECKING:
    from bargein.session.streams.cluster import Cluster

logger = logging.getLogger("bargein")

STATIC_DIR = Path(static.__file__).resolve().parent  # bargein.static: package data
Progress = Callable[[str], None]
LOAD_FAILED = "failed"  # the progress stage reported when loading fails
MAX_UNREAD_S = 5.0  # the longest one pause of a client's reader (see _read_loop)


def close_code_for(exc: BaseException) -> int:
    """The WebSocket close code that answers ``exc`` (docs/protocol.md)."""
    if isinstance(exc, FrameTooLarge):
        return CloseCode.MESSAGE_TOO_BIG
    if isinstance(exc, UnicodeDecodeError):
        return CloseCode.INVALID_UTF8
    return CloseCode.INTERNAL_ERROR


@dataclass(slots=True, kw_only=True)
class AppState:
    """What the app holds while it runs (``app.state.bargein``).

    Attributes:
        settings: what it was started with.
        service: set once the model is loaded (``None`` before: not ready).
        runner: the engine loop, once loaded.
        log: the token log.
        load_error: why loading failed, if it did.
        loaded: set when loading ended (with or without success).
        metrics: the Prometheus metrics (``GET /metrics``).
        observer: feeds them (and the request log) from the sessions.
        shared_runner: a started runner this app serves instead of loading
            one (tests: two servers on one model); the app never shuts it down.
        shared_voice: loaded voice models this app uses instead of loading
            them (tests); never closed here.
        voice: the voice models in use (None: text only).
        writers: the writer of each open ``/v1/realtime`` connection (whether
            it is over its outgoing bound: tests and debugging).
        cluster: this node's part of a multi-node deployment (with a Redis
            log; None alone), once the service is built.
    """

    settings: Settings
    metrics: Metrics
    observer: Observer
    service: Service | None = None
    runner: Any = None
    log: TokenLog | None = None
    load_error: str | None = None
    shared_runner: Any = None
    shared_voice: VoiceRuntime | None = None
    voice: VoiceRuntime | None = None
    loaded: asyncio.Event = field(default_factory=asyncio.Event)
    writers: set[Outgoing] = field(default_factory=set)
    cluster: Cluster | None = None


def load_runner(settings: Settings, progress: Progress) -> Any:
    """Load the model, build the engine and start its thread (slow: seconds).

    Raises whatever loading raises (missing file, bad weights).
    """
    from bargein.engine.engine import LLMEngine
    from bargein.engine.loop import EngineLoop

    def build() -> LLMEngine:
        engine = LLMEngine.from_config(settings.engine)
        progress("weights and KV cache")
        return engine

    # loaded on the thread that will step it (EngineLoop.build_and_start says why)
    runner = EngineLoop.build_and_start(build)
    progress("engine thread")
    return runner


SECRET_WAIT_S = 60.0  # longest wait at startup for Redis to hand out the shared token key


async def token_secret(settings: Settings, log: TokenLog) -> bytes:
    """The key of resume and session tokens.

    ``--secret`` wins. Without it, nodes on one Redis share a key kept there
    (the first node creates it), so any node, and a node after a restart,
    accepts the tokens any of them gave out; the memory log (one process)
    draws a random key, valid until the process ends.

    Raises TokenLogUnavailable when Redis does not answer within ``SECRET_WAIT_S``.
    """
    if settings.server.secret:
        return settings.server.secret.encode()
    candidate = secrets.token_bytes(32)
    if settings.server.redis_url is None:
        logger.info(
            "no --secret: resume and session tokens use a random key of this "
            "process (they stop working when it restarts; pass --secret to keep them)"
        )
        return candidate
    deadline = time.monotonic() + SECRET_WAIT_S
    while True:
        try:
            shared: bytes = await log.shared_secret(candidate)  # type: ignore[attr-defined]
            break
        except TokenLogUnavailable:
            if time.monotonic() > deadline:
                raise
            logger.warning("no --secret and Redis does not answer yet: waiting for the shared token key")
            await asyncio.sleep(1.0)  # a refused connection fails at once: no busy loop
    logger.info("no --secret: resume and session tokens use the key shared by every node on this Redis")
    return shared


async def _load(state: AppState, progress: Progress) -> None:
    try:
        assert state.log is not None
        secret = await token_secret(state.settings, state.log)
    except TokenLogUnavailable as exc:
        logger.error(
            "no --secret, and the shared token key could not be read from Redis: "
            "start Redis, or pass --secret"
        )
        state.load_error = f"token key unavailable: {exc}"
        state.loaded.set()
        progress(LOAD_FAILED)
        return
    try:
        runner = state.shared_runner or await asyncio.to_thread(load_runner, state.settings, progress)
    except Exception as exc:  # reported by /readyz and the log; the server stays up
        logger.exception("loading the model failed")
        state.load_error = f"{type(exc).__name__}: {exc}"
        state.loaded.set()
        progress(LOAD_FAILED)
        return
    state.runner = runner
    state.metrics.attach_runner(runner)
    try:
        voice = state.shared_voice if state.shared_voice is not None else await load_voice(state.settings)
    except VoiceUnavailable as exc:  # --voice on
        logger.error("--voice on, but the voice stack is unavailable: %s", exc)
        state.load_error = f"voice unavailable: {exc}"
        state.loaded.set()
        progress(LOAD_FAILED)
        return
    state.voice = voice
    state.cluster = make_cluster(state.settings, state.log)
    service = Service(
        runner,
        state.log,
        state.settings.session,
        secret=secret,
        node_id=state.settings.server.node_name,
        debug=state.settings.server.debug_endpoints,
        observer=state.observer,
        admission=Admission(state.settings.admission),
        peers=NoPeers() if state.cluster is None else state.cluster,
    )
    try:
        await service.start()
    except NodeIdInUse as exc:  # refused to start: nothing of this node reaches Redis
        logger.error("%s", exc)
        state.load_error = str(exc)
        state.loaded.set()
        progress(LOAD_FAILED)
        return
    state.service = service
    progress("ready")
    state.loaded.set()


async def load_voice(settings: Settings) -> VoiceRuntime | None:
    """The voice models, per ``--voice``: None when off, or when ``auto`` and
    the stack is not installed (the log says what is missing).

    Raises:
        VoiceUnavailable: ``--voice on`` and a piece is missing.
    """
    config = settings.voice
    if config.mode == "off":
        logger.info("voice: off (--voice off): text only")
        return None
    try:
        folder = None
        if config.text_turn:
            # the bundled 135M model, whatever is served: transformers runs it
            # in fp32 (converted from its GGUF once, cached), which a 7B
            # checkpoint would not fit
            from bargein.engine.model.loader import transformers_folder

            folder = Path(transformers_folder(replace(settings.engine.model, path=None)))
        models = await asyncio.to_thread(load_voice_models, text_model_folder=folder)
    except VoiceUnavailable as exc:
        if config.mode == "on":
            raise
        logger.warning("voice: unavailable, serving text only: %s", exc)
        return None
    logger.info("voice: on (Silero VAD, Whisper tiny.en, Piper en_US-joe-medium)")
    return VoiceRuntime(models, config)


def make_cluster(settings: Settings, log: TokenLog) -> Cluster | None:
    """With a Redis log, this node's :class:`bargein.session.streams.cluster.Cluster`
    on it; else None (a node alone)."""
    server = settings.server
    if server.redis_url is None:
        return None
    from bargein.session.streams.cluster import Cluster  # redis only when used
    from bargein.session.streams.cluster.lease import LeaseConfig
    from bargein.session.streams.log.redis_streams import RedisTokenLog

    assert isinstance(log, RedisTokenLog), "open_token_log opens a Redis URL as a RedisTokenLog"
    lease = LeaseConfig(ttl_s=server.lease_ttl_s, renew_every_s=server.lease_ttl_s / 5)
    return Cluster(server.redis_url, server.node_name, log, lease=lease)


def create_app(
    settings: Settings,
    *,
    progress: Progress = lambda stage: None,
    runner: Any = None,
    voice: VoiceRuntime | None = None,
) -> Starlette:
    """The ASGI app for ``settings``; ``progress(stage)`` reports each loading
    stage when it is done (see ``bargein.app.cli.LOAD_STAGES``), or ``LOAD_FAILED``
    (the reason is in ``/readyz`` and the log); ``runner``: serve
    this started engine loop instead of loading the model (never shut down
    here); ``voice``: use these loaded voice models (never closed here)."""
    metrics = create_metrics(settings.server.metrics_multiproc_dir)
    quiet_client_faults()  # a hostile client cannot flood the log with tracebacks
    state = AppState(
        settings=settings,
        metrics=metrics,
        shared_runner=runner,
        shared_voice=voice,
        observer=Observer(metrics, log_prompts=settings.server.log_prompts),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.log = open_token_log(
            settings.server.redis_url,
            node_id=settings.server.node_name,
            durability=settings.server.token_log_durability,
        )
        loader = asyncio.create_task(_load(state, progress), name="load-model")
        try:
            async with state.metrics.watching_event_loop():
                yield
        finally:
            await _shutdown(state, loader)

    routes = [
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics_endpoint),
        WebSocketRoute("/v1/realtime", realtime),
    ]
    routes += openai_routes()
    routes += fallback_routes(routes)  # JSON 404/405 under /v1, never the static mount's
    if settings.server.debug_endpoints:
        routes.append(Route("/debug/engine", debug_engine))
    routes.append(Mount("/", StaticFiles(directory=STATIC_DIR, html=True), name="static"))
    public = frozenset({"/metrics"}) if settings.server.public_metrics else frozenset()
    if not settings.server.allowed_hosts and ANY_HOST in settings.server.trusted_hosts:
        logger.warning(
            "any Host header is served (bound to %s without --allowed-hosts): a DNS-rebinding page "
            "can reach this server from a browser on its network; list the names clients use",
            settings.server.host,
        )
    auth = AuthConfig(
        key_digests=load_api_keys(settings.server.api_keys),
        allowed_hosts=settings.server.trusted_hosts,
        allowed_origins=frozenset(normalize_origin(o) for o in settings.server.allowed_origins),
        open_paths=OPEN_PATHS | public,
    )
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={Exception: internal_error},
        middleware=[Middleware(AuthMiddleware, config=auth, on_refused=state.observer.auth_refused)],
    )
    app.state.bargein = state
    return app


async def _shutdown(state: AppState, loader: asyncio.Task[None]) -> None:
    await loader  # a loading thread cannot be cancelled; let it end first
    if state.service is not None:
        await state.service.hand_over()  # other nodes continue its streams
    if state.runner is not None and state.runner is not state.shared_runner:
        await asyncio.to_thread(state.runner.shutdown)
    if state.service is not None:
        await state.service.stop()
    if state.log is not None:
        await state.log.close()
    if state.voice is not None and state.voice is not state.shared_voice:
        state.voice.close()
    state.metrics.close()


def _state(scope_app: Any) -> AppState:
    return scope_app.state.bargein


async def healthz(request: Request) -> JSONResponse:
    """Liveness: the process answers and its engine thread, once started, lives.

    503 when the engine thread died: only a restart brings it back.
    """
    runner = _state(request.app).runner
    if runner is not None and runner.error is not None:
        return JSONResponse({"status": "engine thread died"}, status_code=503)
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> JSONResponse:
    """Readiness: 200 once the model is loaded, the engine runs, the token
    log answers and no supervised task crashes; else 503 and ``not_ready``
    lists what is missing (``<task>: crashed (<exception>)`` for a task)."""
    state = _state(request.app)
    log_ok = state.log is not None and await state.log.ping()
    not_ready = []
    if state.service is None:
        not_ready.append("model: failed to load" if state.load_error else "model: loading")
    elif state.runner.error is not None:
        not_ready.append("engine: thread died")
    else:  # a long-lived task that crashes (a bug) until its next good run
        not_ready += state.service.failing_tasks()
    if not log_ok:
        not_ready.append("token_log: not reachable")
    log_health = getattr(state.log, "health", None)  # the Redis log's tailer
    if log_health is not None:
        not_ready += log_health.not_ready()
    ready = not not_ready
    body = {
        "ready": ready,
        "model_loaded": state.service is not None,
        "token_log": log_ok,
        "error": state.load_error,
        "not_ready": not_ready,
    }
    return JSONResponse(body, status_code=200 if ready else 503)


async def metrics_endpoint(request: Request) -> Response:
    """Prometheus text exposition of every ``bargein_*`` metric."""
    body, content_type = _state(request.app).metrics.render()
    return Response(body, headers={"Content-Type": content_type})


async def debug_engine(request: Request) -> JSONResponse:
    """Engine stats and the last prompts it received (``--debug-endpoints`` only)."""
    state = _state(request.app)
    if state.service is None:
        return JSONResponse({"error": "not ready"}, status_code=503)
    stats = asdict(state.runner.stats())
    stats["num_finished_by_reason"] = dict(stats["num_finished_by_reason"])
    recent = [
        {"request_id": r.request_id, "prompt_token_ids": list(r.prompt_token_ids)}
        for r in state.service.recent_requests
    ]
    service = state.service
    interrupts = {"count": service.num_interrupts, "latencies_s": list(service.interrupt_latencies_s)}
    body = {"stats": stats, "recent_requests": recent, "interrupts": interrupts}
    if state.cluster is not None:
        body["cluster"] = {
            "node_id": service.node_id,
            "takeovers": state.cluster.num_takeovers,
            "leases_held": len(state.cluster.leases.held),
        }
    return JSONResponse(body)


async def realtime(ws: WebSocket) -> None:
    """``/v1/realtime``: one conversation per connection, in bargein's protocol
    or, for OpenAI's clients (:func:`wants_openai`), in OpenAI's Realtime
    schema (docs/protocol.md sections 1 and 11)."""
    state = _state(ws.app)
    offered = ws.scope.get("subprotocols", [])
    openai = wants_openai(ws.scope)
    fmt, subprotocol, _ = select_subprotocol(offered)
    if openai:
        fmt, subprotocol = "json", OPENAI_SUBPROTOCOL if OPENAI_SUBPROTOCOL in offered else None
    await ws.accept(subprotocol=subprotocol)
    if state.service is None or state.service.saturated():
        reason = "model loading" if state.service is None else "overloaded"
        if state.service is not None:
            state.observer.rejected("overloaded", response_id=None)  # refused at connect
        await ws.close(CloseCode.TRY_AGAIN_LATER, reason=reason)
        return
    server = state.settings.server
    writer = Outgoing(
        ws,
        fmt,
        max_bytes=server.max_outgoing_bytes,
        slow_timeout_s=server.slow_client_timeout_s,
        encoder=encode_openai if openai else None,
    )
    service = state.service
    adapter = (
        OpenAIRealtime(
            writer.send,
            model=service.runner.model_name,
            has_voice=state.voice is not None,
            voices=VOICES,
            on_error=state.observer.protocol_error,
            max_tokens=service.config.max_tokens,
        )
        if openai
        else None
    )
    scope_state = ws.scope.get("state", {})  # set by bargein.app.auth.AuthMiddleware
    connection = Connection(
        service,
        writer.send if adapter is None else adapter.send,
        principal=scope_state.get("principal", "anonymous"),
        limit_key=scope_state.get("limit_key"),
        # OpenAI's clients expect speech to interrupt at once (they clear their
        # playback at speech_started); bargein's own default is to confirm it
        voice=None
        if state.voice is None
        else plug(state.voice, interruption=IMMEDIATE_INTERRUPTION if openai else DEFAULT_INTERRUPTION),
    )
    set_ids(session_id=connection.session_id)  # on this connection's log lines
    state.observer.connected()
    state.writers.add(writer)
    code: int = CloseCode.NORMAL
    try:
        if adapter is None:
            await writer.send(connection.created_event())
            handle = _bargein_frames(
                connection,
                writer,
                Decoder(fmt=fmt, max_frame_bytes=state.settings.session.max_frame_bytes),
                state.observer,
            )
        else:
            adapter.attach(connection)
            await adapter.open()
            handle = _openai_frames(adapter, state.settings.session.max_frame_bytes)
        unread = _unread_pause(connection, _max_unread_s(server))
        closed_with = await _read_loop(ws, writer, handle, unread)
        if closed_with == CloseCode.INVALID_UTF8:  # uvicorn closed it; its line is dropped
            client_logger.info("client sent invalid UTF-8 in a text frame: closed with 1007")
        if writer.too_slow.is_set():
            code = CloseCode.CLIENT_TOO_SLOW
            logger.info("client too slow: closing with 4008")
        state.observer.disconnected(active_response=connection.active_response_id is not None)
    except Exception as exc:
        code = close_code_for(exc)
        if code == CloseCode.INTERNAL_ERROR:
            logger.exception("connection failed")
    finally:
        state.writers.discard(writer)
        state.observer.closed()
        await connection.close()
        await writer.close(code)


FrameHandler = Callable[[str | bytes, float], Awaitable[None]]


def _bargein_frames(
    connection: Connection, writer: Outgoing, decoder: Decoder, observer: Observer
) -> FrameHandler:
    """Frames of bargein's protocol: decoded, then applied."""

    async def handle(frame: str | bytes, received_at: float) -> None:
        try:
            event = decoder.decode(frame)
        except ProtocolError as exc:
            observer.protocol_error(exc.code.value)
            await writer.send(exc.to_event())
            return
        await connection.handle(event, received_at)

    return handle


def _openai_frames(adapter: OpenAIRealtime, max_frame_bytes: int) -> FrameHandler:
    """Frames of OpenAI's schema; one over the frame limit closes with 1009, as in bargein's."""

    async def handle(frame: str | bytes, received_at: float) -> None:
        size = len(frame.encode()) if isinstance(frame, str) else len(frame)
        if size > max_frame_bytes:
            raise FrameTooLarge(size, max_frame_bytes)
        await adapter.handle_frame(frame, received_at)

    return handle


def _max_unread_s(server: ServerConfig) -> float:
    """The longest the reader leaves a client's frames unread at once: the
    frames left include the pong of uvicorn's keepalive ping, and one read
    later than the ping timeout would close the connection."""
    timeout = server.ws_ping_timeout_s
    return MAX_UNREAD_S if not timeout else min(MAX_UNREAD_S, timeout / 2)


def _unread_pause(connection: Connection, max_s: float) -> Callable[[float], float]:
    """``now -> seconds`` to leave the connection's frames unread, at most ``max_s``."""
    return lambda now: min(connection.unread_s(now), max_s)


async def _read_loop(
    ws: WebSocket, writer: Outgoing, handle: FrameHandler, unread_s: Callable[[float], float]
) -> int | None:
    """Hand frames over, until the client goes away (or stayed too slow, see
    :mod:`bargein.app.outgoing`); returns the close code of the disconnect
    (None when the server stopped reading).

    After a frame, ``unread_s(now)`` seconds pass before the next is read
    (a client past its audio pace): uvicorn reads no more of a socket until
    its one message is received, so what the client sends meanwhile stays
    in TCP's buffers and then blocks its sends, at no cost to the loop."""
    while True:
        message = await _receive(ws, writer.too_slow)
        received_at = time.monotonic()
        if message is None:
            return None
        if message["type"] == "websocket.disconnect":
            return message.get("code")
        frame = message.get("text")
        if frame is None:
            frame = message.get("bytes") or b""
        await handle(frame, received_at)
        if (pause_s := unread_s(time.monotonic())) > 0:
            with contextlib.suppress(TimeoutError):  # the pause is over; a writer giving up ends it
                await asyncio.wait_for(writer.too_slow.wait(), pause_s)


async def _receive(ws: WebSocket, stop: asyncio.Event) -> Any:
    """The next ASGI message, or None once ``stop`` is set (a message that
    arrived meanwhile is dropped: the connection is being closed).

    Raises whatever ``ws.receive()`` raises, and CancelledError when the
    handler itself is cancelled.
    """
    if stop.is_set():
        return None
    receive = asyncio.ensure_future(ws.receive())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((receive, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not receive.done():
            receive.cancel()
            # cancel() only asks: the task ends at its next step. Wait for it,
            # or result() finds it neither done nor cancelled. asyncio.wait
            # does not raise the task's CancelledError, only this handler's own.
            await asyncio.wait((receive,))
    if stop.is_set() or receive.cancelled():
        return None
    return receive.result()
