"""One connection's end-of-turn scores: the turn so far, read out of its input
buffer, scored by Smart Turn and, where it says the turn is over, by its words.

:class:`EndOfTurnScorer` is the ``score`` a
:class:`~bargein.voice.semantic_turns.SemanticTurnDetector` is given. It runs
where the detector runs, in the input-audio threads
(:meth:`VoiceRuntime.run_input`, never on the event loop): one scoring at a
time per connection, since a connection's appends are applied one at a time,
beside the VAD rather than queued behind seconds of Whisper in the speech
threads (a turn's end waits for it).

Two signals (docs/perf/end-of-turn.md measured both): the audio (Smart
Turn), and, when a text model is given, the words: the turn's transcript
up to where its speech paused (:class:`SpanTranscripts`: the transcription
the voice channel started at the pause, shared, or made here) and the
probability that a message ending with those words is complete. The words
overrule the audio where they are clear:

- under ``text_threshold`` (0.05) they veto: "I'd like to book a table for"
  is not over, however it sounds, and the turn waits like an incomplete one;
- at or over ``finished_threshold`` (0.3) they end the turn however it
  sounds ("What is the capital of France" read flat or by a synthetic
  voice, which Smart Turn often hears as unfinished);
- between, the audio's score stands.

On the pause set's utterances offline (``loadtests/end_of_turn_eval.py``),
against the audio alone: cut-off sentences scored complete 27 -> 11 of 60,
whole sentences 32 -> 52 of 60, questions 7 -> 8 of 12.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import numpy as np
import numpy.typing as npt

from bargein.session.voice_runtime.span_transcripts import SpanTranscripts
from bargein.voice.input_buffer import InputAudioBuffer

logger = logging.getLogger(__name__)

# A transcription another thread runs is waited for this long at most: past
# it the audio's score stands (a turn end never waits on a stuck transcriber).
WORDS_TIMEOUT_S = 5.0


class EndOfTurn(Protocol):
    """The end-of-turn model (:class:`bargein.voice.end_of_turn.EndOfTurnModel`)."""

    def probability(self, audio: npt.NDArray[np.float32]) -> float:
        """The probability that the turn spoken in ``audio`` (float32, 16 kHz) is complete."""
        ...


class TextEndOfTurn(Protocol):
    """The text model (:class:`bargein.voice.text_end_of_turn.TextEndOfTurnModel`)."""

    def probability(self, text: str) -> float:
        """The probability that a user message ``text`` is complete."""
        ...


class EndOfTurnScorer:
    """Scores the turn held in ``buffer`` between input-timeline positions.

    Args:
        model: the process's end-of-turn model (audio).
        buffer: the connection's uncommitted input audio (16 kHz).
        words: the text signal: the text model, the connection's shared
            transcripts and the transcriber (float32 16 kHz audio -> text);
            None: the audio alone decides.
        text_threshold: the text model's probability under which the words
            veto a complete score, in (0, 1).
        finished_threshold: the text model's probability at or above which
            the words end the turn whatever the audio scored, in
            (``text_threshold``, 1).
        completion_threshold: the score at or above which the detector ends
            the turn.
    """

    def __init__(
        self,
        model: EndOfTurn,
        buffer: InputAudioBuffer,
        *,
        words: tuple[TextEndOfTurn, SpanTranscripts, Callable[[npt.NDArray[np.float32]], str]] | None = None,
        text_threshold: float = 0.05,
        finished_threshold: float = 0.3,
        completion_threshold: float = 0.5,
    ) -> None:
        self._model = model
        self._buffer = buffer
        self._words = words
        self._text_threshold = text_threshold
        self._finished_threshold = finished_threshold
        self._completion_threshold = completion_threshold

    def __call__(self, start_ms: int, speech_end_ms: int, end_ms: int) -> float:
        """The probability, in [0, 1], that the turn in ``[start_ms, end_ms)``
        (its speech paused at ``speech_end_ms``) is complete.

        A model that fails scores 0 (logged): the turn then ends at its
        eagerness' longest silence, as an incomplete one does, and the
        connection goes on. A failed transcription or text model leaves the
        audio's score (logged).
        """
        try:
            audio_score = self._model.probability(self._buffer.read(start_ms, end_ms))
        except Exception:
            logger.exception("scoring the end of turn [%d, %d) ms failed", start_ms, end_ms)
            return 0.0
        if self._words is None:
            return audio_score
        text_model, transcripts, transcribe = self._words
        try:
            span = (start_ms, speech_end_ms)
            text = transcripts.text(
                span, lambda: transcribe(self._buffer.read(*span)), timeout_s=WORDS_TIMEOUT_S
            )
            text_score = text_model.probability(text)
        except Exception:
            logger.exception("reading the words of the turn [%d, %d) ms failed", start_ms, speech_end_ms)
            return audio_score
        if text_score < self._text_threshold:
            return text_score  # the words veto: not over, however it sounds
        if text_score >= self._finished_threshold:
            return max(audio_score, self._completion_threshold)  # the words end it, however it sounds
        return audio_score
