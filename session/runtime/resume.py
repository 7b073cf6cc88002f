"""``stream.resume``: a stream replayed from an offset and followed live, on any connection.

A client that lost its socket sends ``stream.resume`` on a new one with the
stream's resume token and the offset it holds; :class:`StreamResumer`
checks them, replays the log from that offset and follows the stream to its
end (on another node than the one generating it too: the cluster takes a
stream over whose node died). A spoken response resumed with
``audio_from_ms`` has its audio derived again from the logged text, charged
to the caller's audio rate limit (docs/protocol.md 8.8).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import cast

from bargein.protocol import events as pe
from bargein.session.conversation.state import Conversation, ResumedFrom, State
from bargein.session.errors import TokenLogError
from bargein.session.runtime.deliveries import Deliveries
from bargein.session.runtime.delivery import SendEvent, text_before
from bargein.session.runtime.error_events import error_for
from bargein.session.runtime.service import Service
from bargein.session.runtime.tokens import check_resume_token
from bargein.session.runtime.tool_events import spoken_text
from bargein.session.runtime.voice_port import VoicePort

logger = logging.getLogger(__name__)


class StreamResumer:
    """The ``stream.resume`` of one connection.

    Args:
        service: the process's service.
        principal: who is connected (a resume token is the principal's).
        limit_key: whose audio rate limit a resumed audio is charged to.
        deliveries: the connection's deliveries (the resumed one joins them).
        voice: the connection's voice side (it speaks a resumed audio).
        send: writes one server event.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        service: Service,
        *,
        principal: str,
        limit_key: str,
        deliveries: Deliveries,
        voice: VoicePort,
        send: SendEvent,
        clock: Callable[[], float],
    ) -> None:
        self._service = service
        self._principal = principal
        self._limit_key = limit_key
        self._deliveries = deliveries
        self._voice = voice
        self._send = send
        self._clock = clock

    async def resume(self, event: pe.StreamResume, conversation: Conversation) -> None:
        """Replay a stream from ``from`` and follow it live. ``conversation``
        (the connection's) counts what its client holds of a stream it
        knows, for the cut of a later barge-in. Raises TokenLogError."""
        service = self._service
        if not check_resume_token(service.secret, event.stream_id, self._principal, event.resume_token):
            await self._send(error_for(pe.ErrorCode.FORBIDDEN, "wrong resume token", event))
            return
        info = await service.log.info(event.stream_id)
        if info is None:
            await self._send(error_for(pe.ErrorCode.NOT_FOUND, "stream not found", event))
            return
        if info.finish is not None and not info.finish.truncated and event.from_ > info.end:
            message = f"from is past the stream's end {info.end}"
            await self._send(error_for(pe.ErrorCode.INVALID_PARAMETER, message, event))
            return
        if event.stream_id in self._deliveries:
            await self._send(error_for(pe.ErrorCode.CONFLICT, "stream already being delivered", event))
            return
        if info.status == "live":
            await service.follow(event.stream_id)  # its node may have died
        speaker = None
        if self._voice.speaks_on_resume(info.response_id, event.audio_from_ms):
            # the speech synthesized again is charged to the caller's audio rate
            # limit, as its turns' audio is: refused at once while it is spent
            budget = service.admission.audio_budget(self._limit_key)
            if (refusal := budget.refusal(self._clock())) is not None:
                await self._send(
                    error_for(refusal.code, refusal.message, event, retry_after_ms=refusal.retry_after_ms)
                )
                return
            speaker = self._voice.subscriber(
                info.response_id, event.stream_id, skip_before_ms=event.audio_from_ms, budget=budget
            )
        # the log's word on how the answer is read for calls: any session, any node
        tool_mode = cast(pe.ToolMode | None, info.tool_mode)
        held: str | None = None  # the stream's text before from, read once for all its uses
        if conversation.knows_stream(event.stream_id) or speaker is not None or tool_mode is not None:
            try:
                held = await text_before(service.log, event.stream_id, min(event.from_, info.end))
            except TokenLogError:
                if speaker is not None:
                    raise  # the audio is re-derived from all of the text
                logger.warning(  # the delivery below reports the log's state
                    "stream %s: text before %d unreadable; the delivered count stays",
                    event.stream_id,
                    event.from_,
                )
        if held is not None and conversation.knows_stream(event.stream_id):
            # the heard-text cut of a barge-in counts from what the client holds
            # (the conversation's state does not change: no idle to report)
            if conversation.state is not State.CLOSED:
                conversation.handle(ResumedFrom(stream_id=event.stream_id, text=held), self._clock())
        await self._send(
            pe.StreamResumed(
                stream_id=event.stream_id,
                response_id=info.response_id,
                from_=event.from_,
                status=info.status,
                tool_mode=tool_mode,
            )
        )
        service.observer.resumed(
            stream_id=event.stream_id, from_offset=event.from_, num_replayed=max(0, info.end - event.from_)
        )
        if speaker is not None and held is not None:
            # the audio is re-derived from the text: the speaker hears it all from 0
            speaker.on_delta(spoken_text(held, tool_mode))
        self._deliveries.start(
            info.response_id,
            event.stream_id,
            event.from_,
            include_token_ids=conversation.settings.include_token_ids,
            subscriber=speaker,
            # unread text before from would misread the calls: then deltas only
            tool_mode=tool_mode if held is not None else None,
            held_text=held or "",
        )
