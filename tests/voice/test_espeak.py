"""espeak-ng as a subprocess: one IPA line per word."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from bargein.voice.errors import VoiceUnavailable
from bargein.voice.espeak import Espeak
from tests.needs import missing


@pytest.fixture(scope="module")
def espeak() -> Espeak:
    try:
        return Espeak("en-us")
    except VoiceUnavailable as exc:
        missing(exc.reason)


def test_each_word_gets_its_ipa(espeak: Espeak) -> None:
    ipa = espeak.phonemize(["Hello", "there,", "world."])
    assert ipa == ["həlˈoʊ", "ðˈɛɹ", "wˈɜːld"]


def test_a_word_espeak_does_not_speak_is_empty(espeak: Espeak) -> None:
    assert espeak.phonemize(["one", "...", "—", "two"]) == ["wˈʌn", "", "", "tˈuː"]
    assert espeak.phonemize([]) == []


def test_a_word_espeak_splits_in_two_lines_is_asked_for_alone(espeak: Espeak) -> None:
    # an ellipsis character inside a word ends a clause: espeak answers two lines
    assert espeak.phonemize(["one…two", "three"]) == ["wˈʌn tˈuː", "θɹˈiː"]


def test_control_characters_do_not_shift_the_lines(espeak: Espeak) -> None:
    assert espeak.phonemize(["a\x00b\x0c", "three"])[1] == "θɹˈiː"


def test_a_sentence_takes_one_process(espeak: Espeak, monkeypatch: pytest.MonkeyPatch) -> None:
    # one espeak-ng process a sentence, never one a word (how long one takes:
    # loadtests/voice_models_bench.py)
    words = "The quick brown fox jumps over the lazy dog near the bank.".split()
    runs: list[int] = []
    run = espeak._run

    def counted(batch: Sequence[str]) -> list[str]:
        runs.append(len(batch))
        return run(batch)

    monkeypatch.setattr(espeak, "_run", counted)
    assert len(espeak.phonemize(words)) == len(words)
    assert runs == [len(words)]
