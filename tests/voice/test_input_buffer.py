"""The input audio buffer: timeline offsets, cuts, and its bound."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bargein.voice.errors import InputAudioFull
from bargein.voice.input_buffer import InputAudioBuffer
from bargein.voice.turns import SpeechStarted, SpeechStopped, TurnDetection, TurnDetector

SR = 16000
PER_MS = SR // 1000


def ramp(start: int, n: int) -> np.ndarray:
    """Samples whose value is their timeline index (exact in float32 up to 2**24)."""
    return np.arange(start, start + n, dtype=np.float32)


def test_take_cuts_exact_samples_and_drops_what_precedes() -> None:
    buffer = InputAudioBuffer(max_ms=10_000)
    for start, n in [(0, 1000), (1000, 7), (1007, 30_000)]:  # 31,007 samples: 1937.9 ms
        buffer.append(ramp(start, n))
    assert buffer.total_ms == 1937 and buffer.duration_ms == 1937 and buffer.start_ms == 0
    turn = buffer.take(500, 1500)
    assert turn.dtype == np.float32
    np.testing.assert_array_equal(turn, ramp(500 * PER_MS, 1000 * PER_MS))
    assert buffer.start_ms == 1500
    assert buffer.duration_ms == 437
    assert buffer.total_ms == 1937  # the timeline is never shortened


def test_read_keeps_the_audio_and_take_after_it_gives_the_same() -> None:
    buffer = InputAudioBuffer(max_ms=10_000)
    buffer.append(ramp(0, 20 * PER_MS))
    peek = buffer.read(3, 17)
    assert buffer.duration_ms == 20
    np.testing.assert_array_equal(buffer.take(3, 17), peek)


def test_clear_drops_the_audio_but_not_the_timeline() -> None:
    buffer = InputAudioBuffer(max_ms=1_000)
    buffer.append(ramp(0, 800 * PER_MS))
    buffer.clear()
    assert buffer.duration_ms == 0 and buffer.total_ms == 800 and buffer.start_ms == 800
    buffer.append(ramp(800 * PER_MS, 900 * PER_MS))  # room again
    np.testing.assert_array_equal(buffer.take(800, 801), ramp(800 * PER_MS, PER_MS))


def test_appending_past_the_limit_is_refused_and_leaves_the_buffer_as_it_was() -> None:
    buffer = InputAudioBuffer(max_ms=1_000)
    buffer.append(ramp(0, 999 * PER_MS))
    with pytest.raises(InputAudioFull, match="max_input_audio_ms=1000") as refused:
        buffer.append(ramp(0, 2 * PER_MS))
    assert refused.value.limit_ms == 1000
    assert buffer.duration_ms == 999 and buffer.total_ms == 999
    buffer.append(ramp(999 * PER_MS, PER_MS))  # exactly the limit fits
    assert buffer.duration_ms == 1000
    buffer.trim_before(500)
    buffer.append(ramp(1000 * PER_MS, 500 * PER_MS))
    assert buffer.duration_ms == 1000 and buffer.start_ms == 500


def test_bounds_outside_the_held_audio_are_clamped() -> None:
    buffer = InputAudioBuffer(max_ms=1_000)
    buffer.append(ramp(0, 100 * PER_MS))
    buffer.trim_before(40)
    np.testing.assert_array_equal(buffer.read(0, 50), ramp(40 * PER_MS, 10 * PER_MS))
    assert buffer.read(200, 300).size == 0
    buffer.trim_before(10)  # before the start: nothing happens
    assert buffer.start_ms == 40
    assert buffer.take(0, 10_000).size == 60 * PER_MS
    assert buffer.duration_ms == 0


def test_other_rates_and_dtypes() -> None:
    buffer = InputAudioBuffer(max_ms=1_000, sample_rate=24000)
    buffer.append(np.zeros(24000 // 2, dtype=np.int16))  # converted to float32
    assert buffer.total_ms == 500
    assert buffer.take(0, 250).shape == (6000,)
    with pytest.raises(AssertionError):
        buffer.append(np.zeros((2, 10), dtype=np.float32))


def test_a_client_streaming_for_ever_without_a_turn_end_stays_bounded() -> None:
    """With server VAD the session trims to the detector's ``keep_from_ms`` after each frame."""
    params = TurnDetection(min_speech_ms=128)  # random one-frame clicks: two in a row are rare, four never
    detector = TurnDetector(params)
    buffer = InputAudioBuffer(max_ms=3_000)
    rng = np.random.default_rng(0)
    frame = 32 * PER_MS
    # ten minutes of background noise with clicks, then one 1.5 s turn
    probs = [0.9 if rng.random() < 0.05 else 0.1 for _ in range(10 * 60_000 // 32)]
    probs += [0.9] * 47 + [0.0] * 20
    turns = []
    for k, p in enumerate(probs):
        buffer.append(ramp(k * frame, frame))
        for event in detector.push(p):
            if isinstance(event, SpeechStarted):
                start = event.audio_start_ms
            elif isinstance(event, SpeechStopped):
                assert event.audio_start_ms == start
                turns.append((start, event.audio_end_ms, buffer.take(start, event.audio_end_ms)))
        buffer.trim_before(detector.keep_from_ms)
        assert buffer.duration_ms == detector.position_ms - detector.keep_from_ms
        if not detector.in_speech:  # the padding, and a click's frames
            assert buffer.duration_ms <= params.prefix_padding_ms + params.min_speech_ms
    (start, end, audio), *others = turns
    assert not others  # the clicks were no turns
    assert end - start == 1504 + 300
    np.testing.assert_array_equal(audio, ramp(start * PER_MS, (end - start) * PER_MS))


@settings(max_examples=200)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(0, 3000)),
            st.tuples(st.just("take"), st.integers(-50, 400), st.integers(0, 400)),
            st.tuples(st.just("trim"), st.integers(-50, 400)),
            st.tuples(st.just("clear")),
        ),
        max_size=30,
    )
)
def test_random_operations_match_slices_of_the_whole_timeline(ops: list[tuple]) -> None:
    buffer = InputAudioBuffer(max_ms=200)
    held = (0, 0)  # the held samples [lo, hi) of the timeline, as a reference
    for op in ops:
        lo, hi = held
        if op[0] == "append":
            if hi - lo + op[1] > 200 * PER_MS:
                with pytest.raises(InputAudioFull):
                    buffer.append(ramp(hi, op[1]))
            else:
                buffer.append(ramp(hi, op[1]))
                held = (lo, hi + op[1])
        elif op[0] == "take":
            start_ms, end_ms = op[1], op[1] + op[2]
            s = min(max(start_ms * PER_MS, lo), hi)
            e = min(max(end_ms * PER_MS, lo), hi)
            np.testing.assert_array_equal(buffer.take(start_ms, end_ms), ramp(s, e - s))
            held = (e, hi)
        elif op[0] == "trim":
            held = (min(max(op[1] * PER_MS, lo), hi), hi)
            buffer.trim_before(op[1])
        else:
            buffer.clear()
            held = (hi, hi)
        lo, hi = held
        assert (buffer.start_ms, buffer.total_ms, buffer.duration_ms) == (
            lo // PER_MS,
            hi // PER_MS,
            (hi - lo) // PER_MS,
        )
        np.testing.assert_array_equal(buffer.read(0, 10**6), ramp(lo, hi - lo))
