"""One client connection: its session, its deliveries, and the actions they call for.

The app decodes frames and hands the events here one at a time, in order;
:class:`Connection` feeds them to its :class:`~bargein.session.conversation.state.Conversation` and
carries out the actions it returns. It never touches a socket: it writes
server events through a ``send`` coroutine the app gives it (which returns
once the frame is on the wire, so deliveries go at the client's pace).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import replace

from bargein.engine.request import FinishReason
from bargein.protocol import events as pe
from bargein.session.cancel import cancel_and_wait
from bargein.session.conversation.actions import AddItem, DeleteItem, TruncateItem
from bargein.session.conversation.state import (
    Abort,
    Action,
    Conversation,
    Delivered,
    Disconnected,
    GenerationFinished,
    Message,
    ResumedFrom,
    Send,
    StartDelivery,
    State,
    StopDelivery,
    Submit,
    SubmitFailed,
    Submitted,
    assistant_item_id,
)
from bargein.session.errors import StreamNotFound, TokenLogError
from bargein.session.runtime.admission import Refusal
from bargein.session.runtime.delivery import Delivery, SendEvent, done_event
from bargein.session.runtime.saved import SavedSession, SessionSaver, max_saved_bytes, snapshot
from bargein.session.runtime.service import Owner, Service
from bargein.session.runtime.tokens import (
    check_resume_token,
    check_session_token,
    make_resume_token,
    make_session_token,
)
from bargein.session.streams.log import StreamEnd
from bargein.session.voice_runtime.channel import VoiceChannel
from bargein.session.voice_runtime.settings import SessionAudio
from bargein.session.voice_runtime.speaker import Speaker

logger = logging.getLogger(__name__)
NO_VOICE = "this server runs without its voice stack (see the server's log): text only"
IDLE_POLL_S = 0.05  # how often a voice turn waiting for the active response looks


class Connection:
    """The session and deliveries of one WebSocket connection.

    Args:
        service: the process's service.
        send: writes one server event; returns once it is on the wire.
        principal: who is connected (API key owner, or ``"anonymous"``).
        limit_key: who admission limits count against (see app/auth.py);
            None: the principal.
        clock: monotonic seconds (the ``now`` of every event).
    """

    def __init__(
        self,
        service: Service,
        send: SendEvent,
        *,
        principal: str = "anonymous",
        limit_key: str | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.service = service
        self.principal = principal
        self.limit_key = limit_key
        self.session = Conversation(service.config)
        self._send = send
        self._clock = clock or service.clock
        self._deliveries: dict[str, tuple[Delivery, asyncio.Task[None]]] = {}
        self._owned: set[str] = set()
        self._saver = SessionSaver(
            service.log,
            lambda: snapshot(self.session, principal),
            min_interval_s=service.config.save_interval_s,
            max_bytes=max_saved_bytes(service.config),
        )
        self._restore_watch: asyncio.Task[None] | None = None  # a resumed session's active
        # One event at a time, from the client or from a voice turn ending
        # (transcribed off the loop): the session sees them in order.
        self._lock = asyncio.Lock()
        self.voice = (
            None
            if service.voice is None
            else VoiceChannel(
                service.voice,
                self,
                observer=service.observer,
                clock=self._clock,
                max_pending_turns=service.config.max_input_items,
                admit_audio=self._admit_audio,
            )
        )
        service.sessions[self.session.session_id] = self

    def created_event(self) -> pe.SessionCreated:
        """The ``session.created`` that opens the connection."""
        max_model_len = self.service.max_model_len
        return pe.SessionCreated(
            session_id=self.session.session_id,
            session_token=make_session_token(self.service.secret, self.session.session_id, self.principal),
            protocol="bargein.v1",
            model=self.service.runner.model_name,
            limits=pe.Limits(
                max_frame_bytes=self.service.config.max_frame_bytes,
                max_prompt_tokens=max_model_len - 1,
                max_tokens=self.service.config.max_tokens,
                max_context_tokens=max_model_len,
                max_conversation_bytes=self.service.config.max_conversation_bytes,
                max_input_audio_ms=None
                if self.service.voice is None
                else self.service.voice.config.max_input_audio_ms,
                max_voice_turns=None if self.service.voice is None else self.service.voice.config.max_turns,
            ),
        )

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
            await self._dispatch(event, received_at)
        except TokenLogError as exc:
            logger.warning("%s failed, the token log failed: %s", type(event).__name__, exc)
            await self._send(self._log_failed(event, exc))

    async def _dispatch(self, event: object, received_at: float | None) -> None:
        """:meth:`handle` itself. Raises TokenLogError from the log."""
        now = self._clock() if received_at is None else received_at
        if isinstance(event, (pe.InputAudioAppend, pe.InputAudioCommit, pe.InputAudioClear)):
            if self.voice is None:
                await self._send(self._error(pe.ErrorCode.INVALID_PARAMETER, NO_VOICE, event))
            else:
                await self.voice.handle_input(event, now)
            return
        audio: SessionAudio | None = None  # of a session.update, applied if all of it is accepted
        if isinstance(event, pe.SessionUpdate) and event.session.audio is not None:
            merged = (
                (pe.ErrorCode.INVALID_PARAMETER, NO_VOICE)
                if self.voice is None
                else self.voice.merge(event.session.audio)
            )
            if isinstance(merged, tuple):
                await self._send(self._error(*merged, event))
                return
            audio = merged
        if isinstance(event, AddItem) and event.audio is not None:
            if self.voice is None:
                await self._send(self._error(pe.ErrorCode.INVALID_PARAMETER, NO_VOICE, event))
                return
            try:
                text = await self.voice.transcribe_pcm(event.audio, now)
            except ValueError as exc:
                await self._send(self._error(pe.ErrorCode.INVALID_PARAMETER, f"audio: {exc}", event))
                return
            if isinstance(text, Refusal):
                await self._send(
                    replace(self._error(text.code, text.message, event), retry_after_ms=text.retry_after_ms)
                )
                return
            event = replace(event, item=replace(event.item, content=text), audio=None)
        if isinstance(event, TruncateItem) and self.voice is not None:
            response_id = self.session.response_of_item(event.item_id)
            if response_id is not None:
                heard = self.voice.heard_chars(response_id, event.heard_chars, event.audio_end_ms)
                event = replace(event, heard_chars=heard)
                self.voice.stop_speaking(response_id)
        if isinstance(event, pe.ResponseCancel) and self.voice is not None:
            event = replace(
                event,
                heard_chars=self.voice.heard_chars(event.response_id, event.heard_chars, event.audio_end_ms),
            )
            self.voice.stop_speaking(event.response_id)
        if isinstance(event, pe.StreamResume):
            await self._resume(event)
        elif (
            isinstance(event, pe.ResponseCancel)
            and (followed := self._followed_stream(event.response_id)) is not None
        ):
            # A stream this connection only resumed (maybe generated by another
            # node): the service aborts it there; response.done comes from the log.
            now = self._clock() if received_at is None else received_at
            self._abort(Abort(stream_id=followed, reason=FinishReason.INTERRUPTED, requested_at=now))
        elif isinstance(event, pe.SessionResume):
            await self._resume_session(event)
        else:
            if isinstance(event, pe.ResponseCreate):
                await self._settle_restored()
                if self.voice is not None:
                    await self.voice.drop_speculation(now, unless=event.response_id)
                    event, problem = self.voice.on_create(event)
                    if problem is not None:
                        await self._send(self._refused_create(event, problem))
                        return
                    active = self.active_response_id
                    if event.interrupt_active and active is not None:
                        # a spoken response is cut at its audio, as a cancel without heard_chars is (8.6)
                        heard = self.voice.heard_chars(active, None, None)
                        self.voice.stop_speaking(active)
                        await self.cancel_active(heard, now)
                elif event.modalities is not None and "audio" in event.modalities:
                    await self._send(self._refused_create(event, NO_VOICE))
                    return
            actions = self.session.handle(event, now)
            if isinstance(event, pe.ResponseCreate):
                self._report_rejections(actions)
            if audio is not None and self.voice is not None and _updated(actions):
                await self.voice.apply(audio, now)
            await self._run(actions)
            if isinstance(event, (pe.ResponseCancel, pe.SessionUpdate, AddItem, DeleteItem, TruncateItem)):
                self._saver.request()  # a cut turn, new settings, an edited conversation

    def unread_s(self, now: float) -> float:
        """Seconds the socket's reader should leave this client's frames
        unread before the next one (0: read on): after an input audio append
        refused for its pace, so a client that keeps sending is paced by TCP
        rather than answered, at a decode and a refusal a frame, on the loop.

        Args:
            now: monotonic seconds.
        """
        return 0.0 if self.voice is None else self.voice.unread_s(now)

    # ---- what the voice channel calls (bargein.session.voice_runtime.channel.VoiceHost) -----

    def _admit_audio(self, seconds: float, now: float) -> Refusal | None:
        """Charge a voice turn's ``seconds`` of input audio to this
        connection's admission key (``--rate-limit-audio``)."""
        return self.service.admission.charge_audio(self.limit_key or self.principal, seconds, now)

    async def send(self, event: object) -> None:
        """Write one server event to this connection."""
        await self._send(event)

    async def dispatch_if(self, event: object, now: float, wanted: Callable[[], bool]) -> None:
        """Apply ``event`` as if the client had sent it (a voice turn's
        ``response.create``), in order with the client's own events, if
        ``wanted()`` says so once the lock is held."""
        async with self._lock:
            if self.session.state is not State.CLOSED and wanted():
                await self._handle_locked(event, now)

    async def release(self, actions: list[object]) -> None:
        """Carry out actions the voice channel held back (a speculative turn's)."""
        async with self._lock:
            if self.session.state is not State.CLOSED:
                await self._run(actions)  # type: ignore[arg-type]

    async def retract(self, response_id: str, now: float) -> None:
        """Withdraw a speculative response and its turns (the lock is held)."""
        if self.session.state is State.SUBMITTING:
            return  # its submit was cancelled with the connection: nothing reached the engine
        await self._run(self.session.retract(response_id, now))
        self._saver.request()

    async def cancel_active(self, heard_chars: int | None, now: float) -> None:
        """Barge-in by voice: cancel the active response, cut at ``heard_chars``
        (the caller, inside :meth:`handle`, holds the lock)."""
        active = self.session.active_response
        if active is None or self.session.state is not State.GENERATING:
            return
        cancel = pe.ResponseCancel(response_id=active[0], heard_chars=heard_chars)
        await self._run(self.session.handle(cancel, now))
        self._saver.request()

    @property
    def active_response_id(self) -> str | None:
        """The session's active response, if any."""
        active = self.session.active_response
        return None if active is None else active[0]

    async def wait_idle(self) -> None:
        """Return once the session has no active response (or is closed)."""
        while self.session.state not in (State.IDLE, State.CLOSED):
            await asyncio.sleep(IDLE_POLL_S)

    def _refused_create(self, event: pe.ResponseCreate, problem: str) -> pe.ErrorEvent:
        self.service.observer.rejected(pe.ErrorCode.INVALID_PARAMETER.value, response_id=event.response_id)
        return pe.ErrorEvent(
            code=pe.ErrorCode.INVALID_PARAMETER,
            message=problem,
            retryable=False,
            event_id=event.event_id,
            response_id=event.response_id,
        )

    @staticmethod
    def _log_failed(event: object, exc: TokenLogError) -> pe.ErrorEvent:
        """The ``error`` answering ``event`` when the log failed it with ``exc``
        (no internals: the log line has them)."""
        if isinstance(exc, StreamNotFound):
            code, message = pe.ErrorCode.NOT_FOUND, "stream not found"
        else:
            code, message = pe.ErrorCode.INTERNAL_ERROR, "the token log is unavailable; retry later"
        return pe.ErrorEvent(
            code=code,
            message=message,
            retryable=code.retryable,
            event_id=getattr(event, "event_id", None),
            response_id=getattr(event, "response_id", None),
        )

    def _followed_stream(self, response_id: str) -> str | None:
        """The stream of ``response_id`` if this connection delivers it only
        because of a ``stream.resume`` (the session does not know it)."""
        for stream_id, (delivery, _) in self._deliveries.items():
            if (
                delivery.response_id == response_id
                and stream_id not in self._owned
                and stream_id != self.session.active_stream_id
            ):
                return stream_id
        return None

    def _report_rejections(self, actions: list[Action]) -> None:
        """A ``response.create`` the session refused (bad parameter, conflict)
        is an admission rejection; the service reports its own (too long)."""
        for action in actions:
            if isinstance(action, Send) and isinstance(action.event, pe.ErrorEvent):
                self.service.observer.rejected(action.event.code.value, response_id=action.event.response_id)

    async def close(self) -> None:
        """The connection is gone: stop deliveries; apply the disconnect policy;
        save the conversation (its retention starts now) unless a newer
        connection on this node took it over."""
        if self.voice is not None:
            await self.voice.close(self._clock())
        tasks = [task for _, task in self._deliveries.values()]
        if self._restore_watch is not None:
            tasks.append(self._restore_watch)
        await cancel_and_wait(tasks)
        last = snapshot(self.session, self.principal)  # the active response included
        if self.session.state is not State.CLOSED:
            await self._run(self.session.handle(Disconnected(), self._clock()))
        for stream_id in self._owned:
            self.service.release(stream_id)
        if self.service.sessions.get(self.session.session_id) is self:
            del self.service.sessions[self.session.session_id]
            await self._saver.close(last)

    # ---- actions ---------------------------------------------------------------

    async def _run(self, actions: list[Action]) -> None:
        for action in actions:
            if self.voice is not None and self.voice.holds(action):
                continue  # a speculative voice turn's, shown if the turn ends
            if isinstance(action, Send):
                event = action.event
                if isinstance(event, pe.ResponseCreated):
                    await self._drain_earlier(event.stream_id)
                    if self.voice is not None:
                        event = self.voice.created(event)
                elif isinstance(event, pe.SessionUpdated) and self.voice is not None:
                    event = replace(event, session=replace(event.session, audio=self.voice.echo()))
                await self._send(event)
            elif isinstance(action, Submit):
                if self.voice is not None:
                    self.voice.on_submit(action.response_id)
                await self._submit(action)
            elif isinstance(action, StartDelivery):
                speaker = (
                    None
                    if self.voice is None
                    else self.voice.speaker_for(action.response_id, action.stream_id)
                )
                self._start_delivery(
                    action.response_id, action.stream_id, action.from_offset, speaker=speaker
                )
            elif isinstance(action, Abort):
                self._abort(action)
            elif isinstance(action, StopDelivery):
                await self._stop_delivery(action)

    async def _submit(self, action: Submit) -> None:
        owner = Owner(
            principal=self.principal,
            session_id=self.session.session_id,
            on_finish=self._on_finish,
            limit_key=self.limit_key,
        )
        try:
            result: Submitted | SubmitFailed = await self.service.submit(action, owner, self._clock())
        except TokenLogError as exc:
            # The session waits for the outcome of its submit: give it one, or
            # it refuses every later response.create as a conflict.
            logger.warning("response %s not submitted, the token log failed: %s", action.response_id, exc)
            result = SubmitFailed(
                response_id=action.response_id,
                code=pe.ErrorCode.INTERNAL_ERROR,
                message="the token log is unavailable; retry later",
            )
        self._owned.add(action.stream_id)
        await self._run(self.session.handle(result, self._clock()))
        self._saver.request()  # the new turns and the active response

    def _on_finish(self, event: GenerationFinished) -> None:
        if self.session.state is not State.CLOSED:
            self.session.handle(event, self._clock())
            self._saver.request()

    def _abort(self, action: Abort) -> None:
        # Its delivery goes on: it sends what the log holds (nothing is logged
        # after the cancel), then response.done.
        self.service.abort(action.stream_id, action.reason, action.requested_at, kept_chars=action.kept_chars)

    async def _stop_delivery(self, action: StopDelivery) -> None:
        if action.stream_id in self._deliveries:
            return  # its delivery sends the rest of the log, then response.done
        info = await self.service.log.info(action.stream_id)
        if info is None or info.finish is None:
            await self._send(
                pe.ErrorEvent(
                    code=pe.ErrorCode.NOT_FOUND,
                    retryable=False,
                    message="no such response",
                    response_id=action.response_id,
                )
            )
            return
        await self._send(done_event(action.response_id, action.stream_id, info.finish))

    async def _drain_earlier(self, stream_id: str) -> None:
        """Wait until the deliveries of this session's earlier responses sent
        their ``response.done`` (``interrupt_active``: the interrupted one ends
        at the engine's next step), so no event of theirs follows the
        ``response.created`` of ``stream_id``. The engine already generates
        ``stream_id``: only its announcement waits. After
        ``config.drain_timeout_s`` the laggards are stopped instead (a log
        that never ends them); their client can still ``stream.resume`` them.
        """
        earlier = [
            task
            for sid, (_, task) in self._deliveries.items()
            if sid != stream_id and (sid in self._owned or self.session.knows_stream(sid))
        ]
        if not earlier:
            return
        _, pending = await asyncio.wait(earlier, timeout=self.service.config.drain_timeout_s)
        for task in pending:
            logger.warning("delivery %s did not end before the next response; stopped", task.get_name())
        await cancel_and_wait(pending)

    def _start_delivery(
        self, response_id: str, stream_id: str, from_offset: int, *, speaker: Speaker | None = None
    ) -> None:
        def delivered(text: str) -> None:
            if self.session.state is not State.CLOSED:
                self.session.handle(Delivered(stream_id=stream_id, text=text), self._clock())

        delivery = Delivery(
            self.service.log,
            response_id=response_id,
            stream_id=stream_id,
            from_offset=from_offset,
            send=self._send,
            on_delivered=delivered,
            include_token_ids=self.session.settings.include_token_ids,
            observer=self.service.observer,
            subscribers=() if speaker is None else (speaker,),
        )
        task = asyncio.create_task(delivery.run(), name=f"deliver-{stream_id}")
        self._deliveries[stream_id] = (delivery, task)
        self.service.reader_started(stream_id)

        def ended(_: object) -> None:
            self._deliveries.pop(stream_id, None)
            self.service.reader_ended(stream_id)

        task.add_done_callback(ended)

    # ---- stream.resume -----------------------------------------------------------

    async def _resume(self, event: pe.StreamResume) -> None:
        """Replay a stream from ``from`` and follow it live (any connection)."""
        if not check_resume_token(self.service.secret, event.stream_id, self.principal, event.resume_token):
            await self._send(self._error(pe.ErrorCode.FORBIDDEN, "wrong resume token", event))
            return
        info = await self.service.log.info(event.stream_id)
        if info is None:
            await self._send(self._error(pe.ErrorCode.NOT_FOUND, "stream not found", event))
            return
        if info.finish is not None and not info.finish.truncated and event.from_ > info.end:
            await self._send(
                self._error(
                    pe.ErrorCode.INVALID_PARAMETER, f"from is past the stream's end {info.end}", event
                )
            )
            return
        if event.stream_id in self._deliveries:
            await self._send(self._error(pe.ErrorCode.CONFLICT, "stream already being delivered", event))
            return
        if info.status == "live":
            await self.service.follow(event.stream_id)  # its node may have died
        speaker = None
        if (
            event.audio_from_ms is not None
            and self.voice is not None
            and self.voice.spoken_on_resume(info.response_id)
        ):
            # the speech synthesized again is charged to the caller's audio rate
            # limit, as its turns' audio is: refused at once while it is spent
            budget = self.service.admission.audio_budget(self.limit_key or self.principal)
            if (refusal := budget.refusal(self._clock())) is not None:
                await self._send(
                    replace(
                        self._error(refusal.code, refusal.message, event),
                        retry_after_ms=refusal.retry_after_ms,
                    )
                )
                return
            speaker = self.voice.speaker_for(
                info.response_id, event.stream_id, skip_before_ms=event.audio_from_ms, budget=budget
            )
        held: str | None = None  # the stream's text before from, read once for both uses
        if self.session.knows_stream(event.stream_id) or speaker is not None:
            try:
                held = await self._text_before(event.stream_id, min(event.from_, info.end))
            except TokenLogError:
                if speaker is not None:
                    raise  # the audio is re-derived from all of the text
                logger.warning(  # the delivery below reports the log's state
                    "stream %s: text before %d unreadable; the delivered count stays",
                    event.stream_id,
                    event.from_,
                )
        if held is not None and self.session.knows_stream(event.stream_id):
            # the heard-text cut of a barge-in counts from what the client holds
            if self.session.state is not State.CLOSED:
                self.session.handle(ResumedFrom(stream_id=event.stream_id, text=held), self._clock())
        await self._send(
            pe.StreamResumed(
                stream_id=event.stream_id, response_id=info.response_id, from_=event.from_, status=info.status
            )
        )
        self.service.observer.resumed(
            stream_id=event.stream_id, from_offset=event.from_, num_replayed=max(0, info.end - event.from_)
        )
        if speaker is not None and held is not None:
            speaker.feed(held)  # the audio is re-derived from the text: the speaker hears it all from 0
        self._start_delivery(info.response_id, event.stream_id, event.from_, speaker=speaker)

    async def _text_before(self, stream_id: str, offset: int) -> str:
        """The text of the stream's log entries that end at or before ``offset``:
        what a client resuming from ``offset`` holds (a resume replays the entry
        that holds ``offset`` whole). ``offset`` must be at most the logged end,
        so the read never waits for generation. Raises TokenLogError."""
        parts: list[str] = []
        if offset > 0:
            async with contextlib.aclosing(self.service.log.read(stream_id, 0)) as items:
                async for item in items:
                    if isinstance(item, StreamEnd) or item.end > offset:
                        break
                    parts.append(item.text)
                    if item.end == offset:
                        break
        return "".join(parts)

    @staticmethod
    def _error(code: pe.ErrorCode, message: str, event: object) -> pe.ErrorEvent:
        return pe.ErrorEvent(
            code=code, message=message, retryable=code.retryable, event_id=getattr(event, "event_id", None)
        )

    # ---- session.resume ----------------------------------------------------------

    async def _resume_session(self, event: pe.SessionResume) -> None:
        """Re-attach a saved conversation to this connection (docs/protocol.md)."""
        if not check_session_token(
            self.service.secret, event.session_id, self.principal, event.session_token
        ):
            await self._send(self._error(pe.ErrorCode.FORBIDDEN, "wrong session token", event))
            return
        if self.session.turns or self.session.state is not State.IDLE or self._restore_watch is not None:
            await self._send(
                self._error(
                    pe.ErrorCode.CONFLICT,
                    "session.resume must come before this connection's first response",
                    event,
                )
            )
            return
        try:
            saved = await self._load_session(event.session_id)
            if saved is None:
                await self._send(self._error(pe.ErrorCode.NOT_FOUND, "session not found", event))
                return
            active = await self._restore(saved)
        except TokenLogError:
            await self._send(self._error(pe.ErrorCode.INTERNAL_ERROR, "token log unavailable", event))
            return
        await self._send(
            pe.SessionResumed(session_id=saved.session_id, turns=len(self.session.turns), active=active)
        )

    async def _load_session(self, session_id: str) -> SavedSession | None:
        """The saved session of this principal, or None (unknown, expired, unreadable)."""
        data = await self.service.log.load_session(session_id)
        if data is None:
            return None
        try:
            saved = await asyncio.to_thread(SavedSession.from_bytes, data)  # megabytes: off the loop
        except ValueError:
            logger.warning("saved session %s is unreadable", session_id)
            return None
        return saved if saved.principal == self.principal else None

    async def _restore(self, saved: SavedSession) -> pe.ActiveStream | None:
        """Make ``saved`` this connection's session; return its active stream.

        A response that was active when the state was saved: if its stream
        has ended, its whole text (from the log) becomes the assistant turn,
        unless it was dropped at its queue deadline (its input leaves the
        conversation, as on the connection that made it); if it still
        generates, the session waits for it (a watcher reads the log to its
        end); if the stream expired, what was delivered stays.
        """
        session = Conversation(self.service.config, session_id=saved.session_id)
        turns = list(saved.turns)
        active = saved.active
        info = None if active is None else await self.service.log.info(active.stream_id)
        if active is not None and info is None:
            turns.append(
                Message(
                    role="assistant", content=active.delivered, item_id=assistant_item_id(active.stream_id)
                )
            )
        elif active is not None and info is not None and info.finish is not None:
            if info.finish.error is None:
                text = (await self._stream_text(active.stream_id))[0]
                turns.append(
                    Message(role="assistant", content=text, item_id=assistant_item_id(active.stream_id))
                )
            else:
                del turns[len(turns) - active.num_input_turns :]
        live = active if info is not None and info.status == "live" else None
        session.restore(
            settings=saved.settings,
            turns=turns,
            active=None
            if live is None
            else (live.response_id, live.stream_id, live.delivered, live.num_input_turns),
        )
        self.service.sessions.pop(self.session.session_id, None)
        self.session = session
        self.service.sessions[session.session_id] = self
        if live is not None:
            self._restore_watch = asyncio.create_task(
                self._watch_restored(live.stream_id), name=f"restored-{live.stream_id}"
            )
        self._saver.request()  # restarts the retention; the turn of an ended stream
        if active is None or info is None:
            return None
        return pe.ActiveStream(
            response_id=active.response_id,
            stream_id=active.stream_id,
            resume_token=make_resume_token(self.service.secret, active.stream_id, self.principal),
            end=info.end,
        )

    async def _stream_text(self, stream_id: str) -> tuple[str, StreamEnd]:
        """A stream's whole text and its end, read from the log (waits for a live one).

        Raises StreamNotFound, TokenLogUnavailable.
        """
        parts: list[str] = []
        async for item in self.service.log.read(stream_id, 0):
            if isinstance(item, StreamEnd):
                return "".join(parts), item
            parts.append(item.text)
        raise StreamNotFound(stream_id, "ended without its end")

    async def _watch_restored(self, stream_id: str) -> None:
        """Give the resumed session its active response's turn when the stream ends."""
        expired = False
        try:
            text, end = await self._stream_text(stream_id)
            reason, expired = FinishReason(end.finish_reason), end.error is not None
        except TokenLogError:  # keep what this connection delivered of it
            active = self.session.active_response
            text, reason = ("" if active is None else active[2]), FinishReason.ERROR
        if self.session.state is not State.CLOSED:
            self.session.handle(
                GenerationFinished(stream_id=stream_id, text=text, finish_reason=reason, expired=expired),
                self._clock(),
            )
            self._saver.request()

    async def _settle_restored(self) -> None:
        """Before a ``response.create``: if the resumed session's active stream
        has ended, wait until its turn is in the conversation."""
        watch, active = self._restore_watch, self.session.active_response
        if watch is None or watch.done() or active is None:
            return
        info = await self.service.log.info(active[1])
        if info is None or info.status == "complete":
            await asyncio.shield(watch)


def _updated(actions: list[Action]) -> bool:
    """Whether the session accepted a ``session.update`` (it answers ``session.updated``)."""
    return any(isinstance(a, Send) and isinstance(a.event, pe.SessionUpdated) for a in actions)
