"""Words, punctuation, sentences and Piper's id layout, without espeak-ng."""

from __future__ import annotations

from bargein.voice.phonemes import (
    SpokenWord,
    Word,
    sentence_ids,
    sentences,
    split_words,
    spoken_words,
)

# a toy phoneme_id_map in Piper's shape (pad 0, BOS 1, EOS 2, space 3)
ID_MAP = {
    "_": (0,),
    "^": (1,),
    "$": (2,),
    " ": (3,),
    ",": (8,),
    ".": (10,),
    "?": (13,),
    "a": (14,),
    "b": (15,),
}


def test_words_carry_their_end_and_clause_mark() -> None:
    text = 'Hi,  you. "Yes?" ok-ish e.g. 3.5 ...'
    assert split_words(text) == [
        Word("Hi,", 3, ","),
        Word("you.", 9, "."),
        Word('"Yes?"', 16, "?"),
        Word("ok-ish", 23, ""),
        Word("e.g.", 28, "."),
        Word("3.5", 32, ""),
        Word("...", 36, "."),
    ]


def test_offsets_count_code_points() -> None:
    text = "café 😀 naïve!"
    words = split_words(text)
    assert [text[: w.char_end] for w in words] == ["café", "café 😀", "café 😀 naïve!"]
    assert words[-1].punctuation == "!"


def test_words_without_phonemes_join_the_word_before() -> None:
    words = split_words("... wait — really ...")
    spoken = spoken_words(words, ["", "wˈeɪt", "", "ɹˈiəli", ""])
    assert spoken == [SpokenWord("wˈeɪt", 10, ""), SpokenWord("ɹˈiəli", 21, ".")]


def test_sentences_end_at_full_stops_questions_and_exclamations() -> None:
    words = [
        SpokenWord("a", 1, ","),
        SpokenWord("b", 3, "."),
        SpokenWord("a", 5, "?"),
        SpokenWord("b", 7, ""),
    ]
    assert sentences(words) == [words[:2], words[2:3], words[3:]]
    assert sentences([]) == []


def test_ids_are_bos_pad_then_each_symbol_and_pad_then_eos() -> None:
    ids = sentence_ids([SpokenWord("ab", 3, ","), SpokenWord("ba", 6, ".")], ID_MAP)
    #              ^  _  a   _  b   _  ,  _  ' ' _  b   _  a   _  .   _  $
    assert ids.ids == (1, 0, 14, 0, 15, 0, 8, 0, 3, 0, 15, 0, 14, 0, 10, 0, 2)
    # the first word ends after its comma's pad; the last owns the EOS
    assert ids.word_id_ends == (8, 17)


def test_unknown_phonemes_are_dropped_and_nfd_splits_accents() -> None:
    id_map = {**ID_MAP, "\u0303": (141,)}  # combining tilde
    ids = sentence_ids([SpokenWord("aãz", 3, "")], id_map)
    assert ids.ids == (1, 0, 14, 0, 14, 0, 141, 0, 2)
