"""The voice loop of one connection: turns in, barge-ins, responses spoken out.

:class:`VoiceChannel` is the voice side plugged into a connection
(:class:`~bargein.session.runtime.voice_port.VoicePort`; :func:`plug` makes
the factory the app hands the connection). It takes the audio events
(``input_audio.*``), runs them through
:class:`~bargein.session.voice_runtime.audio_input.VoiceInput`, and reports
what the turn detector saw to the connection, its owner
(:class:`~bargein.session.runtime.voice_port.VoiceHooks`), which decides:

- speech started: ``input_audio.speech_started``; with ``interrupt_response``
  the response being spoken stops at once (its :class:`Speaker` sends nothing
  more) and the owner is told of the barge-in: it cancels the active
  response as a ``response.cancel`` would, cut at the text of the audio sent
  (a client that reports ``audio_end_ms`` re-cuts it);
- speech stopped (or ``input_audio.commit``): ``input_audio.speech_stopped``,
  ``input_audio.committed``, then the turn is transcribed off the event loop
  (``input_audio.transcript``) and, with ``create_response``, the owner is
  handed a response to create with the transcript as its user item; without
  it the item waits for the client's next ``response.create``.

Partial transcripts (``partials.py``): at a pause inside a turn the audio
so far is transcribed, by the speculative answer's transcription when one
starts there, else by a partial transcription of its own (at most one in
flight per connection, started only while a voice thread stays idle beside
it, so it never queues in front of a turn's final transcription); the text
is shown as ``input_audio.transcript`` with ``final: false`` while it extends
the last one shown, and, where no speculative answer runs, the conversation
plus that text is prefilled into the engine's prefix cache (the owner's
``on_partial_turn``). A turn that ends at that pause reuses the pause's
transcript as its final one instead of transcribing the audio again.

It also keeps each voice response's speaker, which subscribes to the
response's delivery, so ``response.cancel`` with ``audio_end_ms`` maps
milliseconds to characters, and a resume with ``audio_from_ms`` re-derives
the audio from the logged text.

Bounds (docs/protocol.md sections 2 and 8.4): a connection has at most
``VoiceConfig.max_turns`` turns being transcribed at once (its share of the
process's voice threads; a turn past it is refused with ``rate_limited``),
each turn's audio seconds are charged to its principal's audio rate limit,
and at most ``max_pending_turns`` transcribed turns wait for a
``response.create`` (past it the oldest is dropped, with an ``error``), so a
``response.create`` can always take them all. A transcription that fails is
reported as a final ``input_audio.transcript`` with an ``error``, and logged.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bargein.protocol import events as pe
from bargein.session.cancel import cancel_and_wait
from bargein.session.conversation.actions import Action, Send, StartDelivery
from bargein.session.runtime.admission import AudioBudget, Refusal
from bargein.session.runtime.voice_port import (
    ApplyAudio,
    CreatePlan,
    VoiceContext,
    VoiceFactory,
    VoiceRefusal,
)
from bargein.session.voice_runtime.audio_input import VoiceInput
from bargein.session.voice_runtime.interruptions import ConfirmedInterruptions
from bargein.session.voice_runtime.partials import PartialTranscript
from bargein.session.voice_runtime.runtime import VoiceRuntime
from bargein.session.voice_runtime.settings import DEFAULT_OUTPUT_RATE, SessionAudio, as_event, merged
from bargein.session.voice_runtime.span_transcripts import Span
from bargein.session.voice_runtime.speaker import Speaker
from bargein.session.voice_runtime.spoken import SpokenResponses, VoiceResponse
from bargein.voice.audio import Resampler, pcm16_to_float
from bargein.voice.errors import InputAudioFull
from bargein.voice.interruption import DEFAULT_INTERRUPTION, Interruption
from bargein.voice.turns import SpeechPaused, SpeechResumed, SpeechStarted, SpeechStopped, TurnDetection
from bargein.voice.vad import SAMPLE_RATE

logger = logging.getLogger(__name__)
FIRST_TRANSCRIBE_S = 1.0  # the retry hint of a refused turn before any transcription was timed
TRANSCRIPTION_FAILED = "the turn's audio could not be transcribed (a server fault); say it again"


def plug(runtime: VoiceRuntime, *, interruption: Interruption = DEFAULT_INTERRUPTION) -> VoiceFactory:
    """What a :class:`~bargein.session.runtime.connection.Connection` is given
    to have a voice side on ``runtime``'s models and threads; ``interruption``:
    the endpoint's default (turn detection turned on starts with it)."""
    return functools.partial(VoiceChannel, runtime, interruption=interruption)


@dataclass(slots=True, kw_only=True)
class _Speculation:
    """A turn answered at a pause, before its end (see VoiceChannel)."""

    item_id: str
    audio_start_ms: int
    audio_end_ms: int  # where the pause began
    speech_end_at: float | None
    task: asyncio.Task[None] | None = None
    text: str | None = None  # its transcript, once known
    response_id: str | None = None  # once its response.create is applied
    held: list[Action] = field(default_factory=list)  # its response.created, its delivery
    wanted: bool = True  # False once the user went on speaking
    adopted: bool = False
    failed: bool = False  # its transcription raised


@dataclass(slots=True, kw_only=True)
class _PauseTranscript:
    """A partial transcription of a turn at a pause (no speculative answer runs)."""

    audio_start_ms: int  # where the turn's audio starts
    audio_end_ms: int  # where the pause began
    task: asyncio.Task[None] | None = None
    text: str | None = None  # once known; None after a failure
    known: asyncio.Event = field(default_factory=asyncio.Event)  # set once text is final or failed


class VoiceChannel:
    """The voice side of one connection.

    Args:
        runtime: the process's voice models and threads.
        context: what the connection gives its voice side: itself as the
            owner told of what the channel sees, its ``send``, its clock, the
            observer (voice metrics), the bound on waiting turns, and the
            charge of each turn's audio to its audio rate limit.
        interruption: the endpoint's default interruption settings (a turn
            detection turned on, or of a new type, starts with them).
    """

    def __init__(
        self,
        runtime: VoiceRuntime,
        context: VoiceContext,
        *,
        interruption: Interruption = DEFAULT_INTERRUPTION,
    ) -> None:
        self.runtime = runtime
        self.settings = SessionAudio(turn_detection=TurnDetection(interruption=interruption))
        self._default_interruption = interruption
        self._hooks = context.hooks
        self._send = context.send
        self._observer = context.observer
        self._clock = context.clock
        self._max_pending_turns = context.max_pending_turns
        self._admit_audio = context.admit_audio
        # tasks whose transcription is queued or running in the voice threads
        # (they leave it once their text is known, before their response)
        self._transcribing: set[asyncio.Task[None]] = set()
        self._transcribe_s = FIRST_TRANSCRIBE_S  # the last transcription's time, for retry hints
        self._input: VoiceInput | None = None  # made at the first audio
        self._spoken = SpokenResponses(
            runtime,
            send=self._send,
            clock=self._clock,
            observer=self._observer,
            playback=_InputPlayback(self),
        )
        self._pending_items: list[tuple[str, pe.InputItem]] = []  # turns without a response yet
        self._next: VoiceResponse | None = None  # of a voice turn's response.create, before it is applied
        self._creating: VoiceResponse | None = None  # of the response.create being applied
        self._turns: set[asyncio.Task[None]] = set()
        self._barged = False  # the turn being spoken interrupted a response
        self._speculation: _Speculation | None = None  # of the turn being spoken
        # the user item the turn being spoken becomes, announced at its start
        self._turn_item_id: str | None = None
        self._unshown: list[_Speculation] = []  # speculations whose answer is held back
        self._partial: PartialTranscript | None = None  # of the turn being spoken
        self._pause: _PauseTranscript | None = None  # the partial transcription in flight or last done
        self._interruptions = ConfirmedInterruptions(
            send=self._send,
            transcribe=self._transcribe,
            cut=self._cut_confirmed,
            spawn=self._spawn,
            clock=self._clock,
            observer=self._observer,
        )

    @property
    def max_input_audio_ms(self) -> int:
        """Most uncommitted input audio a session holds."""
        return self.runtime.config.max_input_audio_ms

    @property
    def max_turns(self) -> int:
        """Most turns of the connection transcribed at once."""
        return self.runtime.config.max_turns

    def unread_s(self, now: float) -> float:
        """Seconds the connection's reader should leave its frames unread
        (after an append refused for its pace, :attr:`VoiceInput.unread_until`);
        0: read on."""
        return 0.0 if self._input is None else max(0.0, self._input.unread_until - now)

    # ---- settings ----------------------------------------------------------------

    def merge(self, audio: pe.AudioSettings) -> ApplyAudio | VoiceRefusal:
        """What puts the settings a ``session.update``'s ``audio`` asks for in
        force, or the refusal; nothing changes until it is called (the rest
        of the update may still be refused, and a refused update changes
        nothing)."""
        try:
            new = merged(self.settings, audio, interruption=self._default_interruption)
        except ValueError as exc:
            return VoiceRefusal(pe.ErrorCode.INVALID_PARAMETER, str(exc))
        held = self._input is not None and self._input.buffer.duration_ms > 0
        if new.input_rate != self.settings.input_rate and held:
            # one turn has one rate
            message = "commit or clear the input audio before changing its sample_rate"
            return VoiceRefusal(pe.ErrorCode.CONFLICT, message)
        return functools.partial(self.apply, new)

    async def apply(self, new: SessionAudio, now: float) -> None:
        """Put settings from :meth:`merge` in force (the caller holds the lock).
        New turn detection forgets the turn in progress, and the answer
        started at its pause."""
        if new.turn_detection != self.settings.turn_detection:
            await self.drop_speculation(now, unless=None)
            await self._end_pause(None)
            self._interruptions.forget()
            self._partial = None
        self.settings = new
        if self._input is not None:
            self._input.apply(new)

    def updated(self, event: pe.SessionUpdated) -> pe.SessionUpdated:
        """``session.updated`` with the audio settings in force."""
        return replace(event, session=replace(event.session, audio=as_event(self.settings)))

    def audio_settings(self) -> pe.AudioSettings:
        """The audio settings in force (saved with the session)."""
        return as_event(self.settings)

    # ---- input -------------------------------------------------------------------

    async def handle_input(self, event: object, received_at: float) -> None:
        """``input_audio.append``/``commit``/``clear`` (the caller holds the lock)."""
        inp = self._input
        if inp is None:
            inp = self._input = VoiceInput(self.runtime, self.settings)
        if isinstance(event, pe.InputAudioAppend):
            if (wait_s := inp.too_fast(event.audio, received_at)) is not None:
                await self._too_fast(event, wait_s)
                return
            try:
                seen = await inp.feed(event.audio, received_at)
            except InputAudioFull as exc:
                await self._error(pe.ErrorCode.INVALID_PARAMETER, str(exc), event)
                return
            except ValueError as exc:
                await self._error(pe.ErrorCode.INVALID_PARAMETER, f"audio: {exc}", event)
                return
            for what, audio in seen:
                await self._on_turn_event(what, audio, inp, received_at)
            # speech over an answer that goes on past max_pause_ms is judged there
            self._interruptions.heard(inp.buffer.total_ms, inp.buffer.read, in_speech=inp.in_speech)
        elif isinstance(event, pe.InputAudioCommit):
            await self.drop_speculation(received_at, unless=None)  # the turn ends here instead
            await self._end_pause(None)
            self._interruptions.forget()
            self._partial = None
            # a commit of nothing runs no transcription: nothing to bound
            held = inp.buffer.duration_ms > 0
            refusal = self._refuse_turn(inp.buffer.duration_ms / 1000, received_at) if held else None
            if refusal is not None:
                # the audio stays uncommitted: the same commit succeeds later
                await self._refused(refusal, event, "commit again later")
                return
            start, end, audio = inp.take_all()
            self._start_turn(audio, start, end, speech_end_at=received_at)
        elif isinstance(event, pe.InputAudioClear):
            await self.drop_speculation(received_at, unless=None)  # with the turn it answered
            await self._end_pause(None)
            self._interruptions.forget()
            self._partial = None
            inp.clear()

    async def _on_turn_event(self, what: object, audio: Any, inp: VoiceInput, now: float) -> None:
        td = inp.turn_detection
        assert td is not None
        if isinstance(what, SpeechStarted):
            item_id = self._turn_item_id = f"item_{uuid.uuid4().hex}"
            speakers = self._spoken.audible(now) if td.interruption.mode == "confirm" else []
            if td.interrupt_response and speakers:
                # confirm: the answer pauses; its words decide (interruptions.py)
                padding = td.prefix_padding_ms if isinstance(td, TurnDetection) else td.vad.prefix_padding_ms
                self._interruptions.pause(
                    speakers,
                    item_id=item_id,
                    audio_start_ms=what.audio_start_ms,
                    onset_ms=min(what.audio_start_ms + padding, inp.buffer.total_ms),
                    config=td.interruption,
                    now=now,
                )
                self._observer.barge_in(self._clock() - now)
            elif td.interrupt_response:
                await self._barge_in(now)
            self._partial = PartialTranscript(item_id)
            await self._send(pe.InputAudioSpeechStarted(audio_start_ms=what.audio_start_ms, item_id=item_id))
            await self._interruptions.announce()
        elif isinstance(what, SpeechStopped) and self._interruptions.judging:
            # speech over an answer: a turn only if its words interrupt it
            item_id = self._turn_item_id or f"item_{uuid.uuid4().hex}"
            self._turn_item_id, self._partial = None, None
            await self._send(pe.InputAudioSpeechStopped(audio_end_ms=what.audio_end_ms, item_id=item_id))
            await self._end_pause(what.audio_end_ms)
            self._spawn(
                self._overlapped_turn(item_id, audio, what, speech_end_at=inp.arrival_of(what.audio_end_ms)),
                f"overlapped-{item_id}",
            )
        elif isinstance(what, SpeechStopped):
            self._interruptions.forget()  # confirmed (or none): the turn goes on as any
            await self._send(
                pe.InputAudioSpeechStopped(audio_end_ms=what.audio_end_ms, item_id=self._turn_item_id)
            )
            self._partial = None  # the final transcript follows: no partial after it
            pause = await self._end_pause(what.audio_end_ms)
            speculation, self._speculation = self._speculation, None
            if speculation is not None and speculation.audio_end_ms == what.audio_end_ms:
                self._turn_item_id = None
                self._spawn(self._adopt(speculation), f"adopt-{speculation.item_id}")
                return
            if speculation is not None:
                await self._drop(speculation, now)
            refusal = self._refuse_turn((what.audio_end_ms - what.audio_start_ms) / 1000, now)
            if refusal is not None:
                self._turn_item_id = None  # the detector took the audio: the turn is gone
                await self._refused(refusal, None, f"the turn ending at {what.audio_end_ms} ms was dropped")
                return
            self._start_turn(
                audio,
                what.audio_start_ms,
                what.audio_end_ms,
                speech_end_at=inp.arrival_of(what.audio_end_ms),
                reuse=pause,
            )
        elif isinstance(what, SpeechPaused) and self._interruptions.judging:
            self._interruptions.paused(audio, (what.audio_start_ms, what.audio_end_ms))
        elif isinstance(what, SpeechPaused):
            if (
                self.runtime.config.speculate
                and td.create_response
                and self._speculation is None
                and self._hooks.active_response_id is None
                and len(self._transcribing) < self.runtime.config.max_turns
            ):
                # the turn's own item id: a speculation is retracted (its item
                # gone) before the turn's next pause or its end
                speculation = _Speculation(
                    item_id=self._turn_item_id or f"item_{uuid.uuid4().hex}",
                    audio_start_ms=what.audio_start_ms,
                    audio_end_ms=what.audio_end_ms,
                    speech_end_at=inp.arrival_of(what.audio_end_ms),
                )
                self._speculation = speculation
                self._unshown.append(speculation)
                speculation.task = self._spawn(
                    self._speculate(speculation, audio), f"speculate-{speculation.item_id}", transcribes=True
                )
            elif self._may_transcribe_partial():
                pause = self._pause = _PauseTranscript(
                    audio_start_ms=what.audio_start_ms, audio_end_ms=what.audio_end_ms
                )
                pause.task = self._spawn(self._transcribe_pause(pause, audio), f"partial-{what.audio_end_ms}")
        elif isinstance(what, SpeechResumed) and self._interruptions.judging:
            self._interruptions.resumed()
        elif isinstance(what, SpeechResumed) and self._speculation is not None:
            speculation, self._speculation = self._speculation, None
            await self._drop(speculation, now)

    # ---- speculative turns ---------------------------------------------------------
    #
    # At a short pause (TurnDetection.pause_ms) the turn so far is transcribed
    # and answered at once, out of the client's sight: its response.created and
    # delivery are held. If the silence lasts until the turn ends, the held
    # response is adopted (the user hears an answer the transcription and the
    # prefill of which already ran during the silence window); if the user goes
    # on speaking, it is retracted: its items leave the conversation and its
    # request is aborted, freeing its KV blocks.

    async def transcribe(self, pcm: bytes, now: float) -> str | VoiceRefusal:
        """The words of ``pcm`` (pcm16 at the session's input rate), for an
        audio item the client adds whole (OpenAI's ``input_audio`` content),
        or why not: not whole samples (``invalid_parameter``), a turn past
        the connection's bound or its principal's audio rate
        (``rate_limited``), or a failed transcription (``internal_error``,
        logged)."""
        try:
            samples = pcm16_to_float(pcm)
            refusal = self._refuse_turn(len(samples) / self.settings.input_rate, now)
            if refusal is not None:
                return VoiceRefusal(refusal.code, refusal.message, refusal.retry_after_ms)
            resampler = Resampler(self.settings.input_rate, SAMPLE_RATE)
            audio = np.concatenate([resampler.process(samples), resampler.flush()])
        except ValueError as exc:
            return VoiceRefusal(pe.ErrorCode.INVALID_PARAMETER, f"audio: {exc}")
        try:
            return await self._transcribe(audio)
        except Exception:
            logger.exception("transcribing an audio item failed")
            retry_ms = max(100, round(1000 * self._transcribe_s))
            return VoiceRefusal(pe.ErrorCode.INTERNAL_ERROR, TRANSCRIPTION_FAILED, retry_ms)

    async def _transcribe(self, audio: Any, span: Span | None = None) -> str:
        """A turn's text (``audio``: float32 at 16 kHz), in the voice threads;
        timed. The calling task leaves :attr:`_transcribing` when it is done.
        ``span``: where ``audio`` lies on the input timeline: a span already
        transcribed, or being transcribed by the end-of-turn score, is not
        transcribed again (span_transcripts.py).

        Raises:
            Exception: whatever the transcriber raises.
        """
        started = self._clock()
        inp = self._input
        ran: list[bool] = []  # whether Whisper ran for this call (not a shared span's text)

        def transcribe() -> str:
            ran.append(True)
            text: str = self.runtime.models.transcriber.transcribe(audio)
            return text

        def shared() -> str:
            if span is None or inp is None:
                return transcribe()
            return inp.transcripts.text(span, transcribe)

        try:
            text: str = await self.runtime.run(shared)
        finally:
            self._transcribing.discard(asyncio.current_task())
        if ran:  # the time of a transcription, for retry hints and the metric
            self._transcribe_s = self._clock() - started
            self._observer.transcribed(seconds=self._transcribe_s, audio_s=len(audio) / SAMPLE_RATE)
        return text

    def _refuse_turn(self, audio_s: float, now: float) -> Refusal | None:
        """Why a turn of ``audio_s`` seconds may not be transcribed now, or
        None (then its audio is charged to the principal's rate limit)."""
        limit = self.runtime.config.max_turns
        if len(self._transcribing) >= limit:
            return Refusal(
                code=pe.ErrorCode.RATE_LIMITED,
                message=f"at most {limit} voice turns of one connection are transcribed at once "
                "(limits.max_voice_turns)",
                retry_after_ms=max(100, round(1000 * self._transcribe_s)),
            )
        return None if self._admit_audio is None else self._admit_audio(audio_s, now)

    async def _refused(self, refusal: Refusal, event: object, what_now: str) -> None:
        await self._send(
            pe.ErrorEvent(
                code=refusal.code,
                message=f"{refusal.message}; {what_now}",
                retryable=refusal.code.retryable,
                retry_after_ms=refusal.retry_after_ms,
                event_id=getattr(event, "event_id", None),
            )
        )

    async def _speculate(self, speculation: _Speculation, audio: Any) -> None:
        try:
            text = await self._transcribe(audio, (speculation.audio_start_ms, speculation.audio_end_ms))
        except Exception:
            # nothing was shown; the turn's end says so if it ends here (_adopt)
            logger.exception("transcribing speculative turn %s failed", speculation.item_id)
            speculation.failed = True
            return
        speculation.text = text
        await self._show_partial(text)
        if not text:
            return
        response_id = f"resp_{uuid.uuid4().hex}"

        def claim() -> bool:
            # asked under the connection's lock, where barge-ins and resumes run,
            # once the owner saw no response active
            if speculation.wanted:
                speculation.response_id = response_id
                self._next = VoiceResponse(
                    input_item_id=speculation.item_id, speech_end_at=speculation.speech_end_at
                )
            return speculation.wanted

        item = pe.InputItem(role="user", content=text, item_id=speculation.item_id)
        create = pe.ResponseCreate(response_id=response_id, input=(item,))
        await self._hooks.on_speculative_turn(create, claim)

    # ---- partial transcripts (partials.py) ----------------------------------------

    def _may_transcribe_partial(self) -> bool:
        """Whether a pause without a speculative answer gets a partial
        transcription: none in flight for this connection, and a voice thread
        stays idle beside it for a turn's final transcription (a busy pool
        skips partials: they are a preview, a final is the turn)."""
        in_flight = self._pause is not None and not self._pause.known.is_set()
        return self._partial is not None and not in_flight and self.runtime.idle_threads >= 2

    async def _transcribe_pause(self, pause: _PauseTranscript, audio: Any) -> None:
        """Transcribe the turn so far at a pause: show it as a partial, then
        prefill the conversation plus it (unless the turn ended meanwhile:
        its real request comes at once)."""
        try:
            pause.text = await self._transcribe(audio, (pause.audio_start_ms, pause.audio_end_ms))
            await self._show_partial(pause.text)
        except Exception:
            logger.exception("partial transcription at %d ms failed", pause.audio_end_ms)
            return  # the turn's end transcribes it all again
        finally:
            pause.known.set()
        td = self.settings.turn_detection
        wanted = self.runtime.config.prefill and td is not None and td.create_response
        if wanted and pause.text and self._pause is pause:
            await self._hooks.on_partial_turn(pause.text)

    async def _show_partial(self, text: str) -> None:
        """Send ``text`` (the turn so far) as a partial transcript if it
        extends the last one shown (PartialTranscript.next)."""
        partial = self._partial
        shown = partial.next(text) if partial is not None else None
        if partial is not None and shown is not None:
            await self._send(pe.InputAudioTranscript(item_id=partial.item_id, text=shown, final=False))

    async def _end_pause(self, audio_end_ms: int | None) -> _PauseTranscript | None:
        """The turn ends (at ``audio_end_ms``; None: a commit, a clear, new
        settings): the pause transcription that heard all of it is returned
        for the final transcript to reuse; any other is stopped (a queued one
        leaves the queue; one running finishes unread)."""
        pause, self._pause = self._pause, None
        if pause is None:
            return None
        if audio_end_ms is not None and pause.audio_end_ms == audio_end_ms:
            return pause
        if pause.task is not None:
            await cancel_and_wait([pause.task])
        return None

    async def _adopt(self, speculation: _Speculation) -> None:
        """The turn ended where the speculation's pause began: show its answer."""
        await self._send(
            pe.InputAudioCommitted(
                item_id=speculation.item_id,
                audio_start_ms=speculation.audio_start_ms,
                audio_end_ms=speculation.audio_end_ms,
            )
        )
        if speculation.task is not None:
            await asyncio.wait([speculation.task])  # its failure is its own (logged, flagged)
        speculation.adopted = True
        self._unshown.remove(speculation)
        self._observer.speculation(adopted=True)
        if speculation.failed:
            await self._transcription_failed(speculation.item_id)
            return
        await self._send(
            pe.InputAudioTranscript(item_id=speculation.item_id, text=speculation.text or "", final=True)
        )
        self._judge_barge_in(speculation.text or "")
        if any(_shows_response(action) for action in speculation.held):
            await self._hooks.on_speculation_adopted(speculation.held)
        else:
            # No answer started at the pause (a response was still active, or
            # the start was refused: its error held back, unseen): the turn
            # is answered now, as one without speculation is, so it gets an
            # answer or a refusal, never silence.
            await self._answer(speculation.item_id, speculation.text or "", speculation.speech_end_at)

    async def _drop(self, speculation: _Speculation, now: float) -> None:
        """The user went on speaking: retract the speculative answer (the
        caller holds the connection's lock)."""
        speculation.wanted = False
        task = speculation.task
        if task is not None and speculation.response_id is None and not task.done():
            # its transcription may still wait in the voice threads' queue:
            # cancelling the task takes the job out of it (a job already
            # running finishes there, unread)
            self._transcribing.discard(task)
            await cancel_and_wait([task])
        if speculation in self._unshown:
            self._unshown.remove(speculation)
        self._observer.speculation(adopted=False)
        if speculation.response_id is not None:
            self._spoken.forget(speculation.response_id)
            await self._hooks.on_speculation_dropped(speculation.response_id, now)

    async def drop_speculation(self, now: float, *, unless: str | None) -> None:
        """A ``response.create`` other than the speculation's own (response id
        ``unless``): the speculative answer of the turn being spoken gives way
        (the caller holds the lock)."""
        speculation = self._speculation
        if speculation is not None and (unless is None or speculation.response_id != unless):
            self._speculation = None
            await self._drop(speculation, now)

    def holds(self, action: Action) -> bool:
        """Keep ``action`` back if it shows a speculative response not adopted
        yet, or the ``error`` that refused one (the client never saw it asked)."""
        for speculation in self._unshown:
            if speculation.response_id is None:
                continue
            refused = (
                isinstance(action, Send)
                and isinstance(action.event, pe.ErrorEvent)
                and action.event.response_id == speculation.response_id
            )
            if refused or _response_of(action) == speculation.response_id:
                speculation.held.append(action)
                return True
        return False

    def _spawn(self, coro: Any, name: str, *, transcribes: bool = False) -> asyncio.Task[None]:
        """Run ``coro`` as one of the connection's voice tasks; ``transcribes``:
        it holds one of the connection's :attr:`_transcribing` slots until
        its transcription is done."""
        task = asyncio.create_task(coro, name=name)
        self._turns.add(task)
        if transcribes:
            self._transcribing.add(task)
        task.add_done_callback(self._forget)
        return task

    def _forget(self, task: asyncio.Task[None]) -> None:
        """A voice task ended: a failure no handler caught is logged (a bug),
        never left to asyncio's report of an unretrieved exception."""
        self._turns.discard(task)
        self._transcribing.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.error("voice task %s failed", task.get_name(), exc_info=exc)

    async def _barge_in(self, now: float) -> None:
        """Speech started over the assistant: stop its audio, cancel its
        response (a response whose generation ended may still be speaking)."""
        interrupted = self._spoken.stop_all()
        if await self._hooks.on_barge_in(now):
            interrupted = True  # the owner cancelled the active response, cut at its audio
        if interrupted:
            self._observer.barge_in(self._clock() - now)
            self._barged = True

    async def _cut_confirmed(self, response_ids: Sequence[str], now: float) -> None:
        """Speech that paused the answer is a real interruption: cut it as a
        barge-in does (interruptions.py)."""
        self._spoken.stop_all()
        await self._hooks.on_interruption_confirmed(response_ids, now)
        self._barged = True

    async def _overlapped_turn(
        self, item_id: str, audio: Any, what: SpeechStopped, *, speech_end_at: float | None
    ) -> None:
        """The end of speech that started over an answer: the user's turn if
        its words interrupt the answer, else nothing (it was discarded)."""
        span = (what.audio_start_ms, what.audio_end_ms)
        if not await self._interruptions.ended(audio, span):
            return
        refusal = self._refuse_turn((what.audio_end_ms - what.audio_start_ms) / 1000, self._clock())
        if refusal is not None:
            await self._refused(refusal, None, f"the turn ending at {what.audio_end_ms} ms was dropped")
            return
        self._start_turn(audio, *span, speech_end_at=speech_end_at, item_id=item_id)

    def _judge_barge_in(self, text: str) -> None:
        """The turn that barged in is transcribed: without words (a cough,
        noise, the assistant's own echo) the barge-in was a false one."""
        if self._barged:
            self._barged = False
            self._observer.barge_in_judged(real=bool(text))

    def _start_turn(
        self,
        audio: Any,
        start_ms: int,
        end_ms: int,
        *,
        speech_end_at: float | None,
        reuse: _PauseTranscript | None = None,
        item_id: str | None = None,
    ) -> None:
        """Commit, transcribe and answer a turn in a task of its own; its
        ``item_id`` is the one announced at its start unless given."""
        if item_id is None:
            item_id, self._turn_item_id = self._turn_item_id or f"item_{uuid.uuid4().hex}", None
        self._spawn(
            self._turn(item_id, audio, start_ms, end_ms, speech_end_at, reuse),
            f"turn-{item_id}",
            transcribes=len(audio) > 0,
        )

    async def _turn(
        self,
        item_id: str,
        audio: Any,
        start_ms: int,
        end_ms: int,
        speech_end_at: float | None,
        reuse: _PauseTranscript | None = None,
    ) -> None:
        """Commit, transcribe, and answer one user turn; ``reuse``: the
        transcription of a pause where the turn ended (it heard all of it)."""
        await self._send(
            pe.InputAudioCommitted(item_id=item_id, audio_start_ms=start_ms, audio_end_ms=end_ms)
        )
        try:
            text = await self._final_text(audio, (start_ms, end_ms), reuse)
        except Exception:
            logger.exception("transcribing voice turn %s failed", item_id)
            await self._transcription_failed(item_id)
            return
        await self._send(pe.InputAudioTranscript(item_id=item_id, text=text, final=True))
        self._judge_barge_in(text)
        await self._answer(item_id, text, speech_end_at)

    async def _answer(self, item_id: str, text: str, speech_end_at: float | None) -> None:
        """Answer a transcribed turn (or keep it for the client's next
        ``response.create``)."""
        if not text:
            return  # silence or noise: no words, no item
        item = pe.InputItem(role="user", content=text, item_id=item_id)
        td = self.settings.turn_detection
        if td is None or not td.create_response:
            # push to talk (no server VAD) or no auto response: the client's
            # next response.create answers it, as in OpenAI's realtime API
            await self._keep_pending(item_id, item)
            return

        def claim() -> bool:
            # under the lock: a client's response.create applied meanwhile must
            # not take this turn's item id
            self._next = VoiceResponse(input_item_id=item_id, speech_end_at=speech_end_at)
            return True

        create = pe.ResponseCreate(input=(item,), interrupt_active=True)
        # without interrupt_response the turn waits for the active response
        await self._hooks.on_user_turn(create, claim, after_active=not td.interrupt_response)

    async def _final_text(self, audio: Any, span: Span, reuse: _PauseTranscript | None) -> str:
        """The turn's final transcript: the pause's, when it heard the whole
        turn and succeeded, else ``audio`` (the input's ``span``) transcribed
        now, or by the end-of-turn score that read its words."""
        if reuse is not None:
            await reuse.known.wait()
            if reuse.text is not None:
                self._transcribing.discard(asyncio.current_task())  # nothing queued for this turn
                return reuse.text
        return await self._transcribe(audio, span) if len(audio) else ""  # no audio, no words

    async def _transcription_failed(self, item_id: str) -> None:
        """Tell the client the turn has no transcript (so no item, no
        response); the connection and its later turns go on."""
        self._barged = False  # nothing to judge the barge-in by
        error = pe.TranscriptionError(code=pe.ErrorCode.INTERNAL_ERROR, message=TRANSCRIPTION_FAILED)
        await self._send(pe.InputAudioTranscript(item_id=item_id, text="", final=True, error=error))

    async def _keep_pending(self, item_id: str, item: pe.InputItem) -> None:
        """Keep a transcribed turn for the next ``response.create``. At most
        ``max_pending_turns`` wait, so that one ``response.create`` can take
        them all: past it the oldest leaves (as OpenAI's truncation drops a
        conversation's oldest items), and the client is told which."""
        self._pending_items.append((item_id, item))
        if len(self._pending_items) <= self._max_pending_turns:
            return
        dropped, _ = self._pending_items.pop(0)
        message = (
            f"{self._max_pending_turns} voice turns wait for a response.create: "
            f"the oldest, {dropped}, was dropped"
        )
        await self._send(pe.ErrorEvent(code=pe.ErrorCode.CONFLICT, message=message, retryable=False))

    # ---- responses -----------------------------------------------------------------

    async def prepare_create(self, event: pe.ResponseCreate, now: float) -> CreatePlan:
        """A ``response.create`` is being applied: the speculative answer of
        the turn being spoken gives way (unless it is this one), the turns
        waiting for a response become its input; with ``interrupt_active``
        the response it interrupts is cut at its audio, as a cancel without
        ``heard_chars`` is (8.6). The caller holds the lock."""
        await self.drop_speculation(now, unless=event.response_id)
        event, problem = self._on_create(event)
        return CreatePlan(event, problem, cut_active_first=bool(event.interrupt_active))

    def _on_create(self, event: pe.ResponseCreate) -> tuple[pe.ResponseCreate, str | None]:
        """Add the turns still waiting for a response to ``event``'s input, and
        note whether it is spoken. Returns the event to apply and the problem
        refusing it, if any."""
        modalities = event.modalities
        audio = "audio" in modalities if modalities is not None else self.settings.output_rate is not None
        if audio and self.settings.output_rate is None:
            return event, "modalities asks for audio while session.audio.output is null (text only)"
        if len(self._pending_items) + len(event.input or ()) > self._max_pending_turns:
            return event, (
                f"input holds {len(event.input or ())} items and {len(self._pending_items)} voice turns "
                f"wait for a response: more than {self._max_pending_turns} in all; send response.create "
                "without input (the waiting turns are its input)"
            )
        creating, self._next = self._next or VoiceResponse(), None
        creating.audio = audio
        if self._pending_items:
            creating.input_item_id = creating.input_item_id or self._pending_items[-1][0]
            items = tuple(item for _, item in self._pending_items)
            creating.num_pending_items = len(items)  # they leave the queue once it is submitted
            event = replace(event, input=items + (event.input or ()))
        self._creating = creating
        return event, None

    def submitted(self, response_id: str) -> None:
        """The response being created got its id."""
        response, self._creating = self._creating or VoiceResponse(), None
        del self._pending_items[: response.num_pending_items]  # a refused create leaves them waiting
        self._spoken.remember(response_id, response)

    def created(self, event: pe.ResponseCreated) -> pe.ResponseCreated:
        """``response.created`` with its ``modalities``, and the ``input_item_id``
        of a voice turn."""
        return self._spoken.created(event)

    def speaks_on_resume(self, response_id: str, audio_from_ms: int | None) -> bool:
        """Whether a resume with ``audio_from_ms`` speaks ``response_id``
        (:meth:`SpokenResponses.speaks_on_resume`)."""
        return self._spoken.speaks_on_resume(response_id, audio_from_ms)

    def subscriber(
        self,
        response_id: str,
        stream_id: str,
        *,
        skip_before_ms: int | None = None,
        budget: AudioBudget | None = None,
    ) -> Speaker | None:
        """The speaker subscribed to a response's delivery (None: text only),
        at the session's output rate (:meth:`SpokenResponses.speaker`)."""
        rate = self.settings.output_rate or DEFAULT_OUTPUT_RATE
        return self._spoken.speaker(
            response_id, stream_id, sample_rate=rate, skip_before_ms=skip_before_ms, budget=budget
        )

    def cut(self, response_id: str, heard_chars: int | None, audio_end_ms: int | None) -> int | None:
        """A cancel or truncation of ``response_id``: its speaker sends no more
        audio; returns the ``heard_chars`` it means (:meth:`SpokenResponses.cut`)."""
        return self._spoken.cut(response_id, heard_chars, audio_end_ms)

    async def close(self, now: float) -> None:
        """The connection is gone: stop its turns, and retract the answers
        started at a pause that the client never saw (whatever the
        disconnect policy keeps, it keeps what the client was shown)."""
        self._interruptions.forget(resume=False)
        await cancel_and_wait(list(self._turns))
        if self._input is not None:
            self._input.close()
        self._speculation = None
        for speculation in list(self._unshown):
            await self._drop(speculation, now)

    async def _too_fast(self, event: pe.InputAudioAppend, wait_s: float) -> None:
        """Refuse an append that came while the connection's audio ran past
        its pace (nothing of it is taken; the connection goes on)."""
        config = self.runtime.config
        await self._send(
            pe.ErrorEvent(
                code=pe.ErrorCode.RATE_LIMITED,
                message=f"input audio faster than {config.max_input_audio_speed:g}x real time "
                f"(beyond a burst of {config.input_audio_burst_ms} ms); this append was not taken",
                retryable=True,
                retry_after_ms=max(1, math.ceil(wait_s * 1000)),
                event_id=event.event_id,
            )
        )

    async def _error(self, code: pe.ErrorCode, message: str, event: object) -> None:
        await self._send(
            pe.ErrorEvent(
                code=code,
                message=message,
                retryable=code.retryable,
                event_id=getattr(event, "event_id", None),
            )
        )


def _response_of(action: Action) -> str | None:
    """The response whose ``response.created`` or delivery ``action`` is, if either."""
    if isinstance(action, StartDelivery):
        return action.response_id
    if isinstance(action, Send) and isinstance(action.event, pe.ResponseCreated):
        return action.event.response_id
    return None


def _shows_response(action: Action) -> bool:
    """Whether ``action`` shows a response to the client (its ``response.created``)."""
    return isinstance(action, Send) and isinstance(action.event, pe.ResponseCreated)


class _InputPlayback:
    """The speakers' :class:`~bargein.session.voice_runtime.speaker.Playback`:
    what the client plays goes to the connection's input (its echo canceller),
    once it has one (made at the first audio)."""

    def __init__(self, channel: VoiceChannel) -> None:
        self._channel = channel

    def played(self, samples: np.ndarray, sample_rate: int, start_ms: float, sent_at: float) -> None:
        if (inp := self._channel._input) is not None:
            inp.played(samples, sample_rate, start_ms, sent_at)

    def paused(self, at: float) -> None:
        if (inp := self._channel._input) is not None:
            inp.playback_paused(at)

    def resumed(self, at: float) -> None:
        if (inp := self._channel._input) is not None:
            inp.playback_resumed(at)

    def ended(self, at: float) -> None:
        if (inp := self._channel._input) is not None:
            inp.playback_ended(at)
