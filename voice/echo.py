"""Echo cancellation of a connection's input against the audio it was sent (issue 39).

A client without echo cancellation plays the server's spoken answer through
a speaker into its microphone; without this the echo starts a turn and the
assistant barges in on itself. The server knows what it sent and when, so it
can cancel the echo itself:

* :class:`PlaybackReference` turns "this chunk of the response's output was
  sent at wall time t" (and playback pauses, resumes and cuts) into the
  signal the client's speaker plays, on a 16 kHz grid of wall time: the
  client starts a response's first chunk when it arrives (≈ when sent),
  plays the chunks back to back at real time, holds while paused, and stops
  at a cut.
* :class:`InputClock` places the input audio on the same grid from when each
  append arrived.
* :class:`EchoCanceller` removes the echo of that reference from the input:
  WebRTC's AEC3 (the ``AudioProcessingModule`` of the ``livekit`` wheel,
  Apache-2.0, WebRTC's BSD code built in), which estimates the echo path's
  delay itself. The reference is placed early on purpose (played when sent,
  the input captured when it arrived): the real echo comes later by the
  round trip and the devices' latencies (50-150 ms, unknown), and AEC3
  needs the reference ahead of its echo, never behind.

Every sample here is float32 mono in [-1, 1]; :class:`EchoCanceller` and the
reference work at 16 kHz (the VAD's rate, ``SAMPLE_RATE``). Wall times are
``time.monotonic()`` seconds. Only :class:`EchoCanceller` calls the library;
the rest is pure logic.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .audio import Resampler

SAMPLE_RATE = 16000
FRAME_SAMPLES = 160  # AEC3 takes 10 ms frames
# How long the reference keeps audio already played: an input append arrives
# at most this long after the audio it holds was captured (a client's
# appends are 20-100 ms; a network stall longer than this loses the echo's
# reference for the stalled audio, which AEC3 then passes through).
KEEP_PLAYED_S = 5.0
# InputClock: the earliest arrival over a window of this much input ...
CLOCK_WINDOW_S = 2.0
# ... moves the input's place when it departs from it by more than this (ms):
# a client's clock 100 ppm off the server's takes 200 s to drift this far.
CLOCK_SLACK_MS = 20


def grid(t: float) -> int:
    """Wall time ``t`` (monotonic s) -> its sample index on the 16 kHz grid of wall time."""
    return round(t * SAMPLE_RATE)


@dataclass(slots=True)
class _Segment:
    """Reference audio placed at ``start`` (16 kHz grid index of wall time)."""

    start: int
    audio: npt.NDArray[np.float32]  # [n] at 16 kHz

    @property
    def end(self) -> int:
        return self.start + len(self.audio)


class PlaybackReference:
    """What the client's speaker plays, as 16 kHz samples on a grid of wall time.

    The model of the client: a response's chunks are played back to back at
    real time; a chunk starts when it arrives (taken as when it was sent) or
    when the chunk before it ends, whichever is later; a pause holds the
    playback (what was queued plays on at the resume); a cut drops what was
    not played by then. The output timeline's ``start_ms`` only says whether
    a chunk follows the one before (the resampler's stream goes on) or
    starts anew (a new response, a skip).

    Called from the event loop (the ``played``/pause/resume/end calls) and
    from an input thread (:meth:`span`): thread-safe.

    Args:
        keep_s: seconds of played audio kept for :meth:`span` (older is dropped).
    """

    def __init__(self, keep_s: float = KEEP_PLAYED_S) -> None:
        self._lock = threading.Lock()
        self._keep = round(keep_s * SAMPLE_RATE)
        self._segments: list[_Segment] = []  # by start, not overlapping
        self._tail = -(2**62)  # grid index where the queued audio ends
        self._paused_at: int | None = None
        self._resampler: Resampler | None = None
        self._next_ms: float | None = None  # output-timeline ms the next contiguous chunk starts at
        self._rate = 0
        self.ever_played = False  # any audio at all: until then nothing needs cancelling

    def played(
        self, samples: npt.NDArray[np.float32], sample_rate: int, start_ms: float, sent_at: float
    ) -> None:
        """A chunk of a response's output was sent to the client.

        Args:
            samples: float32 ``[n]`` mono in [-1, 1] at ``sample_rate``, as sent.
            sample_rate: its rate, Hz (the session's output rate: 16 or 24 kHz).
            start_ms: where it starts on the response's output timeline, ms.
            sent_at: when it was sent, monotonic seconds.
        """
        samples = np.ascontiguousarray(samples, dtype=np.float32)
        with self._lock:
            if (
                self._resampler is None
                or sample_rate != self._rate
                or self._next_ms is None
                or (abs(start_ms - self._next_ms) > 1.0)
            ):
                self._end_stream_locked()
                self._resampler = Resampler(sample_rate, SAMPLE_RATE)
                self._rate = sample_rate
            self._next_ms = start_ms + len(samples) * 1000 / sample_rate
            assert self._resampler is not None
            audio = self._resampler.process(samples)
            self._place_locked(audio, grid(sent_at))
            if len(samples) and np.any(samples):
                self.ever_played = True

    def paused(self, at: float) -> None:
        """The client's playback holds from wall time ``at`` (monotonic s) until :meth:`resumed`."""
        with self._lock:
            if self._paused_at is None:
                self._paused_at = grid(at)
                self._split_locked(self._paused_at)

    def resumed(self, at: float) -> None:
        """The client's playback goes on from wall time ``at``: what was queued
        after the pause plays from ``at`` on."""
        with self._lock:
            if self._paused_at is None:
                return
            paused_at, self._paused_at = self._paused_at, None
            shift = max(0, grid(at) - paused_at)
            for seg in self._segments:
                if seg.start >= paused_at:
                    seg.start += shift
            if self._tail > paused_at:
                self._tail += shift

    def ended(self, at: float) -> None:
        """The response's playback stops at wall time ``at`` (a cut, a
        truncation, a new response replacing it): what was not played by
        then is dropped, and the next chunk starts a new stream. After a
        natural end (everything played) it changes nothing but the stream."""
        with self._lock:
            end = grid(at)
            if self._paused_at is not None:
                end = min(end, self._paused_at)
            self._end_stream_locked(place=False)
            self._split_locked(end)
            self._segments = [s for s in self._segments if s.start < end]
            self._tail = min(self._tail, end)

    def span(self, start: int, n: int) -> npt.NDArray[np.float32]:
        """The reference the client played over grid ``[start, start + n)``:
        float32 ``[n]`` at 16 kHz, zeros where nothing played (or what plays
        after a pause not yet resumed). Audio played before ``start -
        keep_s`` is dropped, so spans are asked in increasing order."""
        out = np.zeros(n, dtype=np.float32)
        with self._lock:
            limit = self._paused_at
            for seg in self._segments:
                if limit is not None and seg.start >= limit:
                    continue
                lo, hi = max(start, seg.start), min(start + n, seg.end)
                if lo < hi:
                    out[lo - start : hi - start] = seg.audio[lo - seg.start : hi - seg.start]
            horizon = start - self._keep
            if self._segments and self._segments[0].end < horizon:
                self._segments = [s for s in self._segments if s.end >= horizon]
        return out

    def _place_locked(self, audio: npt.NDArray[np.float32], sent: int) -> None:
        if not len(audio):
            return
        if self._paused_at is not None:
            start = max(self._tail, self._paused_at)  # held: it plays at the resume
        else:
            start = max(self._tail, sent)
        self._segments.append(_Segment(start, audio))
        self._tail = start + len(audio)
        horizon = sent - self._keep  # bounded even when no input asks for spans
        if self._segments[0].end < horizon:
            self._segments = [s for s in self._segments if s.end >= horizon]

    def _end_stream_locked(self, place: bool = True) -> None:
        """The resampler's stream ends: its last samples follow the queued audio (``place``) or are dropped."""
        if self._resampler is not None:
            tail = self._resampler.flush()
            if place:
                self._place_locked(tail, self._tail)
        self._resampler = None
        self._next_ms = None

    def _split_locked(self, at: int) -> None:
        """Cut the segment straddling grid index ``at`` in two there."""
        for i, seg in enumerate(self._segments):
            if seg.start < at < seg.end:
                cut = at - seg.start
                self._segments[i : i + 1] = [
                    _Segment(seg.start, seg.audio[:cut]),
                    _Segment(at, seg.audio[cut:]),
                ]
                return


class InputClock:
    """Places one connection's 16 kHz input audio on the grid of wall time.

    An append's last sample is taken as captured when the append arrived,
    so sample ``k`` of the input sits at ``offset + k``. The offset is the
    first append's, and moves only when the earliest arrival over a window
    of :data:`CLOCK_WINDOW_S` of input departs from it by more than
    :data:`CLOCK_SLACK_MS` (a client clock drifting from the server's, a
    first append that came late): network jitter never moves the audio's
    place, since every move of the place is a jump in the echo's delay that
    AEC3's linear filter must learn again (even a sample's jump costs it
    several dB at the speech's higher frequencies). The place errs late by
    the fastest uplink, which keeps the reference ahead of its echo.
    """

    def __init__(self) -> None:
        self._offset: int | None = None  # grid index of input sample 0
        self._samples = 0  # input samples placed so far
        self._window_min: int | None = None  # earliest offset seen in the current window
        self._window_left = round(CLOCK_WINDOW_S * SAMPLE_RATE)

    def place(self, n: int, arrived_at: float | None) -> int:
        """``n`` more input samples arrived at ``arrived_at`` (monotonic s):
        the grid index of their first sample. ``arrived_at=None``: samples
        that did not arrive as such (a resampler's tail at a commit), placed
        after the others without moving the place."""
        first = self._samples
        self._samples += n
        if arrived_at is None:
            return (self._offset or 0) + first
        candidate = grid(arrived_at) - self._samples
        if self._offset is None:
            self._offset = candidate
        self._window_min = candidate if self._window_min is None else min(self._window_min, candidate)
        self._window_left -= n
        if self._window_left <= 0:
            if abs(self._window_min - self._offset) > CLOCK_SLACK_MS * SAMPLE_RATE // 1000:
                self._offset = self._window_min
            self._window_min = None
            self._window_left = round(CLOCK_WINDOW_S * SAMPLE_RATE)
        return self._offset + first


class EchoCanceller:
    """WebRTC AEC3 on one connection's 16 kHz input (``livekit.rtc.AudioProcessingModule``).

    Feed the reference of a span with :meth:`far`, then the microphone's
    audio of the same span with :meth:`near`, in equal lengths: they run
    through AEC3 in lockstep 10 ms frames (the reference's frame first), so
    the output lags the input by the samples short of a frame (under 10 ms),
    given back by :meth:`flush`. AEC3 itself delays what it gives back by
    128 samples (8 ms, measured: tests/voice/test_echo.py), so the stream
    gets 8 ms of silence where the canceller starts and runs 8 ms late from
    there (the sample count stays the input's). Until the reference first
    holds a sound, the input passes straight through, unframed and without
    a lag (a connection that was never sent audio costs nothing).

    The echo may lag its reference by up to about 250 ms (AEC3's delay
    estimator); it must not lead it. Noise suppression, the high-pass filter
    and the gain control are off: the input's speech reaches the VAD and
    Whisper as the client sent it, only the echo removed. One per connection;
    not thread-safe (one input thread at a time).
    """

    def __init__(self) -> None:
        self._apm: Any = None
        self._frame_type: Any = None
        self._far = np.zeros(0, dtype=np.float32)  # reference not yet framed
        self._near = np.zeros(0, dtype=np.float32)  # input not yet framed
        self._on = False  # the reference held a sound: frame everything from here on

    @property
    def active(self) -> bool:
        """The canceller runs (the reference held a sound); False: a pass-through."""
        return self._on

    def far(self, samples: npt.NDArray[np.float32]) -> None:
        """The reference for the next span of input: float32 ``[n]`` at 16 kHz
        in [-1, 1], what the speaker played over the span :meth:`near` gets next."""
        samples = np.asarray(samples, dtype=np.float32)
        if not self._on:
            if not np.any(samples):
                return
            self._start()
        self._far = np.concatenate([self._far, samples])

    def near(self, samples: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The microphone's next span: float32 ``[n]`` at 16 kHz in [-1, 1] ->
        float32 ``[m]``, the input so far with the echo removed (``m`` within
        a frame of ``n``: whole 10 ms frames, the rest held)."""
        samples = np.asarray(samples, dtype=np.float32)
        if not self._on:
            return samples
        self._near = np.concatenate([self._near, samples])
        usable = len(self._near) - len(self._near) % FRAME_SAMPLES
        if not usable:
            return np.zeros(0, dtype=np.float32)
        if len(self._far) < usable:  # no reference fed for this span: silence
            self._far = np.concatenate([self._far, np.zeros(usable - len(self._far), np.float32)])
        out = self._process(self._far[:usable], self._near[:usable])
        self._far, self._near = self._far[usable:], self._near[usable:]
        return out

    def flush(self) -> npt.NDArray[np.float32]:
        """The input held short of a frame, processed (padded to a frame):
        float32 ``[k]``, k < 160. The stream goes on after it."""
        k = len(self._near)
        if not k:
            return np.zeros(0, dtype=np.float32)
        pad = FRAME_SAMPLES - k
        far = np.concatenate([self._far[:k], np.zeros(FRAME_SAMPLES - min(k, len(self._far)), np.float32)])
        near = np.concatenate([self._near, np.zeros(pad, np.float32)])
        self._far, self._near = self._far[k:], np.zeros(0, dtype=np.float32)
        return self._process(far[:FRAME_SAMPLES], near)[:k]

    def _start(self) -> None:
        from livekit import rtc  # lazily: the voice stack is optional

        self._apm = rtc.AudioProcessingModule(
            echo_cancellation=True, noise_suppression=False, high_pass_filter=False, auto_gain_control=False
        )
        self._frame_type = rtc.AudioFrame
        self._on = True

    def _process(
        self, far: npt.NDArray[np.float32], near: npt.NDArray[np.float32]
    ) -> npt.NDArray[np.float32]:
        """AEC3 over whole frames: ``far`` and ``near`` float32 ``[k * 160]`` -> float32 ``[k * 160]``."""
        far16 = _to_pcm16(far)
        near16 = bytearray(_to_pcm16(near))
        view = memoryview(near16)
        for lo in range(0, len(far16), 2 * FRAME_SAMPLES):
            hi = lo + 2 * FRAME_SAMPLES
            self._apm.process_reverse_stream(self._frame_type(far16[lo:hi], SAMPLE_RATE, 1, FRAME_SAMPLES))
            frame = self._frame_type(view[lo:hi], SAMPLE_RATE, 1, FRAME_SAMPLES)
            self._apm.process_stream(frame)
            view[lo:hi] = frame.data.cast("B")
        return np.frombuffer(bytes(near16), dtype="<i2").astype(np.float32) / np.float32(32768)


def _to_pcm16(x: npt.NDArray[np.float32]) -> bytes:
    return np.rint(np.clip(x * 32768.0, -32768, 32767)).astype("<i2").tobytes()


class EchoPath:
    """One connection's echo removal: what it was sent (:class:`PlaybackReference`),
    where its input falls in wall time (:class:`InputClock`), and the canceller.

    The playback calls (:meth:`played`, :meth:`paused`, :meth:`resumed`,
    :meth:`ended`) come from the event loop as the audio is sent; :meth:`clean`
    from the thread running the input, with each append's 16 kHz samples.
    """

    def __init__(self) -> None:
        self.reference = PlaybackReference()
        self.clock = InputClock()
        self.canceller = EchoCanceller()

    def played(
        self, samples: npt.NDArray[np.float32], sample_rate: int, start_ms: float, sent_at: float
    ) -> None:
        """See :meth:`PlaybackReference.played`."""
        self.reference.played(samples, sample_rate, start_ms, sent_at)

    def paused(self, at: float) -> None:
        """See :meth:`PlaybackReference.paused`."""
        self.reference.paused(at)

    def resumed(self, at: float) -> None:
        """See :meth:`PlaybackReference.resumed`."""
        self.reference.resumed(at)

    def ended(self, at: float) -> None:
        """See :meth:`PlaybackReference.ended`."""
        self.reference.ended(at)

    def clean(self, samples: npt.NDArray[np.float32], arrived_at: float | None) -> npt.NDArray[np.float32]:
        """The next input samples (float32 ``[n]``, 16 kHz), arrived at
        ``arrived_at`` (monotonic s; None: see :meth:`InputClock.place`) ->
        float32 ``[m]``, the input with the echo removed, ``m`` within a 10 ms
        frame of ``n`` (see :class:`EchoCanceller`)."""
        start = self.clock.place(len(samples), arrived_at)
        if self.canceller.active or self.reference.ever_played:
            self.canceller.far(self.reference.span(start, len(samples)))
        return self.canceller.near(samples)

    def flush(self) -> npt.NDArray[np.float32]:
        """The input held short of a frame (float32 ``[k]``, k < 160), cleaned."""
        return self.canceller.flush()
