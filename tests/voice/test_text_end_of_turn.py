"""The text end-of-turn model on the bundled chat model: a message cut where
people hesitate reads as unfinished, a whole one as finished."""

from __future__ import annotations

from pathlib import Path

import pytest

from bargein.engine.config import ModelConfig
from bargein.engine.model.loader import transformers_folder
from bargein.voice.text_end_of_turn import TextEndOfTurnModel
from loadtests.voice_utterances import PAUSED, QUESTIONS

THRESHOLD = 0.05  # EndOfTurnScorer's text_threshold


@pytest.fixture(scope="module")
def model() -> TextEndOfTurnModel:
    return TextEndOfTurnModel(Path(transformers_folder(ModelConfig())))


def test_no_sentence_cut_at_its_pause_reads_as_finished(model: TextEndOfTurnModel) -> None:
    scores = {head: model.probability(head) for head, _ in PAUSED}
    assert max(scores.values()) < THRESHOLD, scores


def test_whole_sentences_and_questions_read_as_finished(model: TextEndOfTurnModel) -> None:
    whole = [f"{head} {tail}" for head, tail in PAUSED] + list(QUESTIONS)
    unfinished = [text for text in whole if model.probability(text) < THRESHOLD]
    # one known miss: "I was wondering whether you could help me plan a trip" (0.004)
    assert len(unfinished) <= 1, unfinished


def test_a_transcript_is_read_by_its_words_not_its_punctuation(model: TextEndOfTurnModel) -> None:
    assert model.probability("Can you tell me the way to.") == model.probability("Can you tell me the way to")
    assert model.probability("") == model.probability(" ... ") == 0.0
