"""The words that make speech over an answer a real interruption (voice/interruption.py)."""

from __future__ import annotations

import pytest

from bargein.voice.interruption import Interruption, decide

CONFIG = Interruption()
ANSWER = "Once upon a time, a dragon slept under the mountain of gold."


@pytest.mark.parametrize(
    ("transcript", "reason"),
    [
        ("", "no_words"),
        (" ", "no_words"),
        ("[MUSIC]", "no_words"),
        ("(coughing)", "no_words"),
        ("*knocks*", "no_words"),
        ("♪ la la ♪", "no_words"),
        ("Mm-hmm.", "backchannel"),
        ("Mmmm hmm", "backchannel"),
        ("Uh-huh.", "backchannel"),
        ("Yeah, okay.", "backchannel"),
        ("Got it, right.", "backchannel"),
        ("Stop!", "backchannel"),  # one word: fewer than min_words
        ("a dragon slept", "echo"),
        ("Under the mountain.", "echo"),
    ],
)
def test_no_interruption(transcript: str, reason: str) -> None:
    decision = decide(transcript, config=CONFIG, still_speaking=False, spoken=ANSWER)
    assert not decision.real
    assert decision.reason == reason
    assert decision.transcript == transcript


@pytest.mark.parametrize(
    "transcript",
    [
        "Wait, stop.",
        "Tell me about dogs instead.",
        "Yeah, but what about Tuesday?",
        "No, the dragon was awake.",
    ],
)
def test_a_real_interruption_has_words_of_the_users_own(transcript: str) -> None:
    decision = decide(transcript, config=CONFIG, still_speaking=False, spoken=ANSWER)
    assert decision.real and decision.reason == "words"
    assert len(decision.words) >= CONFIG.min_words
    assert not set(decision.words) & {"yeah", "dragon", "the"}


def test_speech_that_goes_on_needs_one_word_of_its_own() -> None:
    assert decide("Stop", config=CONFIG, still_speaking=True).real
    assert not decide("Yeah", config=CONFIG, still_speaking=True).real
    assert not decide("[MUSIC]", config=CONFIG, still_speaking=True).real


def test_settings_change_the_rule() -> None:
    three = Interruption(min_words=3, backchannels=("no worries",))
    assert not decide("Stop it", config=three, still_speaking=False).real
    assert decide("Stop it now", config=three, still_speaking=False).real
    assert not decide("No worries!", config=three, still_speaking=False).real
    # a list replaces the default one: "yeah" is a word now
    assert decide("yeah yeah yeah", config=three, still_speaking=False).real


@pytest.mark.parametrize(
    "bad",
    [
        {"mode": "later"},
        {"min_words": 0},
        {"min_words": 17},
        {"max_pause_ms": 99},
        {"max_pause_ms": 2001},
        {"backchannels": ("",)},
        {"backchannels": ("!!",)},
        {"backchannels": ("x",) * 65},
    ],
)
def test_out_of_range_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="interruption"):
        Interruption(**bad)  # type: ignore[arg-type]


def test_the_protocol_bounds_are_the_settings_bounds() -> None:
    from bargein.protocol import _rules
    from bargein.voice import interruption

    assert _rules.INTERRUPTION_PAUSE_MS == (interruption.MIN_PAUSE_MS, interruption.MAX_PAUSE_MS)
    assert _rules.MAX_BACKCHANNELS == interruption.MAX_BACKCHANNELS
    assert _rules.MAX_BACKCHANNEL_CHARS == interruption.MAX_BACKCHANNEL_CHARS
    assert _rules.MAX_INTERRUPTION_WORDS == 16
