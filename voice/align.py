"""The alignment of one response's output audio with its text.

Each spoken segment adds its words: where each word ends in the response
text (code points) and in the response's output audio (milliseconds). From
that the server tells how much text was spoken by a point of the audio
(``response.audio.delta.text_end``), and where to cut the assistant turn when
the user interrupted after hearing ``audio_end_ms`` of it
(``response.cancel.audio_end_ms``).

A word spans from the end of the word before it (or its segment's audio
start) to its own end; the text between two words (spaces, punctuation
before a word) belongs to the word after it.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence

from bargein.voice.segment import speakable

_WORD = re.compile(r"\S+")


class Alignment:
    """Output audio <-> text of one response, built segment by segment in order.

    Offsets are code points of the response text; times are milliseconds of
    the response's output audio.
    """

    def __init__(self) -> None:
        self._char_ends: list[int] = []  # per word, strictly increasing
        self._start_ms: list[float] = []  # per word, where its audio starts
        self._end_ms: list[float] = []  # per word, where its audio ends, non-decreasing
        self._audio_end_ms = 0.0

    @property
    def end_ms(self) -> float:
        """The end of the output audio added so far (the last segment's end), ms."""
        return self._audio_end_ms

    @property
    def text_end(self) -> int:
        """The code points spoken by :attr:`end_ms`: the end of the last word added (0 before any)."""
        return self._char_ends[-1] if self._char_ends else 0

    def add_segment(self, *, start_ms: float, end_ms: float, word_ends: Sequence[tuple[int, float]]) -> None:
        """Adds the next spoken segment.

        Args:
            start_ms: where the segment's audio starts, ms; not before :attr:`end_ms`.
            end_ms: where it ends, ms (a trailing silence included).
            word_ends: ``(char_end, word_end_ms)`` per word in order: the word's
                end in the response text (after :attr:`text_end`, increasing) and
                in the audio (non-decreasing, within ``[start_ms, end_ms]``).
                Empty for a segment with nothing spoken.
        """
        assert self._audio_end_ms <= start_ms <= end_ms, f"{start_ms=}, {end_ms=} after {self._audio_end_ms=}"
        word_start_ms = start_ms
        for char_end, word_end_ms in word_ends:
            assert char_end > self.text_end, f"{char_end=} not after {self.text_end=}"
            assert word_start_ms <= word_end_ms <= end_ms, (
                f"{word_end_ms=} outside [{word_start_ms}, {end_ms}]"
            )
            self._char_ends.append(char_end)
            self._start_ms.append(word_start_ms)
            self._end_ms.append(word_end_ms)
            word_start_ms = word_end_ms
        self._audio_end_ms = end_ms

    def text_end_at(self, ms: float) -> int:
        """Code points of the text spoken by ``ms``: the end of the last word whose audio ended by then.

        0 before the first word ends; monotone in ``ms``; at most :attr:`text_end`.
        """
        done = bisect.bisect_right(self._end_ms, ms)
        return self._char_ends[done - 1] if done else 0

    def cut_at(self, ms: float) -> int:
        """Where to cut the assistant turn when the user heard the audio up to ``ms``.

        At a word end: the words heard in full, and the word in progress at
        ``ms`` (its audio started before ``ms``) too, since the user heard part
        of it. Monotone in ``ms``; never past :attr:`text_end`, the words spoken.
        """
        done = bisect.bisect_right(self._end_ms, ms)
        if done < len(self._end_ms) and self._start_ms[done] < ms:
            return self._char_ends[done]
        return self._char_ends[done - 1] if done else 0


def estimate_word_ends(text: str, char_start: int, start_ms: float, end_ms: float) -> list[tuple[int, float]]:
    """Word ends for a segment spoken from ``start_ms`` to ``end_ms`` without word timings.

    For a speech model that gives the audio only (Piper): the segment's time
    is shared among its words (whitespace-separated) in proportion to their
    :func:`~bargein.voice.segment.speakable` characters, a speaking rate
    constant in characters. A crude estimate, but cuts land on word
    boundaries all the same.

    Args:
        text: the segment's text (as in the response, markup included).
        char_start: where ``text`` starts in the response, code points.
        start_ms: where the segment's speech starts in the output audio, ms.
        end_ms: where it ends, ms.

    Returns:
        ``(char_end, word_end_ms)`` per word, as :meth:`Alignment.add_segment` takes them.
    """
    words = list(_WORD.finditer(text))
    weights = [len(speakable(w.group())) for w in words]
    total = sum(weights)
    out = []
    spoken = 0
    for word, weight in zip(words, weights, strict=True):
        spoken += weight
        # min(): the rounding of start + span * share must not pass end_ms
        at_ms = min(end_ms, start_ms + (end_ms - start_ms) * spoken / total) if spoken < total else end_ms
        out.append((char_start + word.end(), at_ms))
    return out
