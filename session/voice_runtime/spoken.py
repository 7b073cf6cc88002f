"""The responses a connection's voice side knows: whether each is spoken, its turn, its speaker.

:class:`SpokenResponses` remembers the last responses of one connection
(``_REMEMBERED``, so a late ``response.cancel`` still names one), makes the
:class:`~bargein.session.voice_runtime.speaker.Speaker` that subscribes to a
spoken response's delivery, and maps a cancel's audio milliseconds to the
characters the user heard.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

from bargein.protocol import events as pe
from bargein.session.runtime.admission import AudioBudget
from bargein.session.runtime.delivery import SendEvent
from bargein.session.runtime.observer import SessionObserver
from bargein.session.voice_runtime.runtime import VoiceRuntime
from bargein.session.voice_runtime.speaker import Playback, Speaker

_REMEMBERED = 16  # responses whose speaker a late response.cancel can still name


@dataclass(slots=True)
class VoiceResponse:
    """What the voice side knows of one response it speaks or started."""

    speaker: Speaker | None = None
    audio: bool = False  # spoken (modalities, or the session's output)
    input_item_id: str | None = None
    speech_end_at: float | None = None  # arrival of the turn's last voiced audio
    num_pending_items: int = 0  # waiting turns its response.create took as input


class SpokenResponses:
    """The last responses of one connection, as its voice side knows them.

    Args:
        runtime: the process's voice models and threads (the synthesizer).
        send: writes one server event (the speakers' audio).
        clock: monotonic seconds.
        observer: voice metrics (voice-to-voice latency, synthesis).
        playback: told what every speaker sends (the echo canceller's reference).
    """

    def __init__(
        self,
        runtime: VoiceRuntime,
        *,
        send: SendEvent,
        clock: Callable[[], float],
        observer: SessionObserver,
        playback: Playback | None = None,
    ) -> None:
        self._runtime = runtime
        self._playback = playback
        self._send = send
        self._clock = clock
        self._observer = observer
        self._responses: OrderedDict[str, VoiceResponse] = OrderedDict()

    def remember(self, response_id: str, response: VoiceResponse) -> None:
        """``response`` got its id; the oldest beyond ``_REMEMBERED`` are forgotten."""
        self._responses[response_id] = response
        self._responses.move_to_end(response_id)
        while len(self._responses) > _REMEMBERED:
            self._responses.popitem(last=False)

    def forget(self, response_id: str) -> None:
        """A response withdrawn (a speculative answer the user spoke over)."""
        self._responses.pop(response_id, None)

    def created(self, event: pe.ResponseCreated) -> pe.ResponseCreated:
        """``response.created`` with its ``modalities``, and the ``input_item_id``
        of a voice turn."""
        response = self._responses.get(event.response_id)
        if response is None:
            return event
        modalities: tuple[pe.Modality, ...] = ("text", "audio") if response.audio else ("text",)
        return replace(event, input_item_id=response.input_item_id, modalities=modalities)

    def speaks_on_resume(self, response_id: str, audio_from_ms: int | None) -> bool:
        """Whether a resume with ``audio_from_ms`` speaks ``response_id``: a
        response of this connection if it was created spoken, any other
        (whether it was spoken is not logged); never without ``audio_from_ms``."""
        if audio_from_ms is None:
            return False
        response = self._responses.get(response_id)
        return response is None or response.audio

    def speaker(
        self,
        response_id: str,
        stream_id: str,
        *,
        sample_rate: int,
        skip_before_ms: int | None = None,
        budget: AudioBudget | None = None,
    ) -> Speaker | None:
        """The speaker of a response being delivered (None: text only).

        ``sample_rate``: the session's output rate (Hz). ``skip_before_ms``: a
        resume's ``audio_from_ms``. A response of this connection is spoken if
        it was created so; one of another connection only on a resume that
        asks for its audio (:meth:`speaks_on_resume`). ``budget``: a resume's,
        charged with the speech synthesized again (:class:`Speaker`).
        """
        response = self._responses.get(response_id)
        if response is None:
            if skip_before_ms is None:
                return None
            response = self._responses[response_id] = VoiceResponse(audio=True)
        elif not response.audio:
            return None  # audio_from_ms of a text-only response is ignored (8.8)
        speech_end_at = response.speech_end_at

        def first_audio() -> None:
            if speech_end_at is not None:
                self._observer.voice_to_voice(self._clock() - speech_end_at)

        response.speaker = Speaker(
            self._runtime.models.synthesizer,
            response_id=response_id,
            stream_id=stream_id,
            sample_rate=sample_rate,
            send=self._send,
            run_blocking=self._runtime.run,
            skip_before_ms=skip_before_ms or 0,
            clock=self._clock,
            observer=self._observer,
            on_first_audio=first_audio,
            budget=budget,
            playback=self._playback,
            tool_filler=self._runtime.config.tool_filler,
        )
        return response.speaker

    def cut(self, response_id: str, heard_chars: int | None, audio_end_ms: int | None) -> int | None:
        """A cancel or truncation of ``response_id``: its speaker sends no more
        audio. Returns the ``heard_chars`` it means: for a spoken response
        the cut is at the audio, at ``audio_end_ms`` (a word boundary at most
        one word past it), else, while its audio is paused (a confirmed
        interruption), at the server's estimate of what the client played
        by the pause (:meth:`Speaker.played_ms`), else at the audio sent;
        with ``heard_chars`` too, the shorter cut wins. A text-only response
        keeps the client's ``heard_chars``."""
        response = self._responses.get(response_id)
        if response is None or response.speaker is None:
            return heard_chars
        speaker = response.speaker
        if audio_end_ms is None and speaker.paused:
            # the client holds its playback where the pause reached it; the
            # audio sent runs ahead of it by up to the whole answer
            audio_end_ms = speaker.played_ms(self._clock())
        cut = speaker.cut_chars(audio_end_ms)
        speaker.stop()
        return cut if heard_chars is None else min(cut, heard_chars)

    def audible(self, now: float) -> list[Speaker]:
        """The speakers the client may still be playing at ``now`` (:meth:`Speaker.audible`)."""
        return [
            r.speaker for r in self._responses.values() if r.speaker is not None and r.speaker.audible(now)
        ]

    def stop_all(self) -> bool:
        """A barge-in: every speaker still speaking stops (a response whose
        generation ended may still be speaking). Returns whether one was."""
        stopped = False
        for response in self._responses.values():
            if response.speaker is not None and not response.speaker.stopped:
                response.speaker.stop()
                stopped = True
        return stopped
