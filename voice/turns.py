"""Turn detection over VAD speech probabilities, with OpenAI's ``server_vad`` semantics.

A VAD model (Silero) gives one speech probability per fixed-size frame of
input audio; :class:`TurnDetector` turns that stream into the user's turns:
where speech started (minus the prefix padding) and where it stopped (after
``silence_duration_ms`` of silence). It also says, earlier, when a short pause
suggests the turn may be over, so a response can start speculatively, and
when that guess turned out wrong.

Pure: no audio, no model, no clock. Time is the input timeline in
milliseconds, derived from the frames pushed: frame ``k`` after the start
covers ``[start_ms + k * frame_ms, start_ms + (k + 1) * frame_ms)``.

Hysteresis follows Silero's own iterator: speech starts at a frame with
probability ``>= threshold`` and continues while it stays ``>= threshold -
0.15``, so a probability hovering just under the threshold inside a word does
not end the turn. Pipecat's VAD (quiet, starting, speaking, stopping) and
LiveKit's Silero plugin (minimum speech and silence durations, prefix padding)
are the same machine with other knobs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .interruption import Interruption

# The lowest stop threshold: Silero's iterator floors ``threshold - 0.15`` the
# same way, so that a low threshold cannot make speech go on for ever.
_MIN_STOP_THRESHOLD = 0.01


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnDetection:
    """The ``server_vad`` settings of a session (OpenAI's realtime ``turn_detection``).

    Attributes:
        threshold: speech probability at or above which a frame is speech, in (0, 1).
        prefix_padding_ms: audio kept before the speech onset in a turn, ms.
        silence_duration_ms: silence after speech that ends the turn, ms.
        interrupt_response: a turn start interrupts the active response (barge-in).
        create_response: a turn end starts a response.
        min_speech_ms: speech must last this long to start a turn, ms. 64 ms
            (two 32 ms Silero frames) is longer than a click or a tap on the
            microphone, which fills one frame, and it bounds a barge-in's
            delay: the assistant's audio stops within about 100 ms of the
            user's first syllable (docs/perf/voice.md). A plosive's burst may
            fill two frames; 128 ms would rule it out at the cost of 64 ms of
            barge-in latency. Silero itself scores steady noise low (white
            noise at -40 dBFS peaks at 0.05 here), which no duration rule fixes.
        pause_ms: silence after speech that suggests the turn is over, so a
            response may start speculatively (:class:`SpeechPaused`), ms;
            ``<= silence_duration_ms`` (equal: the pause and the stop fall on
            one frame).
        hysteresis: once speech started it continues while the probability is
            ``>= threshold - hysteresis`` (Silero's convention: 0.15), in [0, 1].
        interruption: how speech over a spoken answer interrupts it, with
            ``interrupt_response`` (:mod:`bargein.voice.interruption`).
    """

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    interrupt_response: bool = True
    create_response: bool = True
    min_speech_ms: int = 64
    pause_ms: int = 200
    hysteresis: float = 0.15
    interruption: Interruption = Interruption()

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"{self.threshold=} must be in (0, 1)")
        if not 0.0 <= self.hysteresis <= 1.0:
            raise ValueError(f"{self.hysteresis=} must be in [0, 1]")
        for name in ("prefix_padding_ms", "silence_duration_ms", "min_speech_ms", "pause_ms"):
            value = getattr(self, name)
            if value < 0:
                raise ValueError(f"self.{name}={value!r} must be >= 0")
        if self.pause_ms > self.silence_duration_ms:
            raise ValueError(f"{self.pause_ms=} must be <= {self.silence_duration_ms=}")

    @property
    def stop_threshold(self) -> float:
        """The probability below which a frame inside speech counts as silence."""
        return min(self.threshold, max(self.threshold - self.hysteresis, _MIN_STOP_THRESHOLD))


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeechStarted:
    """A turn started (``input_audio.speech_started``).

    Attributes:
        audio_start_ms: where the turn's audio starts on the input timeline: the
            onset minus the prefix padding, never before the detector's start
            (or last reset) nor before the end of the previous turn.
    """

    audio_start_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeechPaused:
    """``pause_ms`` of silence after speech: the turn may be over (a speculative end).

    Attributes:
        audio_start_ms: where the turn's audio starts (as in :class:`SpeechStarted`).
        audio_end_ms: the end of the last speech frame, before the silence.
    """

    audio_start_ms: int
    audio_end_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeechResumed:
    """Speech came back after :class:`SpeechPaused`, before the turn ended: drop the speculation."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeechStopped:
    """The turn ended: ``silence_duration_ms`` of silence (``input_audio.speech_stopped``).

    Always after a :class:`SpeechPaused` of the same turn (``pause_ms <=
    silence_duration_ms``), possibly on the same frame.

    Attributes:
        audio_start_ms: where the turn's audio starts (as in :class:`SpeechStarted`).
        audio_end_ms: the end of the last speech frame, before the silence window.
    """

    audio_start_ms: int
    audio_end_ms: int


TurnEvent = SpeechStarted | SpeechPaused | SpeechResumed | SpeechStopped


class _Phase(enum.Enum):
    QUIET = enum.auto()  # no speech
    STARTING = enum.auto()  # speech shorter than min_speech_ms: not a turn yet
    SPEAKING = enum.auto()  # in a turn
    PAUSED = enum.auto()  # in a turn, after SpeechPaused


class TurnDetector:
    """Finds the user's turns in a stream of per-frame VAD speech probabilities.

    Args:
        params: the turn detection settings.
        frame_ms: the duration of one VAD frame, ms (Silero: 512 samples at 16 kHz = 32 ms).
        start_ms: where the first frame starts on the input timeline, ms.

    Raises:
        ValueError: ``frame_ms < 1`` or ``start_ms < 0``.
    """

    def __init__(self, params: TurnDetection, frame_ms: int = 32, start_ms: int = 0) -> None:
        if frame_ms < 1:
            raise ValueError(f"{frame_ms=} must be >= 1")
        if start_ms < 0:
            raise ValueError(f"{start_ms=} must be >= 0")
        self._params = params
        self._frame_ms = frame_ms
        self._stop_threshold = params.stop_threshold
        self._position_ms = start_ms
        self._phase = _Phase.QUIET
        self._floor_ms = start_ms  # no turn's audio starts before this
        self._onset_ms = start_ms  # first speech frame of the current turn or candidate
        self._turn_start_ms: int | None = None
        self._last_voiced_end_ms = start_ms
        self._silent_ms = 0  # silence since the last speech frame, inside a turn

    @property
    def params(self) -> TurnDetection:
        """The settings this detector runs with."""
        return self._params

    @property
    def position_ms(self) -> int:
        """The end of the frames pushed so far on the input timeline, ms."""
        return self._position_ms

    @property
    def in_speech(self) -> bool:
        """Whether a turn has started and not stopped (also while paused)."""
        return self._phase in (_Phase.SPEAKING, _Phase.PAUSED)

    @property
    def turn_start_ms(self) -> int | None:
        """Where the current turn's audio starts (its ``SpeechStarted``), ms; ``None`` outside a turn."""
        return self._turn_start_ms

    @property
    def keep_from_ms(self) -> int:
        """The earliest input ms a turn not over yet can need: audio before it may be dropped.

        In a turn, its start; with speech too short to be a turn yet, that
        speech's would-be start; otherwise the prefix padding before the
        current position (a turn starting at the next frame reaches back that far).
        """
        if self._turn_start_ms is not None:
            return self._turn_start_ms
        if self._phase is _Phase.STARTING:
            return self._padded(self._onset_ms)
        return self._padded(self._position_ms)

    def reset(self, start_ms: int | None = None) -> None:
        """Forget any speech in progress (after ``input_audio.clear`` or a commit).

        No events are emitted for a turn that is dropped this way. A later
        turn's audio starts no earlier than the next frame.

        Args:
            start_ms: where the next frame starts on the input timeline, ms; by
                default right after the last frame pushed. Never earlier than that.
        """
        if start_ms is not None:
            assert start_ms >= self._position_ms, f"{start_ms=} before {self._position_ms=}"
            self._position_ms = start_ms
        self._phase = _Phase.QUIET
        self._turn_start_ms = None
        self._floor_ms = self._position_ms
        self._silent_ms = 0

    def push(self, probability: float) -> list[TurnEvent]:
        """Takes the speech probability of the next frame; returns the events it causes.

        Args:
            probability: the VAD's speech probability for the frame, in [0, 1].

        Returns:
            In order, zero to two events (a pause and a stop can fall on one frame).
        """
        assert 0.0 <= probability <= 1.0, f"{probability=} must be in [0, 1]"
        frame_start = self._position_ms
        self._position_ms += self._frame_ms
        if self._phase in (_Phase.SPEAKING, _Phase.PAUSED):
            return self._in_turn(probability)
        if self._phase is _Phase.QUIET:
            if probability < self._params.threshold:
                return []
            self._phase = _Phase.STARTING
            self._onset_ms = frame_start
        elif probability < self._stop_threshold:
            self._phase = _Phase.QUIET  # too short: a click, not a turn
            return []
        if self._position_ms - self._onset_ms < self._params.min_speech_ms:
            return []
        self._phase = _Phase.SPEAKING
        self._turn_start_ms = self._padded(self._onset_ms)
        self._last_voiced_end_ms = self._position_ms
        self._silent_ms = 0
        return [SpeechStarted(audio_start_ms=self._turn_start_ms)]

    def _in_turn(self, probability: float) -> list[TurnEvent]:
        assert self._turn_start_ms is not None
        if probability >= self._stop_threshold:
            self._last_voiced_end_ms = self._position_ms
            self._silent_ms = 0
            if self._phase is _Phase.PAUSED:
                self._phase = _Phase.SPEAKING
                return [SpeechResumed()]
            return []
        self._silent_ms += self._frame_ms
        start_ms, end_ms = self._turn_start_ms, self._last_voiced_end_ms
        events: list[TurnEvent] = []
        if self._phase is _Phase.SPEAKING and self._silent_ms >= self._params.pause_ms:
            self._phase = _Phase.PAUSED
            events.append(SpeechPaused(audio_start_ms=start_ms, audio_end_ms=end_ms))
        if self._silent_ms >= self._params.silence_duration_ms:
            events.append(SpeechStopped(audio_start_ms=start_ms, audio_end_ms=end_ms))
            self._phase = _Phase.QUIET
            self._turn_start_ms = None
            # the next turn's padding must not reach back into this one
            self._floor_ms = self._last_voiced_end_ms
        return events

    def _padded(self, onset_ms: int) -> int:
        return max(onset_ms - self._params.prefix_padding_ms, self._floor_ms)
