"""Text -> words -> Piper phoneme ids, keeping where each word's ids end.

Pure logic; the IPA of each word comes from :mod:`bargein.voice.espeak`.

A *word* is a run of non-space characters of the text. Its trailing clause
punctuation (``, . ? ! ; :``, the marks Piper's phonemizer keeps) is spoken as
that mark's id after the word's phonemes; a word espeak-ng gives no phonemes
(a dash, an ellipsis) joins the word before it. A word ending in ``. ? !``
ends a sentence: each sentence is one id sequence, synthesized on its own, as
Piper does.

Piper's id layout (piper-phonemize, ``phonemes_to_ids``): BOS, PAD, then each
phoneme's ids followed by PAD, then EOS; phonemes are the code points of the
NFD-normalized IPA, and those missing from the voice's ``phoneme_id_map`` are
dropped.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

CLAUSE_PUNCTUATION = ",.?!;:"
SENTENCE_END = ".?!"
PAD, BOS, EOS, SPACE = "_", "^", "$", " "

_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class Word:
    """One run of non-space characters of a text.

    Attributes:
        text: the characters, as given to espeak-ng.
        char_end: code-point offset in the text just after the word.
        punctuation: the clause mark spoken after it: the last of
            ``CLAUSE_PUNCTUATION`` among its trailing non-alphanumeric
            characters (``'said."'`` -> ``"."``), or ``""``.
    """

    text: str
    char_end: int
    punctuation: str


@dataclass(frozen=True)
class SpokenWord:
    """A word with its IPA (non-empty), punctuation and end offset in the text."""

    phonemes: str
    char_end: int
    punctuation: str


@dataclass(frozen=True)
class SentenceIds:
    """The ids of one sentence and, per word, how many of them it spans.

    Attributes:
        ids: Piper phoneme ids, BOS ... EOS.
        word_id_ends: per word, the index just after its last id (its
            phonemes, its punctuation and the PAD after them); the last word's
            is ``len(ids)``: it owns the EOS, so it ends where the audio does.
    """

    ids: tuple[int, ...]
    word_id_ends: tuple[int, ...]


def split_words(text: str) -> list[Word]:
    """The words of ``text`` in order (``"Hi, you."`` -> ``Hi,`` and ``you.``)."""
    words = []
    for match in _WORD.finditer(text):
        token = match.group()
        words.append(Word(text=token, char_end=match.end(), punctuation=_trailing_mark(token)))
    return words


def _trailing_mark(token: str) -> str:
    """The last clause mark among ``token``'s trailing non-alphanumeric characters, or ``""``."""
    stem = len(token)
    while stem and not token[stem - 1].isalnum():
        stem -= 1
    marks = [c for c in token[stem:] if c in CLAUSE_PUNCTUATION]
    return marks[-1] if marks else ""


def spoken_words(words: Sequence[Word], phonemes: Sequence[str]) -> list[SpokenWord]:
    """Pair ``words`` with their IPA, folding words without phonemes into the word before.

    A folded word extends the previous word's ``char_end`` and, if it has one,
    replaces its punctuation (``"wait ..."`` ends in ``"."``); folded words
    before the first spoken word are dropped.
    """
    if len(words) != len(phonemes):
        raise ValueError(f"{len(words)} words but {len(phonemes)} phoneme strings")
    spoken: list[SpokenWord] = []
    for word, ipa in zip(words, phonemes):
        ipa = ipa.strip()
        if ipa:
            spoken.append(SpokenWord(ipa, word.char_end, word.punctuation))
        elif spoken:
            last = spoken[-1]
            spoken[-1] = SpokenWord(last.phonemes, word.char_end, word.punctuation or last.punctuation)
    return spoken


def sentences(words: Sequence[SpokenWord]) -> list[list[SpokenWord]]:
    """``words`` cut after each word whose punctuation ends a sentence (``. ? !``)."""
    groups: list[list[SpokenWord]] = [[]]
    for word in words:
        groups[-1].append(word)
        if word.punctuation and word.punctuation in SENTENCE_END:
            groups.append([])
    return [g for g in groups if g]


def sentence_ids(words: Sequence[SpokenWord], id_map: Mapping[str, Sequence[int]]) -> SentenceIds:
    """Piper ids of one sentence: BOS PAD, words apart by SPACE PAD, each phoneme then PAD, EOS.

    Args:
        words: the sentence's words, at least one.
        id_map: the voice's ``phoneme_id_map`` (phoneme -> its ids).
    """
    if not words:
        raise ValueError("a sentence has at least one word")
    pad = list(id_map[PAD])
    ids: list[int] = [*id_map[BOS], *pad]
    ends: list[int] = []
    for i, word in enumerate(words):
        symbols = unicodedata.normalize("NFD", word.phonemes) + word.punctuation
        if i:
            symbols = SPACE + symbols
        for symbol in symbols:
            if symbol in id_map:
                ids += [*id_map[symbol], *pad]
        ends.append(len(ids))
    ids += id_map[EOS]
    ends[-1] = len(ids)
    return SentenceIds(ids=tuple(ids), word_id_ends=tuple(ends))
