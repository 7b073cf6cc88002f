"""A speaker's view of a spoken answer: pcm16 played in real time, paused, resumed or cut.

The server sends an answer's audio faster than real time (docs/protocol.md
8.6); a client plays it at its own pace, so at any moment part of it is
played and the rest is buffered. :class:`Playback` keeps that account for the
Python client, on a clock (``time.monotonic`` unless one is given), with no
sound device: a program that plays for real feeds its device from
:meth:`Playback.take_played`, or reads :attr:`Playback.played_ms` for the
barge-in.

What the voice events of a confirmed interruption (docs/protocol.md 8.7) do
to it:

- ``response.audio.paused``: :meth:`Playback.pause`: playback stops where it
  is and the unplayed audio is kept, nothing dropped;
- ``response.audio.resumed``: :meth:`Playback.resume`: playback goes on from
  that sample, so nothing is lost and nothing is heard twice; the deltas
  that follow continue the buffer;
- a real interruption (``response.done`` with ``finish_reason:
  "interrupted"``): :meth:`Playback.cut`: the unplayed audio is dropped, and
  :attr:`Playback.played_ms` is the ``audio_end_ms`` of the
  ``response.cancel`` to send.

Pure: no asyncio, no I/O; the time comes from ``clock``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

from bargein.client.pcm import SAMPLE_BYTES

InterruptionMode = Literal["confirm", "immediate"]

Clock = Callable[[], float]  # seconds, never decreasing


class Playback:
    """The real-time playback of one answer's pcm16 mono audio.

    Playback starts with the first audio pushed, and plays one sample per
    ``1 / sample_rate`` seconds of ``clock`` while it is not paused and has
    audio; when the buffer runs dry it waits (a gap) and goes on with the
    next push. Positions are samples from the answer's first, and
    milliseconds on its output timeline (``floor(samples * 1000 / rate)``,
    as the protocol counts).

    Args:
        sample_rate: samples per second of the audio (the session's output rate).
        clock: the time in seconds (default ``time.monotonic``).

    Attributes:
        sample_rate: as given.
        num_pauses: times :meth:`pause` paused playing audio.
        num_resumes: times :meth:`resume` resumed it.
        cut_at: samples played when :meth:`cut` ended it, or None.
    """

    def __init__(self, sample_rate: int, *, clock: Clock = time.monotonic) -> None:
        self.sample_rate = sample_rate
        self._clock = clock
        self._audio = bytearray()  # every sample pushed (and kept: not cut)
        self._played = 0  # samples played as of _mark_s
        self._mark_s: float | None = None  # clock time of _played; None: not started
        self._taken = 0  # samples handed out by take_played
        self.paused = False
        self.num_pauses = 0
        self.num_resumes = 0
        self.cut_at: int | None = None

    # ---- feeding ----------------------------------------------------------------

    def push(self, pcm: bytes) -> None:
        """Add received audio at the end of the buffer (an ``on_audio`` sink);
        after :meth:`cut` it is dropped."""
        if self.cut_at is not None or not pcm:
            return
        self._advance()
        self._audio += pcm[: len(pcm) - len(pcm) % SAMPLE_BYTES]
        if self._mark_s is None:
            self._mark_s = self._clock()

    __call__ = push

    # ---- the confirmed interruption ----------------------------------------------

    def pause(self) -> bool:
        """Stop playing now and keep the unplayed audio; returns whether it
        was playing (False when already paused or cut)."""
        if self.paused or self.cut_at is not None:
            return False
        self._advance()
        self.paused = True
        self.num_pauses += 1
        return True

    def resume(self) -> bool:
        """Play on from the sample where :meth:`pause` stopped; returns whether
        it was paused."""
        if not self.paused or self.cut_at is not None:
            return False
        self.paused = False
        self._mark_s = self._clock() if self._mark_s is not None else None
        self.num_resumes += 1
        return True

    def cut(self) -> int:
        """End playback now (barge-in): the unplayed audio is dropped and later
        pushes too. Returns the milliseconds played (the ``audio_end_ms`` to
        send); idempotent."""
        if self.cut_at is None:
            self._advance()
            self.cut_at = self._played
            del self._audio[self._played * SAMPLE_BYTES :]
            self.paused = False
        return self.played_ms

    # ---- reading ------------------------------------------------------------------

    @property
    def played_samples(self) -> int:
        """Samples played so far."""
        self._advance()
        return self._played

    @property
    def played_ms(self) -> int:
        """Milliseconds of the output timeline played so far (rounded down)."""
        return self.played_samples * 1000 // self.sample_rate

    @property
    def received_samples(self) -> int:
        """Samples pushed (after a cut: the ones played)."""
        return len(self._audio) // SAMPLE_BYTES

    @property
    def buffered_samples(self) -> int:
        """Samples received and not played yet."""
        return self.received_samples - self.played_samples

    @property
    def pending(self) -> bool:
        """Whether audio is still to be heard (buffered, paused or not)."""
        return self.buffered_samples > 0

    def take_played(self) -> bytes:
        """The pcm16 played since the last call (what a sound device would
        have output, in order: every sample once)."""
        played = self.played_samples
        out = bytes(self._audio[self._taken * SAMPLE_BYTES : played * SAMPLE_BYTES])
        self._taken = played
        return out

    def _advance(self) -> None:
        """Bring ``_played`` to the clock's now: at one sample per 1/rate s,
        while playing, up to the audio received (a dry buffer waits)."""
        if self._mark_s is None or self.paused or self.cut_at is not None:
            return
        now = self._clock()
        # + 1e-6: a clock's float sum (100.3 - 100 = 0.29999...) still counts the sample it reached
        due = self._played + int((now - self._mark_s) * self.sample_rate + 1e-6)
        received = len(self._audio) // SAMPLE_BYTES
        if due >= received:  # ran dry (or just finished): wait from now for the next push
            self._played, self._mark_s = received, now
        elif due > self._played:  # keep the fraction of a sample in the mark
            self._mark_s += (due - self._played) / self.sample_rate
            self._played = due


class AnswerPlayer:
    """The answers of a voice conversation as the user hears them: one
    :class:`Playback` per response, driven by the server's events
    (:meth:`take`), with barge-in and confirmed interruptions
    (docs/protocol.md 8.7).

    Feed it every server event in order (:meth:`VoiceClient.voice_turn
    <bargein.client.voice_client.VoiceClient.voice_turn>` does, given it as
    ``player=``) and each response's de-duplicated audio through
    :meth:`sink` (``Response.on_audio``). What it does with them:

    - ``immediate`` mode (or a server without ``interruption``): speech that
      starts (``input_audio.speech_started``) while an answer still plays
      cuts it at once.
    - ``confirm`` mode: that speech only *pauses* the playback, keeping the
      buffered audio; so does ``response.audio.paused``. The playback resumes
      from the paused sample on ``response.audio.resumed`` (the speech is
      still judged again at its end: "yeah, but what about Tuesday?" cuts
      it then), or on ``input_audio.discarded`` for the speech's item (a
      cough, an "mm-hm", the answer's own echo: the verdict), and is cut by
      a real interruption:
      ``response.done`` with ``finish_reason: "interrupted"``, or, for an
      answer whose audio had all been sent (the server no longer pauses it,
      the client still plays it), the speech's final transcript with words
      (resumed when it has none) or a response that starts.

    Each cut answers :meth:`take` with the ``response.cancel`` to send, with
    ``audio_end_ms`` of what was played (the server keeps those words).

    Args:
        sample_rate: the answers' sample rate (the session's output rate).
        mode: the session's ``turn_detection.interruption.mode`` in force.
        clock: seconds, as :class:`Playback`'s.

    Attributes:
        playbacks: a :class:`Playback` per response id, in the order they started.
        discarded: the ``input_audio.discarded`` events seen: speech the server
            judged no interruption and no turn.
        cancels: the ``response.cancel`` events :meth:`take` returned.
    """

    def __init__(
        self, sample_rate: int, *, mode: InterruptionMode = "confirm", clock: Clock = time.monotonic
    ) -> None:
        self.sample_rate = sample_rate
        self.mode: InterruptionMode = mode
        self._clock = clock
        self.playbacks: dict[str, Playback] = {}
        self.discarded: list[dict[str, Any]] = []
        self.cancels: list[dict[str, Any]] = []
        # speech over an answer, awaiting its verdict (its item, and the answer it
        # paused); the answer may play on meanwhile (resumed at a pause in the speech)
        self._overlap_item: str | None = None
        self._overlap: str | None = None
        self._speech_item: str | None = None  # the item of the last speech_started

    def sink(self, response_id: str) -> Callable[[bytes], None]:
        """The ``on_audio`` of a response: its audio goes to its playback."""
        return self._playback(response_id).push

    @property
    def current(self) -> Playback | None:
        """The playback of the latest response, if any."""
        return next(reversed(self.playbacks.values()), None)

    @property
    def paused(self) -> bool:
        """Whether a playback is paused, awaiting the server's verdict."""
        return any(p.paused for p in self.playbacks.values())

    @property
    def judging(self) -> str | None:
        """The item of the speech over an answer whose verdict is still to come, if any."""
        return self._overlap_item if self._overlap is not None else None

    def take(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """Apply one server event; returns a ``response.cancel`` to send, if it cut an answer."""
        kind = event.get("type")
        if kind == "response.created":
            self._playback(event["response_id"])
            if self._overlap is not None:  # the speech was a turn (or another began): the held answer ends
                return self._cut_overlapped()
        elif kind == "input_audio.speech_started":
            self._speech_item = event.get("item_id")
            playing = self._playing()
            if playing is None:
                return None
            if self.mode == "immediate":
                return self._cut(playing)
            self.playbacks[playing].pause()
            self._overlap_item, self._overlap = self._speech_item, playing
        elif kind == "response.audio.paused":
            playback = self._playback(event["response_id"])
            if playback.cut_at is None:
                playback.pause()
                self._overlap_item, self._overlap = self._speech_item, event["response_id"]
        elif kind == "response.audio.resumed":
            if (overlap := self._overlap) is not None and event["response_id"] == overlap:
                # the speech is judged again at its end: still held
                self.playbacks[overlap].resume()
        elif kind == "input_audio.discarded":
            self.discarded.append(event)
            if event.get("item_id") == self._overlap_item:
                self._release()
        elif (
            kind == "input_audio.transcript"
            and event.get("final")
            and event.get("item_id") == self._overlap_item
        ):
            if str(event.get("text", "")).strip():
                return self._cut_overlapped()
            self._release()  # nothing was heard: no turn
        elif kind == "response.done" and event.get("finish_reason") == "interrupted":
            done = self.playbacks.get(event["response_id"])
            if done is not None and done.cut_at is None and (done.pending or done.paused):
                return self._cut(event["response_id"])
        return None

    def _playback(self, response_id: str) -> Playback:
        if response_id not in self.playbacks:
            self.playbacks[response_id] = Playback(self.sample_rate, clock=self._clock)
        return self.playbacks[response_id]

    def _playing(self) -> str | None:
        """The response whose audio is still to be heard, if any (the latest)."""
        for response_id in reversed(self.playbacks):
            playback = self.playbacks[response_id]
            if playback.cut_at is None and playback.pending:
                return response_id
        return None

    def _release(self) -> None:
        """A false interruption: the answer plays on from where it paused (if it still is)."""
        if self._overlap is not None:
            self.playbacks[self._overlap].resume()
        self._overlap_item = self._overlap = None

    def _cut_overlapped(self) -> dict[str, Any] | None:
        held = self._overlap
        self._overlap_item = self._overlap = None
        return self._cut(held) if held is not None else None

    def _cut(self, response_id: str) -> dict[str, Any] | None:
        """Barge-in: drop the rest of the answer; the cancel that says what was heard."""
        if response_id == self._overlap:
            self._overlap_item = self._overlap = None
        playback = self.playbacks[response_id]
        if playback.cut_at is not None:
            return None
        cancel = {"type": "response.cancel", "response_id": response_id, "audio_end_ms": playback.cut()}
        self.cancels.append(cancel)
        return cancel


__all__ = ("AnswerPlayer", "Clock", "InterruptionMode", "Playback")
