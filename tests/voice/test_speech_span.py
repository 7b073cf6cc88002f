"""The speech span: found from VAD frame probabilities, snapped to audible samples, cut with fixed margins."""

from __future__ import annotations

import numpy as np
import pytest

from bargein.voice.speech_span import SpanParams, cut_span, snap_span, speech_span
from bargein.voice.vad import FRAME_SAMPLES


def probs(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_the_span_runs_from_the_first_speech_frame_to_the_end_of_the_last() -> None:
    p = probs(0.1, 0.2, 0.6, 0.3, 0.9, 0.1)
    assert speech_span(p, 6 * FRAME_SAMPLES, 0.5) == (2 * FRAME_SAMPLES, 5 * FRAME_SAMPLES)


def test_a_frame_at_the_threshold_is_speech() -> None:
    assert speech_span(probs(0.5), FRAME_SAMPLES, 0.5) == (0, FRAME_SAMPLES)


def test_no_speech_frame_is_no_span() -> None:
    assert speech_span(probs(0.1, 0.49), 2 * FRAME_SAMPLES, 0.5) is None
    assert speech_span(probs(), 0, 0.5) is None


def test_a_partial_last_frame_ends_the_span_at_the_audio_end() -> None:
    assert speech_span(probs(0.1, 0.9), FRAME_SAMPLES + 100, 0.5) == (FRAME_SAMPLES, FRAME_SAMPLES + 100)


def test_the_cut_keeps_the_margin_from_the_buffer() -> None:
    audio = np.arange(1, 101, dtype=np.float32)
    out = cut_span(audio, (40, 60), 10)
    np.testing.assert_array_equal(out, np.arange(31, 71, dtype=np.float32))
    assert out.dtype == np.float32


def test_the_cut_fills_with_silence_where_the_buffer_is_short() -> None:
    audio = np.arange(1, 21, dtype=np.float32)
    out = cut_span(audio, (2, 18), 5)
    assert out.shape == (16 + 10,)
    np.testing.assert_array_equal(out[:3], [0, 0, 0])
    np.testing.assert_array_equal(out[3:23], audio)
    np.testing.assert_array_equal(out[23:], [0, 0, 0])


def test_a_zero_margin_is_the_span_itself() -> None:
    audio = np.arange(10, dtype=np.float32)
    np.testing.assert_array_equal(cut_span(audio, (3, 7), 0), audio[3:7])


def test_the_edges_snap_to_the_first_and_last_audible_sample_within_reach() -> None:
    audio = np.zeros(1000, dtype=np.float32)
    audio[380:620] = 0.1
    # the VAD's frames said 400..600: the speech starts 20 samples before and ends 20 after
    assert snap_span(audio, (400, 600), 0.01, 64) == (380, 620)


def test_snapping_only_reaches_so_far() -> None:
    audio = np.full(1000, 0.1, dtype=np.float32)  # noise above the level everywhere
    assert snap_span(audio, (400, 600), 0.01, 64) == (336, 664)
    assert snap_span(audio, (10, 990), 0.01, 64) == (0, 1000)  # clamped to the buffer


def test_snapping_moves_inward_to_audible_samples_inside_the_span() -> None:
    audio = np.zeros(1000, dtype=np.float32)
    audio[450:550] = -0.2
    assert snap_span(audio, (400, 600), 0.01, 64) == (450, 550)


def test_a_span_with_no_audible_sample_stays() -> None:
    audio = np.full(1000, 1e-4, dtype=np.float32)
    assert snap_span(audio, (400, 600), 0.01, 64) == (400, 600)


def test_the_same_speech_after_any_silence_is_cut_the_same() -> None:
    # what makes Whisper's input independent of the silence around the speech:
    # wherever the VAD's 32 ms frames fall, the snapped cut is the same samples
    rng = np.random.default_rng(0)
    speech = (rng.standard_normal(5000) * 0.1).astype(np.float32)
    cuts = []
    for lead in (0, 100, 1600, 4800, 8000):
        audio = np.concatenate([np.zeros(lead, np.float32), speech, np.zeros(3000, np.float32)])
        # a VAD that marks the frames overlapping the speech, but the first one late
        first = lead // FRAME_SAMPLES + 1
        last = (lead + speech.size - 1) // FRAME_SAMPLES
        p = np.zeros(-(-audio.size // FRAME_SAMPLES), np.float32)
        p[first : last + 1] = 0.9
        span = speech_span(p, audio.size, 0.5)
        assert span is not None
        cuts.append(cut_span(audio, snap_span(audio, span, 0.01, 2 * FRAME_SAMPLES), 3200))
    for cut in cuts[1:]:
        np.testing.assert_array_equal(cut, cuts[0])


@pytest.mark.parametrize(
    ("field", "value"),
    [("threshold", 0.0), ("threshold", 1.0), ("margin_ms", -1), ("audible_level", 0.0), ("reach_ms", -1)],
)
def test_params_are_checked(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SpanParams(**{field: value})


def test_params_in_samples() -> None:
    params = SpanParams(margin_ms=150, reach_ms=64)
    assert params.margin_samples == 2400
    assert params.reach_samples == 1024
