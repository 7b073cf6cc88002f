"""Echo cancellation (voice/echo.py): the playback reference and the input
clock as pure logic, then WebRTC's AEC3 on a simulated speaker echo of the
project's Piper voice (loadtests/echo_sim.py), judged by the real Silero VAD
and the default ``server_vad`` turn detector. Measured across delays and
levels, with CPU cost: loadtests/echo_bench.py (docs/perf/voice.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from bargein.voice.audio import pcm16_to_float
from bargein.voice.echo import (
    CLOCK_SLACK_MS,
    CLOCK_WINDOW_S,
    SAMPLE_RATE,
    EchoCanceller,
    EchoPath,
    InputClock,
    PlaybackReference,
    grid,
)
from bargein.voice.models import VoiceModels
from loadtests.echo_sim import USER, Scene, erle_db, piper_answer, simulate, turn_starts
from tests.speech import espeak_pcm16

T = 1000.0  # a wall time (monotonic s) to start at


def ramp(n: int) -> np.ndarray:
    """float32 [n]: distinct non-zero samples, to see where each one lands."""
    return ((np.arange(n) + 1) / (n + 1)).astype(np.float32)


def test_a_chunk_plays_from_when_it_was_sent_and_the_next_ones_back_to_back() -> None:
    ref = PlaybackReference()
    x = ramp(4800)  # 300 ms at 16 kHz
    ref.played(x[:1600], 16000, 0.0, T)
    ref.played(x[1600:3200], 16000, 100.0, T + 0.01)  # sent ahead of real time
    ref.played(x[3200:], 16000, 200.0, T + 0.02)
    start = grid(T)
    assert np.array_equal(ref.span(start - 100, 100), np.zeros(100, np.float32))
    assert np.array_equal(ref.span(start, 4800), x)
    assert np.array_equal(ref.span(start + 4800, 50), np.zeros(50, np.float32))


def test_a_chunk_sent_after_the_queue_ran_dry_starts_when_sent() -> None:
    ref = PlaybackReference()
    x = ramp(3200)
    ref.played(x[:1600], 16000, 0.0, T)  # plays T .. T + 0.1
    ref.played(x[1600:], 16000, 100.0, T + 0.3)  # an underrun: 200 ms of silence
    out = ref.span(grid(T), 8000)
    assert np.array_equal(out[:1600], x[:1600])
    assert not out[1600:4800].any()
    assert np.array_equal(out[4800:6400], x[1600:])


def test_a_pause_holds_what_was_queued_until_the_resume() -> None:
    ref = PlaybackReference()
    x = ramp(3200)
    ref.played(x, 16000, 0.0, T)  # queued: T .. T + 0.2
    ref.paused(T + 0.05)
    # while paused, what comes after the pause is not playing
    assert not ref.span(grid(T + 0.05), 1600).any()
    ref.played(ramp(800), 16000, 200.0, T + 0.1)  # sent during the pause: queued after the rest
    ref.resumed(T + 0.5)
    out = ref.span(grid(T), grid(1.0))
    assert np.array_equal(out[:800], x[:800])
    assert not out[800:8000].any()  # T + 0.05 .. T + 0.5: held
    assert np.array_equal(out[8000:10400], x[800:])
    assert np.array_equal(out[10400:11200], ramp(800))
    assert not out[11200:].any()


def test_a_chunk_sent_into_an_idle_pause_plays_at_the_resume() -> None:
    ref = PlaybackReference()
    ref.paused(T)
    ref.played(ramp(800), 16000, 0.0, T + 0.1)
    ref.resumed(T + 0.3)
    out = ref.span(grid(T), grid(0.5))
    assert not out[:4800].any()
    assert np.array_equal(out[4800:5600], ramp(800))


def test_a_cut_drops_what_was_not_played_and_the_next_answer_starts_when_sent() -> None:
    ref = PlaybackReference()
    x = ramp(16000)
    ref.played(x, 16000, 0.0, T)  # a second queued
    ref.ended(T + 0.25)  # a barge-in cuts it
    y = ramp(800)
    ref.played(y, 16000, 0.0, T + 0.5)  # the next answer
    out = ref.span(grid(T), grid(1.0))
    assert np.array_equal(out[:4000], x[:4000])
    assert not out[4000:8000].any()
    assert np.array_equal(out[8000:8800], y)
    assert not out[8800:].any()


def test_the_output_rate_is_resampled_as_one_stream_across_chunks() -> None:
    ref = PlaybackReference()
    t = np.arange(24000) / 24000
    tone = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)  # 1 s at 24 kHz
    for lo in range(0, 24000, 960):  # 40 ms chunks
        ref.played(tone[lo : lo + 960], 24000, lo / 24, T + lo / 24000 / 4)
    out = ref.span(grid(T), 16000)
    expected = (0.5 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)).astype(np.float32)
    # the libsoxr stream's last ~20 ms wait for more input (or a cut), the rest is the tone
    assert np.abs(out[160:15000] - expected[160:15000]).max() < 1e-3


def test_the_input_clock_ignores_jitter_but_follows_a_lasting_shift() -> None:
    clock = InputClock()
    rng = np.random.default_rng(0)
    n = 320  # 20 ms appends
    places = []
    for k in range(200):  # 4 s
        places.append(clock.place(n, T + (k + 1) * 0.02 + rng.uniform(0, 0.015)))
    offsets = {p - k * n for k, p in enumerate(places)}
    assert len(offsets) == 1  # jitter under the slack never moved it
    (offset,) = offsets
    assert abs(offset - grid(T)) <= grid(0.015)
    # the client's audio now arrives 60 ms later for good (its clock fell behind)
    late = [
        clock.place(n, T + (k + 1) * 0.02 + 0.06) for k in range(200, 200 + 2 * round(CLOCK_WINDOW_S * 50))
    ]
    moved = late[-1] - (len(places) + len(late) - 1) * n
    assert moved - offset > grid(CLOCK_SLACK_MS / 1000)


def test_without_a_reference_the_input_passes_untouched_and_unframed() -> None:
    path = EchoPath()
    x = ramp(333)
    assert np.array_equal(path.clean(x, T), x)
    assert not path.canceller.active


@pytest.mark.slow
def test_aec3_gives_back_the_input_8_ms_late_when_there_is_no_echo() -> None:
    rng = np.random.default_rng(0)
    canceller = EchoCanceller()
    near = (rng.standard_normal(3 * SAMPLE_RATE) * 0.1).astype(np.float32)
    out = []
    for lo in range(0, len(near), 330):  # appends that are no whole number of frames
        canceller.far(np.full(330, 1e-3, np.float32))  # a faint, unrelated reference
        out.append(canceller.near(near[lo : lo + 330]))
    out.append(canceller.flush())
    cleaned = np.concatenate(out)
    assert len(cleaned) == len(near)
    lags = range(0, 400)
    best = max(lags, key=lambda lag: float(np.dot(cleaned[lag:], near[: len(near) - lag])))
    assert best == 128
    assert not cleaned[:128].any()


@pytest.fixture(scope="module")
def answer(voice_models: VoiceModels) -> np.ndarray:
    """The spoken answer, float32 at 24 kHz (the session's output rate)."""
    return piper_answer(voice_models.synthesizer, 24000)


ROOMS = [(delay, gain) for delay in (50, 100, 150) for gain in (-10.0, -20.0)]


@pytest.mark.slow
@pytest.mark.parametrize(("delay_ms", "gain_db"), ROOMS)
def test_the_echo_starts_a_turn_raw_but_not_once_cancelled(
    voice_models: VoiceModels, answer: np.ndarray, delay_ms: int, gain_db: float
) -> None:
    path = EchoPath()
    run = simulate(answer, 24000, Scene(delay_ms=delay_ms, gain_db=gain_db), path.clean, path.played)
    assert turn_starts(voice_models.vad, run.mic), "the raw echo must start a turn, or this tests nothing"
    assert turn_starts(voice_models.vad, run.cleaned) == []
    quiet = EchoPath()  # the ERLE without the noise floor, which bounds it
    bare = simulate(
        answer, 24000, Scene(delay_ms=delay_ms, gain_db=gain_db, noise_dbfs=None), quiet.clean, quiet.played
    )
    erle = erle_db(bare.mic, bare.cleaned)
    print(f"{delay_ms} ms, {gain_db} dB: ERLE {erle:.1f} dB")
    assert erle >= 25.0


@pytest.mark.slow
@pytest.mark.parametrize(("delay_ms", "gain_db"), ROOMS)
def test_the_user_talking_over_the_echo_still_starts_a_turn_once_cancelled(
    voice_models: VoiceModels, answer: np.ndarray, delay_ms: int, gain_db: float
) -> None:
    user = pcm16_to_float(espeak_pcm16(USER, SAMPLE_RATE))
    voiced = np.nonzero(np.abs(user) > 0.01)[0]
    path = EchoPath()
    user_at_s = 3.0  # mid-answer, the echo at its loudest
    run = simulate(
        answer,
        24000,
        Scene(delay_ms=delay_ms, gain_db=gain_db),
        path.clean,
        path.played,
        user=user,
        user_at_s=user_at_s,
    )
    onset = (
        0.5 + user_at_s + voiced[0] / SAMPLE_RATE
    )  # the simulation's lead, then the user's first voiced sample
    starts = turn_starts(voice_models.vad, run.cleaned)
    assert len(starts) == 1
    assert onset <= starts[0] <= onset + 0.3
    speech = slice(round(onset * SAMPLE_RATE), round(onset * SAMPLE_RATE) + len(voiced))
    kept_db = 10 * np.log10(np.sum(run.cleaned[speech] ** 2) / np.sum(run.user[speech] ** 2))
    print(
        f"{delay_ms} ms, {gain_db} dB: turn {1000 * (starts[0] - onset):.0f} ms after the onset, user kept {kept_db:.1f} dB"
    )
    assert kept_db > -6.0


@pytest.mark.slow
def test_a_playback_pause_told_to_the_reference_keeps_the_echo_cancelled(
    voice_models: VoiceModels, answer: np.ndarray
) -> None:
    scene = Scene(delay_ms=100, gain_db=-10.0)
    told = EchoPath()
    run = simulate(
        answer,
        24000,
        scene,
        told.clean,
        told.played,
        pause=(3.0, 1.0),
        paused=told.paused,
        resumed=told.resumed,
    )
    assert turn_starts(voice_models.vad, run.cleaned) == []
    # untold, the reference runs on through the pause and the echo after it comes back
    untold = EchoPath()
    run = simulate(answer, 24000, scene, untold.clean, untold.played, pause=(3.0, 1.0))
    assert turn_starts(voice_models.vad, run.cleaned) != []


@pytest.mark.slow
def test_a_cut_answer_leaves_no_turn(voice_models: VoiceModels, answer: np.ndarray) -> None:
    path = EchoPath()
    run = simulate(
        answer,
        24000,
        Scene(delay_ms=100, gain_db=-10.0),
        path.clean,
        path.played,
        cut_s=4.0,
        ended=path.ended,
    )
    assert turn_starts(voice_models.vad, run.mic) != []
    assert turn_starts(voice_models.vad, run.cleaned) == []
