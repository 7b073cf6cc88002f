"""What the voice benchmark's clients say: complete questions, and sentences
with a pause in the middle (the mid-sentence-pause set).

The complete questions are spoken by espeak-ng (:mod:`loadtests.speech`).
The mid-sentence-pause set is 30 sentences cut in two where a speaker
hesitates ("I'd like to book a table for... two people at seven"), each half
spoken separately and joined by a pause of 400 to 900 ms of digital silence,
measured between audible samples (the voices' own leading and trailing
silence, below -55 dBFS, is trimmed first, so the pause is the one listed). Two
voices speak them, alternating: bargein's own synthesizer (Piper's
``en_US-joe-medium``, :mod:`bargein.voice.tts`) and espeak-ng's ``en-us``
formant voice. A turn detector that ends the turn inside the pause cuts the
user off.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import soxr

from bargein.voice.tts import Synthesizer
from loadtests.speech import espeak_pcm16

VOICED = 500  # |sample| above this (of 32767, about -36 dBFS) counts as voiced: the marks
AUDIBLE = 60  # ... above this (about -55 dBFS) is kept when a half is trimmed: no word loses a sound
QUESTIONS = (
    "What is the capital of France?",
    "How far away is the moon?",
    "Can you name three kinds of trees?",
    "Why is the sky blue?",
    "What should I cook for dinner tonight?",
    "How many legs does a spider have?",
)
BARGE = "Wait, stop, tell me something else."
# (before the pause, after it): the pause falls where people hesitate: after
# a preposition, an article, a conjunction, or mid-list.
PAUSED = (
    ("I'd like to book a table for", "two people at seven."),
    ("Can you tell me the way to", "the nearest train station?"),
    ("What's the weather going to be like in", "Paris tomorrow?"),
    ("I need to buy some milk, eggs and", "a loaf of bread."),
    ("Could you remind me to call my", "sister this evening?"),
    ("How long does it take to boil an", "egg properly?"),
    ("My favourite kind of music is", "jazz from the fifties."),
    ("Please set an alarm for", "six thirty in the morning."),
    ("I was wondering whether you could", "help me plan a trip."),
    ("What is the difference between a", "crocodile and an alligator?"),
    ("Tell me a short story about a", "dragon who loves books."),
    ("I think the best way to learn", "a language is to speak it."),
    ("Can you recommend a good book about", "the history of Rome?"),
    ("The meeting tomorrow starts at", "nine in the conference room."),
    ("How many minutes are there in", "a whole week?"),
    ("I'd like to order a large pizza with", "mushrooms and olives."),
    ("What should I pack for a week in", "the mountains?"),
    ("Could you explain how a", "rainbow forms?"),
    ("I'm looking for a recipe that uses", "chicken and rice."),
    ("Is it going to rain in", "London this weekend?"),
    ("Remind me what the capital of", "Australia is."),
    ("I want to send a message to", "my friend Anna."),
    ("What time does the museum", "open on Sundays?"),
    ("Can you translate good morning into", "Spanish for me?"),
    ("How do I get from the airport to", "the city centre?"),
    ("I have a question about the", "train times to Berlin."),
    ("Which planet is the", "closest to the sun?"),
    ("Let's plan a picnic for", "Saturday afternoon."),
    ("Could you play some music by", "the Beatles?"),
    ("How much water should I drink", "every day?"),
)
PAUSE_MS_RANGE = (400, 900)


@dataclass(frozen=True, slots=True)
class Utterance:
    """One spoken utterance of the benchmark.

    Attributes:
        text: what is said (with ``...`` where the pause is).
        voice: ``piper`` or ``espeak``.
        pcm: mono PCM16 at the benchmark's input rate.
        end_sample: the last voiced sample (the user finished here).
        pause_sample: the last sample before the pause; None: no pause.
        pause_ms: the silence between the halves' voiced samples, ms (0: none).
    """

    text: str
    voice: str
    pcm: bytes
    end_sample: int
    pause_sample: int | None = None
    pause_ms: int = 0


def voiced_bounds(pcm: bytes, level: int = VOICED) -> tuple[int, int]:
    """(first, last) index of the samples of PCM16 ``pcm`` above ``level``.

    Raises:
        ValueError: nothing in ``pcm`` is above it.
    """
    x = np.abs(np.frombuffer(pcm, dtype="<i2").astype(np.int32))
    idx = np.flatnonzero(x > level)
    if not len(idx):
        raise ValueError("no voiced sample")
    return int(idx[0]), int(idx[-1])


def _trimmed(pcm: bytes) -> bytes:
    """``pcm`` from its first audible sample to its last."""
    first, last = voiced_bounds(pcm, AUDIBLE)
    return pcm[2 * first : 2 * (last + 1)]


def pause_lengths_ms(count: int, seed: int = 38) -> list[int]:
    """``count`` pauses spread evenly over :data:`PAUSE_MS_RANGE` (both ends
    included), in a fixed shuffled order, ms."""
    lo, hi = PAUSE_MS_RANGE
    pauses = [round(lo + (hi - lo) * i / max(1, count - 1)) for i in range(count)]
    order = np.random.default_rng(seed).permutation(count)
    return [pauses[i] for i in order]


class Voices:
    """The two voices, each giving mono PCM16 at ``rate`` Hz.

    Args:
        rate: the benchmark's input rate (Hz).
    """

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._piper = Synthesizer(num_threads=1)

    def speak(self, text: str, voice: str) -> bytes:
        """``text`` in ``voice`` (``piper`` or ``espeak``), PCM16 at :attr:`rate`.

        Raises:
            ValueError: an unknown voice.
        """
        if voice == "espeak":
            return espeak_pcm16(text, self.rate)
        if voice != "piper":
            raise ValueError(f"voice={voice!r} must be 'piper' or 'espeak'")
        speech = self._piper.synthesize(text)
        x = speech.audio.astype(np.float32) / 32768
        y = soxr.resample(x, self._piper.sample_rate, self.rate)
        return (np.clip(y, -1, 1) * 32767).astype("<i2").tobytes()


def questions(rate: int) -> dict[str, Utterance]:
    """The complete questions and the barge-in, by text (espeak-ng)."""
    out = {}
    for text in (*QUESTIONS, BARGE):
        pcm = espeak_pcm16(text, rate)
        out[text] = Utterance(text=text, voice="espeak", pcm=pcm, end_sample=voiced_bounds(pcm)[1])
    return out


def paused_set(voices: Voices) -> list[Utterance]:
    """The mid-sentence-pause set: :data:`PAUSED`, voices alternating, each
    half trimmed to its voiced samples and joined by its pause."""
    out = []
    for i, ((head, tail), pause_ms) in enumerate(zip(PAUSED, pause_lengths_ms(len(PAUSED)), strict=True)):
        voice = ("piper", "espeak")[i % 2]
        first, second = _trimmed(voices.speak(head, voice)), _trimmed(voices.speak(tail, voice))
        gap = bytes(2 * (voices.rate * pause_ms // 1000))
        out.append(
            Utterance(
                text=f"{head}... {tail}",
                voice=voice,
                pcm=first + gap + second,
                end_sample=(len(first) + len(gap)) // 2 + voiced_bounds(second)[1],
                pause_sample=len(first) // 2 - 1,
                pause_ms=pause_ms,
            )
        )
    return out
