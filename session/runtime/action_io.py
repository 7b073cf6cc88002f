"""The I/O a conversation's actions stand for, carried out for one connection.

The conversation returns actions and does nothing itself (sans-I/O);
:class:`ActionIO` carries them out in order: a ``Send`` is written to the
client (a ``response.created`` once the earlier responses' deliveries
ended), a ``Submit`` goes to the service (and its outcome back through the
conversation), a ``StartDelivery`` starts a delivery with the voice side's
speaker subscribed, an ``Abort`` reaches the engine, a ``StopDelivery``
ends a response that no longer generates.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from bargein.protocol import events as pe
from bargein.session.conversation.actions import (
    Abort,
    Action,
    Send,
    StartDelivery,
    StopDelivery,
    Submit,
    SubmitFailed,
    Submitted,
)
from bargein.session.errors import TokenLogError
from bargein.session.runtime.deliveries import Deliveries
from bargein.session.runtime.delivery import SendEvent
from bargein.session.runtime.live_conversation import LiveConversation
from bargein.session.runtime.service import Owner, Service
from bargein.session.runtime.voice_port import VoicePort

logger = logging.getLogger(__name__)


class ActionIO:
    """Carries out one connection's actions.

    Args:
        service: the process's service.
        conversation: the connection's conversation (a submit's outcome goes
            back through it).
        deliveries: the connection's deliveries.
        voice: the connection's voice side (it holds back a speculative
            answer's actions, completes ``response.created`` and
            ``session.updated``, and subscribes a speaker to a delivery).
        send: writes one server event; returns once it is on the wire.
        principal: who is connected (the owner of the streams submitted).
        limit_key: who admission counts the streams against.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        service: Service,
        *,
        conversation: LiveConversation,
        deliveries: Deliveries,
        voice: VoicePort,
        send: SendEvent,
        principal: str,
        limit_key: str,
        clock: Callable[[], float],
    ) -> None:
        self._service = service
        self._conversation = conversation
        self._deliveries = deliveries
        self._voice = voice
        self._send = send
        self._principal = principal
        self._limit_key = limit_key
        self._clock = clock
        self.owned: set[str] = set()  # the streams this connection submitted

    async def run(self, actions: list[Action]) -> None:
        """Carry out ``actions`` in order. Raises TokenLogError (a ``StopDelivery``'s read)."""
        for action in actions:
            if self._voice.holds(action):
                continue  # a speculative voice turn's, shown if the turn ends
            if isinstance(action, Send):
                await self._send_event(action.event)
            elif isinstance(action, Submit):
                self._voice.submitted(action.response_id)
                await self._submit(action)
            elif isinstance(action, StartDelivery):
                self._deliveries.start(
                    action.response_id,
                    action.stream_id,
                    action.from_offset,
                    include_token_ids=self._conversation.current.settings.include_token_ids,
                    subscriber=self._voice.subscriber(action.response_id, action.stream_id),
                    tool_mode=action.tool_mode,
                )
            elif isinstance(action, Abort):
                self.abort(action)
            elif isinstance(action, StopDelivery):
                await self._deliveries.stop(action.response_id, action.stream_id)

    def abort(self, action: Abort) -> None:
        """Abort a stream's request. Its delivery goes on: it sends what the
        log holds (nothing is logged after the cancel), then ``response.done``."""
        self._service.abort(
            action.stream_id, action.reason, action.requested_at, kept_chars=action.kept_chars
        )

    def followed_stream(self, response_id: str) -> str | None:
        """The stream of ``response_id`` if this connection delivers it only
        because of a ``stream.resume`` (the conversation does not know it)."""
        active = self._conversation.current.active_stream_id
        return self._deliveries.stream_of(response_id, unless=lambda sid: sid in self.owned or sid == active)

    def release(self) -> None:
        """The connection is gone: the service no longer tells it of its streams' ends."""
        for stream_id in self.owned:
            self._service.release(stream_id)

    async def _send_event(self, event: object) -> None:
        if isinstance(event, pe.ResponseCreated):
            # no event of an earlier response follows this one's response.created
            # (interrupt_active: the interrupted one ends at the engine's next step)
            await self._deliveries.drain(
                event.stream_id, earlier=self._earlier, timeout_s=self._service.config.drain_timeout_s
            )
            event = self._voice.created(event)
        elif isinstance(event, pe.SessionUpdated):
            event = self._voice.updated(event)
        await self._send(event)

    def _earlier(self, stream_id: str) -> bool:
        """Whether ``stream_id`` is an earlier response of this connection's conversation."""
        return stream_id in self.owned or self._conversation.current.knows_stream(stream_id)

    async def _submit(self, action: Submit) -> None:
        owner = Owner(
            principal=self._principal,
            session_id=self._conversation.current.session_id,
            on_finish=self._conversation.finished,
            limit_key=self._limit_key,
        )
        try:
            result: Submitted | SubmitFailed = await self._service.submit(action, owner, self._clock())
        except TokenLogError as exc:
            # The conversation waits for the outcome of its submit: give it one,
            # or it refuses every later response.create as a conflict.
            logger.warning("response %s not submitted, the token log failed: %s", action.response_id, exc)
            result = SubmitFailed(
                response_id=action.response_id,
                code=pe.ErrorCode.INTERNAL_ERROR,
                message="the token log is unavailable; retry later",
            )
        self.owned.add(action.stream_id)
        await self.run(self._conversation.apply(result, self._clock()))
        self._conversation.save()  # the new turns and the active response
