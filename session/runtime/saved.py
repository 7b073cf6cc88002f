"""A session's conversation kept in the token log, for ``session.resume``.

What is kept (:class:`SavedSession`, JSON through
:meth:`~bargein.session.streams.log.TokenLog.save_session`): the principal, the
settings, the audio settings (a voice session's), the turns, and the active
response (the one still generating, or not fully delivered, when the state
was saved) with the text delivered of it.
The resume token of the active stream is not kept: it is derived again from
the stream id and the principal. The log keeps a saved state for its
retention time after the last save; a connection asks for a save on every
turn change and saves when it closes, so a session lives for the retention time after its last
connection closed.

:class:`SessionSaver` keeps one pending save per session: the state is read
and encoded when the save starts, and saves start at most once every
``min_interval_s`` (a burst of ``session.update`` is written once or twice,
not once per event: each save re-encodes the whole conversation). The
connection's last save (:meth:`SessionSaver.close`) does not wait for the
interval. The state is encoded off the event loop (megabytes of conversation
take milliseconds), and a save over :func:`max_saved_bytes` is not written:
the log would keep it for its retention time after the client left.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from bargein.protocol import events as pe
from bargein.protocol.codec import Decoder, encode
from bargein.protocol.errors import ProtocolError
from bargein.session.conversation.actions import Message
from bargein.session.conversation.config import SessionConfig
from bargein.session.conversation.state import Conversation, ConversationSettings
from bargein.session.conversation.tools import Tool
from bargein.session.errors import TokenLogError
from bargein.session.streams.log import TokenLog

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
# Saves of one session start at most this often. A crash of the node loses at
# most this much of the conversation; a closing connection saves at once.
DEFAULT_SAVE_INTERVAL_S = 0.1
# Room in a save for what is not conversation text: the settings, item ids,
# the active response's delivered text (max_tokens tokens) and JSON's framing.
SAVE_OVERHEAD_BYTES = 1 << 20


def max_saved_bytes(config: SessionConfig) -> int:
    """Largest save written, in bytes: a conversation at ``max_conversation_bytes``
    whose every character JSON escapes in two bytes (a quote, a newline), plus
    :data:`SAVE_OVERHEAD_BYTES`. Text of control characters (six bytes each
    escaped) can pass it: such a session is then not saved (not resumable)."""
    return 2 * config.max_conversation_bytes + SAVE_OVERHEAD_BYTES


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedActive:
    """The response a saved session had in flight."""

    response_id: str
    stream_id: str
    delivered: str  # text of it written to the old connection's socket
    # the last turns, its input: they leave the conversation if it is dropped at its
    # queue deadline (0 in saves from before this field: the input stays)
    num_input_turns: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedSession:
    """One session's conversation as the token log keeps it."""

    session_id: str
    principal: str
    settings: ConversationSettings
    turns: tuple[Message, ...]
    active: SavedActive | None
    # the audio settings in force (complete), None for a session without voice
    audio: pe.AudioSettings | None = None

    def to_bytes(self) -> bytes:
        """Compact UTF-8 JSON (turns as ``[role, content, item_id]`` triples)."""
        s = self.settings
        body: dict[str, Any] = {
            "v": FORMAT_VERSION,
            "session_id": self.session_id,
            "principal": self.principal,
            "settings": {
                "instructions": s.instructions,
                "defaults": s.defaults,
                "on_disconnect": s.on_disconnect,
                "include_token_ids": s.include_token_ids,
                "tools": [[t.name, t.description, t.parameters] for t in s.tools],
                "tool_choice": s.tool_choice
                if isinstance(s.tool_choice, str)
                else {"type": "function", "name": s.tool_choice.name},
            },
            "turns": [
                [t.role, t.content, t.item_id]
                if t.call_id is None
                else [t.role, t.content, t.item_id, t.call_id]
                for t in self.turns
            ],
            "audio": None if self.audio is None else audio_to_wire(self.audio),
            "active": None
            if self.active is None
            else [
                self.active.response_id,
                self.active.stream_id,
                self.active.delivered,
                self.active.num_input_turns,
            ],
        }
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> SavedSession:
        """Parse :meth:`to_bytes`' output.

        Raises:
            ValueError: not a saved session of this format.
        """
        try:
            body = json.loads(data)
            if body["v"] != FORMAT_VERSION:
                raise ValueError(f"saved session format {body['v']!r} is not {FORMAT_VERSION}")
            active = body["active"]
            return cls(
                session_id=body["session_id"],
                principal=body["principal"],
                settings=_saved_settings(body["settings"]),
                # a save of an older node holds [role, content] pairs
                turns=tuple(
                    Message(
                        role=t[0],
                        content=t[1],
                        item_id=t[2] if len(t) > 2 else None,
                        call_id=t[3] if len(t) > 3 else None,
                    )
                    for t in body["turns"]
                ),
                active=None
                if active is None
                else SavedActive(
                    response_id=active[0],
                    stream_id=active[1],
                    delivered=active[2],
                    num_input_turns=active[3] if len(active) > 3 else 0,
                ),
                audio=_saved_audio(body.get("audio"), body["session_id"]),  # absent in older saves
            )
        except (KeyError, TypeError, IndexError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a saved session: {exc}") from exc


def _saved_settings(body: dict[str, Any]) -> ConversationSettings:
    """The settings of a save (tools absent in saves of older nodes)."""
    tools = tuple(Tool(name=t[0], description=t[1], parameters=t[2]) for t in body.pop("tools", ()))
    choice = body.pop("tool_choice", "auto")
    tool_choice: pe.ToolChoice = (
        cast(pe.ToolChoiceMode, choice)
        if isinstance(choice, str)
        else pe.NamedToolChoice(name=choice["name"])
    )
    return ConversationSettings(**body, tools=tools, tool_choice=tool_choice)


def audio_to_wire(audio: pe.AudioSettings) -> dict[str, Any]:
    """``audio`` as the wire's ``session.audio`` object (JSON-able)."""
    frame = encode(pe.SessionUpdate(session=pe.SessionSettings(audio=audio)), "json")
    wire: dict[str, Any] = json.loads(frame)["session"]["audio"]
    return wire


def audio_from_wire(wire: Any) -> pe.AudioSettings:
    """The inverse of :func:`audio_to_wire`, validated as a ``session.update``'s ``audio``.

    Raises:
        ValueError: ``wire`` is not valid audio settings.
    """
    frame = json.dumps({"type": "session.update", "session": {"audio": wire}})
    try:
        event = Decoder(max_frame_bytes=len(frame.encode()) + 1).decode(frame)
    except ProtocolError as exc:
        raise ValueError(f"not audio settings: {exc}") from exc
    if not isinstance(event, pe.SessionUpdate) or event.session.audio is None:
        raise ValueError("not audio settings: empty")
    return event.session.audio


def _saved_audio(wire: Any, session_id: str) -> pe.AudioSettings | None:
    """A save's audio settings; None if it has none, or ones this build
    cannot read (logged: the session resumes with the connection's)."""
    if wire is None:
        return None
    try:
        return audio_from_wire(wire)
    except ValueError as exc:
        logger.warning("saved session %s: its audio settings are dropped: %s", session_id, exc)
        return None


class SessionHolder(Protocol):
    """A connection that holds a session on this node (``Service.sessions``)."""

    def snapshot(self) -> SavedSession:
        """The session as it would be saved now (its active response included)."""
        ...


def snapshot(session: Conversation, principal: str, audio: pe.AudioSettings | None = None) -> SavedSession:
    """The state of ``session`` now, to save, with the ``audio`` settings in force."""
    active = session.active_response
    return SavedSession(
        session_id=session.session_id,
        principal=principal,
        settings=session.settings,
        turns=tuple(session.turns),
        active=None
        if active is None
        else SavedActive(
            response_id=active[0], stream_id=active[1], delivered=active[2], num_input_turns=active[3]
        ),
        audio=audio,
    )


class SessionSaver:
    """Saves the latest state of one connection's session: one pending save,
    started at most once every ``min_interval_s``.

    A request while a save is pending or being written marks the state dirty:
    the pending save (or one more after the one being written) takes the state
    as it is then. So however many requests come, the saves in any window of
    ``T`` seconds number at most ``T / min_interval_s + 1`` (and the one of
    :meth:`close`).

    Args:
        log: where sessions are kept.
        state: returns the state to save now (called when a save starts).
        min_interval_s: least time between the starts of two saves (0: none).
        max_bytes: a save larger than this many bytes is not written (a
            warning is logged; a resume gets the last save that fitted).
            None: no bound.
        clock: monotonic seconds.
        sleep: waits that many seconds (tests pass one driven by a fake clock).
    """

    def __init__(
        self,
        log: TokenLog,
        state: Callable[[], SavedSession],
        *,
        min_interval_s: float = DEFAULT_SAVE_INTERVAL_S,
        max_bytes: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if min_interval_s < 0:
            raise ValueError(f"{min_interval_s=} must be >= 0")
        self._log = log
        self._state = state
        self._min_interval_s = min_interval_s
        self._max_bytes = max_bytes
        self._clock = clock
        self._sleep = sleep
        self._dirty = False
        self._started_at = -math.inf  # when the last save started
        self._task: asyncio.Task[None] | None = None
        self._waiting = False  # the task sleeps before its save (nothing read or written yet)
        self._closing = False  # the connection ended: no more waiting for the interval
        self.num_saves = 0  # saves written or attempted, for tests and metrics

    def request(self) -> None:
        """Save soon (the state as it is when the save starts)."""
        self._dirty = True
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="save-session")

    async def flush(self) -> None:
        """Wait until every requested save was written (or failed and was logged)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def close(self, last: SavedSession) -> None:
        """Save ``last`` (the connection's end) now, after the save being written.

        A save still waiting for its interval is not waited for: ``last``
        replaces it.
        """
        self._closing = True
        task = self._task
        if task is not None and not task.done() and self._waiting:
            task.cancel()  # it read nothing yet: ``last`` supersedes it
            await asyncio.wait([task])  # our own cancellation still propagates
        await self.flush()  # a save being written lands before ``last``
        self._state = lambda: last
        self._dirty = True
        await self._save()

    async def _run(self) -> None:
        while self._dirty:
            delay = self._started_at + self._min_interval_s - self._clock()
            if delay > 0 and not self._closing:
                self._waiting = True
                try:
                    await self._sleep(delay)  # requests meanwhile fold into this save
                finally:
                    self._waiting = False
            await self._save()

    async def _save(self) -> None:
        self._dirty = False
        self._started_at = self._clock()
        self.num_saves += 1
        saved = self._state()
        try:
            # one save at a time (flush and close wait for it), so saves still land in order
            data = await asyncio.to_thread(saved.to_bytes)
            if self._max_bytes is not None and len(data) > self._max_bytes:
                logger.warning(
                    "session %s not saved: %d bytes, over the %d a save may take",
                    saved.session_id,
                    len(data),
                    self._max_bytes,
                )
                return
            await self._log.save_session(saved.session_id, data)
        except TokenLogError:  # the session is only less resumable; the log says why
            logger.warning("saving session %s failed", saved.session_id)
        except Exception:  # a bug: logged, and the connection (its close too) goes on
            logger.exception("saving session %s failed (a bug in bargein)", saved.session_id)
