"""Smart Turn v3.2, the end-of-turn model: fed as pipecat feeds it, and telling a finished question from a pause."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import numpy as np
import pytest

from bargein.voice.end_of_turn import WINDOW_SAMPLES, last_window, smart_turn_model_path
from bargein.voice.models import VoiceModels
from tests.voice.speech import espeak_speech, piper_speech, silence


def pipecat_features() -> ModuleType:
    """pipecat's own numpy log-mel for Smart Turn (``_whisper_features.py``), the
    reference: loaded from its file, since the ``pipecat`` package itself does
    not import without its dependencies (installed ``--no-deps``)."""
    path = smart_turn_model_path().parent.parent / "_whisper_features.py"
    spec = importlib.util.spec_from_file_location("pipecat_whisper_features", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def voiced(text: str) -> np.ndarray:
    """``text`` spoken, trimmed to its voiced samples."""
    x = espeak_speech(text)
    loud = np.nonzero(np.abs(x) > 0.01)[0]
    return x[loud[0] : loud[-1] + 1]


def test_the_window_is_the_last_8_s_zero_padded_at_the_start() -> None:
    short = np.ones(16000, dtype=np.float32)
    window = last_window(short)
    assert window.shape == (WINDOW_SAMPLES,) and window.dtype == np.float32
    assert not window[: WINDOW_SAMPLES - 16000].any() and window[-16000:].all()
    long = np.arange(WINDOW_SAMPLES + 5, dtype=np.float32)
    assert (last_window(long) == long[5:]).all()


def test_the_features_are_pipecats_for_the_same_audio(voice_models: VoiceModels) -> None:
    audio = np.concatenate([silence(0.3), voiced("What is the capital of France?"), silence(0.1)])
    ours = voice_models.end_of_turn.features(audio)
    assert ours.shape == (1, 80, 800) and ours.dtype == np.float32
    reference = pipecat_features().compute_whisper_log_mel_features(last_window(audio), do_normalize=True)
    assert np.abs(ours[0] - reference).max() < 1e-3


@pytest.mark.parametrize(
    ("text", "pause_after", "complete"),
    [
        ("What is the capital of France?", None, True),
        ("My favorite color is dark green.", None, True),
        ("My favorite color is dark green.", "is", False),  # the pause mid-sentence
    ],
)
def test_a_finished_sentence_scores_complete_and_a_pause_mid_way_does_not(
    voice_models: VoiceModels, text: str, pause_after: str | None, complete: bool
) -> None:
    # the speech up to the pause (or all of it), then what the detector hears when it
    # scores: the prefix padding before, auto's short window (224 ms) of silence after
    speech = piper_speech(voice_models.synthesizer, text, pause_after=pause_after, pause_s=None)
    probability = voice_models.end_of_turn.probability(np.concatenate([silence(0.3), speech, silence(0.224)]))
    assert (probability >= 0.5) is complete, probability


def test_the_package_it_comes_in_is_never_imported(voice_models: VoiceModels) -> None:
    voice_models.end_of_turn.probability(silence(1.0))
    assert "pipecat" not in sys.modules


@pytest.mark.parametrize("seconds", [0.0, 0.5, 12.0])
def test_any_length_of_audio_is_scored(voice_models: VoiceModels, seconds: float) -> None:
    assert 0.0 <= voice_models.end_of_turn.probability(silence(seconds)) <= 1.0
