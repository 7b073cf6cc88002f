"""One client connection: its conversation, its deliveries, and the actions they call for.

The app decodes frames and hands the events here one at a time, in order;
:class:`Connection` feeds them to its
:class:`~bargein.session.conversation.state.Conversation` and carries out the
actions it returns. It never touches a socket: it writes server events
through a ``send`` coroutine the app gives it (which returns once the frame
is on the wire, so deliveries go at the client's pace).

Around it, each in a module of its own: the conversation's life on the node
(:mod:`.live_conversation`), the I/O of its actions (:mod:`.action_io`), the
deliveries (:mod:`.deliveries`), ``stream.resume`` (:mod:`.resume`),
``session.resume`` (:mod:`.restore`), and the voice side, plugged in by
whoever builds the connection through the seam of :mod:`.voice_port` (text
only without one). The connection is the voice side's one owner: it
implements :class:`~.voice_port.VoiceHooks` and decides what a barge-in or a
transcribed turn does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

from bargein.engine.request import FinishReason
from bargein.protocol import events as pe
from bargein.session.cancel import cancel_and_wait
from bargein.session.conversation.actions import (
    Abort,
    Action,
    AddItem,
    DeleteItem,
    Disconnected,
    Message,
    Send,
    TruncateItem,
)
from bargein.session.conversation.state import Conversation, State
from bargein.session.errors import TokenLogError
from bargein.session.runtime.action_io import ActionIO
from bargein.session.runtime.admission import RateLimitLevel, Refusal, rate_limit_levels
from bargein.session.runtime.deliveries import Deliveries
from bargein.session.runtime.delivery import SendEvent
from bargein.session.runtime.error_events import error_for, log_failed
from bargein.session.runtime.live_conversation import LiveConversation
from bargein.session.runtime.restore import SessionRestorer
from bargein.session.runtime.resume import StreamResumer
from bargein.session.runtime.saved import SavedSession
from bargein.session.runtime.service import Service
from bargein.session.runtime.tokens import make_session_token
from bargein.session.runtime.tool_check import tools_problem
from bargein.session.runtime.turn_prefill import TurnPrefill
from bargein.session.runtime.voice_port import (
    ApplyAudio,
    TextOnly,
    VoiceContext,
    VoiceFactory,
    VoicePort,
    VoiceRefusal,
)

logger = logging.getLogger(__name__)
_AUDIO_INPUT = (pe.InputAudioAppend, pe.InputAudioCommit, pe.InputAudioClear)
# Client events after which the conversation is saved: a cut turn, new settings, edited items.
_SAVED_AFTER = (pe.ResponseCancel, pe.SessionUpdate, AddItem, DeleteItem, TruncateItem)


class Connection:
    """The conversation and deliveries of one WebSocket connection.

    Args:
        service: the process's service.
        send: writes one server event; returns once it is on the wire.
        principal: who is connected (API key owner, or ``"anonymous"``).
        limit_key: who admission limits count against (see app/auth.py);
            None: the principal.
        clock: monotonic seconds (the ``now`` of every event).
        voice: makes the connection's voice side; None: text only (audio
            events and settings are refused).
    """

    def __init__(
        self,
        service: Service,
        send: SendEvent,
        *,
        principal: str = "anonymous",
        limit_key: str | None = None,
        clock: Callable[[], float] | None = None,
        voice: VoiceFactory | None = None,
    ) -> None:
        self.service = service
        self.principal = principal
        self._limit_key = limit_key or principal
        self._send = send
        self._clock = clock or service.clock
        self._live = LiveConversation(
            service, principal, clock=self._clock, audio=lambda: self._voice.audio_settings()
        )
        # One event at a time, from the client or from a voice turn ending
        # (transcribed off the loop): the conversation sees them in order.
        self._lock = asyncio.Lock()
        self._voice: VoicePort = (
            TextOnly(send)
            if voice is None
            else voice(
                VoiceContext(
                    hooks=self,
                    send=send,
                    clock=self._clock,
                    observer=service.observer,
                    max_pending_turns=service.config.max_input_items,
                    admit_audio=self._admit_audio,
                )
            )
        )
        self._deliveries = Deliveries(service, send, on_delivered=self._live.delivered)
        self._actions = ActionIO(
            service,
            conversation=self._live,
            deliveries=self._deliveries,
            voice=self._voice,
            send=send,
            principal=principal,
            limit_key=self._limit_key,
            clock=self._clock,
        )
        self._streams = StreamResumer(
            service,
            principal=principal,
            limit_key=self._limit_key,
            deliveries=self._deliveries,
            voice=self._voice,
            send=send,
            clock=self._clock,
        )
        self._restorer = SessionRestorer(service, principal=principal, on_finish=self._live.finished)
        self._prefill = TurnPrefill(service.runner, service.cache_salt(principal), self._clock)
        self._last: SavedSession | None = None  # the conversation as the connection ended
        service.sessions[self.session_id] = self

    # ---- what the app and the OpenAI Realtime codec ask ---------------------------

    @property
    def conversation(self) -> Conversation:
        """The conversation now (a ``session.resume`` replaces it)."""
        return self._live.current

    @property
    def session_id(self) -> str:
        """The conversation's session id (announced in ``session.created``)."""
        return self._live.current.session_id

    @property
    def active_response_id(self) -> str | None:
        """The conversation's active response, if any."""
        active = self._live.current.active_response
        return None if active is None else active[0]

    @property
    def turns(self) -> Sequence[Message]:
        """The conversation's items now, oldest first."""
        return self._live.current.turns

    def knows_stream(self, stream_id: str) -> bool:
        """Whether ``stream_id`` is a response of this conversation (not one only resumed here)."""
        return self._live.current.knows_stream(stream_id)

    def rate_limits(self) -> tuple[RateLimitLevel, ...]:
        """This client's rate limits now (OpenAI's ``rate_limits.updated``)."""
        return rate_limit_levels(self.service.admission, self._limit_key, self._clock())

    def unread_s(self, now: float) -> float:
        """Seconds the socket's reader should leave this client's frames
        unread before the next one (0: read on): after an input audio append
        refused for its pace, so a client that keeps sending is paced by TCP
        rather than answered, at a decode and a refusal a frame, on the loop.

        Args:
            now: monotonic seconds.
        """
        return self._voice.unread_s(now)

    def created_event(self) -> pe.SessionCreated:
        """The ``session.created`` that opens the connection."""
        service, config = self.service, self.service.config
        return pe.SessionCreated(
            session_id=self.session_id,
            session_token=make_session_token(service.secret, self.session_id, self.principal),
            protocol="bargein.v1",
            model=service.runner.model_name,
            limits=pe.Limits(
                max_frame_bytes=config.max_frame_bytes,
                max_prompt_tokens=service.max_model_len - 1,
                max_tokens=config.max_tokens,
                max_context_tokens=service.max_model_len,
                max_conversation_bytes=config.max_conversation_bytes,
                max_input_audio_ms=self._voice.max_input_audio_ms,
                max_voice_turns=self._voice.max_turns,
            ),
        )

    # ---- client events -------------------------------------------------------------

    async def handle(self, event: object, received_at: float | None = None) -> None:
        """Apply one decoded client event and carry out what it calls for.

        ``received_at`` (monotonic seconds, default now) is when its frame
        arrived: the start of the interrupt-latency measurement.

        A token log that fails while this event needs it (unreachable past
        its retry time, or refusing) fails this event alone: it is answered
        with an ``error`` (retryable ``internal_error``; ``not_found`` for a
        stream the log no longer has) echoing its ``event_id`` and
        ``response_id``, and the connection and its deliveries go on.
        """
        async with self._lock:
            await self._handle_locked(event, received_at)

    async def _handle_locked(self, event: object, received_at: float | None) -> None:
        try:
            await self._dispatch(event, self._clock() if received_at is None else received_at)
        except TokenLogError as exc:
            logger.warning("%s failed, the token log failed: %s", type(event).__name__, exc)
            await self._send(log_failed(event, exc))

    async def _dispatch(self, event: object, now: float) -> None:
        """:meth:`handle` itself. Raises TokenLogError from the log."""
        if (problem := tools_problem(event)) is not None:
            # schemas the grammar library cannot enforce: refused before the (pure) conversation
            if isinstance(event, pe.ResponseCreate):
                self.service.observer.rejected(
                    pe.ErrorCode.INVALID_PARAMETER.value, response_id=event.response_id
                )
            error = error_for(pe.ErrorCode.INVALID_PARAMETER, problem, event)
            await self._send(replace(error, response_id=getattr(event, "response_id", None)))
        elif isinstance(event, _AUDIO_INPUT):
            await self._voice.handle_input(event, now)
        elif isinstance(event, pe.StreamResume):
            await self._streams.resume(event, self._live.current)
        elif isinstance(event, pe.SessionResume):
            await self._resume_session(event)
        elif isinstance(event, pe.ResponseCreate):
            await self._create(event, now)
        elif isinstance(event, pe.ResponseCancel):
            await self._cancel(event, now)
        elif isinstance(event, pe.SessionUpdate) and event.session.audio is not None:
            apply = self._voice.merge(event.session.audio)
            if isinstance(apply, VoiceRefusal):
                await self._send(_refused(apply, event))
            else:
                await self._apply(event, now, apply_audio=apply)
        elif isinstance(event, AddItem) and event.audio is not None:
            text = await self._voice.transcribe(event.audio, now)
            if isinstance(text, VoiceRefusal):
                await self._send(_refused(text, event))
            else:
                await self._apply(replace(event, item=replace(event.item, content=text), audio=None), now)
        elif isinstance(event, DeleteItem) and (delivering := self._delivering(event.item_id)) is not None:
            # a cancelled response's last deltas and closing events (OpenAI's
            # output_item.done, response.done) are still to come from its
            # delivery: they go first, so nothing of the item follows its deletion
            await self._deliveries.drain(
                "", earlier=lambda sid: sid == delivering, timeout_s=self.service.config.drain_timeout_s
            )
            await self._apply(event, now)
        elif (
            isinstance(event, TruncateItem)
            and (response_id := self._live.current.response_of_item(event.item_id)) is not None
        ):
            heard = self._voice.cut(response_id, event.heard_chars, event.audio_end_ms)
            await self._apply(replace(event, heard_chars=heard), now)
        else:
            await self._apply(event, now)

    def _delivering(self, item_id: str) -> str | None:
        """The stream of the response whose assistant item is ``item_id``, while
        this connection still delivers it; else None."""
        response_id = self._live.current.response_of_item(item_id)
        if response_id is None:
            return None
        return self._deliveries.stream_of(response_id, unless=lambda stream_id: False)

    async def _create(self, event: pe.ResponseCreate, now: float) -> None:
        await self._restorer.settle(self._live.current)
        plan = await self._voice.prepare_create(event, now)
        if plan.problem is not None:
            self.service.observer.rejected(
                pe.ErrorCode.INVALID_PARAMETER.value, response_id=event.response_id
            )
            error = error_for(pe.ErrorCode.INVALID_PARAMETER, plan.problem, event)
            await self._send(replace(error, response_id=event.response_id))
            return
        if plan.cut_active_first and (active := self.active_response_id) is not None:
            await self._cancel_active(self._voice.cut(active, None, None), now)
        await self._apply(plan.event, now)

    async def _cancel(self, event: pe.ResponseCancel, now: float) -> None:
        event = replace(
            event, heard_chars=self._voice.cut(event.response_id, event.heard_chars, event.audio_end_ms)
        )
        followed = self._actions.followed_stream(event.response_id)
        if followed is not None:
            # A stream this connection only resumed (maybe generated by another
            # node): the service aborts it there; response.done comes from the log.
            self._actions.abort(Abort(stream_id=followed, reason=FinishReason.INTERRUPTED, requested_at=now))
        else:
            await self._apply(event, now)

    async def _apply(self, event: object, now: float, *, apply_audio: ApplyAudio | None = None) -> None:
        """A client event through the conversation, and its actions carried out;
        ``apply_audio``: a ``session.update``'s audio settings, put in force
        if the conversation accepts the update."""
        actions = self._live.apply(event, now)
        if isinstance(event, pe.ResponseCreate):
            # a response.create the conversation refused (bad parameter, conflict)
            # is an admission rejection; the service reports its own (too long)
            for action in actions:
                if isinstance(action, Send) and isinstance(action.event, pe.ErrorEvent):
                    self.service.observer.rejected(
                        action.event.code.value, response_id=action.event.response_id
                    )
        if apply_audio is not None and any(
            isinstance(a, Send) and isinstance(a.event, pe.SessionUpdated) for a in actions
        ):
            await apply_audio(now)
        await self._actions.run(actions)
        if isinstance(event, _SAVED_AFTER):
            self._live.save()

    async def _resume_session(self, event: pe.SessionResume) -> None:
        """Re-attach a saved conversation to this connection (docs/protocol.md)."""
        restored = await self._restorer.restore(event, self._live.current)
        if isinstance(restored, pe.ErrorEvent):
            await self._send(restored)
            return
        conversation, answer, audio = restored
        self.service.sessions.pop(self.session_id, None)
        self._live.replace(conversation)
        self.service.sessions[self.session_id] = self
        self._live.save()  # restarts the retention; the turn of an ended stream
        await self._send(answer)
        in_force = self._voice.audio_settings()
        if audio is not None and in_force is not None and audio != in_force:
            # the session's voice as it was (its rate, voice, turn detection),
            # announced by session.updated as if the client had asked for it
            await self._dispatch(pe.SessionUpdate(session=pe.SessionSettings(audio=audio)), self._clock())

    # ---- the voice side's owner (VoiceHooks) ------------------------------------

    async def on_barge_in(self, now: float) -> bool:
        """Speech over the assistant: cancel the active response, cut at the audio heard."""
        active = self.active_response_id
        if active is None:
            return False
        await self._cancel_active(self._voice.cut(active, None, None), now)
        return True

    async def on_interruption_confirmed(self, response_ids: Sequence[str], now: float) -> bool:
        """Speech that paused the answer interrupts it: cancel the active
        response, if it is one of ``response_ids``, cut at the audio heard."""
        async with self._lock:
            if self._live.closed:
                return False
            if self.active_response_id in response_ids:
                return await self.on_barge_in(now)
            # An answer whose generation had ended while its audio still
            # played: its turn is cut at what the client is estimated to have
            # played (a late cancel of a finished response; the client's own
            # response.cancel with audio_end_ms may cut it shorter).
            for response_id in response_ids:
                heard = self._voice.cut(response_id, None, None)
                if heard is not None:
                    cancel = pe.ResponseCancel(response_id=response_id, heard_chars=heard)
                    await self._actions.run(self._live.apply(cancel, now))
            self._live.save()
            return False

    async def on_user_turn(
        self, create: pe.ResponseCreate, claim: Callable[[], bool], *, after_active: bool
    ) -> None:
        """A transcribed turn's ``response.create``, applied as the client's own."""
        if after_active:
            await self._live.wait_idle()
        await self._dispatch_if(create, self._clock(), claim)

    async def on_speculative_turn(self, create: pe.ResponseCreate, claim: Callable[[], bool]) -> None:
        """A turn answered at its pause, unseen, unless another response is active."""
        await self._dispatch_if(create, self._clock(), lambda: self.active_response_id is None and claim())

    async def on_partial_turn(self, text: str) -> bool:
        """Prefill the conversation plus the turn's words so far into the
        prefix cache (session/runtime/turn_prefill.py), unless a response is
        active (its answer will join the conversation before the turn's)."""
        if self.active_response_id is not None or self._live.closed:
            return False
        messages = (*self._live.current.messages(), Message(role="user", content=text))
        return await self._prefill.prefill(messages)

    async def on_speculation_adopted(self, held: Sequence[Action]) -> None:
        """Show a speculative answer: carry out its held actions."""
        async with self._lock:
            if not self._live.closed:
                await self._actions.run(list(held))

    async def on_speculation_dropped(self, response_id: str, now: float) -> None:
        """Withdraw a speculative response and its turns (the lock is held)."""
        if self._live.current.state is State.SUBMITTING:
            return  # its submit was cancelled with the connection: nothing reached the engine
        await self._actions.run(self._live.retract(response_id, now))
        self._live.save()

    async def _dispatch_if(self, event: object, now: float, wanted: Callable[[], bool]) -> None:
        async with self._lock:
            if not self._live.closed and wanted():
                await self._handle_locked(event, now)

    async def _cancel_active(self, heard_chars: int | None, now: float) -> None:
        """Cancel the active response, cut at ``heard_chars`` (the lock is held)."""
        active = self._live.current.active_response
        if active is None or self._live.current.state is not State.GENERATING:
            return
        cancel = pe.ResponseCancel(response_id=active[0], heard_chars=heard_chars)
        await self._actions.run(self._live.apply(cancel, now))
        self._live.save()

    def _admit_audio(self, seconds: float, now: float) -> Refusal | None:
        """Charge a voice turn's ``seconds`` of input audio to this
        connection's admission key (``--rate-limit-audio``)."""
        return self.service.admission.charge_audio(self._limit_key, seconds, now)

    def snapshot(self) -> SavedSession:
        """The conversation as its save would hold it now (SessionHolder): a
        ``session.resume`` on this node takes it from here, not from a save
        that may predate the last turn."""
        return self._live.snapshot() if self._last is None else self._last

    # ---- the end ---------------------------------------------------------------

    async def close(self) -> None:
        """The connection is gone: stop deliveries; apply the disconnect policy;
        save the conversation (its retention starts now) unless a newer
        connection on this node took it over."""
        await self._voice.close(self._clock())
        self._prefill.drop()
        await cancel_and_wait([*self._deliveries.tasks, *self._restorer.tasks])
        last = self._last = self._live.snapshot()  # the active response included
        if not self._live.closed:
            await self._actions.run(self._live.apply(Disconnected(), self._clock()))
        self._actions.release()
        if self.service.sessions.get(self.session_id) is self:
            await self._live.close(last)
            # held until saved: a session.resume meanwhile takes ``last``, not an older save
            if self.service.sessions.get(self.session_id) is self:
                del self.service.sessions[self.session_id]


def _refused(refusal: VoiceRefusal, event: object) -> pe.ErrorEvent:
    """The ``error`` of a client event the voice side refused."""
    return error_for(refusal.code, refusal.message, event, retry_after_ms=refusal.retry_after_ms)
