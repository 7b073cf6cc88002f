"""Turn detection by meaning, with OpenAI's ``semantic_vad`` semantics.

The VAD finds speech and pauses (:class:`~bargein.voice.turns.TurnDetector`,
the same onset rules as ``server_vad``). At each pause, once the short window
of the eagerness (``complete_silence_ms``, 150-250 ms) has passed in
silence, an end-of-turn model scores the turn so far, its trailing silence
included (the probability that the user is done: Smart Turn,
``voice/end_of_turn.py``; pipecat scores it the same way, after its VAD's
200 ms of silence):

- complete (probability ``>= completion_threshold``): the turn ends there;
- incomplete: the turn waits, and ends after ``max_silence_ms`` of silence
  regardless (OpenAI's maximum per eagerness: low 8 s, medium 4 s, high 2 s;
  auto is medium);
- speech resuming before either cancels the pending end; the next pause is
  scored again.

So "What is the capital of France?" ends about 200 ms after its last word,
and "My favorite color is... dark green" is not cut at the dots.

The events are ``server_vad``'s, in the same order, so the voice channel
treats both modes alike: :class:`~bargein.voice.turns.SpeechPaused` once
``pause_ms`` of silence followed the speech (before the score: the channel
starts its speculative answer there, and the transcription runs while the
window closes), then :class:`~bargein.voice.turns.SpeechStopped`, or
:class:`~bargein.voice.turns.SpeechResumed` if the user speaks first.

Pure: no audio, no model, no clock. The detector asks for a score through
the ``score`` callable it is given, synchronously, so every decision is a
function of the audio alone and falls on the input timeline: the same audio
gives the same turns however fast it arrives or the model runs. Silences are
counted in whole VAD frames (32 ms), so a window ends at the first frame
boundary at or past it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .interruption import Interruption
from .turns import SpeechPaused, SpeechStarted, SpeechStopped, TurnDetection, TurnDetector, TurnEvent

Eagerness = Literal["low", "medium", "high", "auto"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EagernessTiming:
    """The silences of one eagerness, milliseconds.

    Attributes:
        complete_silence_ms: silence after speech at which the turn is scored
            (the model hears this much trailing silence); scored complete,
            it ends there.
        max_silence_ms: silence after speech that ends any turn (OpenAI's
            maximum wait for the eagerness).
    """

    complete_silence_ms: int
    max_silence_ms: int


# OpenAI's maxima (the openai SDK's SemanticVad.eagerness: "low, medium, and
# high have max timeouts of 8s, 4s, and 2s"; auto is medium). The short
# windows are 150-250 ms: about the 200 ms of silence after which pipecat
# scores a turn with Smart Turn (its VAD's stop_secs), and short enough that
# the answer starts near the ~200 ms gap people leave between turns.
EAGERNESS: dict[Eagerness, EagernessTiming] = {
    "low": EagernessTiming(complete_silence_ms=250, max_silence_ms=8000),
    "medium": EagernessTiming(complete_silence_ms=200, max_silence_ms=4000),
    "high": EagernessTiming(complete_silence_ms=150, max_silence_ms=2000),
    "auto": EagernessTiming(complete_silence_ms=200, max_silence_ms=4000),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class SemanticTurnDetection:
    """The ``semantic_vad`` settings of a session (OpenAI's realtime ``turn_detection``).

    Attributes:
        eagerness: how soon a turn ends: ``low`` waits longer for the user to
            go on, ``high`` answers sooner; ``auto`` is ``medium``
            (:data:`EAGERNESS`).
        interrupt_response: a turn start interrupts the active response (barge-in).
        create_response: a turn end starts a response.
        interruption: how speech over a spoken answer interrupts it, with
            ``interrupt_response`` (:mod:`bargein.voice.interruption`).
        completion_threshold: the end-of-turn probability at or above which a
            turn counts as complete, in (0, 1); 0.5, as pipecat's Smart Turn
            analyzer decides.
        pause_ms: silence after speech reported as a pause
            (:class:`~bargein.voice.turns.SpeechPaused`: an answer may start
            speculatively), ms; shorter than the shortest ``complete_silence_ms``,
            so the speculation starts before the score.
        vad: the speech onset and pause rules (threshold, prefix padding,
            minimum speech, hysteresis), as ``server_vad``'s defaults; its
            silence windows are replaced by the eagerness' ones.
    """

    eagerness: Eagerness = "auto"
    interrupt_response: bool = True
    create_response: bool = True
    interruption: Interruption = Interruption()
    completion_threshold: float = 0.5
    pause_ms: int = 96
    vad: TurnDetection = TurnDetection()

    def __post_init__(self) -> None:
        if self.eagerness not in EAGERNESS:
            raise ValueError(f"{self.eagerness=} must be one of {list(EAGERNESS)}")
        if not 0.0 < self.completion_threshold < 1.0:
            raise ValueError(f"{self.completion_threshold=} must be in (0, 1)")
        shortest = min(t.complete_silence_ms for t in EAGERNESS.values())
        if not 0 < self.pause_ms < shortest:
            raise ValueError(f"{self.pause_ms=} must be in (0, {shortest})")

    @property
    def timing(self) -> EagernessTiming:
        """The silences of :attr:`eagerness`."""
        return EAGERNESS[self.eagerness]

    def vad_params(self) -> TurnDetection:
        """The VAD detector's settings: a pause at ``pause_ms``, the turn's end
        at the eagerness' maximum."""
        return TurnDetection(
            threshold=self.vad.threshold,
            prefix_padding_ms=self.vad.prefix_padding_ms,
            silence_duration_ms=self.timing.max_silence_ms,
            interrupt_response=self.interrupt_response,
            create_response=self.create_response,
            interruption=self.interruption,
            min_speech_ms=self.vad.min_speech_ms,
            pause_ms=self.pause_ms,
            hysteresis=self.vad.hysteresis,
        )


# (audio_start_ms, speech_end_ms, audio_end_ms) of the turn so far on the
# input timeline (where it starts, where its speech paused, the audio heard
# through the pause's silence so far) -> the probability that it is
# complete, in [0, 1]
Score = Callable[[int, int, int], float]


class SemanticTurnDetector:
    """Finds the user's turns in per-frame VAD probabilities, ending them by meaning.

    The same interface as :class:`~bargein.voice.turns.TurnDetector`, so the
    input audio runs either.

    Args:
        params: the ``semantic_vad`` settings.
        score: scores the turn so far: called with its ``audio_start_ms``,
            where its speech paused (the end of the turn's audio if it ends
            here) and the current position (the audio through the pause's
            silence so far, ``complete_silence_ms`` of it), during
            :meth:`push`; returns the probability it is complete.
        frame_ms: the duration of one VAD frame, ms.
        start_ms: where the first frame starts on the input timeline, ms.

    Raises:
        ValueError: ``frame_ms < 1`` or ``start_ms < 0``.
    """

    def __init__(
        self, params: SemanticTurnDetection, score: Score, frame_ms: int = 32, start_ms: int = 0
    ) -> None:
        self._params = params
        self._score = score
        self._complete_silence_ms = params.timing.complete_silence_ms
        self._vad = TurnDetector(params.vad_params(), frame_ms=frame_ms, start_ms=start_ms)
        self._pause: SpeechPaused | None = None  # the pause in progress
        self._scored = False  # whether it was scored (incomplete: it waits for the maximum)

    @property
    def params(self) -> SemanticTurnDetection:
        """The settings this detector runs with."""
        return self._params

    @property
    def position_ms(self) -> int:
        """The end of the frames pushed so far on the input timeline, ms."""
        return self._vad.position_ms

    @property
    def in_speech(self) -> bool:
        """Whether a turn has started and not stopped (also while paused)."""
        return self._vad.in_speech

    @property
    def turn_start_ms(self) -> int | None:
        """Where the current turn's audio starts, ms; ``None`` outside a turn."""
        return self._vad.turn_start_ms

    @property
    def keep_from_ms(self) -> int:
        """The earliest input ms a turn not over yet can need (:attr:`TurnDetector.keep_from_ms`)."""
        return self._vad.keep_from_ms

    def reset(self, start_ms: int | None = None) -> None:
        """Forget any speech in progress (:meth:`TurnDetector.reset`)."""
        self._vad.reset(start_ms)
        self._pause, self._scored = None, False

    def push(self, probability: float) -> list[TurnEvent]:
        """Takes the speech probability of the next frame; returns the events it causes.

        At a pause this calls ``score`` once, when its short window closes.

        Args:
            probability: the VAD's speech probability for the frame, in [0, 1].

        Returns:
            In order, zero to two events (a pause and the end of its turn can
            fall on one frame).
        """
        events = self._vad.push(probability)
        for event in events:
            if isinstance(event, SpeechPaused):
                self._pause, self._scored = event, False
            elif not isinstance(event, SpeechStarted):  # resumed, or the eagerness' longest silence
                self._pause, self._scored = None, False
        pause = self._pause
        silent_ms = 0 if pause is None else self._vad.position_ms - pause.audio_end_ms
        if pause is not None and not self._scored and silent_ms >= self._complete_silence_ms:
            self._scored = True
            score = self._score(pause.audio_start_ms, pause.audio_end_ms, self._vad.position_ms)
            if score >= self._params.completion_threshold:
                events.append(
                    SpeechStopped(audio_start_ms=pause.audio_start_ms, audio_end_ms=pause.audio_end_ms)
                )
                self.reset()  # the turn is over: the next one starts from here
        return events
