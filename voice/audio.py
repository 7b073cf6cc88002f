"""PCM16 <-> float samples, sample <-> millisecond counts, and streaming resampling.

Audio on the wire is 16-bit little-endian mono PCM (docs: PROTOCOL.md, "Audio");
the models take float32 mono in [-1, 1]: Silero VAD and Whisper at 16 kHz,
Piper speaks at its voice's rate (22,050 Hz for the bundled voice).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

# The rates a session may ask for (`session.audio.input/output.sample_rate`).
INPUT_RATES = (16000, 24000)
OUTPUT_RATES = (16000, 24000)

_PCM16_SCALE = 32768.0  # int16 spans [-32768, 32767]


def pcm16_to_float(data: bytes) -> npt.NDArray[np.float32]:
    """Little-endian int16 samples -> float32 ``[num_samples]`` in [-1, 1).

    Raises:
        ValueError: ``data`` has an odd number of bytes (not whole samples).
    """
    if len(data) % 2:
        raise ValueError(f"pcm16 audio must be whole 2-byte samples, got {len(data)} bytes")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / np.float32(_PCM16_SCALE)


def float_to_pcm16(x: npt.ArrayLike) -> bytes:
    """float samples in [-1, 1] -> little-endian int16 bytes; values outside are clipped."""
    scaled = np.clip(np.asarray(x, dtype=np.float32) * np.float32(_PCM16_SCALE), -32768, 32767)
    return np.rint(scaled).astype("<i2").tobytes()


def samples_to_ms(num_samples: int, rate: int) -> int:
    """Whole milliseconds in ``num_samples`` at ``rate`` Hz, rounded down."""
    return num_samples * 1000 // rate


def ms_to_samples(ms: int, rate: int) -> int:
    """Samples in ``ms`` milliseconds at ``rate`` Hz, rounded down."""
    return ms * rate // 1000


class Resampler:
    """Streaming resampler for one mono stream (libsoxr, high quality), float32 in and out.

    Feed chunks of any length to :meth:`process`; the filter keeps its state
    between them, so the output is the same as resampling the whole stream at
    once, delayed by the filter (about 20 ms, given back by :meth:`flush`,
    which ends the stream: the next chunk starts a new one). Equal rates pass
    the samples through unchanged. One instance per stream; not thread-safe.
    """

    def __init__(self, in_rate: int, out_rate: int) -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"{in_rate=} and {out_rate=} must be > 0")
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = None
        if in_rate != out_rate:
            import soxr  # lazily: the voice stack is optional

            self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")

    def process(self, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Resample the next chunk: ``x`` float32 ``[n]`` -> float32 ``[m]``, m ≈ n * out/in."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 1:
            raise ValueError(f"expected mono samples [n], got shape {x.shape}")
        if self._stream is None:
            return x
        return np.asarray(self._stream.resample_chunk(x), dtype=np.float32)

    def flush(self) -> npt.NDArray[np.float32]:
        """End the stream: float32 ``[k]``, the samples still in the filter; it then starts afresh."""
        if self._stream is None:
            return np.zeros(0, dtype=np.float32)
        out = np.asarray(self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True), np.float32)
        self._stream.clear()
        return out
