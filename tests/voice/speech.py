"""Real speech for the voice tests: espeak-ng's own synthesizer, resampled by sox.

An independent voice (formant synthesis, not Piper) and an independent
resampler, so a test of our resampling or our models does not grade itself.
:func:`piper_speech` speaks with the project's Piper voice instead, where the
test needs a pause cut into a sentence at a word (Piper says where each
word ends).
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import numpy.typing as npt

from bargein.voice.audio import pcm16_to_float
from bargein.voice.tts import Synthesizer
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


def piper_speech(
    synthesizer: Synthesizer,
    text: str,
    *,
    pause_after: str | None = None,
    pause_s: float | None = 0.0,
    rate: int = 16000,
) -> npt.NDArray[np.float32]:
    """``text`` spoken by the project's Piper voice, float32 mono at ``rate`` Hz,
    trimmed to its voiced samples; with ``pause_after``, ``pause_s`` of silence
    cut into it after that word (``pause_s=None``: the speech ends there).

    The pause is cut into the whole sentence, not spoken as two: a text
    synthesizer speaks a fragment ("I'd like to book a table for") with the
    falling pitch of a finished sentence, while a speaker who pauses mid-way
    keeps the pitch of one that goes on, which is what an end-of-turn model hears.
    """
    if shutil.which("sox") is None:
        missing("sox is not installed: `make system-deps` installs Debian's sox")
    speech = synthesizer.synthesize(text)
    audio = speech.audio.astype(np.float32) / 32768
    if pause_after is not None:
        (cut,) = [
            w.sample_end for w, word in zip(speech.words, text.split(), strict=True) if word == pause_after
        ]
        rest = (
            []
            if pause_s is None
            else [np.zeros(round(pause_s * synthesizer.sample_rate)), _voiced(audio[cut:])]
        )
        audio = np.concatenate([_voiced(audio[:cut]), *rest]).astype(np.float32)
    resampled = subprocess.run(
        [
            "sox",
            "-t",
            "raw",
            "-r",
            str(synthesizer.sample_rate),
            "-e",
            "floating-point",
            "-b",
            "32",
            "-c",
            "1",
            "-",
        ]
        + ["-t", "raw", "-r", str(rate), "-e", "floating-point", "-b", "32", "-c", "1", "-"],
        input=audio.tobytes(),
        check=True,
        capture_output=True,
        timeout=30,
    ).stdout
    return _voiced(np.frombuffer(resampled, dtype=np.float32))


def _voiced(audio: npt.NDArray[np.float32], level: float = 0.01) -> npt.NDArray[np.float32]:
    """``audio`` from its first to its last sample louder than ``level``."""
    loud = np.nonzero(np.abs(audio) > level)[0]
    return audio[loud[0] : loud[-1] + 1] if loud.size else audio[:0]
