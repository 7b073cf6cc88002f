"""PCM16 audio for the Python client: WAV files in and out, resampling, chunks.

Audio on bargein's wire is ``pcm16``: 16-bit little-endian mono samples, as
``bytes`` here (docs/protocol.md, "Audio"). WAV files are read and written
with the stdlib :mod:`wave`: integer PCM, and on Python 3.11 not the
``WAVE_FORMAT_EXTENSIBLE`` header that tools write for more than 16 bits or
2 channels (``sox FILE -b 16 OUT.wav`` converts such a file). Converting another sample width
or channel count needs ``numpy``, another rate ``soxr``; both are imported
only then, so sending a 16 kHz mono file needs neither.
"""

from __future__ import annotations

import os
import wave
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any

SAMPLE_BYTES = 2  # pcm16


def samples_in(pcm: bytes) -> int:
    """Samples in ``pcm`` (whole 2-byte samples)."""
    return len(pcm) // SAMPLE_BYTES


def duration_ms(pcm: bytes, sample_rate: int) -> int:
    """Whole milliseconds of ``pcm`` at ``sample_rate`` Hz, rounded down."""
    return samples_in(pcm) * 1000 // sample_rate


def ms_to_bytes(ms: int, sample_rate: int) -> int:
    """Bytes of ``ms`` milliseconds of pcm16 at ``sample_rate`` Hz (whole samples, rounded down)."""
    return ms * sample_rate // 1000 * SAMPLE_BYTES


def silence(ms: int, sample_rate: int) -> bytes:
    """``ms`` milliseconds of digital silence at ``sample_rate`` Hz."""
    return bytes(ms_to_bytes(ms, sample_rate))


def read_wav(path: str | os.PathLike[str], *, sample_rate: int) -> bytes:
    """The audio of a WAV file as pcm16 mono at ``sample_rate`` Hz.

    Any integer sample width (8, 16, 24, 32 bit) and channel count is
    converted (channels are averaged), any rate resampled with libsoxr.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a WAV file of integer PCM (``wave``'s reason).
    """
    try:
        with wave.open(os.fspath(path), "rb") as wav:
            width, channels, rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
            frames = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError) as exc:
        raise ValueError(
            f"{os.fspath(path)!r} is not a WAV file of integer PCM ({exc}); "
            "`sox FILE -b 16 OUT.wav` converts one"
        ) from None
    if (width, channels) != (SAMPLE_BYTES, 1):
        frames = _to_pcm16_mono(frames, width, channels)
    return resample(frames, rate, sample_rate)


def _to_pcm16_mono(frames: bytes, width: int, channels: int) -> bytes:
    """Interleaved little-endian integer samples of ``width`` bytes -> pcm16 mono."""
    import numpy as np

    raw = np.frombuffer(frames, dtype=np.uint8).reshape(-1, width)
    if width == 1:  # 8-bit WAV is unsigned, centred on 128
        samples = (raw[:, 0].astype(np.int32) - 128) << 8
    else:  # keep the two most significant bytes of each little-endian sample
        samples = raw[:, -2:].copy().view("<i2")[:, 0].astype(np.int32)
    mono = samples.reshape(-1, channels).mean(axis=1)
    return np.rint(mono).astype("<i2").tobytes()


def resample(pcm: bytes, from_rate: int, to_rate: int) -> bytes:
    """pcm16 mono at ``from_rate`` Hz -> at ``to_rate`` Hz (libsoxr, high quality);
    equal rates return ``pcm`` as it is."""
    if from_rate == to_rate:
        return pcm
    import numpy as np
    import soxr

    x = np.frombuffer(pcm, dtype="<i2")
    return np.asarray(soxr.resample(x, from_rate, to_rate, quality="HQ"), dtype="<i2").tobytes()


class Rechunker:
    """Cuts pcm16 arriving in pieces of any sizes into ``chunk_ms`` chunks.

    A piece that ends inside a chunk (or inside a sample) keeps its tail for
    the next one; :meth:`flush` gives the whole samples left at the end.

    Raises:
        ValueError: ``chunk_ms`` gives less than one sample.
    """

    def __init__(self, *, sample_rate: int, chunk_ms: int) -> None:
        self.chunk_bytes = ms_to_bytes(chunk_ms, sample_rate)
        if self.chunk_bytes <= 0:
            raise ValueError(f"{chunk_ms=} ms at {sample_rate} Hz is less than one sample")
        self._pending = bytearray()

    def push(self, piece: bytes) -> list[bytes]:
        """The chunks ``piece`` completes, in order."""
        self._pending += piece
        size = self.chunk_bytes
        num_whole = len(self._pending) // size
        out = [bytes(self._pending[i * size : (i + 1) * size]) for i in range(num_whole)]
        del self._pending[: num_whole * size]
        return out

    def flush(self) -> bytes:
        """The whole samples left (shorter than a chunk; may be empty)."""
        whole = len(self._pending) - len(self._pending) % SAMPLE_BYTES
        rest = bytes(self._pending[:whole])
        self._pending.clear()
        return rest


def chunks(pcm: bytes | Iterable[bytes], *, sample_rate: int, chunk_ms: int) -> Iterator[bytes]:
    """``pcm`` (one buffer, or pieces of any sizes) in ``chunk_ms`` chunks; the
    last may be shorter (:class:`Rechunker`)."""
    rechunker = Rechunker(sample_rate=sample_rate, chunk_ms=chunk_ms)
    for piece in [pcm] if isinstance(pcm, (bytes, bytearray, memoryview)) else pcm:
        yield from rechunker.push(bytes(piece))
    if rest := rechunker.flush():
        yield rest


class WavSink:
    """Writes pcm16 mono to a WAV file as it comes: a callable ``sink(pcm)``
    (e.g. the ``on_audio`` of :meth:`bargein.client.realtime_client.RealtimeClient.talk`).

    Use it as a context manager, or :meth:`close` it: the WAV header gets its
    final length then.

    Attributes:
        path: the file.
        sample_rate: samples per second.
        num_samples: written so far.
    """

    def __init__(self, path: str | os.PathLike[str], sample_rate: int) -> None:
        self.path = os.fspath(path)
        self.sample_rate = sample_rate
        self.num_samples = 0
        self._wav: Any = wave.open(self.path, "wb")  # noqa: SIM115 - closed in close()
        self._wav.setnchannels(1)
        self._wav.setsampwidth(SAMPLE_BYTES)
        self._wav.setframerate(sample_rate)

    def __call__(self, pcm: bytes) -> None:
        self._wav.writeframes(pcm)
        self.num_samples += samples_in(pcm)

    @property
    def duration_ms(self) -> int:
        """Milliseconds written."""
        return self.num_samples * 1000 // self.sample_rate

    def close(self) -> None:
        """Finish the file (idempotent)."""
        self._wav.close()

    def __enter__(self) -> WavSink:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
