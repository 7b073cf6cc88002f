"""semantic_vad's turn policy on hand-built VAD probabilities and scripted end-of-turn scores."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bargein.voice.semantic_turns import (
    EAGERNESS,
    SemanticTurnDetection,
    SemanticTurnDetector,
)
from bargein.voice.turns import (
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TurnEvent,
)
from tests.voice.test_turns import FRAME_MS, SILENCE, SPEECH, frames


class Scores:
    """The end-of-turn model's stand-in: scripted probabilities, one per call, and what it was asked."""

    def __init__(self, *probabilities: float) -> None:
        self.script = list(probabilities)
        self.asked: list[tuple[int, int]] = []  # (start, position)
        self.paused_at: list[int] = []  # where the speech paused

    def __call__(self, start_ms: int, speech_end_ms: int, end_ms: int) -> float:
        self.asked.append((start_ms, end_ms))
        self.paused_at.append(speech_end_ms)
        return self.script.pop(0)


def run(detector: SemanticTurnDetector, probabilities: Sequence[float]) -> list[tuple[int, TurnEvent]]:
    """Every event with the timeline position (end of the frame) it was emitted at."""
    out: list[tuple[int, TurnEvent]] = []
    for p in probabilities:
        out.extend((detector.position_ms, e) for e in detector.push(p))
    return out


def up_to(events: list[tuple[int, TurnEvent]], kind: type) -> int:
    return next(at for at, e in events if isinstance(e, kind))


ONSET, SPOKEN = 640, 1024  # speech starts at 640 ms and lasts 1024 ms
END = ONSET + SPOKEN


def turn(silence_ms: int) -> list[float]:
    return [SILENCE] * frames(ONSET) + [SPEECH] * frames(SPOKEN) + [SILENCE] * frames(silence_ms)


@pytest.mark.parametrize("eagerness", ["low", "medium", "high", "auto"])
def test_a_complete_turn_ends_after_the_short_window_of_its_eagerness(eagerness: str) -> None:
    scores = Scores(0.9)
    detector = SemanticTurnDetector(SemanticTurnDetection(eagerness=eagerness), scores)  # type: ignore[arg-type]
    events = run(detector, turn(3200))
    start = ONSET - 300  # the prefix padding, as server_vad's
    short = EAGERNESS[eagerness].complete_silence_ms  # type: ignore[index]
    whole_frames = -(-short // FRAME_MS) * FRAME_MS  # a window closes at a frame boundary
    assert events == [
        (ONSET + 64, SpeechStarted(audio_start_ms=start)),
        # the pause (pause_ms = 96 ms: three silent frames), for a speculative answer
        (END + 96, SpeechPaused(audio_start_ms=start, audio_end_ms=END)),
        # scored when the short window closes: complete, the turn ends there
        (END + whole_frames, SpeechStopped(audio_start_ms=start, audio_end_ms=END)),
    ]
    # the model heard the turn from its start through the window's silence, once
    assert scores.asked == [(start, END + whole_frames)]
    assert scores.paused_at == [END]  # the turn's words end there (its end if it ends)
    assert not detector.in_speech and detector.turn_start_ms is None


def test_the_short_windows_and_maxima_follow_eagerness() -> None:
    order = ["high", "medium", "low"]
    assert [EAGERNESS[e].max_silence_ms for e in order] == [2000, 4000, 8000]  # OpenAI's
    shorts = [EAGERNESS[e].complete_silence_ms for e in order]
    assert shorts == sorted(shorts) and 150 <= shorts[0] and shorts[-1] <= 250
    assert EAGERNESS["auto"] == EAGERNESS["medium"]


@pytest.mark.parametrize("eagerness", ["low", "medium", "high"])
def test_an_incomplete_turn_waits_for_the_maximum_and_then_ends_regardless(eagerness: str) -> None:
    scores = Scores(0.1)
    detector = SemanticTurnDetector(SemanticTurnDetection(eagerness=eagerness), scores)  # type: ignore[arg-type]
    longest = EAGERNESS[eagerness].max_silence_ms  # type: ignore[index]
    events = run(detector, turn(-(-longest // FRAME_MS) * FRAME_MS + 640))
    # the pause, scored incomplete, then the end at the maximum
    assert [type(e) for _, e in events] == [SpeechStarted, SpeechPaused, SpeechStopped]
    stop_at = up_to(events, SpeechStopped)
    assert longest <= stop_at - END < longest + FRAME_MS
    assert events[-1][1] == SpeechStopped(audio_start_ms=ONSET - 300, audio_end_ms=END)
    assert len(scores.asked) == 1


def test_a_mid_sentence_pause_is_not_cut_and_the_turn_ends_after_its_second_half() -> None:
    # "I'd like to book a table for" ... 896 ms ... "two people": incomplete, then complete
    scores = Scores(0.05, 0.95)
    detector = SemanticTurnDetector(SemanticTurnDetection(), scores)
    first, gap, second = 1600, 896, 640
    probs = [SILENCE] * frames(320) + [SPEECH] * frames(first) + [SILENCE] * frames(gap)
    probs += [SPEECH] * frames(second) + [SILENCE] * frames(1024)
    events = run(detector, probs)
    kinds = [type(e) for _, e in events]
    assert kinds == [SpeechStarted, SpeechPaused, SpeechResumed, SpeechPaused, SpeechStopped]
    end = 320 + first + gap + second
    (_, stopped) = events[-1]
    assert stopped == SpeechStopped(audio_start_ms=20, audio_end_ms=end)  # one turn, both halves
    assert up_to(events, SpeechStopped) == end + 224
    # scored at each pause: the first half alone, then the whole turn
    assert scores.asked == [(20, 320 + first + 224), (20, end + 224)]


def test_speech_resuming_inside_the_short_window_goes_on_with_the_turn_unscored() -> None:
    scores = Scores(0.9)
    detector = SemanticTurnDetector(SemanticTurnDetection(), scores)
    probs = (
        [SPEECH] * frames(640) + [SILENCE] * frames(128) + [SPEECH] * frames(320) + [SILENCE] * frames(640)
    )
    events = run(detector, probs)
    kinds = [type(e) for _, e in events]
    # a pause (reported), the user goes on before the window closed: retracted, never scored
    assert kinds == [SpeechStarted, SpeechPaused, SpeechResumed, SpeechPaused, SpeechStopped]
    assert events[-1][1] == SpeechStopped(audio_start_ms=0, audio_end_ms=640 + 128 + 320)
    assert scores.asked == [(0, 640 + 128 + 320 + 224)]


def test_speech_resuming_after_an_incomplete_pause_goes_on_with_the_turn() -> None:
    scores = Scores(0.2, 0.2)
    detector = SemanticTurnDetector(SemanticTurnDetection(), scores)
    probs = (
        [SPEECH] * frames(640) + [SILENCE] * frames(1024) + [SPEECH] * frames(320) + [SILENCE] * frames(320)
    )
    kinds = [type(e) for _, e in run(detector, probs)]
    assert kinds == [SpeechStarted, SpeechPaused, SpeechResumed, SpeechPaused]  # no end
    assert detector.in_speech and len(scores.asked) == 2


def test_the_threshold_decides_and_is_inclusive() -> None:
    at = SemanticTurnDetector(SemanticTurnDetection(completion_threshold=0.7), Scores(0.7))
    below = SemanticTurnDetector(SemanticTurnDetection(completion_threshold=0.7), Scores(0.69))
    assert SpeechStopped in [type(e) for _, e in run(at, turn(640))]
    assert SpeechStopped not in [type(e) for _, e in run(below, turn(640))]


def test_a_reset_forgets_the_pending_end() -> None:
    detector = SemanticTurnDetector(SemanticTurnDetection(), Scores(0.9))
    run(detector, [SPEECH] * frames(640) + [SILENCE] * frames(128))
    detector.reset()
    assert run(detector, [SILENCE] * frames(1024)) == []
    assert detector.turn_start_ms is None


def test_the_next_turn_starts_after_the_one_that_ended() -> None:
    detector = SemanticTurnDetector(SemanticTurnDetection(), Scores(0.9, 0.9))
    first = run(detector, [SPEECH] * frames(640) + [SILENCE] * frames(320))
    second = run(detector, [SPEECH] * frames(640) + [SILENCE] * frames(320))
    stop_at = up_to(first, SpeechStopped)
    (_, started) = second[0]
    assert isinstance(started, SpeechStarted) and started.audio_start_ms >= stop_at


@pytest.mark.parametrize(
    "fields",
    [
        {"eagerness": "sometimes"},
        {"completion_threshold": 1.0},
        {"pause_ms": 0},
        {"pause_ms": 150},
    ],
)
def test_bad_settings_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SemanticTurnDetection(**fields)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    probs=st.lists(st.sampled_from([0.02, 0.3, 0.4, 0.6, 0.95]), max_size=400),
    scores=st.lists(st.floats(0, 1), min_size=400, max_size=400),
    eagerness=st.sampled_from(["low", "medium", "high", "auto"]),
)
def test_events_alternate_and_every_turn_ends_within_its_maximum(
    probs: list[float], scores: list[float], eagerness: str
) -> None:
    detector = SemanticTurnDetector(SemanticTurnDetection(eagerness=eagerness), Scores(*scores))  # type: ignore[arg-type]
    events = run(detector, probs)
    longest = EAGERNESS[eagerness].max_silence_ms  # type: ignore[index]
    in_turn, paused, last_start = False, False, -1
    for at, event in events:
        if isinstance(event, SpeechStarted):
            assert not in_turn and event.audio_start_ms >= last_start
            in_turn, paused, last_start = True, False, event.audio_start_ms
        elif isinstance(event, SpeechPaused):
            assert in_turn and not paused
            paused = True
        elif isinstance(event, SpeechResumed):
            assert in_turn and paused
            paused = False
        else:
            assert isinstance(event, SpeechStopped) and in_turn
            assert event.audio_end_ms < at <= event.audio_end_ms + longest + FRAME_MS
            in_turn, paused = False, False
