"""Client audio for tests and benchmarks: speech from Debian's espeak-ng,
silence, and white noise, as PCM16 bytes."""

from __future__ import annotations

import io
import shutil
import subprocess
import wave

import numpy as np

ESPEAK_MISSING = "espeak-ng is not installed (make install-dev installs it)"


def espeak_pcm16(text: str, rate: int, *, voice: str = "en-us", words_per_minute: int = 160) -> bytes:
    """``text`` spoken by espeak-ng, as mono PCM16 at ``rate`` Hz.

    Raises:
        FileNotFoundError: espeak-ng is not installed (``make install-dev``).
        subprocess.CalledProcessError: espeak-ng failed.
    """
    binary = shutil.which("espeak-ng")
    if binary is None:
        raise FileNotFoundError(ESPEAK_MISSING)
    wav = subprocess.run(
        [binary, "-v", voice, "-s", str(words_per_minute), "--stdout", text],
        check=True,
        capture_output=True,
    ).stdout
    with wave.open(io.BytesIO(wav)) as w:
        source_rate = w.getframerate()
        x = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float32) / 32768
    import soxr

    y = soxr.resample(x, source_rate, rate)
    return (np.clip(y, -1, 1) * 32767).astype("<i2").tobytes()


def silence_pcm16(ms: int, rate: int) -> bytes:
    """``ms`` of digital silence."""
    return bytes(2 * (rate * ms // 1000))


def noise_pcm16(ms: int, rate: int, *, dbfs: float, seed: int = 0) -> bytes:
    """``ms`` of white noise with an RMS level of ``dbfs`` dB below full scale."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(rate * ms // 1000) * 10 ** (dbfs / 20)
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()
