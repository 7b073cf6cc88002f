"""Speaker: one response's text spoken as it is delivered (``response.audio.delta``).

A speaker subscribes to its response's delivery
(:class:`~bargein.session.runtime.delivery.DeliverySubscriber`): each delta's
text reaches :meth:`Speaker.feed` once it is sent;
the speaker cuts the text into segments (sentences, or clauses: the first one a
word or two, for early first audio), synthesizes each in a worker thread as soon as
it is complete, and sends its audio in chunks of at most ``chunk_ms``. Each
chunk carries ``start_ms``/``end_ms`` on the response's output timeline and
``text_end``, the code points of the response text spoken by ``end_ms``, from
the synthesizer's own word timings; as only delivered text is ever segmented,
``text_end`` never passes the text the client already has.

The audio is re-derived, never stored: segmenting is a function of the text,
and the synthesizer's timings are deterministic (``noise_w = 0``), so a
client that resumes with ``audio_from_ms`` gets the same timeline again
(:class:`Speaker` with ``skip_before_ms``), and the model generates nothing
twice. Such a resume synthesizes only from the segment that holds
``audio_from_ms``: the segments before it are placed on the timeline by the
synthesizer's durations alone (``timing``, a tenth of the CPU), so a resume
at the end of the audio synthesizes nothing. Synthesis is cheap next to generation (a real-time factor of about
0.05 here), while logging 24 kHz audio would cost 48 KB per second of speech
in the token log of every stream.

A barge-in calls :meth:`Speaker.stop`: no audio chunk of the response is sent
after it. Speech over the answer that is not confirmed yet as an interruption
(``confirm`` mode, :mod:`bargein.voice.interruption`) calls :meth:`Speaker.pause`:
no chunk is sent until :meth:`Speaker.resume` (synthesis goes on), so a false
interruption resumes at the paused millisecond, nothing lost or repeated. :meth:`Speaker.finish` speaks what is left (unless stopped) and
sends ``response.audio.done``; the delivery awaits it (``on_end``, or
``on_failure``) before ``response.done`` or the ``error`` that ends it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from bargein.protocol import events as pe
from bargein.session.cancel import cancel_and_wait
from bargein.session.runtime.admission import AudioBudget, Refusal
from bargein.session.runtime.observer import SessionObserver
from bargein.voice.align import Alignment
from bargein.voice.audio import Resampler, float_to_pcm16
from bargein.voice.segment import Segment, Segmenter

logger = logging.getLogger(__name__)

SendEvent = Callable[[object], Awaitable[None]]
RunBlocking = Callable[[Callable[[], Any]], Awaitable[Any]]
CHUNK_MS = 200  # audio per response.audio.delta: small enough to stop quickly
# Markup a chat model writes that must not be read aloud; each becomes a space
# so the synthesizer's character offsets stay those of the response text.
_UNSPOKEN = str.maketrans({c: " " for c in "*#`_~|<>[]"})


class SpeechSynth(Protocol):
    """What the speaker needs of :class:`bargein.voice.tts.Synthesizer`."""

    @property
    def sample_rate(self) -> int: ...

    def synthesize(self, text: str) -> Any: ...

    def timing(self, text: str) -> Any:
        """What ``synthesize(text)`` would give, without the audio: its
        ``num_samples`` and ``words`` (:class:`bargein.voice.tts.Timing`)."""


class Playback(Protocol):
    """Told what the client's speaker plays, as it is sent (the echo
    canceller's reference: :class:`bargein.voice.echo.EchoPath`). Times are
    monotonic seconds."""

    def played(self, samples: np.ndarray, sample_rate: int, start_ms: float, sent_at: float) -> None:
        """A chunk was sent: float32 ``[n]`` at ``sample_rate`` Hz, starting at
        ``start_ms`` of the response's output timeline."""

    def paused(self, at: float) -> None:
        """The playback holds from ``at``."""

    def resumed(self, at: float) -> None:
        """The playback goes on from ``at``."""

    def ended(self, at: float) -> None:
        """The response's audio stops at ``at``: what was not played never plays."""


class Speaker:
    """The spoken audio of one response.

    Args:
        synth: the synthesizer (shared; called from ``run_blocking``).
        response_id, stream_id: the response, echoed in its audio events.
        sample_rate: the session's output rate (Hz).
        send: writes one server event, returns once it is on the wire.
        run_blocking: runs a blocking call off the event loop (a thread pool).
        skip_before_ms: audio before this output-timeline point is not sent
            (a resume with ``audio_from_ms``); its timeline is still computed.
        chunk_ms: most audio per delta.
        clock: monotonic seconds (for the synthesis time).
        on_first_audio: called once, when the first chunk went out.
        budget: a resume's: each segment's synthesized seconds are charged
            to it; a segment due while it is empty is not synthesized, and
            the audio stops there with a ``rate_limited`` ``error`` (the
            text goes on; ``response.audio.done`` says where the audio ended).
        playback: told each chunk sent, and the pauses, resumes and stop
            (the connection's echo canceller).
        tool_filler: said when the answer is function calls, while the client
            runs them (``""``: nothing); its audio's ``text_end`` stays where
            the response's spoken text ended, as it is no part of that text.
    """

    def __init__(
        self,
        synth: SpeechSynth,
        *,
        response_id: str,
        stream_id: str,
        sample_rate: int,
        send: SendEvent,
        run_blocking: RunBlocking,
        skip_before_ms: int = 0,
        chunk_ms: int = CHUNK_MS,
        clock: Callable[[], float],
        observer: SessionObserver | None = None,
        on_first_audio: Callable[[], None] | None = None,
        budget: AudioBudget | None = None,
        playback: Playback | None = None,
        tool_filler: str = "",
    ) -> None:
        self.response_id = response_id
        self.stream_id = stream_id
        self.sample_rate = sample_rate
        self.alignment = Alignment()
        self.sent_end_ms = 0  # end of the last chunk sent (output timeline)
        self.sent_text_end = 0
        self.stopped = False
        self.done = False  # response.audio.done was sent
        self._playing = asyncio.Event()  # cleared while paused
        self._playing.set()
        self._text: list[str] = []  # the response text fed so far
        # the client's playback, as the server sees it: each chunk plays in real
        # time from when it was sent or when the audio before it ends, whichever
        # is later (a synthesis underrun leaves a gap), held while paused:
        # (wall start s, start_ms, end_ms) runs of the output timeline
        self._schedule: list[tuple[float, int, int]] = []
        self._play_end = 0.0  # wall time the client ends the audio sent so far
        self._paused_at: float | None = None
        self._synth = synth
        self._send = send
        self._run_blocking = run_blocking
        self._skip_before_ms = skip_before_ms
        self._chunk = max(1, chunk_ms * sample_rate // 1000)
        self._clock = clock
        self._observer = observer
        self._on_first_audio = on_first_audio
        self._budget = budget
        self._playback = playback
        self._tool_filler = tool_filler
        self._segmenter = Segmenter()
        self._queue: asyncio.Queue[Segment | None] = asyncio.Queue()
        self._samples = 0  # output timeline length so far, in samples
        self._worker: asyncio.Task[None] | None = None

    def feed(self, text: str) -> None:
        """The delivery sent ``text``, the next characters of the response."""
        if self.stopped or not text:
            return
        self._text.append(text)
        for segment in self._segmenter.feed(text):
            self._enqueue(segment)

    def stop(self) -> None:
        """Barge-in: send no more audio (synthesis in flight is dropped)."""
        if not self.stopped and self._playback is not None and self.sent_end_ms:
            self._playback.ended(self._clock())
        self.stopped = True
        if self._worker is not None:
            self._worker.cancel()

    @property
    def paused(self) -> bool:
        """Paused by :meth:`pause` and not resumed yet."""
        return not self._playing.is_set()

    def pause(self) -> None:
        """Speech over the answer: send no chunk until :meth:`resume`
        (:attr:`sent_end_ms` is where the audio paused)."""
        if self._playing.is_set():
            self._playing.clear()
            self._paused_at = self._clock()
            if self._playback is not None:
                self._playback.paused(self._paused_at)

    def resume(self) -> None:
        """The speech was no interruption: the audio goes on from where it paused."""
        if not self._playing.is_set():
            self._playing.set()
            now = self._clock()
            if self._playback is not None:
                self._playback.resumed(now)
            if self._paused_at is not None:
                # what the client held plays on from now, back to back
                held_from = self.played_ms(self._paused_at)
                self._paused_at = None
                if self._schedule:
                    self._schedule = [(now, held_from, self.sent_end_ms)]
                    self._play_end = now + (self.sent_end_ms - held_from) / 1000

    def played_ms(self, now: float) -> int:
        """The output-timeline ms the client has played by ``now`` (monotonic
        s), estimated: each chunk plays in real time from when it was sent or
        when the audio before it ends, whichever is later; stopped while
        paused; never past the audio sent. 0 before any was sent."""
        if not self._schedule:
            return 0
        until = now if self._paused_at is None else self._paused_at
        for start, start_ms, end_ms in reversed(self._schedule):
            if until >= start:
                return min(end_ms, start_ms + round(1000 * (until - start)))
        return self._schedule[0][1]

    def audible(self, now: float) -> bool:
        """Whether the client may still be playing (or about to play) this
        answer at ``now``: not stopped, and audio is still to come or not
        played yet (:meth:`played_ms`)."""
        return not self.stopped and (not self.done or self.played_ms(now) < self.sent_end_ms)

    def heard_text(self, now: float, *, before_ms: int, after_ms: int) -> str:
        """The response text spoken from ``before_ms`` before to ``after_ms``
        after the estimated playback position (:meth:`played_ms`): the words
        the user's microphone may pick up as echo."""
        played = self.played_ms(now)
        text = "".join(self._text)
        lo = self.alignment.cut_at(max(0, played - before_ms))
        # cut_at keeps the word in progress: start after it, at the word boundary before
        lo = text.rfind(" ", 0, max(0, lo - 1)) + 1 if lo else 0
        hi = self.alignment.cut_at(min(self.sent_end_ms, played + after_ms))
        return text[lo:hi]

    async def finish(self) -> None:
        """The response's text is complete (or was cut): speak the rest, unless
        stopped, then send ``response.audio.done``."""
        if not self.stopped:
            for segment in self._segmenter.flush():
                self._enqueue(segment)
            if self._worker is not None:
                self._queue.put_nowait(None)
        if self._worker is not None:
            # wait() does not raise the worker's CancelledError (a stop), so
            # a cancellation of the caller itself propagates, never swallowed
            await asyncio.wait((self._worker,))
        if self.done:
            return
        self.done = True
        # the audio's length: what was sent when stopped, else the whole timeline
        # (on a resume past the end, nothing was sent but the audio is that long)
        end_ms = self.sent_end_ms
        if not self.stopped:
            end_ms = max(end_ms, self._samples * 1000 // self.sample_rate)
        await self._send(
            pe.ResponseAudioDone(response_id=self.response_id, stream_id=self.stream_id, end_ms=end_ms)
        )

    # ---- a subscriber of the response's delivery ---------------------------------

    def on_delta(self, text: str) -> None:
        """The delivery sent ``text``: speak it."""
        self.feed(text)

    def on_calls(self) -> None:
        """The answer is function calls: say the filler, if any, while the client runs them."""
        if self.stopped or not self._tool_filler:
            return
        at = sum(len(t) for t in self._text)  # an answer of calls has no text to speak: 0
        self._enqueue(Segment(start=at, end=at, text=self._tool_filler))

    async def on_end(self) -> None:
        """The response's text is all sent: speak the rest, then ``response.audio.done``."""
        await self.finish()

    async def on_failure(self) -> None:
        """The delivery failed: the audio stops here, ``response.audio.done`` first."""
        if not self.done:
            self.stop()
            await self.finish()

    async def on_close(self) -> None:
        """The delivery is over (a cancelled one too): no synthesis is left behind."""
        self.stop()
        if self._worker is not None:
            await cancel_and_wait([self._worker])

    def cut_chars(self, heard_ms: int | None) -> int:
        """Where the assistant turn is cut when the user heard up to
        ``heard_ms`` of the output timeline (None: all the audio sent): at a
        word boundary at most one word past it, never past what was sent."""
        ms = self.sent_end_ms if heard_ms is None else min(heard_ms, self.sent_end_ms)
        return self.alignment.cut_at(ms)

    # ---- the worker --------------------------------------------------------------

    def _enqueue(self, segment: Segment) -> None:
        self._queue.put_nowait(segment)
        if self._worker is None:
            self._worker = asyncio.create_task(self._speak(), name=f"speak-{self.stream_id}")

    async def _speak(self) -> None:
        while not self.stopped and (segment := await self._queue.get()) is not None:
            try:
                await self._speak_segment(segment)
            except asyncio.CancelledError:
                raise
            except Exception:  # a synthesizer failure costs the audio, not the response
                logger.exception("speech synthesis failed for stream %s; its audio stops", self.stream_id)
                self.stopped = True
                return

    async def _speak_segment(self, segment: Segment) -> None:
        text = segment.text.translate(_UNSPOKEN)
        if not text.strip():
            return
        if self._samples * 1000 // self.sample_rate < self._skip_before_ms:
            # a resume: a segment whose every chunk is skipped is only placed
            timing = await self._run_blocking(lambda: self._synth.timing(text))
            length = self._resampled_length(timing.num_samples)
            if (self._samples + length) * 1000 // self.sample_rate <= self._skip_before_ms:
                self._place(segment, timing.words, length)
                return
        started = self._clock()
        if self._budget is not None and (refusal := self._budget.refusal(started)) is not None:
            await self._refuse(refusal)
            return
        speech = await self._run_blocking(lambda: self._synth.synthesize(text))
        audio = self._resampled(speech.audio)
        if self._budget is not None:
            self._budget.spend(len(audio) / self.sample_rate, self._clock())
        if self._observer is not None and len(audio):
            self._observer.synthesized(
                audio_s=len(audio) / self.sample_rate, compute_s=self._clock() - started
            )
        base = self._samples
        self._place(segment, speech.words, len(audio))
        skip = -(-self._skip_before_ms * self.sample_rate // 1000)  # first sample at or after it
        for lo in range(0, len(audio), self._chunk):
            if self.stopped:
                return
            chunk_end = base + min(lo + self._chunk, len(audio))
            # Chunks are cut the same way on every derivation; a resume skips
            # those that end (in whole ms, as announced) by audio_from_ms.
            if chunk_end * 1000 // self.sample_rate <= self._skip_before_ms:
                continue
            piece = audio[max(lo, skip - base) : chunk_end - base]
            await self._send_chunk(piece, chunk_end)

    async def _refuse(self, refusal: Refusal) -> None:
        """The audio budget is spent: no more audio of this response (its
        text goes on), and the client is told when to resume it again."""
        self.stopped = True
        await self._send(
            pe.ErrorEvent(
                code=refusal.code,
                message=f"{refusal.message}: the resumed audio stops at "
                f"{max(self.sent_end_ms, self._skip_before_ms)} ms "
                "(resume again with audio_from_ms to hear the rest)",
                retryable=True,
                retry_after_ms=refusal.retry_after_ms,
                response_id=self.response_id,
            )
        )

    def _place(self, segment: Segment, words: Any, length: int) -> None:
        """Put a segment of ``length`` samples (at the session's rate) with
        its ``words`` (:class:`bargein.voice.tts.WordEnd`) next on the timeline."""
        scale = self.sample_rate / self._synth.sample_rate
        base = self._samples
        ms = 1000 / self.sample_rate
        self.alignment.add_segment(
            start_ms=base * ms,
            end_ms=(base + length) * ms,
            word_ends=[
                # the last word carries what follows it in the segment (markup,
                # spaces): text without sound counts as spoken with its words
                (
                    segment.end if i == len(words) - 1 else segment.start + w.char_end,
                    min(base + w.sample_end * scale, base + length) * ms,
                )
                for i, w in enumerate(words)
                if segment.end > segment.start  # a filler covers no text: its audio holds no word of it
            ],
        )
        self._samples += length

    async def _send_chunk(self, piece: np.ndarray, end_sample: int) -> None:
        await self._playing.wait()  # a paused answer's next chunk waits here
        start_ms = (end_sample - len(piece)) * 1000 // self.sample_rate
        end_ms = end_sample * 1000 // self.sample_rate
        # at the exact end, not the rounded-down ms: a segment's last word ends there
        text_end = self.alignment.text_end_at(end_sample * 1000 / self.sample_rate)
        first = self.sent_end_ms == 0
        # Counted as sent once handed to send: a stop() while it is written
        # cancels the wait, not the frame (it is queued for the wire), so the
        # cut and response.audio.done's end_ms must include it.
        self.sent_end_ms, self.sent_text_end = end_ms, text_end
        # before the write: a send that waits for the socket must not place the
        # echo canceller's reference late (its echo may lag it, never lead it)
        sent_at = self._clock()
        self._scheduled(sent_at, start_ms, end_ms)
        if self._playback is not None:
            self._playback.played(piece, self.sample_rate, start_ms, sent_at)
        await self._send(
            pe.ResponseAudioDelta(
                response_id=self.response_id,
                stream_id=self.stream_id,
                audio=float_to_pcm16(piece),
                start_ms=start_ms,
                end_ms=end_ms,
                text_end=text_end,
            )
        )
        if first and self._on_first_audio is not None:
            self._on_first_audio()

    def _scheduled(self, sent_at: float, start_ms: int, end_ms: int) -> None:
        """The chunk ``[start_ms, end_ms)`` sent at ``sent_at`` joins the playback estimate."""
        start = max(sent_at, self._play_end)
        if self._schedule and start == self._play_end and self._schedule[-1][2] == start_ms:
            wall, first_ms, _ = self._schedule[-1]  # back to back: one run
            self._schedule[-1] = (wall, first_ms, end_ms)
        else:
            self._schedule.append((start, start_ms, end_ms))
        self._play_end = start + (end_ms - start_ms) / 1000

    def _resampled_length(self, num_samples: int) -> int:
        """The samples :meth:`_resampled` gives for ``num_samples`` of the
        synthesizer's (the resampler's own count: its filter rounds)."""
        if self._synth.sample_rate == self.sample_rate:
            return num_samples
        return len(self._resampled(np.zeros(num_samples, dtype=np.int16)))

    def _resampled(self, audio: np.ndarray) -> np.ndarray:
        """The synthesizer's int16 audio as float32 at the session's rate."""
        x = audio.astype(np.float32) / 32768.0
        if self._synth.sample_rate == self.sample_rate:
            return x
        resampler = Resampler(self._synth.sample_rate, self.sample_rate)
        return np.concatenate([resampler.process(x), resampler.flush()])
