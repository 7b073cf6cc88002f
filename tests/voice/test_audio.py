"""PCM16 conversion, sample/ms arithmetic and the streaming resampler."""

from __future__ import annotations

import numpy as np
import pytest

from bargein.voice.audio import (
    INPUT_RATES,
    OUTPUT_RATES,
    Resampler,
    float_to_pcm16,
    ms_to_samples,
    pcm16_to_float,
    samples_to_ms,
)


def test_pcm16_round_trips_exactly() -> None:
    pcm = np.array([-32768, -1, 0, 1, 12345, 32767], dtype="<i2").tobytes()
    x = pcm16_to_float(pcm)
    assert x.dtype == np.float32
    assert x.min() == -1.0 and x.max() < 1.0
    assert float_to_pcm16(x) == pcm


def test_odd_byte_count_is_refused() -> None:
    with pytest.raises(ValueError, match="3 bytes"):
        pcm16_to_float(b"\x00\x01\x02")


def test_float_beyond_full_scale_is_clipped() -> None:
    out = np.frombuffer(float_to_pcm16(np.array([-2.0, 1.5, 0.5])), dtype="<i2")
    assert out.tolist() == [-32768, 32767, 16384]


def test_samples_and_ms() -> None:
    assert samples_to_ms(16000, 16000) == 1000
    assert samples_to_ms(23, 24000) == 0  # rounded down
    assert samples_to_ms(22050 * 3 + 22049, 22050) == 3999
    assert ms_to_samples(32, 16000) == 512
    assert ms_to_samples(1, 22050) == 22


def _tone(freq: float, rate: int, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(round(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _peak_hz(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * rate / len(x))


@pytest.mark.parametrize(("in_rate", "out_rate"), [(24000, 16000), (22050, 16000), (22050, 24000)])
def test_resampling_in_chunks_keeps_the_tone_and_the_length(in_rate: int, out_rate: int) -> None:
    x = _tone(440.0, in_rate)
    resampler = Resampler(in_rate, out_rate)
    # uneven chunks, as they come off a socket
    chunks = [resampler.process(c) for c in np.array_split(x, [7, 480, 1000, 1001, 9000])]
    out = np.concatenate([*chunks, resampler.flush()])
    assert out.dtype == np.float32
    assert abs(len(out) - len(x) * out_rate / in_rate) <= 1
    assert _peak_hz(out, out_rate) == pytest.approx(440.0, abs=2.0)
    assert np.max(np.abs(out)) == pytest.approx(0.5, abs=0.02)


def test_chunked_and_whole_resampling_agree() -> None:
    x = _tone(1000.0, 24000, 0.5)
    whole = Resampler(24000, 16000)
    expected = np.concatenate([whole.process(x), whole.flush()])
    chunked = Resampler(24000, 16000)
    got = np.concatenate([*(chunked.process(c) for c in np.array_split(x, 37)), chunked.flush()])
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_after_flush_a_new_stream_starts() -> None:
    x = _tone(300.0, 24000, 0.25)
    resampler = Resampler(24000, 16000)
    first = np.concatenate([resampler.process(x), resampler.flush()])
    second = np.concatenate([resampler.process(x), resampler.flush()])
    np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("rate", sorted({*INPUT_RATES, *OUTPUT_RATES}))
def test_equal_rates_pass_through(rate: int) -> None:
    x = _tone(200.0, rate, 0.1)
    resampler = Resampler(rate, rate)
    np.testing.assert_array_equal(resampler.process(x), x)
    assert resampler.flush().size == 0


def test_stereo_is_refused() -> None:
    with pytest.raises(ValueError, match="mono"):
        Resampler(16000, 16000).process(np.zeros((10, 2), dtype=np.float32))
