"""Silero VAD: speech is speech, silence and faint noise are not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bargein.voice.models import VoiceModels
from bargein.voice.vad import FRAME_SAMPLES, SAMPLE_RATE, VadStream
from tests.voice.speech import espeak_speech, silence, white_noise

pytestmark = pytest.mark.slow


def probabilities(stream: VadStream, audio: np.ndarray) -> np.ndarray:
    frames = audio[: len(audio) // FRAME_SAMPLES * FRAME_SAMPLES].reshape(-1, FRAME_SAMPLES)
    return np.array([stream.probability(f) for f in frames])


def test_speech_between_silences_is_found(voice_models: VoiceModels) -> None:
    speech = espeak_speech("The quick brown fox jumps over the lazy dog near the river bank.")
    audio = np.concatenate([silence(1.0), speech, silence(1.0)])
    probs = probabilities(voice_models.vad.stream(), audio)  # how fast: loadtests/voice_models_bench.py

    lead = SAMPLE_RATE // FRAME_SAMPLES  # frames in the first second
    voiced = probs[lead + 2 : lead + len(speech) // FRAME_SAMPLES - 2]
    print(f"VAD: speech > 0.5 in {np.mean(voiced > 0.5):.0%} of its frames")
    assert np.mean(voiced > 0.5) > 0.8
    assert probs[: lead - 1].max() < 0.5  # the silence before
    assert probs[-lead + 12 :].max() < 0.5  # the silence after, once the speech's tail has passed


@pytest.mark.parametrize(
    ("name", "audio"),
    [("silence", silence(3.0)), ("white noise at -40 dBFS", white_noise(3.0, dbfs=-40.0))],
)
def test_no_speech_stays_below_half(voice_models: VoiceModels, name: str, audio: np.ndarray) -> None:
    probs = probabilities(voice_models.vad.stream(), audio)
    print(f"\nVAD: {name}: max {probs.max():.3f}, mean {probs.mean():.3f}")
    assert probs.max() < 0.5


def test_streams_keep_their_own_state(voice_models: VoiceModels) -> None:
    speech = espeak_speech("Hello there, how are you?")
    frames = speech[: 20 * FRAME_SAMPLES].reshape(20, FRAME_SAMPLES)
    alone = probabilities(voice_models.vad.stream(), speech[: 20 * FRAME_SAMPLES])
    a, b = voice_models.vad.stream(), voice_models.vad.stream()
    interleaved = []
    for frame in frames:
        interleaved.append(a.probability(frame))
        b.probability(np.zeros(FRAME_SAMPLES, dtype=np.float32))
    np.testing.assert_allclose(interleaved, alone, atol=1e-6)
    a.reset()
    np.testing.assert_allclose(probabilities(a, speech[: 20 * FRAME_SAMPLES]), alone, atol=1e-6)


def test_a_frame_is_512_samples(voice_models: VoiceModels) -> None:
    with pytest.raises(ValueError, match="512"):
        voice_models.vad.stream().probability(np.zeros(480, dtype=np.float32))


def test_probabilities_match_silero_s_own_wrapper(voice_models: VoiceModels, tmp_path: Path) -> None:
    """The reference: silero-vad's OnnxWrapper on the same frames, in a subprocess
    (importing silero_vad sets torch's thread count for the whole process)."""
    speech = espeak_speech("Hello there, how are you?")
    audio = speech[: len(speech) // FRAME_SAMPLES * FRAME_SAMPLES]
    np.save(tmp_path / "audio.npy", audio)
    code = (
        "import sys, numpy as np, torch\n"
        "from silero_vad import load_silero_vad\n"
        "model = load_silero_vad(onnx=True)\n"
        "x = np.load(sys.argv[1]).reshape(-1, 512)\n"
        "print(' '.join(str(float(model(torch.from_numpy(f), 16000))) for f in x))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "audio.npy")], check=True, capture_output=True, text=True
    )
    expected = np.array([float(p) for p in done.stdout.split()])
    got = probabilities(voice_models.vad.stream(), audio)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert expected.max() > 0.5  # the reference heard speech: the comparison means something
