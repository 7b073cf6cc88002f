"""The node's service: one per process, between its connections, the engine and the token log.

:class:`Service` is the face the connections (session/runtime/connection.py)
and the HTTP routes (app/openai/) use, and the
:class:`~bargein.session.streams.peers.LocalNode` a cluster calls back. It
wires the node's parts together, each in its own module:

- :mod:`~bargein.session.runtime.submit`: a session's ``Submit`` through
  admission, the chat template and the log's new stream into the engine;
- :mod:`~bargein.session.runtime.live`: the streams the engine generates here,
  their cancels, readers, abandon grace and queue deadline;
- :mod:`~bargein.session.runtime.step_queue`: each engine step from the
  engine thread to the event loop, bounded (backpressure on the engine);
- :mod:`~bargein.session.runtime.log_writer` and
  :mod:`~bargein.session.runtime.step_outputs`: each step into the token log
  in one write, then the ends told to the streams' owners;
- the peers (:class:`~bargein.session.streams.peers.Peers`): the other nodes
  sharing the log, or :class:`~bargein.session.streams.peers.NoPeers` alone,
  chosen by whoever builds the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable

from bargein.engine.request import EngineRequest, FinishReason
from bargein.session.conversation.config import SessionConfig
from bargein.session.conversation.state import Submit, SubmitFailed, Submitted
from bargein.session.errors import TokenLogError
from bargein.session.runtime.admission import Admission, AdmissionConfig
from bargein.session.runtime.delivery import Batch, feed
from bargein.session.runtime.engine_handle import EngineHandle
from bargein.session.runtime.live import LiveStream, LiveStreams
from bargein.session.runtime.log_writer import LogWriter
from bargein.session.runtime.observer import NullObserver, SessionObserver
from bargein.session.runtime.saved import SessionHolder
from bargein.session.runtime.step_outputs import StepOutputs
from bargein.session.runtime.step_queue import StepQueue
from bargein.session.runtime.submit import Owner, Submitter
from bargein.session.streams.log import StreamEnd, StreamInfo, TokenLog
from bargein.session.streams.log.read_probe import read_error_soon
from bargein.session.streams.peers import NoPeers, Peers, StreamContinuation
from bargein.session.supervise import TaskHealth

__all__ = ["Owner", "Service"]  # Owner: the submitter of Service.submit


class Service:
    """Runs the realtime sessions of one process on one engine runner.

    Args:
        runner: the engine: a started :class:`bargein.engine.loop.EngineLoop`
            (:class:`~bargein.session.runtime.engine_handle.EngineHandle`).
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
        peers: the other nodes sharing the Redis log
            (:class:`bargein.session.streams.cluster.Cluster`: leases, forwarded
            cancels, takeover); default :class:`NoPeers`, a node alone.
    """

    def __init__(
        self,
        runner: EngineHandle,
        log: TokenLog,
        config: SessionConfig,
        *,
        secret: bytes,
        node_id: str = "node-0",
        clock: Callable[[], float] = time.monotonic,
        debug: bool = False,
        observer: SessionObserver | None = None,
        admission: Admission | None = None,
        peers: Peers | None = None,
    ) -> None:
        self.runner = runner
        self.peers: Peers = peers if peers is not None else NoPeers()
        self.admission = admission or Admission(AdmissionConfig(max_waiting=0, max_queue_time_s=0))
        self.observer: SessionObserver = observer or NullObserver()
        self.log = log
        self.config = config
        self.secret = secret
        self.node_id = node_id
        self.clock = clock
        self.recent_requests: deque[EngineRequest] = deque(maxlen=256 if debug else 0)
        # session id -> the connection on this node that holds it (the last to attach)
        self.sessions: dict[str, SessionHolder] = {}
        # Supervised tasks failing now (the writer here; the peers have their own): /readyz lists them.
        self.health = TaskHealth()
        self._streams = LiveStreams(
            runner, self.peers, self.admission, abandon_grace_s=config.abandon_grace_s, clock=clock
        )
        self._outputs = StepOutputs(self._streams, self.admission, self.peers, self.observer, clock)
        self._steps = StepQueue(runner, config.max_pending_log_steps)
        self._writer = LogWriter(
            self._steps, self._outputs, self._streams, log, self.peers, runner, self.observer, self.health
        )
        self._submitter = Submitter(
            runner,
            log,
            self.peers,
            self._streams,
            self.admission,
            self.observer,
            secret=secret,
            node_id=node_id,
            clock=clock,
            cache_salt=self.cache_salt,
            recent_requests=self.recent_requests,
        )

    def cache_salt(self, principal: str) -> str | None:
        """The prefix-cache salt of a principal's requests: the principal
        itself, unless the cache is shared (``config.shared_prefix_cache``)."""
        return None if self.config.shared_prefix_cache else principal

    @property
    def max_model_len(self) -> int:
        """Prompt plus output tokens of one sequence."""
        return self.runner.max_model_len

    @property
    def num_interrupts(self) -> int:
        """Streams ended by a cancel whose blocks were freed."""
        return self._outputs.num_interrupts

    @property
    def interrupt_latencies_s(self) -> deque[float]:
        """Frame received -> the engine step that freed the blocks began, per
        interrupt (newest last; ``/debug/engine``)."""
        return self._outputs.interrupt_latencies_s

    # ---- life cycle --------------------------------------------------------------

    async def start(self) -> None:
        """Attach to the runner, measure its tokenizer (the prompt text bound, see
        session/conversation/chat.py), start the log writer (on the event loop)
        and the peers.

        Raises what the peers' ``start`` raises (``NodeIdInUse``).
        """
        loop = asyncio.get_running_loop()
        self._steps.attach(loop)
        self._streams.attach(loop)
        await self._submitter.start()
        self._writer.start()
        self.runner.add_step_listener(self._steps.put)
        await self.peers.start(self)

    async def hand_over(self) -> None:
        """Before a graceful shutdown (before the engine stops): stop writing
        this node's streams so that the nodes their clients reconnect to
        continue them at once (a node alone has nobody to hand them to)."""
        await self.peers.hand_over()

    async def stop(self) -> None:
        """Stop the log writer (after the runner was shut down, or, for a
        runner shared with another service, detach from it)."""
        self.runner.remove_step_listener(self._steps.put)
        await self.peers.stop()
        self._steps.stop()  # nobody will make room any more
        await self._writer.stop()

    def failing_tasks(self) -> list[str]:
        """The supervised tasks of this node that crash now (the step writer,
        the cluster's tick and abort listener), as ``/readyz`` lists them."""
        return self.health.not_ready() + self.peers.health.not_ready()

    # ---- generating ----------------------------------------------------------------

    def saturated(self) -> bool:
        """The waiting queue is full (a new connection gets close 1013)."""
        return self.admission.saturated()

    async def submit(self, action: Submit, owner: Owner, now: float) -> Submitted | SubmitFailed:
        """Admit, render the prompt, create the stream, submit the request
        (:mod:`bargein.session.runtime.submit`).

        Admission answers first, before any KV block is allocated. From
        ``runner.submit`` to the return there is no ``await``: the caller
        hands ``Submitted`` to its session before any engine output of this
        request can reach the loop.
        """
        return await self._submitter.submit(action, owner, now)

    def abort(
        self, stream_id: str, reason: FinishReason, requested_at: float, *, kept_chars: int | None = None
    ) -> None:
        """Abort a stream's request (no-op once it finished); one generated on
        another node is forwarded there.

        ``kept_chars``: the characters of its text the conversation keeps (a
        barge-in's heard text): only the KV of the prompt and of the logged
        tokens whose text lies wholly within them stays in the prefix cache
        (:func:`~bargein.session.runtime.live.kept_output_tokens`); None keeps
        the KV of every logged token.
        """
        self._streams.abort(stream_id, reason, requested_at, kept_chars=kept_chars)

    def is_generating(self, stream_id: str) -> bool:
        """Whether this node's engine is generating ``stream_id`` now."""
        return stream_id in self._streams

    async def follow(self, stream_id: str) -> None:
        """A client here reads a live stream: continue it here if the node
        generating it died (see session/streams/cluster/)."""
        await self.peers.follow(stream_id)

    def continue_stream(
        self, request: EngineRequest, *, response_id: str, continuation: StreamContinuation
    ) -> None:
        """Submit a takeover's request; its outputs go to the stream
        ``request.request_id`` through ``continuation.translate``.

        Raises what ``runner.submit`` raises (PromptTooLongError, EngineStoppedError).
        """
        self.runner.submit(request)
        live = LiveStream(
            response_id=response_id,
            on_finish=None,
            started=True,
            continuation=continuation,
            logged_end=continuation.offset,
            num_prompt_tokens=len(request.prompt_token_ids),
        )
        self._streams.add(request.request_id, live)
        self.recent_requests.append(request)

    def release(self, stream_id: str) -> None:
        """Its connection is gone: generation goes on, nobody is told of the end;
        if nobody reads it within ``config.abandon_grace_s``, it is aborted."""
        self._streams.release(stream_id)

    # ---- reading streams (the face the HTTP layer reads through) -----------------

    @property
    def model_name(self) -> str:
        """The served model's name (``model`` of the OpenAI answers)."""
        return self.runner.model_name

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
        self._streams.reader_started(stream_id)

    def reader_ended(self, stream_id: str) -> None:
        """A delivery of ``stream_id`` here ended (sent its end, or its socket closed)."""
        self._streams.reader_ended(stream_id)
