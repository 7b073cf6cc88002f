"""The speech in a turn's audio, cut out with fixed margins, for speech-to-text.

Whisper's transcript of a sentence depends on the silence around it: tiny.en
hears espeak's "What is the capital of France?" right as is, and as "... the
capital and friends?" with 300 ms of digital silence before it. So the
transcriber does not get the raw buffer, whose silence margins depend on
where the turn's edges fell, but the span the VAD marked as speech, from the
start of its first speech frame to the end of its last, widened by the same
fixed margin on both sides: :func:`speech_span` finds it from the per-frame
speech probabilities, :func:`snap_span` moves its edges from the VAD's 32 ms
frame grid to the first and last audible sample near them (Whisper's words
change with as little as 12 ms more silence before the speech, and where the
grid falls depends on the silence before), :func:`cut_span` cuts it out of the audio, filling
with digital silence where the buffer holds less than the margin (so a
sentence at the very start of the buffer gets the same margin as one
after a pause). The margins were picked by measurement (``docs/perf/stt.md``,
``loadtests/stt_bench.py``).

Pure logic on numpy arrays but :func:`frame_probabilities`, which runs a
fresh :class:`~bargein.voice.vad.VadStream` over the audio (never a
connection's: its state would carry the previous audio).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .vad import FRAME_SAMPLES, SAMPLE_RATE, SileroVad


@dataclass(frozen=True, slots=True, kw_only=True)
class SpanParams:
    """How the speech is found and cut out.

    Attributes:
        threshold: speech probability at or above which a 32 ms VAD frame is
            speech, in (0, 1) (Silero's and ``server_vad``'s default 0.5).
        margin_ms: audio kept before the first speech frame and after the
            last, milliseconds, >= 0; digital silence where the buffer has less.
        audible_level: absolute sample value, in (0, 1), at or above which a
            sample is audible, for :func:`snap_span` (-50 dBFS).
        reach_ms: how far, milliseconds, >= 0, :func:`snap_span` looks
            outside the VAD's span for an audible sample (two frames: the VAD
            often marks a word's soft onset a frame late). In audio whose
            noise is above ``audible_level`` the edges move out by exactly this
            much, so the margins stay fixed there too.
    """

    threshold: float = 0.5
    margin_ms: int = 150
    audible_level: float = 10 ** (-50 / 20)
    reach_ms: int = 64

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"{self.threshold=} must be in (0, 1)")
        if self.margin_ms < 0:
            raise ValueError(f"{self.margin_ms=} must be >= 0")
        if not 0.0 < self.audible_level < 1.0:
            raise ValueError(f"{self.audible_level=} must be in (0, 1)")
        if self.reach_ms < 0:
            raise ValueError(f"{self.reach_ms=} must be >= 0")

    @property
    def margin_samples(self) -> int:
        """:attr:`margin_ms` in samples at 16 kHz."""
        return self.margin_ms * SAMPLE_RATE // 1000

    @property
    def reach_samples(self) -> int:
        """:attr:`reach_ms` in samples at 16 kHz."""
        return self.reach_ms * SAMPLE_RATE // 1000


def frame_probabilities(vad: SileroVad, audio: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """The speech probability of each 32 ms frame of ``audio``, from a fresh VAD stream.

    Args:
        vad: the loaded Silero model (shared; the stream made here is not).
        audio: float32 ``[num_samples]``, 16 kHz mono, in [-1, 1]. A last
            partial frame is heard padded with zeros.

    Returns:
        float32 ``[ceil(num_samples / FRAME_SAMPLES)]``, in [0, 1]; frame ``i``
        covers samples ``[i * FRAME_SAMPLES, (i + 1) * FRAME_SAMPLES)``.
    """
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    num_frames = -(-audio.size // FRAME_SAMPLES)
    padded = np.zeros(num_frames * FRAME_SAMPLES, dtype=np.float32)
    padded[: audio.size] = audio
    stream = vad.stream()
    probs = [
        stream.probability(padded[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES]) for i in range(num_frames)
    ]
    return np.asarray(probs, dtype=np.float32)


def speech_span(
    probabilities: npt.NDArray[np.float32], num_samples: int, threshold: float
) -> tuple[int, int] | None:
    """Where the speech lies: from the start of the first frame at or above ``threshold`` to the end of the last.

    Args:
        probabilities: float32 ``[num_frames]``, one per ``FRAME_SAMPLES``
            frame (:func:`frame_probabilities`).
        num_samples: the audio's length in samples (the last frame may be partial).
        threshold: the speech probability of a speech frame, in (0, 1).

    Returns:
        ``(start, end)`` sample indices, ``0 <= start < end <= num_samples``;
        None when no frame is speech.
    """
    speech = np.flatnonzero(np.asarray(probabilities) >= threshold)
    if speech.size == 0 or num_samples <= 0:
        return None
    start = int(speech[0]) * FRAME_SAMPLES
    end = min((int(speech[-1]) + 1) * FRAME_SAMPLES, num_samples)
    if start >= end:
        return None
    return start, end


def snap_span(
    audio: npt.NDArray[np.float32], span: tuple[int, int], level: float, reach_samples: int
) -> tuple[int, int]:
    """``span`` with its edges on the first and last audible samples within ``reach_samples`` of it.

    The new start is the first sample of ``audio[start - reach : end]`` whose
    magnitude is at least ``level``; the new end is one past the last such
    sample of ``audio[start : end + reach]`` (both clamped to the buffer).
    Where no sample is audible (a VAD span over very quiet audio) that edge stays.

    Args:
        audio: float32 ``[num_samples]``.
        span: ``(start, end)`` sample indices (:func:`speech_span`).
        level: magnitude of an audible sample, in (0, 1).
        reach_samples: how far outside ``span`` to look, samples, >= 0.

    Returns:
        ``(start, end)`` sample indices, ``0 <= start < end <= num_samples``.
    """
    assert reach_samples >= 0, reach_samples
    start, end = span
    assert 0 <= start < end <= audio.size, (span, audio.size)
    lo = max(0, start - reach_samples)
    hi = min(audio.size, end + reach_samples)
    loud_head = np.flatnonzero(np.abs(audio[lo:end]) >= level)
    loud_tail = np.flatnonzero(np.abs(audio[start:hi]) >= level)
    new_start = lo + int(loud_head[0]) if loud_head.size else start
    new_end = start + int(loud_tail[-1]) + 1 if loud_tail.size else end
    if new_start >= new_end:
        return span
    return new_start, new_end


def cut_span(
    audio: npt.NDArray[np.float32], span: tuple[int, int], margin_samples: int
) -> npt.NDArray[np.float32]:
    """``audio[start - margin : end + margin]``, zero-filled where that reaches past the buffer.

    Args:
        audio: float32 ``[num_samples]``.
        span: ``(start, end)`` sample indices of the speech (:func:`speech_span`).
        margin_samples: samples kept (or added as zeros) on each side, >= 0.

    Returns:
        float32 ``[end - start + 2 * margin_samples]``, a new array.
    """
    assert margin_samples >= 0, margin_samples
    start, end = span
    assert 0 <= start < end <= audio.size, (span, audio.size)
    out = np.zeros(end - start + 2 * margin_samples, dtype=np.float32)
    lo, hi = max(0, start - margin_samples), min(audio.size, end + margin_samples)
    offset = lo - (start - margin_samples)
    out[offset : offset + hi - lo] = audio[lo:hi]
    return out


def speech_with_margins(
    vad: SileroVad, audio: npt.NDArray[np.float32], params: SpanParams
) -> npt.NDArray[np.float32] | None:
    """The speech of ``audio`` with ``params``' fixed margins (:func:`cut_span`), None when the VAD hears none.

    Args:
        vad: the loaded Silero model; a fresh stream is run over ``audio``.
        audio: float32 ``[num_samples]``, 16 kHz mono, in [-1, 1].
        params: the threshold and the margin.

    Returns:
        float32 ``[num_speech_samples + 2 * margin]``, or None.
    """
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    span = speech_span(frame_probabilities(vad, audio), audio.size, params.threshold)
    if span is None:
        return None
    span = snap_span(audio, span, params.audible_level, params.reach_samples)
    return cut_span(audio, span, params.margin_samples)
