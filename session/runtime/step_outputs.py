"""What an engine step's outputs mean for the streams: their log writes and their ends.

Pure bookkeeping on the event loop, no I/O: the log writer
(:mod:`bargein.session.runtime.log_writer`) asks :class:`StepOutputs` which
:class:`~bargein.session.streams.log.StreamWrite` each output becomes, writes
them, then hands the step back so that the streams that ended are settled:
their owner is told (``GenerationFinished``: the conversation keeps the text
as the assistant turn), admission gets the slot back, the peers release the
lease, the observer counts the end, and an interrupt's latency is recorded.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence

from bargein.engine.request import FinishReason, RequestOutput
from bargein.protocol import events as pe
from bargein.session.conversation.state import GenerationFinished
from bargein.session.runtime.admission import Admission
from bargein.session.runtime.live import LiveStream, LiveStreams
from bargein.session.runtime.observer import SessionObserver
from bargein.session.streams.log import EndError, LogEntry, StreamEnd, StreamWrite
from bargein.session.streams.peers import Peers

logger = logging.getLogger(__name__)


class StepOutputs:
    """Engine outputs -> stream writes, and the ends of streams (see the module doc).

    Args:
        streams: this node's live streams (outputs of other requests are ignored).
        admission: told when a stream leaves the queue and when it ends.
        peers: told when a stream's generation ended.
        observer: metrics and the request log.
        clock: monotonic seconds (the service's clock).

    Attributes:
        num_interrupts: streams ended by a cancel whose blocks were freed.
        interrupt_latencies_s: frame received -> the engine step that freed
            the blocks began, per interrupt (newest last).
    """

    def __init__(
        self,
        streams: LiveStreams,
        admission: Admission,
        peers: Peers,
        observer: SessionObserver,
        clock: Callable[[], float],
    ) -> None:
        self._streams = streams
        self._admission = admission
        self._peers = peers
        self._observer = observer
        self._clock = clock
        self.num_interrupts = 0
        self.interrupt_latencies_s: deque[float] = deque(maxlen=4096)

    def continued(self, out: RequestOutput) -> RequestOutput:
        """A taken-over stream's output as the stream sees it (offsets, text)."""
        live = self._streams.get(out.request_id)
        return out if live is None else live.continuation.translate(out)

    def to_write(self, out: RequestOutput) -> StreamWrite | None:
        """What ``out`` writes to its stream's log; None: nothing (not a
        stream of this node, or nothing to log once a cancel was accepted)."""
        live = self._streams.get(out.request_id)
        if live is None:
            return None  # not a stream of this service
        if not live.started and (out.new_token_ids or out.finished):
            self._left_queue(live, out)
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
            finish = _stream_end(live, out, cut_tokens=cut and bool(out.new_token_ids))
        if entry is None and finish is None:
            return None
        return StreamWrite(stream_id=out.request_id, entry=entry, finish=finish)

    def _left_queue(self, live: LiveStream, out: RequestOutput) -> None:
        """Its first token (or its end) came: it is no longer queued."""
        live.started = True
        if live.deadline is not None:
            live.deadline.cancel()
            live.deadline = None
        if out.new_token_ids:
            live.expired = None  # scheduled before its deadline: the drop did not apply
        now = self._clock()
        self._admission.started(now, admitted_at=live.admitted_at, served=live.expired is None)
        self._admission.release_load(live.queued_tokens)
        if live.predicted_ttft_s is not None and out.new_token_ids:
            self._observer.ttft_predicted(
                predicted_s=live.predicted_ttft_s, measured_s=now - live.admitted_at
            )

    def finished(self, outputs: Sequence[RequestOutput], freed_at: float) -> None:
        """Settle the streams that ended in a step whose writes were made;
        ``freed_at``: when that step began (the blocks of its cancelled
        requests were freed then)."""
        for out in outputs:
            if not out.finished or out.request_id not in self._streams:
                continue
            live = self._streams.pop(out.request_id)
            assert live is not None and out.finish_reason is not None
            live.cancel_timers()
            self._peers.ended(out.request_id)
            self._admission.ended(live.principal)
            latency = None
            if live.abort_requested_at is not None and out.finish_reason in (
                FinishReason.INTERRUPTED,
                FinishReason.CANCELLED,
            ):
                latency = freed_at - live.abort_requested_at
                self.num_interrupts += 1
                self.interrupt_latencies_s.append(latency)
            text = "".join(live.texts)
            self._observer.finished(
                stream_id=out.request_id,
                finish_reason=out.finish_reason.value,
                num_output_tokens=out.num_output_tokens,
                text=text,
                interrupt_to_free_s=latency,
            )
            dropped = _dropped(live, out) is not None
            if dropped:
                logger.info("stream %s still queued at its deadline: dropped", out.request_id)
                self._observer.rejected(pe.ErrorCode.OVERLOADED.value, response_id=live.response_id)
            live.tell_owner(
                GenerationFinished(
                    stream_id=out.request_id, text=text, finish_reason=out.finish_reason, expired=dropped
                )
            )

    def failed(self, stream_id: str, live: LiveStream) -> None:
        """Settle a stream that failed (already popped from the live streams)
        as if it had finished with ``error``; the caller aborts its request
        and writes its error end."""
        live.cancel_timers()
        self._peers.ended(stream_id)
        if live.started:
            self._admission.ended(live.principal)
        else:  # still counted as waiting: its first token never came
            self._admission.cancelled(live.principal)
            self._admission.release_load(live.queued_tokens)
        text = "".join(live.texts)
        self._observer.finished(
            stream_id=stream_id,
            finish_reason=FinishReason.ERROR.value,
            num_output_tokens=live.logged_end,
            text=text,
            interrupt_to_free_s=None,
        )
        live.tell_owner(GenerationFinished(stream_id=stream_id, text=text, finish_reason=FinishReason.ERROR))


def _stream_end(live: LiveStream, out: RequestOutput, *, cut_tokens: bool) -> StreamEnd:
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
        error=_dropped(live, out),
    )


def _dropped(live: LiveStream, out: RequestOutput) -> EndError | None:
    """The error of a stream the engine dropped at its queue deadline; None
    for any other end (it was scheduled and got tokens, or a cancel or
    an engine error ended it)."""
    if live.abort_requested_at is None and out.finish_reason is FinishReason.CANCELLED:
        return live.expired
    return None
