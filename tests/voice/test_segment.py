"""Segmenting a streaming response for speech: where it cuts, and that chunking never matters."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bargein.voice.segment import Segment, Segmenter, speakable


def segment_all(text: str, chunks: list[int] | None = None, **kwargs: int) -> list[str]:
    """The segments' texts for ``text`` fed in pieces of the given sizes (all at once by default)."""
    segmenter = Segmenter(**kwargs)
    out: list[Segment] = []
    at = 0
    for size in chunks or []:
        out += segmenter.feed(text[at : at + size])
        at += size
    out += segmenter.feed(text[at:])
    out += segmenter.flush()
    return [s.text for s in out]


def test_sentence_ends_cut_at_any_length_and_whitespace_leads_the_next_segment() -> None:
    assert segment_all("Hi! How are you? Fine. ") == ["Hi!", " How are you?", " Fine.", " "]


def test_a_boundary_waits_for_the_next_character() -> None:
    segmenter = Segmenter()
    assert segmenter.feed("Hello.") == []
    assert segmenter.feed(" W") == [Segment(start=0, end=6, text="Hello.")]
    assert segmenter.flush() == [Segment(start=6, end=8, text=" W")]


def test_a_decimal_split_across_chunks_is_not_a_sentence_end() -> None:
    segmenter = Segmenter(first_min_chars=200)  # sentence rules alone
    assert segmenter.feed("It costs 3.") == []
    assert segmenter.feed("5 dollars. Then") == [Segment(start=0, end=21, text="It costs 3.5 dollars.")]
    assert segment_all("I counted to 3. Then", first_min_chars=200) == ["I counted to 3.", " Then"]


@pytest.mark.parametrize(
    "text",
    [
        "Bring snacks, e.g. apples and pears",
        "Ask Dr. Who about it",
        "Written by J. R. R. Tolkien in the",
        "Made in the U.S. since then",
        "Cats vs. dogs and more",
        "1. First the list item",
        'He said "stop.',  # at the end: no whitespace follows yet, so it stays for the flush
    ],
)
def test_periods_that_end_no_sentence(text: str) -> None:
    assert segment_all(text, first_min_chars=200) == [text]


def test_closing_quotes_and_brackets_stay_with_their_sentence() -> None:
    assert segment_all('He said "stop." Then (see above). Then', first_min_chars=200) == [
        'He said "stop."',
        " Then (see above).",
        " Then",
    ]


def test_the_first_segment_is_cut_at_the_first_clause_after_first_min_chars() -> None:
    text = "Well, you know, it depends on the weather, the season, and on what you like to eat for lunch"
    assert segment_all(text, first_min_chars=12, min_chars=30) == [
        "Well, you know,",  # "Well," is too short for a first segment
        " it depends on the weather, the season,",  # 30 or more before a clause cut
        " and on what you like to eat for lunch",
    ]


def test_clause_punctuation_needs_whitespace_after_it_but_dashes_do_not() -> None:
    assert segment_all("It is 12:30 now, 3,000 people, well—maybe", first_min_chars=1, min_chars=1) == [
        "It",  # the first segment: a word
        " is 12:30 now,",
        " 3,000 people,",
        " well—",
        "maybe",
    ]


def test_line_breaks_cut_headings_and_list_items() -> None:
    text = "# Steps\n1. Open it.\n2. Close it\n\n- done"
    assert segment_all(text) == ["# Steps", "\n1. Open it.", "\n2. Close it", "\n\n- done"]


def test_a_segment_never_exceeds_max_chars_cutting_at_the_last_space() -> None:
    text = "one two three four five six seven eight nine ten"
    assert segment_all(text, first_min_chars=15, min_chars=15, max_chars=15) == [
        "one two three",
        " four five six",
        " seven eight",
        " nine ten",
    ]
    assert segment_all("x" * 25, first_min_chars=0, min_chars=0, max_chars=10) == [
        "x" * 10,
        "x" * 10,
        "x" * 5,
    ]


def test_flush_of_nothing_is_nothing() -> None:
    assert Segmenter().flush() == []
    assert segment_all("") == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_chars": 0}, "max_chars"),
        ({"first_min_chars": -1}, "first_min_chars"),
        ({"first_min_chars": 300, "max_chars": 200}, "first_min_chars"),
        ({"min_chars": 201, "max_chars": 200}, "min_chars"),
    ],
)
def test_bounds_are_checked(kwargs: dict[str, int], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Segmenter(**kwargs)


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("Some **bold** and *it* and `code`", "Some bold and it and code"),
        ("## Heading\n> quoted\n- item\n* item", "Heading\nquoted\nitem\nitem"),
        ("See [the docs](https://x.org/a_b) and ![a cat](c.png)", "See the docs and a cat"),
        ("_emphasis_ but snake_case and ~~gone~~", "emphasis but snake_case and gone"),
        ("-5 degrees, 3 * 4 #1", "-5 degrees, 3  4 #1"),
    ],
)
def test_speakable_drops_markup_but_not_words(text: str, spoken: str) -> None:
    assert speakable(text) == spoken


# Text made of the pieces the rules look at, so that every rule is exercised.
texts = st.lists(
    st.sampled_from(
        [
            "Hello",
            "world",
            "e.g.",
            "Dr.",
            "3.5",
            "3",
            ".",
            ",",
            ";",
            ":",
            "!",
            "?",
            "...",
            "—",
            '"',
            ")",
            "(",
            " ",
            " ",
            "\n",
            "\n\n",
            "#",
            "**",
            "1.",
            "a",
            "xxxxxxxxxxxxxxxxxxxxxx",
        ]
    ),
    max_size=80,
).map("".join)


@settings(max_examples=400)
@given(
    text=texts, data=st.data(), bounds=st.sampled_from([(12, 60, 200), (0, 0, 1), (1, 5, 9), (12, 20, 30)])
)
def test_segments_cover_the_text_and_do_not_depend_on_the_chunking(
    text: str, data: st.DataObject, bounds: tuple[int, int, int]
) -> None:
    first_min, min_chars, max_chars = bounds
    segmenter = Segmenter(first_min_chars=first_min, min_chars=min_chars, max_chars=max_chars)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=10)))
    segments: list[Segment] = []
    previous = 0
    for cut in [*cuts, len(text)]:
        new = segmenter.feed(text[previous:cut])
        # never cut before the character after the cut is known
        assert all(s.end < cut for s in new)
        segments += new
        previous = cut
    segments += segmenter.flush()
    assert "".join(s.text for s in segments) == text
    at = 0
    for s in segments:
        assert s.start == at < s.end <= at + max_chars
        assert s.text == text[s.start : s.end]
        at = s.end
    one_shot = Segmenter(first_min_chars=first_min, min_chars=min_chars, max_chars=max_chars)
    assert segments == one_shot.feed(text) + one_shot.flush()


@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("Paris is the capital of France.", "Paris"),  # one word of four or more characters
        ("The capital of France is Paris.", "The capital"),  # a short word takes the next one along
        ("I think it is Paris.", "I think"),
        ("Yes, it is.", "Yes,"),  # a clause end ends a word too
        ("Hi! How are you?", "Hi!"),  # a sentence end cuts at any length
        ("Sure", "Sure"),  # a one-word answer is its own first segment (flushed)
    ],
)
def test_the_first_segment_is_a_word_or_two(text: str, first: str) -> None:
    segments = segment_all(text)
    assert segments[0] == first
    assert "".join(segments) == text


def test_the_first_word_is_cut_the_moment_the_next_token_starts() -> None:
    """Token by token, as a model writes: the first segment goes to the
    synthesizer as soon as the token after its last word arrives, and not
    before (the word might go on: "Par" + "is")."""
    segmenter = Segmenter()
    assert segmenter.feed("Par") == []
    assert segmenter.feed("is") == []
    assert segmenter.feed(" is") == [Segment(start=0, end=5, text="Paris")]
    # the rest goes clause by clause, as before: not word by word
    assert segmenter.feed(" the capital of") == []
    assert segmenter.feed(" France. It") == [Segment(start=5, end=31, text=" is the capital of France.")]


def test_after_the_first_segment_cuts_wait_for_a_clause_or_a_sentence() -> None:
    segmenter = Segmenter(first_min_chars=12, first_max_chars=24, min_chars=60, max_chars=200)
    text = "The quick brown fox jumps over the lazy dog and keeps running far away"
    first = segmenter.feed(text)
    assert [s.text for s in first] == ["The quick brown"]  # the first word end at 12 characters or more
    rest = segmenter.flush()
    assert "".join(s.text for s in first + rest) == text
    assert len(rest) == 1  # later segments wait for a clause or a sentence end


def test_a_first_word_longer_than_first_max_chars_is_cut_there() -> None:
    assert segment_all("x" * 20 + " y", first_min_chars=4, first_max_chars=16) == ["x" * 16, "x" * 4 + " y"]
