"""One client connection: its session, its deliveries, and the actions they call for.

The app decodes frames and hands the events here one at a time, in order;
:class:`Connection` feeds them to its :class:`~session.session.Session` and
carries out the actions it returns. It never touches a socket: it writes
server events through a ``send`` coroutine the app gives it (which returns
once the frame is on the wire, so deliveries go at the client's pace).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from protocol import events as pe
from session.delivery import Delivery, SendEvent, done_event
from session.service import Owner, Service
from session.session import (
    Abort,
    Action,
    Delivered,
    Disconnected,
    GenerationFinished,
    Send,
    Session,
    StartDelivery,
    State,
    StopDelivery,
    Submit,
)
from session.tokens import check_resume_token, make_session_token


class Connection:
    """The session and deliveries of one WebSocket connection.

    Args:
        service: the process's service.
        send: writes one server event; returns once it is on the wire.
        principal: who is connected (API key owner, or ``"anonymous"``).
        clock: monotonic seconds (the ``now`` of every event).
    """

    def __init__(self, service: Service, send: SendEvent, *, principal: str = "anonymous",
                 clock: Callable[[], float] | None = None) -> None:
        self.service = service
        self.principal = principal
        self.session = Session(service.config)
        self._send = send
        self._clock = clock or service.clock
        self._deliveries: dict[str, tuple[Delivery, asyncio.Task[None]]] = {}
        self._owned: set[str] = set()

    def created_event(self) -> pe.SessionCreated:
        """The ``session.created`` that opens the connection."""
        max_model_len = self.service.max_model_len
        return pe.SessionCreated(
            session_id=self.session.session_id,
            session_token=make_session_token(self.service.secret, self.session.session_id,
                                             self.principal),
            protocol="bargein.v1", model=self.service.runner.model_name,
            limits=pe.Limits(max_frame_bytes=self.service.config.max_frame_bytes,
                             max_prompt_tokens=max_model_len - 1,
                             max_tokens=self.service.config.max_tokens,
                             max_context_tokens=max_model_len))

    async def handle(self, event: object, received_at: float | None = None) -> None:
        """Apply one decoded client event and carry out what it calls for.

        ``received_at`` (monotonic seconds, default now) is when its frame
        arrived: the start of the interrupt-latency measurement.
        """
        if isinstance(event, pe.StreamResume):
            await self._resume(event)
        elif isinstance(event, pe.SessionResume):
            await self._send(pe.ErrorEvent(code=pe.ErrorCode.NOT_FOUND, retryable=False,
                                           message="no such session",
                                           event_id=event.event_id))
        else:
            now = self._clock() if received_at is None else received_at
            actions = self.session.handle(event, now)
            if isinstance(event, pe.ResponseCreate):
                self._report_rejections(actions)
            await self._run(actions)

    def _report_rejections(self, actions: list[Action]) -> None:
        """A ``response.create`` the session refused (bad parameter, conflict)
        is an admission rejection; the service reports its own (too long)."""
        for action in actions:
            if isinstance(action, Send) and isinstance(action.event, pe.ErrorEvent):
                self.service.observer.rejected(action.event.code.value,
                                               response_id=action.event.response_id)

    async def close(self) -> None:
        """The connection is gone: stop deliveries; apply the disconnect policy."""
        for _, task in self._deliveries.values():
            task.cancel()
        for _, task in list(self._deliveries.values()):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.session.state is not State.CLOSED:
            await self._run(self.session.handle(Disconnected(), self._clock()))
        for stream_id in self._owned:
            self.service.release(stream_id)

    # ---- actions ---------------------------------------------------------------

    async def _run(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                await self._send(action.event)
            elif isinstance(action, Submit):
                await self._submit(action)
            elif isinstance(action, StartDelivery):
                self._start_delivery(action.response_id, action.stream_id,
                                     action.from_offset)
            elif isinstance(action, Abort):
                self._abort(action)
            elif isinstance(action, StopDelivery):
                await self._stop_delivery(action)

    async def _submit(self, action: Submit) -> None:
        owner = Owner(principal=self.principal, session_id=self.session.session_id,
                      on_finish=self._on_finish)
        result = await self.service.submit(action, owner, self._clock())
        self._owned.add(action.stream_id)
        await self._run(self.session.handle(result, self._clock()))

    def _on_finish(self, event: GenerationFinished) -> None:
        if self.session.state is not State.CLOSED:
            self.session.handle(event, self._clock())

    def _abort(self, action: Abort) -> None:
        self.service.abort(action.stream_id, action.reason, action.requested_at)
        running = self._deliveries.get(action.stream_id)
        if running is not None:
            running[0].mute()  # the user stopped listening: only response.done follows

    async def _stop_delivery(self, action: StopDelivery) -> None:
        running = self._deliveries.get(action.stream_id)
        if running is not None:
            running[0].mute()
            return
        info = await self.service.log.info(action.stream_id)
        if info is None or info.finish is None:
            await self._send(pe.ErrorEvent(code=pe.ErrorCode.NOT_FOUND, retryable=False,
                                           message="no such response",
                                           response_id=action.response_id))
            return
        await self._send(done_event(action.response_id, action.stream_id, info.finish))

    def _start_delivery(self, response_id: str, stream_id: str, from_offset: int) -> None:
        def delivered(text: str) -> None:
            if self.session.state is not State.CLOSED:
                self.session.handle(Delivered(stream_id=stream_id, text=text), self._clock())

        delivery = Delivery(self.service.log, response_id=response_id, stream_id=stream_id,
                            from_offset=from_offset, send=self._send, on_delivered=delivered,
                            include_token_ids=self.session.settings.include_token_ids,
                            observer=self.service.observer)
        task = asyncio.create_task(delivery.run(), name=f"deliver-{stream_id}")
        self._deliveries[stream_id] = (delivery, task)
        task.add_done_callback(lambda _: self._deliveries.pop(stream_id, None))

    # ---- stream.resume -----------------------------------------------------------

    async def _resume(self, event: pe.StreamResume) -> None:
        """Replay a stream from ``from`` and follow it live (any connection)."""
        if not check_resume_token(self.service.secret, event.stream_id, self.principal,
                                  event.resume_token):
            await self._send(self._error(pe.ErrorCode.FORBIDDEN, "wrong resume token", event))
            return
        info = await self.service.log.info(event.stream_id)
        if info is None:
            await self._send(self._error(pe.ErrorCode.NOT_FOUND, "stream not found", event))
            return
        if event.from_ > info.end and info.status == "complete":
            await self._send(self._error(pe.ErrorCode.INVALID_PARAMETER,
                                         f"from is past the stream's end {info.end}", event))
            return
        if event.stream_id in self._deliveries:
            await self._send(self._error(pe.ErrorCode.CONFLICT,
                                         "stream already being delivered", event))
            return
        await self._send(pe.StreamResumed(stream_id=event.stream_id,
                                          response_id=info.response_id,
                                          from_=event.from_, status=info.status))
        self.service.observer.resumed(stream_id=event.stream_id, from_offset=event.from_,
                                      num_replayed=max(0, info.end - event.from_))
        self._start_delivery(info.response_id, event.stream_id, event.from_)

    @staticmethod
    def _error(code: pe.ErrorCode, message: str, event: object) -> pe.ErrorEvent:
        return pe.ErrorEvent(code=code, message=message, retryable=code.retryable,
                             event_id=getattr(event, "event_id", None))
