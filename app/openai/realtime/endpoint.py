"""One OpenAI Realtime connection on bargein's :class:`Connection`.

:func:`wants_openai` is the dispatch rule of ``/v1/realtime``: a client that
offers the ``realtime`` subprotocol (OpenAI's browser clients), or names a
``model`` in the query string without offering a ``bargein.*`` subprotocol
(OpenAI's SDKs), speaks OpenAI's schema; everyone else speaks bargein's.

:class:`OpenAIRealtime` sits between the socket and the connection: frames
go through :class:`Inbound` to :meth:`Connection.handle`, and every event the
connection sends goes through :class:`Translator` to the writer.
"""

from __future__ import annotations

import json
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from bargein.app.openai.realtime.inbound import Inbound, OpenAISession, RealtimeError
from bargein.app.openai.realtime.outbound import Translator
from bargein.protocol import events as pe
from bargein.session.conversation.actions import Message
from bargein.session.runtime.admission import RateLimitLevel
from bargein.session.runtime.connection import Connection

OPENAI_SUBPROTOCOL = "realtime"


def wants_openai(scope: Mapping[str, Any]) -> bool:
    """Whether a ``/v1/realtime`` WebSocket speaks OpenAI's Realtime schema."""
    offered = list(scope.get("subprotocols", []))
    if OPENAI_SUBPROTOCOL in offered:
        return True
    query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return "model" in query and not any(p.startswith("bargein.") for p in offered)


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def encode(event: dict[str, Any]) -> str:
    """The JSON text frame of an OpenAI event."""
    return json.dumps(event, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


class OpenAIRealtime:
    """The OpenAI face of one connection.

    Args:
        write: hands one OpenAI event to the socket's writer.
        model: the served model's name.
        has_voice: whether the server runs the voice pipeline.
        voices: the server's voice names.
        on_error: told the code of every client event refused (metrics).
        max_tokens: the server's largest ``max_tokens`` (``max_output_tokens`` is clamped to it).
    """

    def __init__(
        self,
        write: Callable[[dict[str, Any]], Awaitable[None]],
        *,
        model: str,
        has_voice: bool,
        voices: tuple[str, ...],
        on_error: Callable[[str], None],
        max_tokens: int | None = None,
    ) -> None:
        self._write = write
        self._has_voice = has_voice
        self._on_error = on_error
        self._connection: Connection | None = None
        self.settings = OpenAISession(audio_output=has_voice)
        self.translator = Translator(
            session=self.settings,
            model=model,
            conversation=self._turns,
            rate_limits=self._rate_limits,
        )
        self.inbound = Inbound(
            self.settings,
            has_voice=has_voice,
            active_response_id=self._active,
            voices=voices,
            max_tokens=max_tokens,
        )

    def attach(self, connection: Connection) -> None:
        """The connection whose events this translates."""
        self._connection = connection

    async def send(self, event: object) -> None:
        """The connection's ``send``: one bargein event out as OpenAI's."""
        for out in self.translator.translate(event):
            await self._write(out)

    async def open(self) -> None:
        """``session.created``, with the session's settings: OpenAI's defaults
        (spoken answers on a server with voice; server VAD)."""
        connection = self._require()
        await self.send(connection.created_event())
        audio = (
            pe.AudioSettings(output=pe.AudioOutputSettings(sample_rate=24000)) if self._has_voice else None
        )
        await connection.handle(pe.SessionUpdate(session=pe.SessionSettings(audio=audio)))

    async def handle_frame(self, frame: str | bytes, received_at: float) -> None:
        """Apply one client frame; a bad one is answered with ``error``."""
        connection = self._require()
        if isinstance(frame, bytes):
            await self._refuse(RealtimeError("invalid_json", "send JSON text frames"), None)
            return
        try:
            # NaN and Infinity are not JSON (RFC 8259), and a NaN temperature
            # would reach the sampler: refused, as bargein's own decoder does
            data = json.loads(frame, parse_constant=_not_json)
        except ValueError:
            await self._refuse(RealtimeError("invalid_json", "the frame is not JSON"), None)
            return
        except RecursionError:  # ``[[[[...`` from a hostile client: refused, not a crash
            await self._refuse(RealtimeError("invalid_json", "the frame is nested too deeply"), None)
            return
        try:
            event_id, events = self.inbound.translate(data)
        except RealtimeError as exc:
            await self._refuse(exc, self.inbound.last_event_id)
            return
        for event in events:
            await connection.handle(event, received_at)
            if isinstance(event, pe.InputAudioClear):
                await self._write(
                    {"type": "input_audio_buffer.cleared", "event_id": f"event_{uuid.uuid4().hex[:24]}"}
                )

    async def _refuse(self, exc: RealtimeError, event_id: str | None) -> None:
        self._on_error(exc.code)
        await self._write(self.translator.error(exc.code, exc.message, param=exc.param, event_id=event_id))

    def _rate_limits(self) -> tuple[RateLimitLevel, ...]:
        return () if self._connection is None else self._connection.rate_limits()

    def _turns(self) -> Sequence[Message]:
        return () if self._connection is None else self._connection.turns

    def _active(self) -> str | None:
        """The response a ``response.cancel`` without ``response_id`` cancels:
        the session's active one, else a live stream this connection only
        follows (a ``bargein.resume`` of a stream without its session)."""
        connection = self._connection
        if connection is None:
            return None
        if connection.active_response_id is not None:
            return connection.active_response_id
        followed = [
            response_id
            for response_id, stream_id in self.translator.open_responses()
            if not connection.knows_stream(stream_id)
        ]
        return followed[-1] if followed else None

    def _require(self) -> Connection:
        assert self._connection is not None, "attach() first"
        return self._connection
