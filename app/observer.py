"""The app's :class:`~bargein.session.runtime.observer.SessionObserver`: metrics and request log lines.

Each line about a request carries its ``request_id`` (the response id),
``session_id`` and ``stream_id`` (bound with :func:`bargein.app.logging.bind`).
Conversation text goes into a line only with ``--log-prompts``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bargein.app.logging import bind
from bargein.app.metrics import Metrics

if TYPE_CHECKING:
    from bargein.session.conversation.state import Message

logger = logging.getLogger("bargein.request")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Ids:
    request_id: str
    session_id: str


class Observer:
    """Turns session events into metric updates and structured log lines.

    Args:
        metrics: the app's metrics.
        log_prompts: put prompts and generated text in the log lines (debugging only).
    """

    def __init__(self, metrics: Metrics, *, log_prompts: bool = False) -> None:
        self.metrics = metrics
        self.log_prompts = log_prompts
        self._streams: dict[str, _Ids] = {}  # live streams submitted here

    # ---- session hooks (SessionObserver) ---------------------------------------

    def submitted(
        self,
        *,
        response_id: str,
        stream_id: str,
        session_id: str,
        num_prompt_tokens: int,
        max_tokens: int,
        messages: Sequence[Message],
    ) -> None:
        self._streams[stream_id] = _Ids(request_id=response_id, session_id=session_id)
        extra: dict[str, object] = {"prompt_tokens": num_prompt_tokens, "max_tokens": max_tokens}
        if self.log_prompts:
            extra["messages"] = [{"role": m.role, "content": m.content} for m in messages]
        with bind(request_id=response_id, session_id=session_id, stream_id=stream_id):
            logger.info("response submitted", extra=extra)

    def transcribed(self, *, seconds: float, audio_s: float) -> None:
        self.metrics.transcription.observe(seconds)

    def synthesized(self, *, audio_s: float, compute_s: float) -> None:
        if audio_s > 0:
            self.metrics.synthesis_rtf.observe(compute_s / audio_s)

    def voice_to_voice(self, seconds: float) -> None:
        self.metrics.voice_to_voice.observe(seconds)

    def barge_in(self, seconds: float) -> None:
        self.metrics.barge_in.observe(seconds)

    def barge_in_judged(self, *, real: bool) -> None:
        self.metrics.voice_barge_ins.labels(outcome="real" if real else "false").inc()

    def interruption_decided(self, *, real: bool, reason: str, seconds: float) -> None:
        self.metrics.voice_interruptions.labels(decision="cut" if real else "resumed", reason=reason).inc()
        self.metrics.interruption_decision.observe(seconds)

    def speculation(self, *, adopted: bool) -> None:
        self.metrics.voice_speculations.labels(outcome="adopted" if adopted else "dropped").inc()

    def rejected(self, reason: str, *, response_id: str | None) -> None:
        self.metrics.admission_rejections.labels(reason=reason).inc()
        with bind(request_id=response_id):
            logger.info("response rejected", extra={"reason": reason})

    def ttft_predicted(self, *, predicted_s: float, measured_s: float) -> None:
        # A floor of 10 ms: a prediction of about nothing (an idle engine) makes no ratio.
        self.metrics.admission_ttft_error.observe(measured_s / max(predicted_s, 0.01))

    def finished(
        self,
        *,
        stream_id: str,
        finish_reason: str,
        num_output_tokens: int,
        text: str,
        interrupt_to_free_s: float | None,
    ) -> None:
        if interrupt_to_free_s is not None:
            self.metrics.interrupt_to_free.observe(interrupt_to_free_s)
        ids = self._streams.pop(stream_id, None)
        extra: dict[str, object] = {"finish_reason": finish_reason, "completion_tokens": num_output_tokens}
        if interrupt_to_free_s is not None:
            extra["interrupt_to_free_s"] = round(interrupt_to_free_s, 6)
        if self.log_prompts:
            extra["text"] = text
        with bind(
            stream_id=stream_id,
            request_id=ids.request_id if ids else None,
            session_id=ids.session_id if ids else None,
        ):
            logger.info("response finished", extra=extra)

    def log_written(self, seconds: float, num_streams: int) -> None:
        self.metrics.log_write.observe(seconds)

    def log_backlog(self, *, num_steps: int, engine_wait_s: float) -> None:
        self.metrics.log_pending_steps.set(num_steps)
        if engine_wait_s:
            self.metrics.engine_log_wait.inc(engine_wait_s)

    def resumed(self, *, stream_id: str, from_offset: int, num_replayed: int) -> None:
        self.metrics.resumes.inc()
        if num_replayed:
            self.metrics.replayed_tokens.inc(num_replayed)
        with bind(stream_id=stream_id):
            logger.info("stream resumed", extra={"from": from_offset, "replayed_tokens": num_replayed})

    def delivery_started(self) -> None:
        self.metrics.streams_delivering.inc()

    def delivery_ended(self) -> None:
        self.metrics.streams_delivering.dec()

    def delta_sent(self, num_tokens: int) -> None:
        self.metrics.delivery_lag.observe(num_tokens)

    # ---- connection hooks (app/server.py) -----------------------------------------

    def connected(self) -> None:
        """A realtime connection was accepted."""
        self.metrics.sessions_connected.inc()

    def disconnected(self, *, active_response: bool) -> None:
        """The client closed or dropped its connection."""
        self.metrics.disconnects.labels(active_response=str(active_response).lower()).inc()
        logger.info("client disconnected", extra={"active_response": active_response})

    def protocol_error(self, code: str) -> None:
        """A frame broke the protocol (``invalid_message``, ``unknown_type``,
        ``invalid_parameter`` found by the decoder) and got an ``error``."""
        self.metrics.protocol_errors.labels(code=code).inc()

    def http_error(self, status: int, code: str | None) -> None:
        """An HTTP API request got an error answer (``ApiError``)."""
        self.metrics.http_errors.labels(status=str(status), code=code or "none").inc()

    def auth_refused(self, reason: str) -> None:
        """A request or upgrade was refused (401/403): missing or invalid key, Origin."""
        self.metrics.auth_refusals.labels(reason=reason).inc()

    def closed(self) -> None:
        """A realtime connection ended (whoever closed it)."""
        self.metrics.sessions_connected.dec()
