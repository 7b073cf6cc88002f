"""A connection's conversation as it lives on the node: applied events, idleness, saves.

The :class:`~bargein.session.conversation.state.Conversation` is pure: it
takes an event and returns actions. :class:`LiveConversation` is where a
connection keeps it: every event goes through :meth:`LiveConversation.apply`,
which also keeps an :class:`asyncio.Event` of whether a response is active
(a voice turn that must not interrupt waits on it, no polling), and the
conversation is saved in the token log as it changes (coalesced, see
:class:`~bargein.session.runtime.saved.SessionSaver`) for ``session.resume``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from bargein.protocol import events as pe
from bargein.session.conversation.actions import Action, Delivered, GenerationFinished
from bargein.session.conversation.state import Conversation, State
from bargein.session.runtime.saved import SavedSession, SessionSaver, max_saved_bytes, snapshot
from bargein.session.runtime.service import Service

_IDLE = (State.IDLE, State.CLOSED)


class LiveConversation:
    """One connection's conversation, its idleness and its saves.

    Args:
        service: the process's service (its config, its log).
        principal: whose conversation it is (saved with it).
        clock: monotonic seconds (the ``now`` of the events it applies itself).
        audio: the audio settings in force, saved with the conversation (None:
            a session without voice).
    """

    def __init__(
        self,
        service: Service,
        principal: str,
        *,
        clock: Callable[[], float],
        audio: Callable[[], pe.AudioSettings | None] = lambda: None,
    ) -> None:
        self.current = Conversation(service.config)
        self._principal = principal
        self._audio = audio
        self._clock = clock
        self._idle = asyncio.Event()  # set while no response is active (or it is closed)
        self._idle.set()
        self._saver = SessionSaver(
            service.log,
            lambda: snapshot(self.current, principal, audio()),
            min_interval_s=service.config.save_interval_s,
            max_bytes=max_saved_bytes(service.config),
        )

    @property
    def closed(self) -> bool:
        """Whether the conversation has ended (its connection closed)."""
        return self.current.state is State.CLOSED

    def apply(self, event: object, now: float) -> list[Action]:
        """``event`` through the conversation; the actions it calls for.

        Raises:
            IllegalTransition: the conversation does not take ``event`` now.
        """
        actions = self.current.handle(event, now)
        self._note_state()
        return actions

    def retract(self, response_id: str, now: float) -> list[Action]:
        """Withdraw a response and its turns (see :meth:`Conversation.retract`)."""
        actions = self.current.retract(response_id, now)
        self._note_state()
        return actions

    def finished(self, event: GenerationFinished) -> None:
        """A response's generation ended (the service tells its owner): its
        turn joins the conversation, unless the conversation ended first."""
        if not self.closed:
            self.apply(event, self._clock())
            self.save()

    def delivered(self, stream_id: str, text: str) -> None:
        """A delta of ``stream_id`` carrying ``text`` reached the client."""
        if not self.closed:
            self.apply(Delivered(stream_id=stream_id, text=text), self._clock())

    def replace(self, conversation: Conversation) -> None:
        """Make ``conversation`` (a restored one) the connection's."""
        self.current = conversation
        self._note_state()

    async def wait_idle(self) -> None:
        """Return once no response is active (or the conversation is closed)."""
        while self.current.state not in _IDLE:
            self._idle.clear()
            await self._idle.wait()

    def save(self) -> None:
        """Save the conversation soon (coalesced with other requests)."""
        self._saver.request()

    def snapshot(self) -> SavedSession:
        """The conversation as it would be saved now (its active response included)."""
        return snapshot(self.current, self._principal, self._audio())

    async def close(self, last: SavedSession) -> None:
        """Save ``last`` now, the connection's end (its retention starts)."""
        await self._saver.close(last)

    def _note_state(self) -> None:
        if self.current.state in _IDLE:
            self._idle.set()
        else:
            self._idle.clear()
