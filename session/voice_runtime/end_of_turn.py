"""One connection's end-of-turn scores: the turn so far, read out of its input buffer, scored by Smart Turn.

:class:`EndOfTurnScorer` is the ``score`` a
:class:`~bargein.voice.semantic_turns.SemanticTurnDetector` is given. It runs
where the detector runs, in the input-audio threads
(:meth:`VoiceRuntime.run_input`, never on the event loop): one scoring at a
time per connection, since a connection's appends are applied one at a time,
beside the VAD rather than queued behind seconds of Whisper in the speech
threads (a turn's end waits for it).
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np
import numpy.typing as npt

from bargein.voice.input_buffer import InputAudioBuffer

logger = logging.getLogger(__name__)


class EndOfTurn(Protocol):
    """The end-of-turn model (:class:`bargein.voice.end_of_turn.EndOfTurnModel`)."""

    def probability(self, audio: npt.NDArray[np.float32]) -> float:
        """The probability that the turn spoken in ``audio`` (float32, 16 kHz) is complete."""
        ...


class EndOfTurnScorer:
    """Scores the turn held in ``buffer`` between two input-timeline positions.

    Args:
        model: the process's end-of-turn model.
        buffer: the connection's uncommitted input audio (16 kHz).
    """

    def __init__(self, model: EndOfTurn, buffer: InputAudioBuffer) -> None:
        self._model = model
        self._buffer = buffer

    def __call__(self, start_ms: int, end_ms: int) -> float:
        """The probability, in [0, 1], that the turn in ``[start_ms, end_ms)`` is
        complete. A model that fails scores 0 (logged): the turn then ends at
        its eagerness' longest silence, as an incomplete one does, and the
        connection goes on."""
        try:
            return self._model.probability(self._buffer.read(start_ms, end_ms))
        except Exception:
            logger.exception("scoring the end of turn [%d, %d) ms failed", start_ms, end_ms)
            return 0.0
