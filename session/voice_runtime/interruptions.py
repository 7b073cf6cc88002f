"""Confirmed interruptions: speech over a spoken answer pauses it; its words decide.

In ``confirm`` mode (``turn_detection.interruption``,
:mod:`bargein.voice.interruption`), the start of speech while an answer may
still be playing pauses the answer's speakers (``response.audio.paused``:
no audio delta follows; the engine is not told, so the answer stays in the
log). The speech's words are then judged, by :func:`~bargein.voice.interruption.decide`,
at the first of:

- its first pause (``pause_ms`` of silence: an "mm-hm" has ended),
- ``max_pause_ms`` of audio after its onset while it goes on (the user is
  plainly speaking, or a sound goes on: music, a TV); one word of the
  user's own is then enough. Without one, the speech is judged again each
  ``max_pause_ms`` (the first word may not be out yet), and the answer
  resumes after the ``WINDOWS``-th (a sound that goes on has no words),
- its end (``silence_duration_ms``), which judges the whole utterance.

A real interruption cuts the answer as an ``immediate`` barge-in does (the
owner cancels it at the engine, cut at the audio sent) and the speech goes on
as the user's turn. A false one resumes the paused speakers from the paused
millisecond (``response.audio.resumed``), but the speech is judged again at
its end, over all its words: a "yeah" followed by a question still becomes a
turn (it then cuts the answer). One that ends false is no turn:
``input_audio.discarded``, and nothing joins the conversation.

Each judgement is one transcription of the speech so far, shared with the
turn's final transcript when the spans meet (span_transcripts.py): at most
three per utterance.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bargein.protocol import events as pe
from bargein.session.runtime.observer import SessionObserver
from bargein.session.voice_runtime.span_transcripts import Span
from bargein.session.voice_runtime.speaker import Speaker
from bargein.voice.interruption import Decision, Interruption, decide

logger = logging.getLogger(__name__)

SendEvent = Callable[[object], Awaitable[None]]
Transcribe = Callable[[Any, Span], Awaitable[str]]
Cut = Callable[[Sequence[str], float], Awaitable[None]]
Spawn = Callable[[Any, str], "asyncio.Task[Any]"]
# The answer's words the microphone may hear back: from this long before the
# estimated playback position to this long after it (the client's playback
# runs ahead of the estimate by its network and buffer delay).
ECHO_BEFORE_MS, ECHO_AFTER_MS = 4000, 1500
WINDOWS = 3  # judgements of speech that goes on, max_pause_ms apart, before the answer resumes


@dataclass(slots=True, kw_only=True)
class _Overlap:
    """Speech over a spoken answer, not (yet) a confirmed interruption."""

    item_id: str
    audio_start_ms: int  # the turn's audio start (with its prefix padding)
    onset_ms: int  # where its speech was heard to start
    config: Interruption
    speakers: list[Speaker]  # the answers it paused
    echo: str  # their words the microphone may hear
    paused: bool = True
    speaking: bool = True  # False from a pause until the speech resumes
    real: bool = False  # confirmed: the answer was cut
    windows_judged: int = 0
    window_in_flight: bool = False  # a window's judgement runs: the next waits for it
    pause_judged: bool = False
    judgements: dict[Span, asyncio.Task[Decision]] = field(default_factory=dict)


class ConfirmedInterruptions:
    """The confirm mode of one connection's voice side.

    Args:
        send: writes one server event.
        transcribe: the channel's transcription of a span of the input
            (float32 16 kHz audio, its span; shared with the turn's transcript).
        cut: cancels the active response if it is one of the response ids
            (at the audio sent), as a barge-in does.
        spawn: runs a coroutine as one of the connection's voice tasks
            (cancelled when it closes).
        clock: monotonic seconds.
        observer: the decisions and their latency.
    """

    def __init__(
        self,
        *,
        send: SendEvent,
        transcribe: Transcribe,
        cut: Cut,
        spawn: Spawn,
        clock: Callable[[], float],
        observer: SessionObserver,
    ) -> None:
        self._send = send
        self._transcribe = transcribe
        self._cut = cut
        self._spawn = spawn
        self._clock = clock
        self._observer = observer
        self._overlap: _Overlap | None = None

    @property
    def judging(self) -> bool:
        """The turn being spoken started over an answer and is not confirmed
        as an interruption yet (no speculative answer or partial runs for it)."""
        return self._overlap is not None and not self._overlap.real

    def pause(
        self,
        speakers: list[Speaker],
        *,
        item_id: str,
        audio_start_ms: int,
        onset_ms: int,
        config: Interruption,
        now: float,
    ) -> None:
        """Speech started over ``speakers`` (the answers the client may be
        playing; not empty): pause them at once (:meth:`announce` tells the
        client), and judge the speech as it goes."""
        echo = " ".join(s.heard_text(now, before_ms=ECHO_BEFORE_MS, after_ms=ECHO_AFTER_MS) for s in speakers)
        for speaker in speakers:
            speaker.pause()
        self._overlap = _Overlap(
            item_id=item_id,
            audio_start_ms=audio_start_ms,
            onset_ms=onset_ms,
            config=config,
            speakers=speakers,
            echo=echo,
        )

    async def announce(self) -> None:
        """``response.audio.paused`` for each answer :meth:`pause` paused."""
        overlap = self._overlap
        for speaker in [] if overlap is None else overlap.speakers:
            await self._send(
                pe.ResponseAudioPaused(
                    response_id=speaker.response_id, stream_id=speaker.stream_id, end_ms=speaker.sent_end_ms
                )
            )

    def paused(self, audio: Any, span: Span) -> None:
        """The speech paused (``pause_ms`` of silence): judge it so far, once."""
        overlap = self._overlap
        if overlap is not None:
            overlap.speaking = False
        if overlap is not None and not overlap.real and not overlap.pause_judged:
            overlap.pause_judged = True
            self._judge(overlap, audio, span, still_speaking=False)

    def resumed(self) -> None:
        """The speech went on after its pause: a judgement of the words before
        the pause that finds no interruption leaves the answer paused (the
        user is not done: the window or the end decides)."""
        if self._overlap is not None:
            self._overlap.speaking = True

    def heard(self, end_ms: int, read: Callable[[int, int], Any], *, in_speech: bool) -> None:
        """The input reached ``end_ms``; ``read(start_ms, end_ms)`` gives
        held audio. Each ``max_pause_ms`` after the onset, up to ``WINDOWS``
        times, speech still going on is judged."""
        overlap = self._overlap
        if overlap is None or overlap.real or overlap.windows_judged >= WINDOWS or overlap.window_in_flight:
            return
        if not (in_speech and overlap.speaking):  # a pause is judged at the pause
            return
        if end_ms - overlap.onset_ms >= overlap.config.max_pause_ms * (overlap.windows_judged + 1):
            overlap.windows_judged += 1
            overlap.window_in_flight = True
            span = (overlap.audio_start_ms, end_ms)
            last = overlap.windows_judged == WINDOWS
            self._judge(overlap, read(*span), span, still_speaking=True, last=last)

    async def ended(self, audio: Any, span: Span) -> bool:
        """The speech ended (its turn's ``span`` and ``audio``): whether it
        is the user's turn. Without an overlap, or one already confirmed, it
        is; else its whole words decide: a real interruption cuts the answer
        now, a false one resumes it (if still paused) and is discarded
        (``input_audio.discarded``)."""
        overlap, self._overlap = self._overlap, None
        if overlap is None or overlap.real:
            return True
        decision = await self._judgement(overlap, audio, span, still_speaking=False)
        # a judgement of its pause or of a window, in flight when the speech
        # ended, may have confirmed it meanwhile: the answer is cut, so the
        # speech is the turn whatever the whole words say
        if overlap.real:
            return True
        if decision.real:
            await self._confirm(overlap)
            return True
        await self._resume(overlap)
        assert decision.reason != "words"  # a false interruption's reason is a discard reason
        await self._send(
            pe.InputAudioDiscarded(
                item_id=overlap.item_id, reason=decision.reason, transcript=decision.transcript.strip()
            )
        )
        return False

    def forget(self, *, resume: bool = True) -> None:
        """The turn is gone (cleared, committed by the client, new settings,
        the connection closed): no judgement is pending, and, with
        ``resume``, paused answers go on."""
        overlap, self._overlap = self._overlap, None
        if resume and overlap is not None and overlap.paused and not overlap.real:
            self._spawn(self._resume(overlap), f"resume-{overlap.item_id}")

    # ---- judging ----------------------------------------------------------------------

    def _judge(
        self, overlap: _Overlap, audio: Any, span: Span, *, still_speaking: bool, last: bool = True
    ) -> None:
        """Judge the speech so far in a task of its own; a real interruption cuts at once,
        a false one resumes the answer unless the speech went on meanwhile
        (its end judges it again) or, while it goes on, unless a later
        window will judge it (not ``last``)."""

        async def judge() -> None:
            try:
                decision = await self._judgement(overlap, audio, span, still_speaking=still_speaking)
            finally:
                if still_speaking:
                    overlap.window_in_flight = False
            if overlap.real:
                return
            if decision.real:
                await self._confirm(overlap)
            elif (still_speaking and last) or (not still_speaking and not overlap.speaking):
                await self._resume(overlap)

        self._spawn(judge(), f"judge-{overlap.item_id}-{span[1]}")

    async def _judgement(
        self, overlap: _Overlap, audio: Any, span: Span, *, still_speaking: bool
    ) -> Decision:
        """The decision over ``span`` (one transcription per span; a failed
        one counts as a real interruption, as ``immediate`` would have it)."""
        task = overlap.judgements.get(span)
        if task is None:
            coro = self._decide(overlap, audio, span, still_speaking=still_speaking)
            task = overlap.judgements[span] = self._spawn(coro, f"decide-{overlap.item_id}-{span[1]}")
        return await asyncio.shield(task)

    async def _decide(self, overlap: _Overlap, audio: Any, span: Span, *, still_speaking: bool) -> Decision:
        started = self._clock()
        try:
            text = await self._transcribe(audio, span)
        except Exception:
            logger.exception("transcribing the speech over an answer failed: taken as an interruption")
            return Decision(True, "words", (), "")
        decision = decide(text, config=overlap.config, still_speaking=still_speaking, spoken=overlap.echo)
        self._observer.interruption_decided(
            real=decision.real, reason=decision.reason, seconds=self._clock() - started
        )
        return decision

    async def _confirm(self, overlap: _Overlap) -> None:
        """A real interruption: the paused answers stop for good, the active one is cancelled."""
        overlap.real = True
        overlap.paused = False
        for speaker in overlap.speakers:
            # held where it is now, if it had resumed: the cut is at the
            # estimate of what was played by then (SpokenResponses.cut)
            speaker.pause()
            speaker.stop()
        await self._cut([s.response_id for s in overlap.speakers], self._clock())

    async def _resume(self, overlap: _Overlap) -> None:
        """A false interruption: the paused answers go on from where they paused."""
        if not overlap.paused:
            return
        overlap.paused = False
        for speaker in overlap.speakers:
            if speaker.stopped:
                continue  # cancelled meanwhile (a response.cancel): nothing to resume
            speaker.resume()
            await self._send(
                pe.ResponseAudioResumed(
                    response_id=speaker.response_id, stream_id=speaker.stream_id, from_ms=speaker.sent_end_ms
                )
            )
