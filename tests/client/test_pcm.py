"""The Python client's audio helpers (client/pcm.py): WAV files in and out, resampling, chunks.

Test files are written by Debian's sox where a format matters (an independent
writer of 24-bit, 8-bit, stereo and 44.1 kHz WAV), and tones are checked by
their frequency and level after conversion.
"""

from __future__ import annotations

import shutil
import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest

from bargein.client.pcm import Rechunker, WavSink, chunks, duration_ms, read_wav, silence
from tests.needs import missing


def sox_tone(
    path: Path, *, rate: int, bits: int, channels: int, hz: float = 440.0, seconds: float = 1.0
) -> Path:
    """One second of a 440 Hz sine at half of full scale (-6 dBFS), written by sox."""
    if shutil.which("sox") is None:
        missing("sox is not installed (Debian's sox package)")
    encoding = "unsigned" if bits == 8 else "signed"
    subprocess.run(
        ["sox", "-D", "-n", "-r", str(rate), "-b", str(bits), "-e", encoding, "-c", str(channels), str(path)]
        + ["synth", "1", "sine", "440", "vol", "0.5"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return path


def tone_of(pcm: bytes, rate: int) -> tuple[float, float]:
    """(frequency in Hz by zero crossings, RMS as a fraction of full scale) of pcm16."""
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float64) / 32768
    x = x[rate // 10 : -rate // 10]  # past the resampler's edges
    crossings = np.count_nonzero(np.signbit(x[1:]) != np.signbit(x[:-1]))
    return crossings / 2 / (len(x) / rate), float(np.sqrt(np.mean(x**2)))


def wave_tone(path: Path, *, rate: int, width: int, channels: int) -> Path:
    """The same sine written by the stdlib ``wave`` (plain PCM header for any width,
    which sox writes only up to 16 bits): little-endian, ``width`` bytes a sample."""
    t = np.arange(rate) / rate
    x = np.rint(0.5 * np.sin(2 * np.pi * 440 * t) * 2 ** (8 * width - 1)).astype(np.int64)
    raw = (x[:, None] >> (8 * np.arange(width))) & 0xFF  # little-endian bytes of each sample
    frames = np.repeat(raw[:, None, :], channels, axis=1).astype(np.uint8).tobytes()
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(width)
        wav.setframerate(rate)
        wav.writeframes(frames)
    return path


@pytest.mark.parametrize(
    ("rate", "bits", "channels", "writer"),
    [
        (16000, 16, 1, "sox"),
        (44100, 16, 2, "sox"),
        (22050, 8, 1, "sox"),
        (48000, 24, 1, "wave"),
        (8000, 32, 2, "wave"),
    ],
)
def test_any_integer_wav_becomes_16_khz_mono_pcm16_of_the_same_sound(
    tmp_path: Path, rate: int, bits: int, channels: int, writer: str
) -> None:
    path = tmp_path / "tone.wav"
    if writer == "sox":
        sox_tone(path, rate=rate, bits=bits, channels=channels)
    else:
        wave_tone(path, rate=rate, width=bits // 8, channels=channels)
    pcm = read_wav(path, sample_rate=16000)
    assert abs(duration_ms(pcm, 16000) - 1000) <= 1
    hz, rms = tone_of(pcm, 16000)
    assert abs(hz - 440) < 3
    assert abs(rms - 0.5 / np.sqrt(2)) < (0.02 if bits == 8 else 0.005)


def test_a_16_khz_mono_file_is_read_as_it_is(tmp_path: Path) -> None:
    samples = np.arange(-800, 800, dtype="<i2") * 20
    with WavSink(tmp_path / "ramp.wav", 16000) as sink:
        sink(samples.tobytes())
    assert sink.duration_ms == 100 and sink.num_samples == 1600
    assert read_wav(tmp_path / "ramp.wav", sample_rate=16000) == samples.tobytes()
    with wave.open(str(tmp_path / "ramp.wav")) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate(), wav.getnframes()) == (
            1,
            2,
            16000,
            1600,
        )
    # and at 24 kHz, the same sound: 1.5 times the samples
    assert len(read_wav(tmp_path / "ramp.wav", sample_rate=24000)) == 2400 * 2


def test_what_is_not_an_integer_wav_is_refused_naming_the_file(tmp_path: Path) -> None:
    text = tmp_path / "notes.wav"
    text.write_text("not audio")
    with pytest.raises(ValueError, match="notes.wav.*is not a WAV file of integer PCM"):
        read_wav(text, sample_rate=16000)
    if shutil.which("sox") is None:
        missing("sox is not installed (Debian's sox package)")
    floats = tmp_path / "float.wav"
    subprocess.run(
        [
            "sox",
            "-n",
            "-r",
            "16000",
            "-e",
            "floating-point",
            "-b",
            "32",
            str(floats),
            "synth",
            "0.1",
            "sine",
            "440",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    with pytest.raises(ValueError, match="float.wav.*sox FILE -b 16 OUT.wav"):
        read_wav(floats, sample_rate=16000)
    extensible = sox_tone(
        tmp_path / "24bit.wav", rate=48000, bits=24, channels=1
    )  # what sox writes past 16 bits
    with pytest.raises(ValueError, match="24bit.wav"):
        read_wav(extensible, sample_rate=16000)
    with pytest.raises(FileNotFoundError):
        read_wav(tmp_path / "missing.wav", sample_rate=16000)


def test_chunks_cut_pieces_of_any_size_into_whole_chunks_and_keep_every_sample() -> None:
    pcm = np.arange(3200, dtype="<i2").tobytes()  # 200 ms at 16 kHz
    pieces = [pcm[i : i + 333] for i in range(0, len(pcm), 333)]  # odd sizes, some splitting a sample
    out = list(chunks(pieces, sample_rate=16000, chunk_ms=40))
    assert [len(c) for c in out[:-1]] == [1280] * (len(out) - 1)
    assert b"".join(out) == pcm
    assert list(chunks(pcm, sample_rate=16000, chunk_ms=40)) == out
    rechunker = Rechunker(sample_rate=24000, chunk_ms=20)
    assert rechunker.push(b"\x01") == [] and rechunker.flush() == b""  # half a sample is no sample
    with pytest.raises(ValueError, match="less than one sample"):
        Rechunker(sample_rate=16000, chunk_ms=0)


def test_silence_is_zeros_of_the_right_length() -> None:
    assert silence(250, 16000) == bytes(8000)
    assert duration_ms(silence(1500, 24000), 24000) == 1500
