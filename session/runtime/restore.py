"""``session.resume``: a saved conversation re-attached to a new connection.

A connection's conversation is saved in the token log as it changes
(:mod:`~bargein.session.runtime.saved`). A client that reconnects sends
``session.resume`` with the session token before its first response;
:class:`SessionRestorer` loads the saved conversation and rebuilds it: a
response that was active when it was saved ends as its stream did (its
whole text from the log, its input dropped if the queue deadline dropped
it, what was delivered if the stream expired), and one that still
generates is watched to its end, which gives the conversation its turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from bargein.engine.request import FinishReason
from bargein.protocol import events as pe
from bargein.session.conversation.state import (
    Conversation,
    GenerationFinished,
    Message,
    State,
    assistant_item_id,
)
from bargein.session.errors import StreamNotFound, TokenLogError
from bargein.session.runtime.error_events import error_for
from bargein.session.runtime.saved import SavedSession
from bargein.session.runtime.service import Service
from bargein.session.runtime.tokens import check_session_token, make_resume_token
from bargein.session.streams.log import StreamEnd, TokenLog

logger = logging.getLogger(__name__)

Restored = tuple[Conversation, pe.SessionResumed, pe.AudioSettings | None]
"""The conversation that replaces the connection's, the answer to send once
it does, and the session's saved audio settings (None: none saved)."""


class SessionRestorer:
    """The ``session.resume`` of one connection.

    Args:
        service: the process's service.
        principal: who is connected (a saved session is the principal's).
        on_finish: told when a restored active response's stream ends (the
            connection applies it to its conversation, as a finish of its own
            response).
    """

    def __init__(
        self, service: Service, *, principal: str, on_finish: Callable[[GenerationFinished], None]
    ) -> None:
        self._service = service
        self._principal = principal
        self._on_finish = on_finish
        self._watch: asyncio.Task[None] | None = None  # a restored session's active stream

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The watcher of a restored active response, while there is one."""
        return [] if self._watch is None else [self._watch]

    async def restore(self, event: pe.SessionResume, current: Conversation) -> Restored | pe.ErrorEvent:
        """The saved conversation ``event`` names, in place of ``current``
        (the connection swaps it in before sending the answer), or the
        ``error`` refusing it (a wrong token, a connection that already has
        a conversation, nothing saved, an unreadable log)."""
        service = self._service
        if not check_session_token(service.secret, event.session_id, self._principal, event.session_token):
            return error_for(pe.ErrorCode.FORBIDDEN, "wrong session token", event)
        if current.turns or current.state is not State.IDLE or self._watch is not None:
            message = "session.resume must come before this connection's first response"
            return error_for(pe.ErrorCode.CONFLICT, message, event)
        try:
            saved = await self._saved(event.session_id)
            if saved is None:
                return error_for(pe.ErrorCode.NOT_FOUND, "session not found", event)
            conversation, active = await self._rebuild(saved)
        except TokenLogError:
            return error_for(pe.ErrorCode.INTERNAL_ERROR, "token log unavailable", event)
        answer = pe.SessionResumed(session_id=saved.session_id, turns=len(conversation.turns), active=active)
        return conversation, answer, saved.audio

    async def _saved(self, session_id: str) -> SavedSession | None:
        """The session as its connection on this node holds it now, if one
        still does (a client that reconnects before the server noticed the
        drop: the last save may predate its last turn), else as saved."""
        holder = self._service.sessions.get(session_id)
        if holder is not None:
            live = holder.snapshot()
            return live if live.principal == self._principal else None
        return await load_session(self._service.log, session_id, self._principal)

    async def _rebuild(self, saved: SavedSession) -> tuple[Conversation, pe.ActiveStream | None]:
        """``saved`` as a conversation, and its active stream.

        A response that was active when the state was saved: if its stream
        has ended, its whole text (from the log) becomes the assistant turn,
        unless it was dropped at its queue deadline (its input leaves the
        conversation, as on the connection that made it); if it still
        generates, the conversation waits for it (a watcher reads the log to
        its end); if the stream expired, what was delivered stays.
        """
        log = self._service.log
        conversation = Conversation(self._service.config, session_id=saved.session_id)
        turns = list(saved.turns)
        active = saved.active
        info = None if active is None else await log.info(active.stream_id)
        if active is not None and info is None:
            item_id = assistant_item_id(active.stream_id)
            turns.append(Message(role="assistant", content=active.delivered, item_id=item_id))
        elif active is not None and info is not None and info.finish is not None:
            if info.finish.error is None:
                text = (await stream_text(log, active.stream_id))[0]
                turns.append(
                    Message(role="assistant", content=text, item_id=assistant_item_id(active.stream_id))
                )
            else:
                del turns[len(turns) - active.num_input_turns :]
        live = active if info is not None and info.status == "live" else None
        conversation.restore(
            settings=saved.settings,
            turns=turns,
            active=None
            if live is None
            else (live.response_id, live.stream_id, live.delivered, live.num_input_turns),
        )
        if live is not None:
            self._watch = asyncio.create_task(
                self._watch_restored(conversation, live.stream_id), name=f"restored-{live.stream_id}"
            )
        if active is None or info is None:
            return conversation, None
        return conversation, pe.ActiveStream(
            response_id=active.response_id,
            stream_id=active.stream_id,
            resume_token=make_resume_token(self._service.secret, active.stream_id, self._principal),
            end=info.end,
        )

    async def _watch_restored(self, conversation: Conversation, stream_id: str) -> None:
        """Give the restored conversation its active response's turn when the stream ends."""
        expired = False
        try:
            text, end = await stream_text(self._service.log, stream_id)
            reason, expired = FinishReason(end.finish_reason), end.error is not None
        except TokenLogError:  # keep what this connection delivered of it
            active = conversation.active_response
            text, reason = ("" if active is None else active[2]), FinishReason.ERROR
        self._on_finish(
            GenerationFinished(stream_id=stream_id, text=text, finish_reason=reason, expired=expired)
        )

    async def settle(self, conversation: Conversation) -> None:
        """Before a ``response.create``: if the restored conversation's active
        stream has ended, wait until its turn is in the conversation."""
        watch, active = self._watch, conversation.active_response
        if watch is None or watch.done() or active is None:
            return
        info = await self._service.log.info(active[1])
        if info is None or info.status == "complete":
            await asyncio.shield(watch)


async def load_session(log: TokenLog, session_id: str, principal: str) -> SavedSession | None:
    """The saved session of ``principal``, or None (unknown, expired, unreadable).
    Raises TokenLogError."""
    data = await log.load_session(session_id)
    if data is None:
        return None
    try:
        saved = await asyncio.to_thread(SavedSession.from_bytes, data)  # megabytes: off the loop
    except ValueError:
        logger.warning("saved session %s is unreadable", session_id)
        return None
    return saved if saved.principal == principal else None


async def stream_text(log: TokenLog, stream_id: str) -> tuple[str, StreamEnd]:
    """A stream's whole text and its end, read from the log (waits for a live one).

    Raises StreamNotFound, TokenLogUnavailable.
    """
    parts: list[str] = []
    async for item in log.read(stream_id, 0):
        if isinstance(item, StreamEnd):
            return "".join(parts), item
        parts.append(item.text)
    raise StreamNotFound(stream_id, "ended without its end")
