"""The streams this node's engine is generating, and who reads them.

One :class:`LiveStream` per engine request of this node, from its submit
(or a takeover's continuation) to its end. :class:`LiveStreams` keeps them and
applies what concerns a stream while it is generated, before the log has its
end:

- a cancel (``abort``): from then on nothing more of the stream is logged;
  the engine keeps the KV of the prompt and of the tokens the conversation
  keeps in its prefix cache (:func:`kept_output_tokens`);
- the abandon grace: a stream whose connection is gone (``release``) and that
  nobody reads, here or on another node, for ``abandon_grace_s`` is cancelled;
- the queue deadline: a request still unscheduled ``max_queue_time_s`` after
  its admission is dropped with ``overloaded`` (``start_deadline``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bargein.engine.request import FinishReason, RequestOutput
from bargein.protocol import events as pe
from bargein.session.conversation.state import GenerationFinished
from bargein.session.runtime.admission import Admission
from bargein.session.runtime.engine_handle import EngineHandle
from bargein.session.streams.log import EndError
from bargein.session.streams.peers import Peers, StreamContinuation

logger = logging.getLogger(__name__)

OnFinish = Callable[[GenerationFinished], None]


class _FromTheStart:
    """The :class:`~bargein.session.streams.peers.StreamContinuation` of a
    stream generated here from its first token: its outputs are its own."""

    offset = 0

    def translate(self, out: RequestOutput) -> RequestOutput:
        """``out`` itself."""
        return out


FROM_THE_START: StreamContinuation = _FromTheStart()


@dataclass(slots=True, kw_only=True)
class LiveStream:
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
    # How its request's outputs map onto the stream: shifted for one taken over from a dead node.
    continuation: StreamContinuation = FROM_THE_START

    def cancel_timers(self) -> None:
        """Its generation ended: neither the abandon grace nor the deadline applies."""
        for timer in (self.abandoned, self.deadline):
            if timer is not None:
                timer.cancel()

    def tell_owner(self, event: GenerationFinished) -> None:
        """Tell the connection that created the stream (if still there) that it ended."""
        if self.on_finish is None:
            return
        try:
            self.on_finish(event)
        except Exception:  # one broken session must not stop the other streams
            logger.exception("finish callback of %s failed", event.stream_id)


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


class LiveStreams:
    """The live streams of one node (see the module doc).

    Args:
        runner: the engine runner (``abort``).
        peers: the other nodes (a cancel for a stream generated elsewhere, readers there).
        admission: its queue deadline (``config.max_queue_time_s``, read when
            a deadline starts) and the retry hint of a dropped request.
        abandon_grace_s: how long a released stream nobody reads goes on (0: for ever).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        runner: EngineHandle,
        peers: Peers,
        admission: Admission,
        *,
        abandon_grace_s: float,
        clock: Callable[[], float],
    ) -> None:
        self._runner = runner
        self._peers = peers
        self._admission = admission
        self._abandon_grace_s = abandon_grace_s
        self._clock = clock
        self._live: dict[str, LiveStream] = {}
        self._readers: dict[str, int] = {}  # stream id -> deliveries of it on this node
        self._loop: asyncio.AbstractEventLoop | None = None  # no timers before attach

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the grace and deadline timers on ``loop`` (the service started)."""
        self._loop = loop

    def get(self, stream_id: str) -> LiveStream | None:
        """The live stream ``stream_id``; None when this node does not generate it."""
        return self._live.get(stream_id)

    def add(self, stream_id: str, live: LiveStream) -> None:
        """Its request was submitted to the engine."""
        self._live[stream_id] = live

    def pop(self, stream_id: str) -> LiveStream | None:
        """Forget a stream whose generation ended; None when it was not live."""
        return self._live.pop(stream_id, None)

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._live

    def abort(
        self, stream_id: str, reason: FinishReason, requested_at: float, *, kept_chars: int | None = None
    ) -> None:
        """Cancel a stream's request (see :meth:`bargein.session.runtime.service.Service.abort`);
        one generated on another node is forwarded there."""
        live = self._live.get(stream_id)
        if live is None:
            self._peers.abort_elsewhere(stream_id, reason)
            return
        if live.abort_requested_at is None:
            live.abort_requested_at, live.abort_reason = requested_at, reason
        kept = kept_output_tokens(live.texts, live.ends, kept_chars)
        offset = live.continuation.offset  # the request's output starts there in the stream
        self._runner.abort(stream_id, reason, keep_tokens=live.num_prompt_tokens + max(0, kept - offset))

    def start_deadline(self, stream_id: str, live: LiveStream) -> None:
        """Drop ``stream_id`` if the engine has not scheduled it within the
        admission's ``max_queue_time_s`` (none when 0)."""
        queue_time_s = self._admission.config.max_queue_time_s
        if queue_time_s and self._loop is not None:
            live.deadline = self._loop.call_later(queue_time_s, self._expire, stream_id)

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
        queue_time_s = self._admission.config.max_queue_time_s
        live.expired = EndError(
            code=pe.ErrorCode.OVERLOADED.value,
            message=f"the server is overloaded: still queued after {queue_time_s:g} s; retry later",
            retry_after_ms=self._admission.drain_retry_ms(self._clock()),
        )
        self._runner.abort(stream_id, FinishReason.CANCELLED, only_if_waiting=True)

    # ---- readers and the abandon grace ---------------------------------------------

    def release(self, stream_id: str) -> None:
        """Its connection is gone: generation goes on, nobody is told of the end;
        if nobody reads it within the abandon grace, it is aborted."""
        live = self._live.get(stream_id)
        if live is not None:
            live.on_finish = None
            live.released = True
            if not self._readers.get(stream_id):
                self._watch_abandoned(stream_id, live)

    def reader_started(self, stream_id: str) -> None:
        """A connection here started delivering ``stream_id``."""
        self._readers[stream_id] = self._readers.get(stream_id, 0) + 1
        self._peers.reader_started(stream_id)  # the node generating it learns it is read
        live = self._live.get(stream_id)
        if live is not None and live.abandoned is not None:
            live.abandoned.cancel()
            live.abandoned = None

    def reader_ended(self, stream_id: str) -> None:
        """A delivery of ``stream_id`` here ended (sent its end, or its socket closed)."""
        self._peers.reader_ended(stream_id)
        num_readers = self._readers.pop(stream_id, 1) - 1
        if num_readers > 0:
            self._readers[stream_id] = num_readers
            return
        live = self._live.get(stream_id)
        if live is not None and live.released:
            self._watch_abandoned(stream_id, live)

    def _watch_abandoned(self, stream_id: str, live: LiveStream) -> None:
        grace_s = self._abandon_grace_s
        if grace_s <= 0 or self._loop is None or live.abandoned is not None:
            return
        live.abandoned = self._loop.call_later(grace_s, self._abort_abandoned, stream_id)

    def _abort_abandoned(self, stream_id: str) -> None:
        """Grace time is over and nobody reads the stream: free its blocks."""
        live = self._live.get(stream_id)
        if live is None or self._readers.get(stream_id):
            return
        live.abandoned = None
        if self._peers.read_elsewhere(stream_id):
            self._watch_abandoned(stream_id, live)  # a client reads it on another node
            return
        logger.info("stream %s abandoned for %.1f s: cancelled", stream_id, self._abandon_grace_s)
        self._runner.abort(stream_id, FinishReason.CANCELLED)
