"""The uncommitted input audio of a session, on the session's input timeline.

The input timeline counts every sample the client appended since the session
began (``input_audio.speech_started.audio_start_ms`` and the other input
offsets are on it); it goes on across commits and clears. The buffer holds
only the part not yet committed into a user item, bounded by
``limits.max_input_audio_ms``: with server VAD the session drops what no turn
can need any more (:meth:`InputAudioBuffer.trim_before` with the detector's
``keep_from_ms``), so a client that streams for ever without a turn end
holds at most the prefix padding, and a turn that reaches the limit is ended
there by the session (``session/voice_runtime/audio_input.py``).

Pure computation on numpy arrays; audio is mono float32 at ``sample_rate``
(after resampling). Milliseconds map to samples as ``ms * sample_rate // 1000``.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import numpy.typing as npt

from bargein.voice.errors import InputAudioFull

Audio = npt.NDArray[np.float32]


class InputAudioBuffer:
    """Uncommitted input audio with the input timeline's offsets.

    Args:
        max_ms: the most uncommitted audio held, ms (``limits.max_input_audio_ms``).
        sample_rate: samples per second of the audio appended.

    Raises:
        ValueError: ``max_ms < 1`` or ``sample_rate < 1``.
    """

    def __init__(self, *, max_ms: int, sample_rate: int = 16000) -> None:
        if max_ms < 1:
            raise ValueError(f"{max_ms=} must be >= 1")
        if sample_rate < 1:
            raise ValueError(f"{sample_rate=} must be >= 1")
        self._max_ms = max_ms
        self._sample_rate = sample_rate
        self._max_samples = self._to_sample(max_ms)
        self._chunks: deque[Audio] = deque()  # the held audio, in order
        self._offset = 0  # samples of _chunks[0] already dropped
        self._head = 0  # timeline sample of the first held sample
        self._total = 0  # timeline samples appended since the session began

    @property
    def sample_rate(self) -> int:
        """Samples per second."""
        return self._sample_rate

    @property
    def max_ms(self) -> int:
        """The most uncommitted audio held, ms."""
        return self._max_ms

    @property
    def total_ms(self) -> int:
        """The input timeline's end: all audio appended since the session began, ms (floor)."""
        return self._to_ms(self._total)

    @property
    def start_ms(self) -> int:
        """Where the held audio starts on the input timeline, ms (floor)."""
        return self._to_ms(self._head)

    @property
    def duration_ms(self) -> int:
        """The uncommitted audio held, ms (floor)."""
        return self._to_ms(self._total - self._head)

    @property
    def free_samples(self) -> int:
        """Samples that can still be appended before the held audio reaches ``max_ms``."""
        return self._max_samples - (self._total - self._head)

    def append(self, chunk: npt.ArrayLike) -> None:
        """Appends audio at the end of the timeline (copied, as float32).

        Args:
            chunk: ``[num_samples]`` mono samples at ``sample_rate``.

        Raises:
            InputAudioFull: the held audio would exceed ``max_ms``; nothing is appended.
        """
        samples: Audio = np.array(chunk, dtype=np.float32)
        assert samples.ndim == 1, f"mono audio is 1-D, got shape {samples.shape}"
        if self._total - self._head + samples.size > self._max_samples:
            raise InputAudioFull(self._max_ms)
        if samples.size:
            self._chunks.append(samples)
            self._total += samples.size

    def read(self, start_ms: int, end_ms: int) -> Audio:
        """A copy of the held audio in ``[start_ms, end_ms)``, keeping it held (a speculative turn).

        Bounds outside the held audio are clamped to it.

        Returns:
            ``[num_samples]`` float32.
        """
        assert start_ms <= end_ms, f"{start_ms=} after {end_ms=}"
        start, end = self._clamp(start_ms), self._clamp(end_ms)
        out = np.empty(end - start, dtype=np.float32)
        at = self._head - self._offset  # timeline sample of _chunks[0][0]
        for chunk in self._chunks:
            lo, hi = max(start, at), min(end, at + chunk.size)
            if lo < hi:
                out[lo - start : hi - start] = chunk[lo - at : hi - at]
            at += chunk.size
            if at >= end:
                break
        return out

    def take(self, start_ms: int, end_ms: int) -> Audio:
        """Cuts a turn's audio ``[start_ms, end_ms)`` and drops everything before ``end_ms``.

        Bounds outside the held audio are clamped to it (audio before
        :attr:`start_ms` was trimmed and is gone).

        Returns:
            ``[num_samples]`` float32.
        """
        out = self.read(start_ms, end_ms)
        self.trim_before(end_ms)
        return out

    def trim_before(self, ms: int) -> None:
        """Drops the held audio before ``ms`` on the input timeline (no turn needs it)."""
        drop = self._clamp(ms) - self._head
        while drop > 0:
            left = self._chunks[0].size - self._offset
            if left <= drop:
                self._chunks.popleft()
                self._offset = 0
            else:
                self._offset += drop
                left = drop
            self._head += left
            drop -= left

    def clear(self) -> None:
        """Drops all the held audio (``input_audio.clear``); the timeline goes on."""
        self._chunks.clear()
        self._offset = 0
        self._head = self._total

    def _clamp(self, ms: int) -> int:
        return min(max(self._to_sample(ms), self._head), self._total)

    def _to_sample(self, ms: int) -> int:
        return ms * self._sample_rate // 1000

    def _to_ms(self, sample: int) -> int:
        return sample * 1000 // self._sample_rate
