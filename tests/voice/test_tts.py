"""Piper: speech for a text, the time each word ends, the same every time."""

from __future__ import annotations

from typing import NoReturn

import numpy as np
import pytest

from bargein.voice.audio import Resampler
from bargein.voice.models import VoiceModels
from bargein.voice.tts import HOP_LENGTH, Speech, Synthesizer
from tests.voice.test_stt import words

pytestmark = pytest.mark.slow

TWO_SENTENCES = "Hello there, how are you today? I would like to book a table for two."


@pytest.fixture(scope="module")
def synthesizer(voice_models: VoiceModels) -> Synthesizer:
    return voice_models.synthesizer


@pytest.fixture(scope="module")
def two_sentences(synthesizer: Synthesizer) -> Speech:
    return synthesizer.synthesize(TWO_SENTENCES)


def test_each_word_ends_after_the_one_before(synthesizer: Synthesizer, two_sentences: Speech) -> None:
    speech = two_sentences
    assert synthesizer.sample_rate == 22050
    assert speech.audio.dtype == np.int16 and speech.audio.ndim == 1
    spoken = [TWO_SENTENCES[: w.char_end].split()[-1] for w in speech.words]
    assert spoken == TWO_SENTENCES.split()  # one end per word, punctuation included
    assert speech.words[-1].char_end == len(TWO_SENTENCES)
    assert speech.words[-1].sample_end == len(speech.audio)
    sample_ends = [w.sample_end for w in speech.words]
    assert all(a < b for a, b in zip(sample_ends, sample_ends[1:]))
    assert all(end % HOP_LENGTH == 0 for end in sample_ends)


def test_word_durations_are_plausible(synthesizer: Synthesizer, two_sentences: Speech) -> None:
    ends = [0] + [w.sample_end for w in two_sentences.words]
    ms = [(b - a) * 1000 / synthesizer.sample_rate for a, b in zip(ends, ends[1:])]
    print("\nTTS word durations (ms):", " ".join(f"{w}={d:.0f}" for w, d in zip(TWO_SENTENCES.split(), ms)))
    assert all(100 <= d <= 1200 for d in ms)
    # the audio is speech-loud, not silence or clipping
    rms = np.sqrt(np.mean(two_sentences.audio.astype(np.float64) ** 2)) / 32768
    assert 0.02 < rms < 0.5


def test_the_same_text_gives_the_same_speech(synthesizer: Synthesizer, two_sentences: Speech) -> None:
    again = synthesizer.synthesize(TWO_SENTENCES)
    assert again.words == two_sentences.words
    np.testing.assert_array_equal(again.audio, two_sentences.audio)


class NoAudio:
    """Stands in for the model that makes the audio: running it fails the test."""

    def run(self, *args: object, **kwargs: object) -> NoReturn:
        raise AssertionError("the audio model ran: timing() is to run the durations model alone")


@pytest.mark.parametrize("text", [TWO_SENTENCES, "Wait ... what?", "In 1215, King John met them.", "..."])
def test_timing_gives_synthesis_length_and_word_ends_without_making_the_audio(
    synthesizer: Synthesizer, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    speech = synthesizer.synthesize(text)
    # The durations alone, far cheaper than the audio: how much is measured by
    # loadtests/voice_models_bench.py; here, that the audio model never runs.
    monkeypatch.setattr(synthesizer, "_session", NoAudio())
    timing = synthesizer.timing(text)
    assert (timing.num_samples, timing.words) == (len(speech.audio), speech.words)


@pytest.mark.parametrize("text", ["", "   ", "...", "— …"])
def test_nothing_to_say_gives_empty_speech(synthesizer: Synthesizer, text: str) -> None:
    speech = synthesizer.synthesize(text)
    assert speech.audio.size == 0 and speech.words == ()


def test_marks_alone_join_the_word_before(synthesizer: Synthesizer) -> None:
    text = "Wait ... what?"
    speech = synthesizer.synthesize(text)
    assert [w.char_end for w in speech.words] == [len("Wait ..."), len(text)]


REPORT = "Please send the weekly report to my manager before Friday, and call me tomorrow."


@pytest.fixture(scope="module")
def report(synthesizer: Synthesizer) -> Speech:
    return synthesizer.synthesize(REPORT)


def _hear(voice_models: VoiceModels, audio: np.ndarray) -> set[str]:
    """The words Whisper hears in Piper's int16 audio, resampled to 16 kHz."""
    resampler = Resampler(voice_models.synthesizer.sample_rate, 16000)
    x = audio.astype(np.float32) / 32768
    text = voice_models.transcriber.transcribe(np.concatenate([resampler.process(x), resampler.flush()]))
    print(f"\nheard: {text!r}")
    return words(text)


def test_round_trip_through_whisper(voice_models: VoiceModels, report: Speech) -> None:
    assert {"send", "weekly", "report", "manager", "friday", "call", "tomorrow"} <= _hear(
        voice_models, report.audio
    )


def test_audio_cut_at_a_word_end_holds_that_word_and_not_the_next(
    voice_models: VoiceModels, report: Speech
) -> None:
    ends = {REPORT[: w.char_end].split()[-1].strip(",."): w.sample_end for w in report.words}
    heard = _hear(voice_models, report.audio[: ends["report"]])
    assert "report" in heard and not heard & {"manager", "friday"}
    heard = _hear(voice_models, report.audio[: ends["Friday"]])
    assert {"manager", "friday"} <= heard and not heard & {"call", "tomorrow"}
