"""Test speech: :func:`loadtests.speech.espeak_pcm16`, skipped (failed in CI) without espeak-ng."""

from __future__ import annotations

import shutil

from loadtests import speech
from tests.needs import missing


def espeak_pcm16(text: str, rate: int, *, voice: str = "en-us", words_per_minute: int = 160) -> bytes:
    """``text`` spoken by espeak-ng, as mono PCM16 at ``rate`` Hz (:func:`loadtests.speech.espeak_pcm16`).

    Skips (fails in CI) when espeak-ng is not installed (``make install-dev``).
    """
    if shutil.which("espeak-ng") is None:
        missing(speech.ESPEAK_MISSING)
    return speech.espeak_pcm16(text, rate, voice=voice, words_per_minute=words_per_minute)
