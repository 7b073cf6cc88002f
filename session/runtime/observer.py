"""What the session layer reports to whoever watches it (metrics, request logs).

``session`` never imports ``app``: the service, connections and deliveries
call a :class:`SessionObserver` they are given, and the app passes one that
feeds Prometheus and the structured request log (``app/observer.py``).
Every method must be quick and must not raise: it runs on the event loop in
the middle of serving a client.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from bargein.session.conversation.state import Message


class SessionObserver(Protocol):
    """Hooks called by :class:`~bargein.session.runtime.service.Service`, ``Connection`` and ``Delivery``.

    Ids: ``response_id`` is the id the client knows (its own or the one the
    server made), ``stream_id`` the engine request and token log stream,
    ``session_id`` the conversation (or, for HTTP, what the HTTP API uses).
    """

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
        """A request went to the engine."""

    def rejected(self, reason: str, *, response_id: str | None) -> None:
        """A request was refused before it reached the engine; ``reason`` is
        the error code sent (``invalid_parameter``, ``prompt_too_long``,
        ``conflict``, ...) or ``engine_stopped``."""

    def ttft_predicted(self, *, predicted_s: float, measured_s: float) -> None:
        """An admitted request's first token came ``measured_s`` seconds after
        admission, which had predicted ``predicted_s`` (its step-time model)."""

    def finished(
        self,
        *,
        stream_id: str,
        finish_reason: str,
        num_output_tokens: int,
        text: str,
        interrupt_to_free_s: float | None,
    ) -> None:
        """Generation of a stream ended. ``interrupt_to_free_s``: for an aborted
        one, seconds from the abort's frame to the engine freeing its blocks
        (``None`` for the others)."""

    def log_written(self, seconds: float, num_streams: int) -> None:
        """One ``TokenLog.write_step`` took ``seconds`` for ``num_streams`` streams."""

    def log_backlog(self, *, num_steps: int, engine_wait_s: float) -> None:
        """The log writer took a step: ``num_steps`` engine steps were waiting
        to be written (that one included), and the engine thread waited
        ``engine_wait_s`` seconds for room to hand it over (backpressure)."""

    def resumed(self, *, stream_id: str, from_offset: int, num_replayed: int) -> None:
        """A ``stream.resume`` was accepted; ``num_replayed`` tokens were already
        in the log past ``from_offset`` (they are sent from the log, not generated)."""

    def delivery_started(self) -> None:
        """A delivery task began sending a stream to a client."""

    def delivery_ended(self) -> None:
        """That delivery task ended (stream done, client gone, or error)."""

    def delta_sent(self, num_tokens: int) -> None:
        """A ``response.delta`` went out carrying ``num_tokens`` tokens: the
        tokens generated but not yet sent when it was sent (delivery lag)."""

    def transcribed(self, *, seconds: float, audio_s: float) -> None:
        """A voice turn of ``audio_s`` seconds was transcribed in ``seconds``."""

    def synthesized(self, *, audio_s: float, compute_s: float) -> None:
        """A segment's ``audio_s`` seconds of speech took ``compute_s`` to synthesize."""

    def voice_to_voice(self, seconds: float) -> None:
        """End of a voice turn's speech (its audio's arrival) to its answer's first audio sent."""

    def barge_in(self, seconds: float) -> None:
        """Speech over the assistant (its audio's arrival) to its audio stopped and request aborted."""

    def barge_in_judged(self, *, real: bool) -> None:
        """The turn that barged in was transcribed: with words (real) or
        without (false: a cough, noise, echo)."""

    def interruption_decided(self, *, real: bool, reason: str, seconds: float) -> None:
        """Speech that paused a spoken answer (``confirm`` mode) was judged:
        a real interruption (cut) or not (resumed; ``reason``: backchannel,
        no_words, echo); ``seconds``: from the speech's end (or the end of
        the pause window) to the decision."""

    def speculation(self, *, adopted: bool) -> None:
        """A voice turn answered at a pause was shown (the turn ended there) or
        dropped (the user went on speaking; its KV blocks were freed)."""


class NullObserver:
    """Observes nothing (the default, and for tests of the session layer)."""

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
        pass

    def rejected(self, reason: str, *, response_id: str | None) -> None:
        pass

    def ttft_predicted(self, *, predicted_s: float, measured_s: float) -> None:
        pass

    def finished(
        self,
        *,
        stream_id: str,
        finish_reason: str,
        num_output_tokens: int,
        text: str,
        interrupt_to_free_s: float | None,
    ) -> None:
        pass

    def log_written(self, seconds: float, num_streams: int) -> None:
        pass

    def log_backlog(self, *, num_steps: int, engine_wait_s: float) -> None:
        pass

    def resumed(self, *, stream_id: str, from_offset: int, num_replayed: int) -> None:
        pass

    def delivery_started(self) -> None:
        pass

    def delivery_ended(self) -> None:
        pass

    def delta_sent(self, num_tokens: int) -> None:
        pass

    def transcribed(self, *, seconds: float, audio_s: float) -> None:
        pass

    def synthesized(self, *, audio_s: float, compute_s: float) -> None:
        pass

    def voice_to_voice(self, seconds: float) -> None:
        pass

    def barge_in(self, seconds: float) -> None:
        pass

    def barge_in_judged(self, *, real: bool) -> None:
        pass

    def interruption_decided(self, *, real: bool, reason: str, seconds: float) -> None:
        pass

    def speculation(self, *, adopted: bool) -> None:
        pass
