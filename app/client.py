"""A small Python client for bargein's realtime protocol (docs/protocol.md).

Importable without torch or the engine: it needs only ``websockets``.

    async with RealtimeClient("ws://127.0.0.1:8000/v1/realtime") as client:
        async for text in client.respond("What is the capital of France?"):
            print(text, end="", flush=True)

``respond`` yields text deltas of one response. When the connection drops
mid-answer, the client reconnects and sends ``stream.resume`` from the ``end``
of the last delta it got, so the iterator goes on with no gap and no
duplicate. ``cancel`` interrupts the active response (barge-in).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import ssl as ssl_module
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

SUBPROTOCOL = "bargein.v1.json"


class ServerError(Exception):
    """The server answered with an ``error`` event.

    Attributes:
        code: the error code (docs/protocol.md), e.g. ``"conflict"``.
        event: the whole error event.
    """

    def __init__(self, event: dict[str, Any]) -> None:
        super().__init__(f"{event.get('code')}: {event.get('message')}")
        self.code: str = event.get("code", "")
        self.event = event


@dataclass(slots=True, kw_only=True)
class Response:
    """What the client knows of one response, filled in while it streams.

    Attributes:
        response_id, stream_id, resume_token: from ``response.created``.
        text: the text received so far (all deltas joined).
        end: offset after the last token received (``from`` for a resume).
        done: the ``response.done`` event once it arrived.
    """

    response_id: str = ""
    stream_id: str = ""
    resume_token: str = ""
    text: str = ""
    end: int = 0
    done: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)


class RealtimeClient:
    """One realtime session over one (re-opened when needed) WebSocket.

    Args:
        url: ``ws://host:port/v1/realtime``, or ``wss://`` for a server with TLS.
        max_reconnects: reconnect attempts per dropped connection.
        headers: extra upgrade headers (e.g. ``Authorization``).
        ssl: the TLS context of a ``wss://`` URL (None: the system's trusted
            CAs); e.g. ``ssl.create_default_context(cafile="cert.pem")`` for a
            self-signed certificate.
    """

    def __init__(
        self,
        url: str,
        *,
        max_reconnects: int = 5,
        headers: dict[str, str] | None = None,
        ssl: ssl_module.SSLContext | None = None,
    ) -> None:
        self.url = url
        self.max_reconnects = max_reconnects
        self.headers = headers or {}
        self.ssl = ssl
        self.session: dict[str, Any] = {}
        self.current: Response | None = None
        self._ws: ClientConnection | None = None
        self._ids = itertools.count(1)
        self.num_resumes = 0  # reconnects that resumed a stream

    async def __aenter__(self) -> RealtimeClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> dict[str, Any]:
        """Open the WebSocket and return the ``session.created`` event."""
        self._ws = await connect(
            self.url,
            subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
            additional_headers=self.headers,
            # websockets takes no context for ws:// and no None for wss://
            **({"ssl": self.ssl} if self.ssl is not None else {}),
        )
        self.session = await self._recv()
        return self.session

    async def close(self) -> None:
        """Close the WebSocket (an active response goes on into the log)."""
        if self._ws is not None:
            await self._ws.close()
            self._ws = None

    def abort_transport(self) -> None:
        """Drop the TCP connection at once, without a closing handshake."""
        if self._ws is not None:
            self._ws.transport.abort()

    async def send(self, event: dict[str, Any]) -> None:
        """Send one event as a JSON text frame."""
        assert self._ws is not None, "not connected"
        await self._ws.send(json.dumps(event))

    async def _recv(self) -> dict[str, Any]:
        assert self._ws is not None, "not connected"
        frame = await self._ws.recv()
        return json.loads(frame)

    async def update(self, **session: Any) -> dict[str, Any]:
        """``session.update``; returns the ``session.updated`` event."""
        await self.send({"type": "session.update", "session": session})
        return await self._expect("session.updated")

    async def _expect(self, kind: str) -> dict[str, Any]:
        while True:
            event = await self._recv()
            if event["type"] == "error":
                raise ServerError(event)
            if event["type"] == kind:
                return event

    async def respond(
        self, text: str | None = None, *, role: str = "user", **params: Any
    ) -> AsyncIterator[str]:
        """Append ``text`` (as ``role``) and stream the assistant's answer.

        Yields:
            text deltas, in order; after the last one ``self.current.done``
            holds ``response.done``.

        Raises:
            ServerError: the server refused the request.
            ConnectionClosed: the connection dropped and resuming failed
                ``max_reconnects`` times.
        """
        event: dict[str, Any] = {"type": "response.create", "response_id": f"r{next(self._ids)}", **params}
        if text is not None:
            event["input"] = [{"role": role, "content": text}]
        await self.send(event)
        self.current = response = Response()
        await self._created(response)
        async for delta in self._follow(response):
            yield delta

    async def _created(self, response: Response) -> None:
        created = await self._expect("response.created")
        response.response_id = created["response_id"]
        response.stream_id = created["stream_id"]
        response.resume_token = created["resume_token"]

    async def _follow(self, response: Response) -> AsyncIterator[str]:
        while response.done is None:
            try:
                event = await self._recv()
            except ConnectionClosed:
                if self.max_reconnects < 1:
                    raise
                await self._resume(response)
                continue
            if event.get("response_id") != response.response_id:
                continue
            response.events.append(event)
            if event["type"] == "response.delta" and event["end"] > response.end:
                response.text += event["text"]
                response.end = event["end"]
                yield event["text"]
            elif event["type"] == "response.done":
                response.done = event
            elif event["type"] == "error":
                raise ServerError(event)

    async def _resume(self, response: Response) -> None:
        """Reconnect and ``stream.resume`` from ``response.end``, retrying with
        exponential backoff (50 ms, 100 ms, ...) up to ``max_reconnects`` times.

        Raises:
            ConnectionClosed or OSError: the last attempt's failure.
            ServerError: the server refused the resume (e.g. ``not_found``).
        """
        self._ws = None
        for attempt in range(self.max_reconnects):
            await asyncio.sleep(0.05 * 2**attempt)
            try:
                await self.connect()
                await self.send(
                    {
                        "type": "stream.resume",
                        "stream_id": response.stream_id,
                        "resume_token": response.resume_token,
                        "from": response.end,
                    }
                )
                await self._expect("stream.resumed")
            except (ConnectionClosed, OSError):
                if attempt == self.max_reconnects - 1:
                    raise
                continue
            self.num_resumes += 1
            return

    async def cancel(self, heard_chars: int | None = None) -> dict[str, Any]:
        """Interrupt the current response; returns its ``response.done``.

        Deltas still in flight before the ``response.done`` are added to
        ``self.current.text``. Called before ``response.created`` came (a
        :meth:`respond` stopped early), it waits for it first.
        """
        response = self.current
        assert response is not None, "no response to cancel"
        if not response.response_id:
            await self._created(response)
        event: dict[str, Any] = {"type": "response.cancel", "response_id": response.response_id}
        if heard_chars is not None:
            event["heard_chars"] = heard_chars
        await self.send(event)
        async for _ in self._follow(response):
            pass
        assert response.done is not None
        return response.done

    async def chat(self, text: str, **params: Any) -> str:
        """Ask and return the whole answer."""
        return "".join([delta async for delta in self.respond(text, **params)])


def drop_connection(client: RealtimeClient) -> None:
    """Cut the client's TCP connection without a closing handshake, as a
    network drop would (for tests and demos of resume)."""
    client.abort_transport()


def ws_url(host: str, port: int) -> str:
    """The realtime endpoint of a server at ``host:port``."""
    return f"ws://{host}:{port}/v1/realtime"


__all__: Sequence[str] = ("RealtimeClient", "Response", "ServerError", "ws_url", "drop_connection")
