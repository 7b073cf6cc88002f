"""Real speech for the voice tests: espeak-ng's own synthesizer, resampled by sox.

An independent voice (formant synthesis, not Piper) and an independent
resampler, so a test of our resampling or our models does not grade itself.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import numpy.typing as npt

from bargein.voice.audio import pcm16_to_float
from tests.needs import missing


def espeak_speech(text: str, rate: int = 16000) -> npt.NDArray[np.float32]:
    """``text`` spoken by espeak-ng (en-us), float32 mono ``[num_samples]`` at ``rate`` Hz."""
    for binary in ("espeak-ng", "sox"):
        if shutil.which(binary) is None:
            missing(f"{binary} is not installed: `make system-deps` installs Debian's {binary}")
    wav = subprocess.run(
        ["espeak-ng", "-v", "en-us", "--stdout", text], check=True, capture_output=True, timeout=30
    ).stdout
    raw = subprocess.run(
        [
            "sox",
            "-D",
            "-t",
            "wav",
            "-",
            "-t",
            "raw",
            "-r",
            str(rate),
            "-e",
            "signed",
            "-b",
            "16",
            "-c",
            "1",
            "-",
        ],
        input=wav,
        check=True,
        capture_output=True,
        timeout=30,
    ).stdout
    return pcm16_to_float(raw)


def silence(seconds: float, rate: int = 16000) -> npt.NDArray[np.float32]:
    """Digital silence, float32 ``[seconds * rate]``."""
    return np.zeros(round(seconds * rate), dtype=np.float32)


def white_noise(seconds: float, dbfs: float, rate: int = 16000, seed: int = 0) -> npt.NDArray[np.float32]:
    """Gaussian white noise whose RMS is ``dbfs`` dB below full scale, float32 ``[seconds * rate]``."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(round(seconds * rate)) * 10 ** (dbfs / 20)).astype(np.float32)
