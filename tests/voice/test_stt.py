"""Whisper tiny.en: espeak-ng's speech comes back as its words; silence as nothing."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bargein.voice.models import VoiceModels
from tests.voice.speech import espeak_speech, silence, white_noise

pytestmark = pytest.mark.slow


def words(text: str) -> set[str]:
    return {w.strip(".,?!").lower() for w in text.split()}


def test_a_sentence_is_transcribed(voice_models: VoiceModels) -> None:
    audio = espeak_speech("I would like to book a table for dinner tonight.")
    text = voice_models.transcriber.transcribe(audio)  # how fast: loadtests/voice_models_bench.py
    print(f"\nSTT: {text!r}")
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


def test_transcribing_from_many_threads_leaves_no_openmp_team_behind(voice_models: VoiceModels) -> None:
    # libgomp keeps a team for each thread that ran a parallel region, as long
    # as it lives; each persistent thread that computed features with torch
    # used to add a worker thread to torch's libgomp, and past one worker per
    # CPU libgomp throttles the engine's spin (voice/stt.py)
    from concurrent.futures import ThreadPoolExecutor

    audio = espeak_speech("Good morning.")
    voice_models.transcriber.transcribe(audio)  # ctranslate2 starts its own threads once
    before = len(os.listdir("/proc/self/task"))
    pools = [ThreadPoolExecutor(max_workers=1) for _ in range(3)]  # threads that stay, like the voice pool's
    try:
        for pool in pools:
            assert pool.submit(voice_models.transcriber.transcribe, audio).result()
        assert len(os.listdir("/proc/self/task")) == before + len(pools)
    finally:
        for pool in pools:
            pool.shutdown()
