"""Turn detection: server_vad semantics on hand-built probability sequences, then properties."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bargein.voice.turns import (
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TurnDetection,
    TurnDetector,
    TurnEvent,
)

FRAME_MS = 32
SPEECH, SILENCE = 0.9, 0.05


def frames(ms: int) -> int:
    """Whole frames in ``ms`` (the tests use multiples of 32 ms where offsets matter)."""
    assert ms % FRAME_MS == 0
    return ms // FRAME_MS


def run(detector: TurnDetector, probabilities: Sequence[float]) -> list[tuple[int, TurnEvent]]:
    """Every event with the timeline position (end of the frame) it was emitted at."""
    out: list[tuple[int, TurnEvent]] = []
    for p in probabilities:
        out.extend((detector.position_ms, e) for e in detector.push(p))
    return out


def test_silence_never_starts_a_turn() -> None:
    detector = TurnDetector(TurnDetection(min_speech_ms=128))
    # just below the threshold: hysteresis only counts once speech started
    assert run(detector, [0.0, 0.2, 0.49, 0.3] * 500) == []
    assert not detector.in_speech
    assert detector.turn_start_ms is None


def test_one_second_of_speech_gives_started_paused_stopped_with_exact_offsets() -> None:
    detector = TurnDetector(TurnDetection(min_speech_ms=128))
    probs = [SILENCE] * frames(640) + [SPEECH] * frames(1024) + [SILENCE] * frames(1024)
    events = run(detector, probs)
    onset, end = 640, 640 + 1024
    assert events == [
        # min_speech_ms = 128: four frames after the onset
        (onset + 128, SpeechStarted(audio_start_ms=onset - 300)),
        # pause_ms = 200: the seventh silent frame (224 ms)
        (end + 224, SpeechPaused(audio_start_ms=onset - 300, audio_end_ms=end)),
        # silence_duration_ms = 500: the sixteenth silent frame (512 ms)
        (end + 512, SpeechStopped(audio_start_ms=onset - 300, audio_end_ms=end)),
    ]
    assert not detector.in_speech


def test_prefix_padding_is_clamped_at_the_first_frame() -> None:
    events = run(TurnDetector(TurnDetection(min_speech_ms=128)), [SILENCE] * 2 + [SPEECH] * 10)
    assert events == [(64 + 128, SpeechStarted(audio_start_ms=0))]
    later = TurnDetector(TurnDetection(min_speech_ms=128), start_ms=10_000)
    assert run(later, [SILENCE, SPEECH, SPEECH, SPEECH, SPEECH]) == [
        (10_000 + 160, SpeechStarted(audio_start_ms=10_000))
    ]


def test_started_is_emitted_while_in_speech_and_in_speech_follows() -> None:
    detector = TurnDetector(TurnDetection(min_speech_ms=128))
    assert run(detector, [SPEECH] * 3) == []
    assert not detector.in_speech
    assert detector.push(SPEECH) == [SpeechStarted(audio_start_ms=0)]
    assert detector.in_speech
    assert detector.turn_start_ms == 0


def test_a_click_shorter_than_min_speech_does_nothing() -> None:
    detector = TurnDetector(TurnDetection(min_speech_ms=128))
    click = [SILENCE] * 20 + [SPEECH] * frames(64) + [SILENCE] * 40
    assert run(detector, click * 5) == []
    # the same click long enough is a turn
    assert run(TurnDetector(TurnDetection(min_speech_ms=64)), click)[0][1] == SpeechStarted(
        audio_start_ms=640 - 300
    )


def test_a_short_pause_inside_speech_is_paused_then_resumed_and_no_stop() -> None:
    detector = TurnDetector(TurnDetection(min_speech_ms=128))
    probs = [SPEECH] * frames(512) + [SILENCE] * frames(320) + [SPEECH] * frames(512)
    events = [e for _, e in run(detector, probs)]
    assert events == [
        SpeechStarted(audio_start_ms=0),
        SpeechPaused(audio_start_ms=0, audio_end_ms=512),
        SpeechResumed(),
    ]
    assert detector.in_speech
    tail = run(detector, [SILENCE] * frames(512))
    assert [e for _, e in tail] == [
        SpeechPaused(audio_start_ms=0, audio_end_ms=512 + 320 + 512),
        SpeechStopped(audio_start_ms=0, audio_end_ms=512 + 320 + 512),
    ]


def test_probabilities_between_the_stop_and_start_thresholds_keep_speech_going() -> None:
    params = TurnDetection(min_speech_ms=128)
    assert params.stop_threshold == pytest.approx(0.35)
    detector = TurnDetector(params)
    hover = [0.36, 0.49, 0.4, 0.35]
    events = run(detector, [SPEECH] * 10 + hover * 50)
    assert [e for _, e in events] == [SpeechStarted(audio_start_ms=0)]
    assert detector.in_speech
    end = detector.position_ms
    # just below the stop threshold is silence
    events = run(detector, [0.34] * frames(512))
    assert [e for _, e in events] == [
        SpeechPaused(audio_start_ms=0, audio_end_ms=end),
        SpeechStopped(audio_start_ms=0, audio_end_ms=end),
    ]


def test_hysteresis_also_holds_while_a_turn_is_starting() -> None:
    # one frame over the threshold, then hovering: one candidate that becomes a turn
    events = run(TurnDetector(TurnDetection(min_speech_ms=128)), [SILENCE, SPEECH, 0.4, 0.4, 0.4])
    assert events == [(160, SpeechStarted(audio_start_ms=0))]


def test_hysteresis_zero_stops_at_the_threshold() -> None:
    detector = TurnDetector(TurnDetection(hysteresis=0.0))
    events = run(detector, [SPEECH] * 10 + [0.49] * frames(512))
    assert [type(e) for _, e in events] == [SpeechStarted, SpeechPaused, SpeechStopped]


def test_a_low_threshold_still_lets_speech_stop() -> None:
    params = TurnDetection(threshold=0.1)
    assert params.stop_threshold == pytest.approx(0.01)
    events = run(TurnDetector(params), [0.2] * 10 + [0.0] * frames(512))
    assert [type(e) for _, e in events] == [SpeechStarted, SpeechPaused, SpeechStopped]


def test_reset_drops_the_turn_silently_and_moves_the_clamp() -> None:
    detector = TurnDetector(TurnDetection(min_speech_ms=128))
    run(detector, [SPEECH] * 20)
    assert detector.in_speech
    detector.reset()
    assert not detector.in_speech and detector.turn_start_ms is None
    assert run(detector, [SILENCE] * frames(1024)) == []
    detector.reset(start_ms=5_000)  # e.g. after a clear that dropped a partial frame
    assert run(detector, [SPEECH] * 4) == [(5_000 + 128, SpeechStarted(audio_start_ms=5_000))]


def test_a_turn_never_reaches_back_into_the_previous_one() -> None:
    # padding longer than the silence window
    detector = TurnDetector(TurnDetection(prefix_padding_ms=2_000))
    probs = [SPEECH] * 10 + [SILENCE] * frames(512) + [SPEECH] * 10
    starts = [e for _, e in run(detector, probs) if isinstance(e, SpeechStarted)]
    assert starts == [SpeechStarted(audio_start_ms=0), SpeechStarted(audio_start_ms=320)]


def test_pause_and_stop_can_fall_on_one_frame() -> None:
    detector = TurnDetector(TurnDetection(pause_ms=490, silence_duration_ms=500))
    events = run(detector, [SPEECH] * 10 + [SILENCE] * frames(512))
    assert events[1:] == [
        (320 + 512, SpeechPaused(audio_start_ms=0, audio_end_ms=320)),
        (320 + 512, SpeechStopped(audio_start_ms=0, audio_end_ms=320)),
    ]


def test_keep_from_ms_never_drops_audio_a_turn_needs() -> None:
    detector = TurnDetector(TurnDetection(min_speech_ms=128))
    run(detector, [SILENCE] * 100)
    assert detector.keep_from_ms == 3200 - 300
    detector.push(SPEECH)  # a candidate: its padding must be kept
    assert detector.keep_from_ms == 3200 - 300
    run(detector, [SPEECH] * 100 + [SILENCE] * 10)
    assert detector.keep_from_ms == detector.turn_start_ms == 3200 - 300
    run(detector, [SILENCE] * 10)
    assert not detector.in_speech
    assert detector.keep_from_ms == detector.position_ms - 300
    # with a padding longer than the silence window, the end of the last turn is the floor
    long_padding = TurnDetector(TurnDetection(prefix_padding_ms=2_000))
    stops = [e for _, e in run(long_padding, [SPEECH] * 10 + [SILENCE] * 20) if isinstance(e, SpeechStopped)]
    assert long_padding.keep_from_ms == stops[0].audio_end_ms == 320


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("threshold", 0.0),
        ("threshold", 1.0),
        ("threshold", float("nan")),
        ("prefix_padding_ms", -1),
        ("silence_duration_ms", -1),
        ("min_speech_ms", -5),
        ("pause_ms", -1),
        ("pause_ms", 501),
        ("hysteresis", -0.1),
        ("hysteresis", 1.5),
    ],
)
def test_out_of_range_settings_are_refused_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        TurnDetection(**{field: value})  # type: ignore[arg-type]


def test_frame_ms_must_be_positive() -> None:
    with pytest.raises(ValueError, match="frame_ms"):
        TurnDetector(TurnDetection(min_speech_ms=128), frame_ms=0)


# A probability stream with runs, as a VAD gives: speech, silence and in-between.
runs = st.lists(
    st.tuples(st.sampled_from([0.0, 0.2, 0.34, 0.36, 0.49, 0.5, 0.9, 1.0]), st.integers(1, 25)),
    max_size=40,
).map(lambda rs: [p for p, n in rs for _ in range(n)])
params_st = st.builds(
    TurnDetection,
    threshold=st.sampled_from([0.3, 0.5, 0.8]),
    prefix_padding_ms=st.integers(0, 1000),
    silence_duration_ms=st.integers(99, 1000),
    min_speech_ms=st.integers(0, 300),
    pause_ms=st.integers(0, 99),
)


@settings(max_examples=300)
@given(params=params_st, frame_ms=st.sampled_from([10, 20, 32]), probs=runs)
def test_events_follow_the_turn_grammar_with_consistent_offsets(
    params: TurnDetection, frame_ms: int, probs: list[float]
) -> None:
    detector = TurnDetector(params, frame_ms=frame_ms)
    start: int | None = None  # the open turn's audio start
    paused = False
    previous_end = 0
    for p in probs:
        position = detector.position_ms + frame_ms
        for event in detector.push(p):
            match event:
                case SpeechStarted(audio_start_ms=s):
                    assert start is None, "two starts without a stop"
                    assert previous_end <= s <= position - max(params.min_speech_ms, frame_ms)
                    start = s
                case SpeechPaused(audio_start_ms=s, audio_end_ms=e):
                    assert start == s and not paused
                    assert position - e >= params.pause_ms and e % frame_ms == 0
                    paused = True
                case SpeechResumed():
                    assert start is not None and paused
                    paused = False
                case SpeechStopped(audio_start_ms=s, audio_end_ms=e):
                    assert start == s and paused, "a stop always follows its pause"
                    assert s < e
                    assert params.silence_duration_ms <= position - e < params.silence_duration_ms + frame_ms
                    start, paused, previous_end = None, False, e
        assert detector.in_speech == (start is not None)
        assert detector.turn_start_ms == start
        assert detector.keep_from_ms <= (position if start is None else start)


@settings(max_examples=200)
@given(probs=runs)
def test_no_frame_at_or_over_the_threshold_means_no_events(probs: list[float]) -> None:
    quiet = [min(p, 0.49) for p in probs]
    assert run(TurnDetector(TurnDetection(min_speech_ms=128)), quiet) == []


def test_the_default_starts_a_turn_after_two_voiced_frames_not_one() -> None:
    assert TurnDetection().min_speech_ms == 64
    click = [SILENCE] * 20 + [SPEECH] + [SILENCE] * 40
    assert run(TurnDetector(TurnDetection()), click * 5) == []
    word = [SILENCE] * 20 + [SPEECH] * 2 + [SILENCE] * 40
    assert run(TurnDetector(TurnDetection()), word)[0] == (
        20 * 32 + 64,
        SpeechStarted(audio_start_ms=640 - 300),
    )
