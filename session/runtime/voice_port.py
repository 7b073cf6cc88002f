"""The seam between a connection and its voice side, one protocol each way.

A :class:`~bargein.session.runtime.connection.Connection` knows no voice:
whoever builds it (the app's ``/v1/realtime`` endpoint) plugs one in as a
:data:`VoiceFactory`, or leaves it out, and the connection runs with
:class:`TextOnly`, which refuses every audio event. The node runtime never
imports the voice runtime (``tests/test_layers.py``); the voice runtime
implements these protocols.

- :class:`VoicePort`: what the connection asks of its voice side, at the
  points of a client event's path where voice changes it (input audio,
  audio settings, audio items, a cut at the audio heard, a
  ``response.create``'s waiting turns, the speaker that subscribes to a
  response's delivery).
- :class:`VoiceHooks`: what the voice side reports to the connection, its
  one owner, which decides what to do (after LiveKit agents' recognition
  hooks): speech over the assistant (and, in ``confirm`` mode, its
  confirmation as an interruption), a user turn to answer, a turn's words
  so far at a pause (to prefill), a turn answered speculatively at a pause,
  adopted or dropped.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from bargein.protocol import events as pe
from bargein.session.conversation.actions import Action
from bargein.session.runtime.admission import AudioBudget, Refusal
from bargein.session.runtime.delivery import DeliverySubscriber, SendEvent
from bargein.session.runtime.observer import SessionObserver

NO_VOICE = "this server runs without its voice stack (see the server's log): text only"

ApplyAudio = Callable[[float], Awaitable[None]]
"""``(now)``: put accepted audio settings in force (see :meth:`VoicePort.merge`)."""

AdmitAudio = Callable[[float, float], Refusal | None]
"""``(seconds, now)``: charge a turn's audio to the connection's admission key, or the refusal."""


@dataclass(frozen=True, slots=True)
class VoiceRefusal:
    """Why the voice side refuses a client event: what its ``error`` says.

    Attributes:
        code: the error code.
        message: the error message.
        retry_after_ms: when to try again; None: not said.
    """

    code: pe.ErrorCode
    message: str
    retry_after_ms: int | None = None


@dataclass(frozen=True, slots=True)
class CreatePlan:
    """What the voice side makes of a ``response.create`` before the conversation sees it.

    Attributes:
        event: the event to apply (a voice side adds the transcribed turns
            still waiting for a response to its input).
        problem: why it is refused (``invalid_parameter``); None: applied.
        cut_active_first: with ``interrupt_active``, cancel the active
            response first, cut at the audio heard of it (protocol 8.6),
            rather than leave its cut to the conversation.
    """

    event: pe.ResponseCreate
    problem: str | None = None
    cut_active_first: bool = False


class VoiceHooks(Protocol):
    """What a voice side reports to the connection that owns it; the
    connection decides. Each ``on_*`` is awaited by the voice side."""

    @property
    def active_response_id(self) -> str | None:
        """The conversation's active response, if any."""

    async def on_barge_in(self, now: float) -> bool:
        """The user started speaking over the assistant, asking to interrupt
        it: the owner cancels the active response, cut at the audio heard.
        Called with the connection's lock held (inside :meth:`VoicePort.handle_input`).

        Returns:
            whether a response was active.
        """

    async def on_interruption_confirmed(self, response_ids: Sequence[str], now: float) -> bool:
        """Speech that paused the answer is a real interruption (``confirm``
        mode): as :meth:`on_barge_in`, if the active response is one of
        ``response_ids`` (the ones paused; a later response is not the one
        the user spoke over). Takes the connection's lock.

        Returns:
            whether the active response was cancelled.
        """

    async def on_user_turn(
        self, create: pe.ResponseCreate, claim: Callable[[], bool], *, after_active: bool
    ) -> None:
        """A user turn is transcribed and asks for an answer: the owner
        applies ``create`` as if the client had sent it, in order with the
        client's own events, if ``claim()`` (asked under the lock) agrees;
        ``after_active``: once the active response, if any, has ended."""

    async def on_speculative_turn(self, create: pe.ResponseCreate, claim: Callable[[], bool]) -> None:
        """A turn is transcribed at a pause, before it ends: the owner applies
        ``create`` unseen if no response is active and ``claim()`` agrees
        (both asked under the lock)."""

    async def on_partial_turn(self, text: str) -> bool:
        """A turn's words so far (a partial transcript at a pause): the owner
        may prefill the conversation plus them into the engine's prefix
        cache, so the turn's response has only its last words to prefill.

        Returns:
            whether a prefill was submitted.
        """

    async def on_speculation_adopted(self, held: Sequence[Action]) -> None:
        """The turn ended at the speculation's pause: the owner carries out
        the actions held back (:meth:`VoicePort.holds`) that show its answer."""

    async def on_speculation_dropped(self, response_id: str, now: float) -> None:
        """The user went on speaking: the owner withdraws the speculative
        response and its turns. Called with the connection's lock held."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VoiceContext:
    """What a voice side is given by the connection it is plugged into.

    Attributes:
        hooks: the connection, told of what the voice side sees.
        send: writes one server event to the connection's client.
        clock: monotonic seconds.
        observer: voice metrics.
        max_pending_turns: most transcribed turns waiting for a
            ``response.create`` (the session's ``max_input_items``, so that one
            ``response.create`` takes them all).
        admit_audio: charges a turn's audio to the connection's admission key.
    """

    hooks: VoiceHooks
    send: SendEvent
    clock: Callable[[], float]
    observer: SessionObserver
    max_pending_turns: int
    admit_audio: AdmitAudio


class VoicePort(Protocol):
    """What a connection asks of its voice side (``TextOnly`` without one)."""

    @property
    def max_input_audio_ms(self) -> int | None:
        """Most uncommitted input audio (``session.created``'s limits); None: no audio."""

    @property
    def max_turns(self) -> int | None:
        """Most turns transcribed at once (``session.created``'s limits); None: no audio."""

    def unread_s(self, now: float) -> float:
        """Seconds the socket's reader should leave the client's frames unread (0: read on)."""

    async def handle_input(self, event: object, now: float) -> None:
        """``input_audio.append``/``commit``/``clear`` (the lock is held)."""

    def merge(self, audio: pe.AudioSettings) -> ApplyAudio | VoiceRefusal:
        """A ``session.update``'s ``audio``: what puts it in force once the rest
        of the update is accepted (nothing changes before), or the refusal."""

    async def transcribe(self, pcm: bytes, now: float) -> str | VoiceRefusal:
        """The words of an audio item the client adds whole (pcm16 at the
        session's input rate), or the refusal."""

    def cut(self, response_id: str, heard_chars: int | None, audio_end_ms: int | None) -> int | None:
        """A cancel or truncation of ``response_id``: its speech stops, and the
        ``heard_chars`` its cut means (at the audio heard for a spoken one)."""

    async def prepare_create(self, event: pe.ResponseCreate, now: float) -> CreatePlan:
        """A client's or a voice turn's ``response.create``, before it is applied."""

    def submitted(self, response_id: str) -> None:
        """The response of the ``response.create`` being applied got its id."""

    def holds(self, action: Action) -> bool:
        """Whether ``action`` is held back (it shows a speculative answer not adopted yet)."""

    def created(self, event: pe.ResponseCreated) -> pe.ResponseCreated:
        """``response.created`` as the client is told it (its modalities, its input item)."""

    def updated(self, event: pe.SessionUpdated) -> pe.SessionUpdated:
        """``session.updated`` as the client is told it (the audio settings in force)."""

    def audio_settings(self) -> pe.AudioSettings | None:
        """The audio settings in force, complete (saved with the session); None without voice."""

    def speaks_on_resume(self, response_id: str, audio_from_ms: int | None) -> bool:
        """Whether a ``stream.resume`` with ``audio_from_ms`` speaks ``response_id`` again."""

    def subscriber(
        self,
        response_id: str,
        stream_id: str,
        *,
        skip_before_ms: int | None = None,
        budget: AudioBudget | None = None,
    ) -> DeliverySubscriber | None:
        """What speaks a response being delivered (None: text only); on a
        resume, from ``skip_before_ms``, its synthesis charged to ``budget``."""

    async def close(self, now: float) -> None:
        """The connection is gone: stop the voice side's work."""


class TextOnly:
    """The :class:`VoicePort` of a server without voice: audio is refused.

    Args:
        send: writes one server event (the refusal of an ``input_audio.*``).
    """

    max_input_audio_ms: int | None = None
    max_turns: int | None = None

    def __init__(self, send: SendEvent) -> None:
        self._send = send

    def unread_s(self, now: float) -> float:
        """Always 0: no audio is paced."""
        return 0.0

    async def handle_input(self, event: object, now: float) -> None:
        """Refuse it: ``invalid_parameter``."""
        code = pe.ErrorCode.INVALID_PARAMETER
        event_id = getattr(event, "event_id", None)
        await self._send(
            pe.ErrorEvent(code=code, message=NO_VOICE, retryable=code.retryable, event_id=event_id)
        )

    def merge(self, audio: pe.AudioSettings) -> ApplyAudio | VoiceRefusal:
        """Refused: ``invalid_parameter``."""
        return VoiceRefusal(pe.ErrorCode.INVALID_PARAMETER, NO_VOICE)

    async def transcribe(self, pcm: bytes, now: float) -> str | VoiceRefusal:
        """Refused: ``invalid_parameter``."""
        return VoiceRefusal(pe.ErrorCode.INVALID_PARAMETER, NO_VOICE)

    def cut(self, response_id: str, heard_chars: int | None, audio_end_ms: int | None) -> int | None:
        """The client's own ``heard_chars``."""
        return heard_chars

    async def prepare_create(self, event: pe.ResponseCreate, now: float) -> CreatePlan:
        """Refused if it asks for audio."""
        spoken = event.modalities is not None and "audio" in event.modalities
        return CreatePlan(event, NO_VOICE if spoken else None)

    def submitted(self, response_id: str) -> None:
        """Nothing to note."""

    def holds(self, action: Action) -> bool:
        """Nothing is held."""
        return False

    def created(self, event: pe.ResponseCreated) -> pe.ResponseCreated:
        """Unchanged."""
        return event

    def updated(self, event: pe.SessionUpdated) -> pe.SessionUpdated:
        """Unchanged."""
        return event

    def audio_settings(self) -> pe.AudioSettings | None:
        """None: no voice."""
        return None

    def speaks_on_resume(self, response_id: str, audio_from_ms: int | None) -> bool:
        """Never."""
        return False

    def subscriber(
        self,
        response_id: str,
        stream_id: str,
        *,
        skip_before_ms: int | None = None,
        budget: AudioBudget | None = None,
    ) -> DeliverySubscriber | None:
        """None: text only."""
        return None

    async def close(self, now: float) -> None:
        """Nothing to stop."""


VoiceFactory = Callable[[VoiceContext], VoicePort]
"""Makes a connection's voice side from what the connection gives it."""
