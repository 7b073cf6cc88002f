"""Splitting a response's text, as it streams in, into segments to speak.

A text-to-speech model speaks a sentence best as a whole, but waiting for
whole sentences delays the first audio. :class:`Segmenter` cuts the growing
text at sentence ends, at line breaks, and at clause punctuation once a
segment is long enough. The first segment of a response is a word or two:
it ends at the first word end once it holds a few characters, so the first
audio waits for two or three tokens and one short synthesis, not for a
clause (the rest of the answer is generated while it plays). A cut is made
only once the character after it is known ("3." may become "3.5", "Par" may
become "Paris"), so the segments never depend on how the text was chunked.

Segments carry offsets in code points of the response text and cover it
exactly, whitespace included: a segment starts with the whitespace that
followed the previous cut, and one may be blank (nothing to speak; the speaker
skips it). What is read aloud is :func:`speakable` of a segment's text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SENTENCE_END = ".!?…"
_CLOSERS = "\"')]}”’»"
_OPENERS = "\"'([{“‘«"
_CLAUSE = ",;:"  # a clause end when whitespace follows
_DASHES = "—–"  # em and en dash: a clause end wherever they stand
# Words that end with a period without ending the sentence (compared lower-case).
_ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "approx", "cf"})
_DOTTED = re.compile(r"(?:[^\W\d_]\.)+[^\W\d_]")  # e.g, i.e, U.S, a.m (before their final period)


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    """A piece of the response text to speak.

    Attributes:
        start: its first code point in the response text.
        end: one past its last code point (``text == response[start:end]``).
        text: the response text it covers (markup included: see :func:`speakable`).
    """

    start: int
    end: int
    text: str


class Segmenter:
    """Cuts one response's streaming text into :class:`Segment` s.

    Args:
        first_min_chars: the first segment is cut at the first word end (a
            word followed by whitespace) or clause boundary once it holds
            this many code points: a word or two ("Paris", "The capital",
            "I think"), for early first audio.
        first_max_chars: ... and at its last space once it would pass this
            many without a word end (a long word, a URL; within
            ``[first_min_chars, max_chars]``).
        min_chars: later segments are cut at a clause boundary once they hold this many.
        max_chars: no segment is longer: one that would be is cut at its last
            space (or, with none, at ``max_chars``).

    Sentence ends (``. ! ? …`` and closing quotes or brackets, then whitespace)
    and line breaks cut at any length; a period after an abbreviation, an
    initial, a dotted abbreviation or a list number does not end a sentence.

    Raises:
        ValueError: a bound below 0 (``max_chars`` below 1), or a minimum over ``max_chars``.
    """

    def __init__(
        self,
        *,
        first_min_chars: int = 4,
        first_max_chars: int = 16,
        min_chars: int = 60,
        max_chars: int = 200,
    ) -> None:
        if max_chars < 1:
            raise ValueError(f"{max_chars=} must be >= 1")
        if first_max_chars < 1:
            raise ValueError(f"{first_max_chars=} must be >= 1")
        if not 0 <= first_min_chars <= max_chars:
            raise ValueError(f"{first_min_chars=} must be in [0, {max_chars=}]")
        if not 0 <= min_chars <= max_chars:
            raise ValueError(f"{min_chars=} must be in [0, {max_chars=}]")
        self._first_min_chars = first_min_chars
        self._first_max_chars = max(first_min_chars, min(first_max_chars, max_chars))
        self._min_chars = min_chars
        self._max_chars = max_chars
        self._text = ""
        self._start = 0  # where the segment being built starts
        self._scan = 1  # the next cut position to consider (those before it were not cuts)
        self._finished = False

    @property
    def text(self) -> str:
        """The response text fed so far."""
        return self._text

    def feed(self, text: str) -> list[Segment]:
        """Appends ``text`` to the response; returns the segments now complete, in order."""
        assert not self._finished, "feed after flush"
        self._text += text
        return self._cut()

    def flush(self) -> list[Segment]:
        """The response ended: returns the rest of the text as its last segments."""
        assert not self._finished, "flush twice"
        self._finished = True
        segments = self._cut()
        if self._start < len(self._text):
            segments.append(self._emit(len(self._text)))
        return segments

    def _cut(self) -> list[Segment]:
        segments: list[Segment] = []
        t = self._text
        b = max(self._scan, self._start + 1)
        while True:
            if b - self._start > self._limit():
                segments.append(self._emit(self._forced_cut()))
                b = self._start + 1
                continue
            if b >= len(t):
                break  # a cut at b needs t[b]: wait for more text
            if self._is_cut(b):
                segments.append(self._emit(b))
                b = self._start + 1
            else:
                b += 1
        self._scan = b
        return segments

    def _emit(self, end: int) -> Segment:
        segment = Segment(start=self._start, end=end, text=self._text[self._start : end])
        self._start = end
        return segment

    def _is_cut(self, b: int) -> bool:
        """Whether to cut between ``text[b - 1]`` and ``text[b]`` (both known)."""
        t, s = self._text, self._start
        before, after = t[b - 1], t[b]
        if after == "\n" and not before.isspace():
            return True
        if after.isspace() and _ends_sentence(t, b):
            return True
        min_chars = self._first_min_chars if s == 0 else self._min_chars
        if b - s < min_chars:
            return False
        if s == 0 and after.isspace() and not before.isspace():
            return True  # the first segment: a word or two
        return (before in _CLAUSE and after.isspace()) or before in _DASHES

    def _limit(self) -> int:
        """The longest the segment being built may be."""
        return self._first_max_chars if self._start == 0 else self._max_chars

    def _forced_cut(self) -> int:
        """Where to cut a segment over its limit: before its last space in reach."""
        t, s, limit = self._text, self._start, self._limit()
        for w in range(s + limit, s, -1):
            if t[w].isspace() and not t[w - 1].isspace():
                return w
        return s + limit


def _ends_sentence(t: str, b: int) -> bool:
    """Whether ``t[:b]`` ends with a sentence end: terminal punctuation, then closers."""
    j = b
    while j > 0 and t[j - 1] in _CLOSERS:
        j -= 1
    if j == 0 or t[j - 1] not in _SENTENCE_END:
        return False
    if t[j - 1] != "." or (j > 1 and t[j - 2] in _SENTENCE_END):
        return True  # ! ? … and runs like "..." or "?!" always end one
    word_start = j - 1
    while word_start > 0 and not t[word_start - 1].isspace():
        word_start -= 1
    word = t[word_start : j - 1].lstrip(_OPENERS)
    if word.isdigit():  # "1. " at a line start numbers a list item
        return word_start > 0 and t[word_start - 1] != "\n"
    if len(word) == 1 and word.isalpha():  # an initial: "J. Smith"
        return False
    return word.lower() not in _ABBREVIATIONS and _DOTTED.fullmatch(word) is None


_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")  # [label](url) and ![alt](url)
_LINE_MARKUP = re.compile(r"(?m)^[ \t]*(?:#{1,6}|>+|[-+*])[ \t]+")  # heading, quote, bullet
_INLINE_MARKUP = re.compile(r"[*`~]|(?<!\w)_+|_+(?!\w)")  # emphasis, code, strike-through


def speakable(text: str) -> str:
    """The text to read aloud: ``text`` without Markdown markup.

    Links and images keep their label, headings, quotes and bullets lose their
    marker, and ``*``, backticks, ``~`` and emphasis underscores go
    (``snake_case`` keeps its underscore). The result is for the speech model
    only: offsets (:class:`Segment`, the alignment) are in the original text.
    """
    text = _LINK.sub(r"\1", text)
    text = _LINE_MARKUP.sub("", text)
    return _INLINE_MARKUP.sub("", text)
