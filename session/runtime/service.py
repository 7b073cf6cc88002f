"""The glue between connections, the engine runner and the token log.

One :class:`Service` per process. It

- turns a session's :class:`~bargein.session.conversation.state.Submit` into an engine request:
  text too long to fit the context is refused before any tokenizing, the
  chat template is applied off the event loop (``asyncio.to_thread``, one
  at a time per connection), the stream is created in the log, then the
  request goes to the runner;
- listens to the runner's steps: one ``call_soon_threadsafe`` per engine step
  hands the step's outputs to the event loop, and one ``write_step`` per step
  puts them into the token log (in step order, by one writer task). At most
  ``config.max_pending_log_steps`` steps wait for the writer: past that the
  engine thread waits for room (backpressure), so a log slower than the
  engine (a replica ``WAIT``, a slow Redis) slows generation down instead of
  growing memory and delivery lag without bound; the observer is told how
  long the engine waited and how many steps were pending;
- tells the connection that owns a stream when generation finished, so the
  conversation gets the assistant turn.

The writer runs supervised (session/supervise.py): a bug that crashes it
fails the streams of the step it was writing (an error end in the log, the
engine request aborted, the admission slot returned) and the writer
restarts; a log write that raises something unexpected fails only the
streams whose own write fails. While it fails, ``health`` makes ``/readyz``
answer 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bargein.engine.errors import EngineStoppedError, PromptTooLongError
from bargein.engine.request import EngineRequest, FinishReason, RequestOutput
from bargein.protocol import events as pe
from bargein.session.cancel import cancel_and_wait
from bargein.session.conversation.chat import (
    longest_token_bytes,
    max_prompt_bytes,
    prompt_bytes,
    prompt_ids,
)
from bargein.session.conversation.config import SessionConfig
from bargein.session.conversation.state import GenerationFinished, Submit, SubmitFailed, Submitted
from bargein.session.errors import StreamFenced, TokenLogError, TokenLogUnavailable
from bargein.session.runtime.admission import Admission, AdmissionConfig, Refusal
from bargein.session.runtime.delivery import Batch, feed
from bargein.session.runtime.observer import NullObserver, SessionObserver
from bargein.session.runtime.one_at_a_time import OneAtATime
from bargein.session.runtime.tokens import make_resume_token
from bargein.session.streams.log import EndError, LogEntry, StreamEnd, StreamInfo, StreamWrite, TokenLog
from bargein.session.streams.log.read_probe import read_error_soon
from bargein.session.supervise import TaskHealth, supervised

logger = logging.getLogger(__name__)

WRITER = "token-log-writer"  # the step writer's task name (the log, /readyz)
FAILED_MESSAGE = "the server failed while writing this response (a bug, in its log); it ended here"
RETRY_AFTER_FAILURE_MS = 1000  # a new request may well succeed: the step writer restarted

OnFinish = Callable[[GenerationFinished], None]
# How often an engine thread waiting for the writer looks whether the service stopped.
_STOP_POLL_S = 0.1


@dataclass(frozen=True, slots=True, kw_only=True)
class _Step:
    """One engine step on its way to the log writer."""

    started_at: float  # monotonic seconds: when the engine step began
    outputs: list[RequestOutput]
    engine_wait_s: float  # the engine thread waited this long for room in the queue
    holds_slot: bool  # it took one of the queue's slots (the writer gives it back)


@dataclass(slots=True, kw_only=True)
class _LiveStream:
    """A stream whose request the engine is still generating."""

    response_id: str
    on_finish: OnFinish | None
    texts: list[str] = field(default_factory=list)  # of each logged entry
    ends: list[int] = field(default_factory=list)  # token offset after each logged entry
    logged_end: int = 0  # offset after the last token written to the log
    abort_requested_at: float | None = None
    abort_reason: FinishReason | None = None  # what the accepted cancel asked for
    principal: str = ""  # its owner's admission key (told when it ended)
    num_prompt_tokens: int = 0
    queued_tokens: int = 0  # prompt tokens admission counts as queued (check_load) until it starts
    admitted_at: float = 0.0  # service clock when admission let it in
    predicted_ttft_s: float | None = None  # admission's model of its first token's time
    started: bool = False  # its first token (or its end) came: it left the queue
    released: bool = False  # the connection that created it closed
    abandoned: asyncio.TimerHandle | None = None  # aborts it if nobody reads it in time
    deadline: asyncio.TimerHandle | None = None  # drops it if it is still queued then
    expired: EndError | None = None  # it was dropped from the queue at its deadline
    continuation: Any = None  # a bargein.session.streams.cluster.takeover.Continuation: a stream taken over


def kept_output_tokens(texts: Sequence[str], ends: Sequence[int], kept_chars: int | None) -> int:
    """Output tokens of a stream whose text lies wholly within its first
    ``kept_chars`` characters (all logged tokens when None).

    Args:
        texts: the text of each logged entry, in order.
        ends: the token offset after each entry (ascending, same length).
        kept_chars: characters of ``"".join(texts)`` that are kept.

    An entry whose text crosses the cut is not kept: the next turn's prompt
    re-tokenizes the kept text, whose last characters may become other tokens
    than the engine generated. Entries with no text (a character's first
    bytes) count with the text that completes them.
    """
    if not ends:
        return 0
    if kept_chars is None:
        return ends[-1]
    kept, chars = 0, 0
    for text, end in zip(texts, ends, strict=True):
        chars += len(text)
        if chars > kept_chars:
            break
        if text:
            kept = end
    return kept


@dataclass(frozen=True, slots=True, kw_only=True)
class Owner:
    """Who submits: the principal (for resume tokens) and their session.

    ``limit_key``: who admission's rate limits and caps count against
    (without API keys, the client's address: see app/auth.py); None: the
    principal. ``connection``: the client connection submitting, which has
    at most one prompt being tokenized at a time; None: the session (a
    WebSocket connection has one).
    """

    principal: str
    session_id: str
    on_finish: OnFinish | None = None
    limit_key: str | None = None
    connection: str | None = None  # one tokenization at a time each; None: session_id

    @property
    def admission_key(self) -> str:
        """The key of this owner's admission state."""
        return self.limit_key or self.principal

    @property
    def interactive(self) -> bool:
        """A realtime session's turn (it has a session id), which admission
        favours over a bulk HTTP request (none): session/runtime/admission.py."""
        return bool(self.session_id)


class Service:
    """Runs the realtime sessions of one process on one engine runner.

    Args:
        runner: a started :class:`bargein.engine.runner.EngineRunner` (or anything
            with its ``submit``/``abort``/``add_step_listener``/``tokenizer``/
            ``max_model_len``/``model_name``/``stats``).
        log: the token log streams are written to and delivered from.
        config: session limits.
        secret: resume/session token key (non-empty).
        node_id: recorded as the owner of the streams written here.
        clock: monotonic seconds.
        debug: keep the last requests submitted (``recent_requests``) for
            tests and ``/debug/engine``.
        observer: told of submits, rejections, finishes and log writes (metrics).
        admission: refuses requests past the queue and rate limits (default:
            no limits).
        cluster: a :class:`bargein.session.streams.cluster.Cluster` when several nodes share
            the Redis log (leases, forwarded cancels, takeover); None alone.
    """

    def __init__(
        self,
        runner: Any,
        log: TokenLog,
        config: SessionConfig,
        *,
        secret: bytes,
        node_id: str = "node-0",
        clock: Callable[[], float] = time.monotonic,
        debug: bool = False,
        observer: SessionObserver | None = None,
        admission: Admission | None = None,
        cluster: Any = None,
    ) -> None:
        self.runner = runner
        self.cluster = cluster
        self.admission = admission or Admission(AdmissionConfig(max_waiting=0, max_queue_time_s=0))
        self.observer: SessionObserver = observer or NullObserver()
        self.log = log
        self.config = config
        self.secret = secret
        self.node_id = node_id
        self.clock = clock
        self.recent_requests: deque[EngineRequest] = deque(maxlen=256 if debug else 0)
        # Frame received -> the engine step that freed the blocks began, per
        # interrupt (newest last); issue 8 turns it into a histogram metric.
        self.interrupt_latencies_s: deque[float] = deque(maxlen=4096)
        self.num_interrupts = 0
        self._live: dict[str, _LiveStream] = {}
        self._readers: dict[str, int] = {}  # stream id -> deliveries of it on this node
        # session id -> the connection on this node that holds it (the last to attach)
        self.sessions: dict[str, Any] = {}
        self._steps: asyncio.Queue[_Step] = asyncio.Queue()
        # Room for steps between the engine thread and the writer: taken by the
        # engine thread (it waits when none is left), given back once written.
        self._step_slots = threading.BoundedSemaphore(config.max_pending_log_steps)
        self._stopping = threading.Event()  # an engine thread waiting for room gives up
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id: int | None = None
        self._writer: asyncio.Task[None] | None = None
        self._tokenizing = OneAtATime()  # one tokenization in flight per connection
        self._max_prompt_bytes: int | None = None  # None: no bound before tokenizing
        self._in_flight: list[RequestOutput] = []  # the step the writer is writing
        # Supervised tasks failing now (the writer here, the cluster's): /readyz lists them.
        self.health = TaskHealth()

    def cache_salt(self, principal: str) -> str | None:
        """The prefix-cache salt of a principal's requests: the principal
        itself, unless the cache is shared (``config.shared_prefix_cache``)."""
        return None if self.config.shared_prefix_cache else principal

    @property
    def max_model_len(self) -> int:
        """Prompt plus output tokens of one sequence."""
        return int(self.runner.max_model_len)

    async def start(self) -> None:
        """Attach to the runner, measure its tokenizer (the prompt text bound, see
        session/conversation/chat.py) and start the log writer (on the event loop)."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        self._stopping.clear()
        token_bytes = await asyncio.to_thread(longest_token_bytes, getattr(self.runner, "tokenizer", None))
        if token_bytes is not None:
            self._max_prompt_bytes = max_prompt_bytes(token_bytes, self.max_model_len)
        self._writer = supervised(
            self._write_steps, name=WRITER, on_crash=self._writer_crashed, health=self.health
        )
        self.runner.add_step_listener(self._on_engine_step)
        if self.cluster is not None:
            await self.cluster.start(self)

    async def stop(self) -> None:
        """Stop the log writer (after the runner was shut down, or, for a
        runner shared with another service, detach from it)."""
        remove = getattr(self.runner, "remove_step_listener", None)
        if remove is not None:
            remove(self._on_engine_step)
        if self.cluster is not None:
            await self.cluster.stop()
        self._stopping.set()  # nobody will make room any more
        if self._writer is not None:
            await cancel_and_wait([self._writer])
            self._writer = None

    def failing_tasks(self) -> list[str]:
        """The supervised tasks of this node that crash now (the step writer,
        the cluster's tick and abort listener), as ``/readyz`` lists them."""
        failing = self.health.not_ready()
        if self.cluster is not None:
            failing += self.cluster.health.not_ready()
        return failing

    # ---- submitting ----------------------------------------------------------

    def saturated(self) -> bool:
        """The waiting queue is full (a new connection gets close 1013)."""
        return self.admission.saturated()

    async def submit(self, action: Submit, owner: Owner, now: float) -> Submitted | SubmitFailed:
        """Admit, render the prompt, create the stream, submit the request.

        Admission (:mod:`bargein.session.runtime.admission`) answers first, before any KV
        block is allocated. From ``runner.submit`` to the return there is no
        ``await``: the caller hands ``Submitted`` to its session before any
        engine output of this request can reach the loop.
        """
        admitted_at = self.clock()
        refusal = self.admission.check_request(owner.admission_key, admitted_at)
        if refusal is not None:
            return self._refused(action, refusal)
        refusal = self.admission.precheck_load(
            self._engine_load(), interactive=owner.interactive, max_tokens=action.params.max_tokens
        )
        if refusal is not None:  # the load alone refuses it: no need to tokenize
            self.admission.cancelled(owner.admission_key)
            return self._refused(action, refusal)
        try:
            result = await self._submit_admitted(action, owner, now, admitted_at)
        except BaseException:
            self.admission.cancelled(owner.admission_key)
            raise
        if isinstance(result, SubmitFailed):
            self.admission.cancelled(owner.admission_key)
        return result

    def _refused(self, action: Submit, refusal: Refusal) -> SubmitFailed:
        self.observer.rejected(refusal.code.value, response_id=action.response_id)
        return SubmitFailed(
            response_id=action.response_id,
            code=refusal.code,
            message=refusal.message,
            retry_after_ms=refusal.retry_after_ms,
        )

    async def _submit_admitted(
        self, action: Submit, owner: Owner, now: float, admitted_at: float
    ) -> Submitted | SubmitFailed:
        num_bytes = prompt_bytes(action.messages, action.prompt)
        if self._max_prompt_bytes is not None and num_bytes > self._max_prompt_bytes:
            return self._too_long_text(action, num_bytes)  # no tokenizing: it cannot fit
        async with self._tokenizing.hold(owner.connection or owner.session_id):
            ids = await asyncio.to_thread(prompt_ids, self.runner.tokenizer, action.messages, action.prompt)
        if len(ids) >= self.max_model_len:
            return self._too_long(action, len(ids))
        load = self._engine_load()
        verdict = self.admission.judge_load(
            len(ids), load, interactive=owner.interactive, max_tokens=action.params.max_tokens
        )
        if verdict.refusal is not None:  # first: a request refused for the load costs no rate tokens
            return self._refused(action, verdict.refusal)
        queued = len(ids) if load is not None else 0  # what check_load counted as queued
        refusal = self.admission.charge_tokens(
            owner.admission_key, len(ids) + action.params.max_tokens, self.clock()
        )
        if refusal is not None:
            self.admission.release_load(queued)
            return self._refused(action, refusal)
        submitted = False
        try:
            result = await self._create_and_submit(
                action, owner, now, admitted_at, ids, queued, verdict.predicted_ttft_s
            )
            submitted = isinstance(result, Submitted)
            return result
        finally:
            if not submitted:  # it never reached the engine: not queued after all
                self.admission.release_load(queued)

    def _engine_load(self) -> Any:
        """The runner's stats when they carry a step budget (the engine runs
        with an ITL target), for admission's model-based check; else None."""
        stats = getattr(self.runner, "stats", None)
        load = stats() if stats is not None else None
        return load if getattr(load, "step_budget", None) is not None else None

    async def _create_and_submit(
        self,
        action: Submit,
        owner: Owner,
        now: float,
        admitted_at: float,
        ids: tuple[int, ...],
        queued: int,
        predicted_ttft_s: float | None = None,
    ) -> Submitted | SubmitFailed:
        """Create the stream in the log, submit the request, start its deadline."""
        try:
            if self.cluster is not None:  # its record and lease exist before the stream
                await self.cluster.claim(action.stream_id, ids, action.params)
            await self.log.create_stream(
                StreamInfo(
                    stream_id=action.stream_id,
                    response_id=action.response_id,
                    principal=owner.principal,
                    session_id=owner.session_id,
                    owner_node=self.node_id,
                    status="live",
                    end=0,
                    finish=None,
                )
            )
        except TokenLogUnavailable:  # nothing was generated: the client may retry
            logger.warning(
                "stream %s not created: the token log is unavailable", action.stream_id, exc_info=True
            )
            return SubmitFailed(
                response_id=action.response_id,
                code=pe.ErrorCode.INTERNAL_ERROR,
                message="the token log is unavailable; retry later",
            )
        request = EngineRequest(
            request_id=action.stream_id,
            prompt_token_ids=ids,
            params=action.params,
            arrival_time=now,
            cache_salt=self.cache_salt(owner.principal),
        )
        try:
            self.runner.submit(request)
        except PromptTooLongError:
            await self._end_unsubmitted(action.stream_id, len(ids))
            return self._too_long(action, len(ids))
        except EngineStoppedError:
            await self._end_unsubmitted(action.stream_id, len(ids))
            self.observer.rejected("engine_stopped", response_id=action.response_id)
            return SubmitFailed(
                response_id=action.response_id,
                code=pe.ErrorCode.INTERNAL_ERROR,
                message="the engine is not running",
            )
        live = self._live[action.stream_id] = _LiveStream(
            response_id=action.response_id,
            on_finish=owner.on_finish,
            principal=owner.admission_key,
            num_prompt_tokens=len(ids),
            queued_tokens=queued,
            admitted_at=admitted_at,
            predicted_ttft_s=predicted_ttft_s,
        )
        queue_time_s = self.admission.config.max_queue_time_s
        if queue_time_s and self._loop is not None:
            live.deadline = self._loop.call_later(queue_time_s, self._expire, action.stream_id)
        self.recent_requests.append(request)
        self.observer.submitted(
            response_id=action.response_id,
            stream_id=action.stream_id,
            session_id=owner.session_id,
            num_prompt_tokens=len(ids),
            max_tokens=action.params.max_tokens,
            messages=action.messages,
        )
        return Submitted(
            response_id=action.response_id,
            resume_token=make_resume_token(self.secret, action.stream_id, owner.principal),
        )

    def _too_long(self, action: Submit, num_tokens: int) -> SubmitFailed:
        return self._prompt_too_long(
            action,
            f"the prompt has {num_tokens} tokens; the context holds "
            f"{self.max_model_len} (prompt plus at least one new token)",
        )

    def _too_long_text(self, action: Submit, num_bytes: int) -> SubmitFailed:
        return self._prompt_too_long(
            action,
            f"the prompt has {num_bytes} bytes of text: more than the context of "
            f"{self.max_model_len} tokens can hold",
        )

    def _prompt_too_long(self, action: Submit, message: str) -> SubmitFailed:
        self.observer.rejected(pe.ErrorCode.PROMPT_TOO_LONG.value, response_id=action.response_id)
        return SubmitFailed(
            response_id=action.response_id, code=pe.ErrorCode.PROMPT_TOO_LONG, message=message
        )

    async def _end_unsubmitted(self, stream_id: str, num_prompt_tokens: int) -> None:
        """Close a stream whose request the runner refused (readers must not hang)."""
        end = StreamEnd(
            end=0,
            finish_reason=FinishReason.ERROR.value,
            prompt_tokens=num_prompt_tokens,
            completion_tokens=0,
            cached_tokens=0,
        )
        await self.log.write_step([StreamWrite(stream_id=stream_id, entry=None, finish=end)])
        if self.cluster is not None:
            self.cluster.ended(stream_id)

    def abort(
        self, stream_id: str, reason: FinishReason, requested_at: float, *, kept_chars: int | None = None
    ) -> None:
        """Abort a stream's request (no-op once it finished).

        ``kept_chars``: the characters of its text the conversation keeps (a
        barge-in's heard text): only the KV of the prompt and of the logged
        tokens whose text lies wholly within them stays in the prefix cache
        (:func:`kept_output_tokens`); None keeps the KV of every logged token.
        """
        live = self._live.get(stream_id)
        if live is None:
            if self.cluster is not None:  # generated by another node: forward it
                self.cluster.abort_elsewhere(stream_id, reason)
            return
        if live.abort_requested_at is None:
            live.abort_requested_at, live.abort_reason = requested_at, reason
        kept = kept_output_tokens(live.texts, live.ends, kept_chars)
        offset = live.continuation.offset if live.continuation is not None else 0
        self.runner.abort(stream_id, reason, keep_tokens=live.num_prompt_tokens + max(0, kept - offset))

    def is_generating(self, stream_id: str) -> bool:
        """Whether this node's engine is generating ``stream_id`` now."""
        return stream_id in self._live

    async def follow(self, stream_id: str) -> None:
        """A client here reads a live stream: with a cluster, continue it here
        if the node generating it died (see session/streams/cluster/)."""
        if self.cluster is not None:
            await self.cluster.follow(stream_id)

    def continue_stream(self, request: EngineRequest, *, response_id: str, continuation: Any) -> None:
        """Submit a takeover's request; its outputs go to the stream
        ``request.request_id`` through ``continuation.translate``.

        Raises what ``runner.submit`` raises (PromptTooLongError, EngineStoppedError).
        """
        self.runner.submit(request)
        self._live[request.request_id] = _LiveStream(
            response_id=response_id,
            on_finish=None,
            started=True,
            continuation=continuation,
            logged_end=continuation.offset,
            num_prompt_tokens=len(request.prompt_token_ids),
        )
        self.recent_requests.append(request)

    def _expire(self, stream_id: str) -> None:
        """The queue-time deadline passed with no first token: drop the request
        if the engine has not scheduled it yet.

        The up-front estimate is a mean, so some admitted requests would wait
        past it; they are cancelled instead (nothing was generated, no KV block
        held, so nothing is lost) and every reader of the stream, on any node,
        is told ``overloaded`` with when to retry (the error rides in the
        log's ``StreamEnd``), as if refused at submit. The engine decides on
        its thread, at its next step: a request whose prefill has begun (a
        long prompt) goes on, so the deadline bounds the wait in the queue,
        not the prefill.
        """
        live = self._live.get(stream_id)
        if live is None or live.started or live.abort_requested_at is not None:
            return  # it started, or it is already being cancelled for another reason
        live.deadline = None
        queue_time_s = self.admission.config.max_queue_time_s
        live.expired = EndError(
            code=pe.ErrorCode.OVERLOADED.value,
            message=f"the server is overloaded: still queued after {queue_time_s:g} s; retry later",
            retry_after_ms=self.admission.drain_retry_ms(self.clock()),
        )
        self.runner.abort(stream_id, FinishReason.CANCELLED, only_if_waiting=True)

    def release(self, stream_id: str) -> None:
        """Its connection is gone: generation goes on, nobody is told of the end;
        if nobody reads it within ``config.abandon_grace_s``, it is aborted."""
        live = self._live.get(stream_id)
        if live is not None:
            live.on_finish = None
            live.released = True
            if not self._readers.get(stream_id):
                self._watch_abandoned(stream_id, live)

    # ---- reading streams (the face the HTTP layer reads through) -----------------

    @property
    def model_name(self) -> str:
        """The served model's name (``model`` of the OpenAI answers)."""
        return str(self.runner.model_name)

    async def stream_info(self, stream_id: str) -> StreamInfo | None:
        """What the log knows of a stream; None when unknown or expired.

        Raises TokenLogUnavailable when the log cannot be read.
        """
        return await self.log.info(stream_id)

    async def feed(self, stream_id: str, from_offset: int) -> AsyncGenerator[Batch | StreamEnd, None]:
        """A stream from ``from_offset`` for a client of this node, as
        :func:`bargein.session.runtime.delivery.feed` reads it (batches of what
        queued, then the end; the same errors), counted as one of the
        stream's readers while it runs: the abandon grace does not cancel a
        stream someone reads, on any node."""
        self.reader_started(stream_id)
        try:
            items = feed(self.log, stream_id, from_offset, observer=self.observer)
            async with contextlib.aclosing(items):
                async for item in items:
                    yield item
        finally:
            self.reader_ended(stream_id)

    async def read_error_soon(
        self, stream_id: str, from_offset: int, timeout_s: float
    ) -> TokenLogError | None:
        """The error a read of the stream from ``from_offset`` raises within
        ``timeout_s`` before its first item, else None (see
        :mod:`bargein.session.streams.log.read_probe`): an answer's status can say it."""
        return await read_error_soon(self.log, stream_id, from_offset, timeout_s)

    async def wait_end(self, stream_id: str, from_offset: int, timeout_s: float) -> StreamEnd | None:
        """The stream's end, once it is logged; None if it is not within
        ``timeout_s``, or the stream cannot be read (expired, log down)."""
        with contextlib.suppress(TimeoutError, TokenLogError):
            async with asyncio.timeout(timeout_s):
                async with contextlib.aclosing(self.log.read(stream_id, from_offset)) as items:
                    async for item in items:
                        if isinstance(item, StreamEnd):
                            return item
        return None

    def reader_started(self, stream_id: str) -> None:
        """A connection here started delivering ``stream_id``."""
        self._readers[stream_id] = self._readers.get(stream_id, 0) + 1
        if self.cluster is not None:  # the node generating it learns it is read
            self.cluster.reader_started(stream_id)
        live = self._live.get(stream_id)
        if live is not None and live.abandoned is not None:
            live.abandoned.cancel()
            live.abandoned = None

    def reader_ended(self, stream_id: str) -> None:
        """A delivery of ``stream_id`` here ended (sent its end, or its socket closed)."""
        if self.cluster is not None:
            self.cluster.reader_ended(stream_id)
        num_readers = self._readers.pop(stream_id, 1) - 1
        if num_readers > 0:
            self._readers[stream_id] = num_readers
            return
        live = self._live.get(stream_id)
        if live is not None and live.released:
            self._watch_abandoned(stream_id, live)

    def _watch_abandoned(self, stream_id: str, live: _LiveStream) -> None:
        grace_s = self.config.abandon_grace_s
        if grace_s <= 0 or self._loop is None or live.abandoned is not None:
            return
        live.abandoned = self._loop.call_later(grace_s, self._abort_abandoned, stream_id)

    def _abort_abandoned(self, stream_id: str) -> None:
        """Grace time is over and nobody reads the stream: free its blocks."""
        live = self._live.get(stream_id)
        if live is None or self._readers.get(stream_id):
            return
        live.abandoned = None
        if self.cluster is not None and self.cluster.read_elsewhere(stream_id):
            self._watch_abandoned(stream_id, live)  # a client reads it on another node
            return
        logger.info("stream %s abandoned for %.1f s: cancelled", stream_id, self.config.abandon_grace_s)
        self.runner.abort(stream_id, FinishReason.CANCELLED)

    # ---- engine steps -> token log ---------------------------------------------

    def _on_engine_step(self, outputs: list[RequestOutput]) -> None:
        """Step listener, on the engine thread: one hand-off to the loop per step.

        The step's start time travels along: the engine frees the blocks of
        aborted requests first thing in a step (the runner drains the aborts
        and hands their ends over before the forward pass), so interrupt
        latency is measured to it, not to when the busy event loop got round
        to the outputs.
        """
        assert self._loop is not None
        # Ends alone (no token) come from the runner's abort drain, sent before
        # the step's forward pass: their blocks were freed just now.
        ends_only = all(not out.new_token_ids for out in outputs)
        step_start = time.monotonic() - (0.0 if ends_only else self.runner.stats().last_step_s)
        waited_s, holds_slot = self._wait_for_room()
        step = _Step(started_at=step_start, outputs=outputs, engine_wait_s=waited_s, holds_slot=holds_slot)
        self._loop.call_soon_threadsafe(self._steps.put_nowait, step)

    def _wait_for_room(self) -> tuple[float, bool]:
        """Take a slot of the writer's queue, waiting while it is full
        (backpressure on the engine thread); ``(seconds waited, whether a
        slot was taken)``.

        Never waits on the event loop's own thread (a runner shut down from
        the loop hands its last outputs over there: the writer could not run),
        nor once the service stops: those steps go over the bound.
        """
        if self._step_slots.acquire(blocking=False):
            return 0.0, True
        if threading.get_ident() == self._loop_thread_id:
            return 0.0, False
        started = time.perf_counter()
        while not self._step_slots.acquire(timeout=_STOP_POLL_S):
            if self._stopping.is_set():
                return time.perf_counter() - started, False
        return time.perf_counter() - started, True

    async def _write_steps(self) -> None:
        """Write each step to the log in one ``write_step``, in step order
        (supervised: see :meth:`_writer_crashed`); each step's slot is given
        back once it is written (or failed)."""
        while True:
            step = await self._steps.get()
            try:
                self.observer.log_backlog(num_steps=self._steps.qsize() + 1, engine_wait_s=step.engine_wait_s)
                self._in_flight = step.outputs
                if await self._write_step(step.started_at, step.outputs):
                    self.health.working(WRITER)
                self._in_flight = []
            finally:
                if step.holds_slot:
                    self._step_slots.release()

    async def _write_step(self, step_start: float, outputs: list[RequestOutput]) -> bool:
        """Log one step's outputs, tell the owners of finished streams; whether
        the log took writes of the step (a step with none says nothing of it)."""
        outputs = [self._continued(out) for out in outputs]
        writes = [w for w in map(self._to_write, outputs) if w is not None]
        if not writes:
            return False
        if self.cluster is not None:  # only streams whose lease is still ours
            writes = await self.cluster.fence(writes)
        written = True
        try:
            await self._write(writes)
        except Exception as exc:  # a bug, or one broken stream: it must not stop the others
            logger.error(
                "token log write of %d streams failed (a bug in bargein): %r; "
                "failing the streams whose own write fails",
                len(writes),
                exc,
                exc_info=exc,
            )
            self.health.crashed(WRITER, exc)
            await self._write_one_by_one(writes)
            written = False
        self._notify_finished(outputs, step_start)
        return written

    async def _write(self, writes: list[StreamWrite]) -> None:
        """One ``write_step``; streams the log refuses as expected are stopped.

        Raises what else the log raises (a bug, or a stream the log no longer
        takes: expired, already ended, a bad offset).
        """
        started = time.perf_counter()
        try:
            await self.log.write_step(writes)
        except StreamFenced as exc:  # another node continues them: stop, free the KV
            for stream_id in exc.stream_ids:
                self.cluster.lost(stream_id)
            return
        except TokenLogUnavailable as exc:
            logger.error("token log write failed for %s", exc.stream_ids)
            for stream_id in exc.stream_ids:
                self.runner.abort(stream_id, FinishReason.ERROR)
            return
        self.observer.log_written(time.perf_counter() - started, len(writes))

    async def _write_one_by_one(self, writes: list[StreamWrite]) -> None:
        """After a step write failed: write each stream alone and fail those
        whose own write fails (their readers get an error end)."""
        if len(writes) == 1:  # nothing to tell apart: it is this stream's write
            await self.fail_streams([writes[0].stream_id])
            return
        failed = []
        for write in writes:
            try:
                await self._write([write])
            except Exception:
                logger.exception("stream %s: its log write failed: ending it with an error", write.stream_id)
                failed.append(write.stream_id)
        await self.fail_streams(failed)

    async def _writer_crashed(self, exc: Exception) -> None:
        """The writer crashed (a bug) in the middle of a step: that step's
        tokens were not all logged, so its streams end here, with an error."""
        outputs, self._in_flight = self._in_flight, []
        await self.fail_streams(list(dict.fromkeys(out.request_id for out in outputs)))

    async def fail_streams(self, stream_ids: Sequence[str]) -> None:
        """End streams generated here that cannot go on (a bug broke their log):
        the engine frees their KV blocks, admission gets their slots back,
        their owners are told, and their readers get an error end (or, when
        even that cannot be written, a retryable read error)."""
        failed = [(sid, live) for sid in stream_ids if (live := self._live.pop(sid, None)) is not None]
        for sid, live in failed:
            self._forget(sid, live)
        for sid, live in failed:
            await self._end_with_error(sid, live)

    def _forget(self, stream_id: str, live: _LiveStream) -> None:
        """A failed stream's bookkeeping, as if it had finished with ``error``."""
        for timer in (live.abandoned, live.deadline):
            if timer is not None:
                timer.cancel()
        self.runner.abort(stream_id, FinishReason.ERROR)  # its later outputs are ignored
        if self.cluster is not None:
            self.cluster.ended(stream_id)
        if live.started:
            self.admission.ended(live.principal)
        else:  # still counted as waiting: its first token never came
            self.admission.cancelled(live.principal)
            self.admission.release_load(live.queued_tokens)
        text = "".join(live.texts)
        self.observer.finished(
            stream_id=stream_id,
            finish_reason=FinishReason.ERROR.value,
            num_output_tokens=live.logged_end,
            text=text,
            interrupt_to_free_s=None,
        )
        if live.on_finish is not None:
            try:
                live.on_finish(
                    GenerationFinished(stream_id=stream_id, text=text, finish_reason=FinishReason.ERROR)
                )
            except Exception:  # one broken session must not stop the others
                logger.exception("finish callback of %s failed", stream_id)

    async def _end_with_error(self, stream_id: str, live: _LiveStream) -> None:
        """Write an error end at what the log holds of the stream; if the log
        refuses that too, stop its readers here (``abandon_stream``)."""
        try:
            info = await self.log.info(stream_id)
            if info is None or info.finish is not None:
                return  # gone (its readers were told) or ended already
            end = StreamEnd(
                end=info.end,
                finish_reason=FinishReason.ERROR.value,
                prompt_tokens=live.num_prompt_tokens,
                completion_tokens=info.end,
                cached_tokens=0,
                error=EndError(
                    code=pe.ErrorCode.INTERNAL_ERROR.value,
                    message=FAILED_MESSAGE,
                    retry_after_ms=RETRY_AFTER_FAILURE_MS,
                ),
            )
            await self.log.write_step([StreamWrite(stream_id=stream_id, entry=None, finish=end)])
        except Exception:
            logger.exception(
                "stream %s: its error end could not be logged either; stopping its readers", stream_id
            )
            abandon = getattr(self.log, "abandon_stream", None)
            if abandon is not None:
                abandon(stream_id)

    def _continued(self, out: RequestOutput) -> RequestOutput:
        """A taken-over stream's output as the stream sees it (offsets, text)."""
        live = self._live.get(out.request_id)
        if live is None or live.continuation is None:
            return out
        return live.continuation.translate(out)

    def _to_write(self, out: RequestOutput) -> StreamWrite | None:
        live = self._live.get(out.request_id)
        if live is None:
            return None  # not a stream of this service
        if not live.started and (out.new_token_ids or out.finished):
            live.started = True
            if live.deadline is not None:
                live.deadline.cancel()
                live.deadline = None
            if out.new_token_ids:
                live.expired = None  # scheduled before its deadline: the drop did not apply
            now = self.clock()
            self.admission.started(now, admitted_at=live.admitted_at, served=live.expired is None)
            self.admission.release_load(live.queued_tokens)
            if live.predicted_ttft_s is not None and out.new_token_ids:
                self.observer.ttft_predicted(
                    predicted_s=live.predicted_ttft_s, measured_s=now - live.admitted_at
                )
        cut = live.abort_requested_at is not None
        entry = None
        if out.new_token_ids and not cut:
            # Text that arrives with no token (held back, then flushed by an
            # abort) has no offset to live at; it is dropped from the stream
            # and from the turn alike, so both stay the same text.
            entry = LogEntry(
                start=out.num_output_tokens - len(out.new_token_ids),
                end=out.num_output_tokens,
                text=out.text,
                token_ids=tuple(out.new_token_ids),
            )
            live.texts.append(out.text)
            live.ends.append(entry.end)
            live.logged_end = entry.end
        finish = None
        if out.finished:
            finish = self._stream_end(live, out, cut_tokens=cut and bool(out.new_token_ids))
        if entry is None and finish is None:
            return None
        return StreamWrite(stream_id=out.request_id, entry=entry, finish=finish)

    def _stream_end(self, live: _LiveStream, out: RequestOutput, *, cut_tokens: bool) -> StreamEnd:
        """The log's end of a finished stream: its ``end`` is what was logged.

        Once a cancel is accepted nothing more is logged (the token of the
        step in flight when it arrived was sampled after the user spoke), so
        ``end`` may be below the engine's count; a finish whose last tokens
        were cut that way is the cancel's (``interrupted``), whatever the
        engine would have called it. ``completion_tokens`` counts the
        stream's tokens, so usage, ``response.done`` and a replay agree.
        """
        reason = out.finish_reason
        assert reason is not None
        if cut_tokens and live.abort_reason is not None:
            reason = live.abort_reason
        return StreamEnd(
            end=live.logged_end,
            finish_reason=reason.value,
            prompt_tokens=out.num_prompt_tokens,
            completion_tokens=live.logged_end,
            cached_tokens=out.num_cached_tokens,
            error=self._dropped(live, out),
        )

    @staticmethod
    def _dropped(live: _LiveStream, out: RequestOutput) -> EndError | None:
        """The error of a stream the engine dropped at its queue deadline; None
        for any other end (it was scheduled and got tokens, or a cancel or
        an engine error ended it)."""
        if live.abort_requested_at is None and out.finish_reason is FinishReason.CANCELLED:
            return live.expired
        return None

    def _notify_finished(self, outputs: Sequence[RequestOutput], freed_at: float) -> None:
        for out in outputs:
            if not out.finished or out.request_id not in self._live:
                continue
            live = self._live.pop(out.request_id)
            if live.abandoned is not None:
                live.abandoned.cancel()
            if live.deadline is not None:
                live.deadline.cancel()
            if self.cluster is not None:
                self.cluster.ended(out.request_id)
            self.admission.ended(live.principal)
            latency = None
            assert out.finish_reason is not None
            if live.abort_requested_at is not None and out.finish_reason in (
                FinishReason.INTERRUPTED,
                FinishReason.CANCELLED,
            ):
                latency = freed_at - live.abort_requested_at
                self.num_interrupts += 1
                self.interrupt_latencies_s.append(latency)
            text = "".join(live.texts)
            self.observer.finished(
                stream_id=out.request_id,
                finish_reason=out.finish_reason.value,
                num_output_tokens=out.num_output_tokens,
                text=text,
                interrupt_to_free_s=latency,
            )
            dropped = self._dropped(live, out) is not None
            if dropped:
                logger.info("stream %s still queued at its deadline: dropped", out.request_id)
                self.observer.rejected(pe.ErrorCode.OVERLOADED.value, response_id=live.response_id)
            if live.on_finish is not None:
                event = GenerationFinished(
                    stream_id=out.request_id, text=text, finish_reason=out.finish_reason, expired=dropped
                )
                try:
                    live.on_finish(event)
                except Exception:  # one broken session must not stop every stream
                    logger.exception("finish callback of %s failed", out.request_id)
