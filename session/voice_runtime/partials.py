"""Partial transcripts: a turn's words so far, shown while the user speaks.

At each pause inside a turn the voice channel transcribes the audio so far
(Whisper hears the whole turn again: it has no streaming state) and shows
the text as ``input_audio.transcript`` with ``final: false``. Whisper
revises: the audio heard later changes its guess of earlier words, and a
pause's text often ends in a full stop the next words turn into a comma. So
a partial is shown only while it *extends* the last one shown (each partial
text starts with the previous one), with its trailing punctuation held back;
a guess that revises shown words is not sent, and the final transcript
(``final: true``) carries the turn's text whatever the partials said. On
OpenAI's endpoint each partial becomes the delta that extends the last
(``conversation.item.input_audio_transcription.delta``), so the deltas never
restate text and concatenate to the last partial.

Pure: no audio, no asyncio.
"""

from __future__ import annotations

# Held back at a partial's end: the next words may turn them into others.
_TRAILING = " \t\n.,;:!?\u2026-\u2013\u2014\"'"


def stable_text(text: str) -> str:
    """``text`` without what its next words may revise: trailing spaces and
    punctuation (``"I'd like a table for."`` -> ``"I'd like a table for"``)."""
    return text.strip().rstrip(_TRAILING)


class PartialTranscript:
    """The partial transcripts shown of one turn.

    Attributes:
        item_id: the user item the turn becomes.
        shown: the text of the last partial shown ("" before the first).
        num_skipped: guesses not shown because they revised shown words.
    """

    def __init__(self, item_id: str) -> None:
        self.item_id = item_id
        self.shown = ""
        self.num_skipped = 0

    def next(self, text: str) -> str | None:
        """The partial to show for a new guess of the turn so far, or None:
        nothing new (empty, the same words), or it revises what was shown.
        Each returned text starts with the one returned before it."""
        stable = stable_text(text)
        if len(stable) <= len(self.shown):
            return None
        if not stable.startswith(self.shown):
            self.num_skipped += 1
            return None
        self.shown = stable
        return stable
