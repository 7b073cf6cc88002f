"""The output audio <-> text alignment: spoken text by a time, and where a barge-in cuts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bargein.voice.align import Alignment, estimate_word_ends
from bargein.voice.segment import Segmenter

#          0    5      12     19
TEXT = "Hello there, world. And more."


def two_segments() -> Alignment:
    alignment = Alignment()
    alignment.add_segment(start_ms=0, end_ms=1100, word_ends=[(5, 300), (12, 700), (19, 1000)])
    # a silence between the segments: 1100 to 1200
    alignment.add_segment(start_ms=1200, end_ms=2000, word_ends=[(23, 1500), (29, 1900)])
    return alignment


@pytest.mark.parametrize(
    ("ms", "spoken", "cut"),
    [
        (-5, 0, 0),
        (0, 0, 0),  # nothing heard yet
        (1, 0, 5),  # the first word in progress: kept whole
        (299, 0, 5),
        (300, 5, 5),  # "Hello" just ended; "there," has not started
        (301, 5, 12),
        (1000, 19, 19),
        (1150, 19, 19),  # in the silence between segments
        (1200, 19, 19),
        (1201, 19, 23),
        (1999, 29, 29),
        (10_000, 29, 29),
    ],
)
def test_spoken_text_and_cuts_at_word_boundaries(ms: float, spoken: int, cut: int) -> None:
    alignment = two_segments()
    assert alignment.text_end_at(ms) == spoken
    assert alignment.cut_at(ms) == cut
    assert TEXT[:cut] in ("", "Hello", "Hello there,", "Hello there, world.", TEXT[:23], TEXT)


def test_totals() -> None:
    alignment = two_segments()
    assert alignment.end_ms == 2000 and alignment.text_end == 29
    empty = Alignment()
    assert (empty.end_ms, empty.text_end, empty.text_end_at(100), empty.cut_at(100)) == (0.0, 0, 0, 0)
    empty.add_segment(start_ms=0, end_ms=250, word_ends=[])  # a blank segment: audio, no words
    assert (empty.end_ms, empty.text_end, empty.cut_at(100)) == (250, 0, 0)


def test_segments_must_come_in_order() -> None:
    alignment = two_segments()
    with pytest.raises(AssertionError):
        alignment.add_segment(start_ms=1500, end_ms=2500, word_ends=[(40, 2100)])  # overlaps the audio
    with pytest.raises(AssertionError):
        alignment.add_segment(start_ms=2000, end_ms=2500, word_ends=[(29, 2100)])  # text already spoken
    with pytest.raises(AssertionError):
        alignment.add_segment(start_ms=2000, end_ms=2500, word_ends=[(40, 2600)])  # past the segment


def test_estimated_word_ends_share_the_time_by_spoken_characters() -> None:
    # weights: "Hello" 5, "**big**" 3 (markup is not spoken), "world." 6
    assert estimate_word_ends(" Hello **big** world.", 10, 100.0, 1500.0) == [
        (16, 100.0 + 1400.0 * 5 / 14),
        (24, 100.0 + 1400.0 * 8 / 14),
        (31, 1500.0),
    ]
    assert estimate_word_ends("  ", 3, 0.0, 10.0) == []
    assert estimate_word_ends("** `", 0, 0.0, 10.0) == [(2, 10.0), (4, 10.0)]
    # the last word ends exactly at the end, whatever the float rounding
    assert estimate_word_ends("a b c", 0, 0.1, 0.3)[-1] == (5, 0.3)


texts = st.lists(
    st.sampled_from(["Hello", "world", " ", " ", ".", ",", "**", "3.5", "\n", "xxxxxxxxxxxxx"]), max_size=60
).map("".join)


@settings(max_examples=300)
@given(text=texts, data=st.data())
def test_streamed_segments_give_monotone_word_boundary_cuts(text: str, data: st.DataObject) -> None:
    """Segmenter -> estimated word ends -> alignment, with gaps and random segment durations."""
    segmenter = Segmenter(first_min_chars=3, min_chars=8, max_chars=20)
    alignment = Alignment()
    word_ends: set[int] = {0}
    segment_ends: set[int] = set()
    at_ms = 0.0
    for segment in segmenter.feed(text) + segmenter.flush():
        start_ms = at_ms + data.draw(st.sampled_from([0.0, 0.5, 40.0]))
        end_ms = start_ms + data.draw(st.floats(0.0, 3000.0))
        words = estimate_word_ends(segment.text, segment.start, start_ms, end_ms)
        alignment.add_segment(start_ms=start_ms, end_ms=end_ms, word_ends=words)
        word_ends |= {c for c, _ in words}
        segment_ends.add(segment.end)
        at_ms = end_ms
    assert alignment.text_end == len(text.rstrip())
    times = sorted(data.draw(st.lists(st.floats(-10.0, at_ms + 10.0), max_size=30)) + [at_ms])
    spoken = [alignment.text_end_at(ms) for ms in times]
    cuts = [alignment.cut_at(ms) for ms in times]
    assert spoken == sorted(spoken) and cuts == sorted(cuts)
    ends = sorted(word_ends)
    for s, c in zip(spoken, cuts, strict=True):
        assert s <= c <= alignment.text_end
        assert c in word_ends
        assert ends.index(c) - ends.index(s) <= 1  # at most the one word in progress more
        # a word's end: a space after it, or a segment cut in a word longer than max_chars
        assert c == 0 or not text[c - 1].isspace()
        assert c == 0 or c == len(text) or text[c].isspace() or c in segment_ends
    assert cuts[-1] == spoken[-1] == alignment.text_end  # all of it heard
