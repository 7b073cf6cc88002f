"""Confirmed interruptions: is speech over the assistant's answer a real interruption?

In ``confirm`` mode (:class:`Interruption`), speech that starts over a spoken
answer only pauses its audio; once the speech ends, or has gone on for
``max_pause_ms``, its words decide (:func:`decide`):

- a **real interruption** has at least ``min_words`` words that are neither
  a backchannel ("mm-hm", "yeah", "okay") nor the assistant's own words
  heard back through the user's speaker (echo); speech still going on at
  ``max_pause_ms`` needs one such word, since the user is plainly not done;
- anything else (a cough, a knock, music: no words; a backchannel; the echo
  of the answer) is a **false interruption**: the answer's audio resumes
  from the paused millisecond.

The words are Whisper's transcript. Whisper writes what is not speech in
brackets or parentheses (``[MUSIC]``, ``(coughing)``, ``*sneezes*``), and
often a lone word or two for a noise it cannot place ("you", "Thank you.");
the bracketed ones are dropped, the rest is why ``min_words`` defaults to 2
(Pipecat's ``MinWordsInterruptionStrategy`` takes the same rule). The echo
test is in words, not audio: the server knows the text it spoke, so a word
it said in the last seconds before the pause is not the user's.

Pure: no audio, no model, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

InterruptionMode = Literal["immediate", "confirm"]
INTERRUPTION_MODES: tuple[InterruptionMode, ...] = ("immediate", "confirm")
# Backchannels: what a listener says to show they follow, not to take the
# floor (the usual English set; hyphens, repeated letters and case do not
# matter, see _normalized)
DEFAULT_BACKCHANNELS: tuple[str, ...] = (
    "mm-hm",
    "mhm",
    "mm",
    "hm",
    "hmm",
    "uh-huh",
    "uh",
    "um",
    "ah",
    "oh",
    "yeah",
    "yes",
    "yep",
    "okay",
    "ok",
    "right",
    "sure",
    "alright",
    "i see",
    "got it",
)
MIN_PAUSE_MS, MAX_PAUSE_MS = 100, 2000
MAX_BACKCHANNELS = 64
MAX_BACKCHANNEL_CHARS = 64

Reason = Literal["words", "backchannel", "no_words", "echo"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Interruption:
    """How speech over a spoken answer interrupts it (``turn_detection.interruption``).

    Attributes:
        mode: ``immediate``: the answer is interrupted the moment speech starts;
            ``confirm``: its audio pauses, and :func:`decide` says whether it
            is cut or resumes.
        min_words: words (not backchannels, not echo) that make an
            interruption real, >= 1.
        backchannels: phrases that never interrupt, matched whole and
            case-, punctuation- and hyphen-insensitively.
        max_pause_ms: the longest the answer stays paused before the words
            decide, in ms of the user's audio after its speech started,
            in [MIN_PAUSE_MS, MAX_PAUSE_MS].
    """

    mode: InterruptionMode = "confirm"
    min_words: int = 2
    backchannels: tuple[str, ...] = DEFAULT_BACKCHANNELS
    max_pause_ms: int = 500

    def __post_init__(self) -> None:
        if self.mode not in INTERRUPTION_MODES:
            raise ValueError(f"interruption.mode={self.mode!r} must be one of {list(INTERRUPTION_MODES)}")
        if not 1 <= self.min_words <= 16:
            raise ValueError(f"interruption.min_words={self.min_words} must be in [1, 16]")
        if not MIN_PAUSE_MS <= self.max_pause_ms <= MAX_PAUSE_MS:
            raise ValueError(
                f"interruption.max_pause_ms={self.max_pause_ms} must be in [{MIN_PAUSE_MS}, {MAX_PAUSE_MS}]"
            )
        if len(self.backchannels) > MAX_BACKCHANNELS:
            raise ValueError(f"interruption.backchannels: at most {MAX_BACKCHANNELS} phrases")
        for phrase in self.backchannels:
            if not 0 < len(phrase) <= MAX_BACKCHANNEL_CHARS or not _normalized(phrase):
                raise ValueError(
                    f"interruption.backchannels: {phrase!r} must hold a word, at most {MAX_BACKCHANNEL_CHARS} characters"
                )


@dataclass(frozen=True, slots=True)
class Decision:
    """What :func:`decide` made of the speech over an answer.

    Attributes:
        real: a real interruption (cut the answer) or a false one (resume it).
        reason: ``words``: enough words of the user's own; ``no_words``: none
            at all (noise, music, a cough); ``backchannel``: only backchannels
            (or too few words); ``echo``: its words are the answer's own.
        words: the user's own words counted (not backchannels, not echo).
        transcript: the text judged.
    """

    real: bool
    reason: Reason
    words: tuple[str, ...]
    transcript: str


# what Whisper writes for sounds that are not speech: [MUSIC], (coughing), *sigh*, ♪
_NON_SPEECH = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*|♪[^♪]*♪?")
_WORD = re.compile(r"[a-z0-9']+")


def _normalized(text: str) -> tuple[str, ...]:
    """Lowercase words, punctuation and hyphens dropped, repeated letters of
    a hum squeezed ("Mmm-hmm" -> "mm hm"), so spellings of one backchannel meet."""
    words = _WORD.findall(_NON_SPEECH.sub(" ", text.lower()).replace("-", " "))
    return tuple(re.sub(r"(.)\1{2,}", r"\1\1", w) if set(w) <= set("mh") else w for w in words)


def _without(words: tuple[str, ...], phrases: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
    """``words`` with every occurrence of any of ``phrases`` taken out (longest first)."""
    ordered = sorted({p for p in phrases if p}, key=len, reverse=True)
    kept: list[str] = []
    i = 0
    while i < len(words):
        match = next((p for p in ordered if words[i : i + len(p)] == p), None)
        if match is None:
            kept.append(words[i])
            i += 1
        else:
            i += len(match)
    return tuple(kept)


def decide(transcript: str, *, config: Interruption, still_speaking: bool, spoken: str = "") -> Decision:
    """Whether speech over an answer interrupts it.

    Args:
        transcript: the speech's words so far (Whisper's text).
        config: the session's interruption settings.
        still_speaking: the speech went on to ``max_pause_ms`` (one word of
            the user's own is then enough), rather than ending sooner.
        spoken: the answer's text heard in the seconds before the pause:
            words of it in ``transcript`` are echo, not the user.

    Returns:
        The decision, with the reason (see :class:`Decision`).
    """
    words = _normalized(transcript)
    if not words:
        return Decision(False, "no_words", (), transcript)
    backchannels = [_normalized(p) for p in config.backchannels]
    own = _without(words, backchannels)
    echo = set(_normalized(spoken))
    own = tuple(w for w in own if w not in echo)
    needed = 1 if still_speaking else config.min_words
    if len(own) >= needed:
        return Decision(True, "words", own, transcript)
    if _without(words, backchannels) and not own:
        return Decision(False, "echo", (), transcript)
    return Decision(False, "backchannel", own, transcript)


DEFAULT_INTERRUPTION = Interruption()  # bargein's protocol: speech over an answer is confirmed
IMMEDIATE_INTERRUPTION = Interruption(mode="immediate")  # OpenAI's: speech interrupts at once
