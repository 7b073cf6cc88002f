"""Whisper tiny.en: espeak-ng's speech comes back as its words; silence as nothing."""

from __future__ import annotations

import time

import numpy as np
import pytest

from bargein.voice.models import VoiceModels
from tests.voice.speech import espeak_speech, silence, white_noise

pytestmark = pytest.mark.slow


def words(text: str) -> set[str]:
    return {w.strip(".,?!").lower() for w in text.split()}


def test_a_sentence_is_transcribed(voice_models: VoiceModels) -> None:
    audio = espeak_speech("I would like to book a table for dinner tonight.")
    voice_models.transcriber.transcribe(audio[:16000])  # the first call warms the model up
    start = time.perf_counter()
    text = voice_models.transcriber.transcribe(audio)
    seconds = time.perf_counter() - start
    print(f"\nSTT: {seconds:.2f} s for {len(audio) / 16000:.1f} s of speech: {text!r}")
    assert {"book", "table", "dinner", "tonight"} <= words(text)
    assert text == text.strip()


@pytest.mark.parametrize(
    ("name", "audio"),
    [
        ("empty", np.zeros(0, dtype=np.float32)),
        ("silence", silence(2.0)),
        ("white noise at -40 dBFS", white_noise(2.0, dbfs=-40.0)),
        ("white noise at -20 dBFS", white_noise(2.0, dbfs=-20.0)),
    ],
)
def test_no_speech_gives_no_words(voice_models: VoiceModels, name: str, audio: np.ndarray) -> None:
    assert voice_models.transcriber.transcribe(audio) == ""


def test_speech_after_30_seconds_is_heard_too(voice_models: VoiceModels) -> None:
    audio = np.concatenate(
        [espeak_speech("The first part."), silence(30.0), espeak_speech("Please call me tomorrow morning.")]
    )
    text = voice_models.transcriber.transcribe(audio)
    assert {"first", "call", "tomorrow", "morning"} <= words(text)
