"""A small Python client for bargein's realtime protocol (docs/protocol.md).

Importable without torch or the engine: it needs only ``websockets``.

    async with RealtimeClient("ws://127.0.0.1:8000/v1/realtime") as client:
        async for text in client.respond("What is the capital of France?"):
            print(text, end="", flush=True)

``respond`` yields text deltas of one response. When the connection drops
mid-answer, the client reconnects and sends ``stream.resume`` from the ``end``
of the last delta it got, so the iterator goes on with no gap and no
duplicate. ``cancel`` interrupts the active response (barge-in).

Voice (a server with audio: ``session.created`` announces
``limits.max_input_audio_ms``): a response's spoken answer
(``response.audio.delta``, pcm16 mono bytes, 24 kHz by default) is collected
in :attr:`Response.audio` and handed to its ``on_audio`` as it comes, and
resumes with the text after a drop (``audio_from_ms``);
:class:`bargein.client.voice_client.VoiceClient` adds the user's side (audio in,
turns found by the server). Both need ``pcm.py`` beside this file.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import ssl as ssl_module
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from bargein.client.pcm import ms_to_bytes

SUBPROTOCOL = "bargein.v1.json"
INPUT_RATE = 16000  # the server's default input_audio sample rate, Hz
OUTPUT_RATE = 24000  # the server's default response.audio sample rate, Hz
AudioSink = Callable[[bytes], None]
EventSink = Callable[[dict[str, Any]], None]


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
        input_item_id: the user item of the voice turn that started it, if one did.
        text: the text received so far (all deltas joined).
        end: offset after the last token received (``from`` for a resume).
        done: the ``response.done`` event once it arrived.
        audio: pcm16 of its spoken answer received so far (output sample rate).
        audio_end_ms: output timeline position after the last audio received
            (``audio_from_ms`` for a resume).
        text_end: code points of :attr:`text` spoken by ``audio_end_ms``.
        audio_done: the ``response.audio.done`` event once it arrived.
        paused: the server paused its audio (``response.audio.paused``: speech
            started over it, and a confirmed interruption is being decided);
            False again once ``response.audio.resumed`` came (docs/protocol.md 8.7).
        num_pauses, num_resumes: ``response.audio.paused`` and ``.resumed`` events taken.
        on_audio: called with each new piece of :attr:`audio`.
        on_pause, on_resume: called with each ``response.audio.paused`` and
            ``response.audio.resumed`` event: pause the playback there, keeping
            what is buffered, and play on from where it paused.
    """

    response_id: str = ""
    stream_id: str = ""
    resume_token: str = ""
    input_item_id: str | None = None
    text: str = ""
    end: int = 0
    done: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    audio: bytearray = field(default_factory=bytearray, repr=False)
    audio_end_ms: int = 0
    text_end: int = 0
    audio_done: dict[str, Any] | None = None
    paused: bool = False
    num_pauses: int = 0
    num_resumes: int = 0
    on_audio: AudioSink | None = field(default=None, repr=False)
    on_pause: EventSink | None = field(default=None, repr=False)
    on_resume: EventSink | None = field(default=None, repr=False)

    def take_created(self, created: dict[str, Any]) -> None:
        """Fill in the ids from the ``response.created`` event."""
        self.response_id = created["response_id"]
        self.stream_id = created["stream_id"]
        self.resume_token = created["resume_token"]
        self.input_item_id = created.get("input_item_id")


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
        # audio settings in force (session.updated): rates, and whether answers are spoken
        self.input_rate = INPUT_RATE
        self.output_rate = OUTPUT_RATE
        self.audio_output = False
        self.current: Response | None = None
        self._ws: ClientConnection | None = None
        self._ids = itertools.count(1)
        self.num_resumes = 0  # reconnects that resumed a stream

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> dict[str, Any]:
        """Open the WebSocket and return the ``session.created`` event."""
        # websockets takes no context for ws:// and no None for wss://
        tls: dict[str, Any] = {"ssl": self.ssl} if self.ssl is not None else {}
        self._ws = await connect(
            self.url,
            subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
            additional_headers=self.headers,
            **tls,
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

    @property
    def has_audio(self) -> bool:
        """Whether the server speaks audio (``limits.max_input_audio_ms`` announced)."""
        return self.session.get("limits", {}).get("max_input_audio_ms") is not None

    async def update(self, **session: Any) -> dict[str, Any]:
        """``session.update``; returns the ``session.updated`` event.

        Raises:
            ServerError: refused (``invalid_parameter`` for audio settings on a
                server without audio).
        """
        await self.send({"type": "session.update", "session": session})
        updated = await self._expect("session.updated")
        audio = updated.get("session", {}).get("audio")
        if audio is not None:
            self.input_rate = (audio.get("input") or {}).get("sample_rate", self.input_rate)
            output = audio.get("output")
            self.audio_output = output is not None
            self.output_rate = (output or {}).get("sample_rate", self.output_rate)
        return updated

    async def _expect(self, kind: str) -> dict[str, Any]:
        while True:
            event = await self._recv()
            if event["type"] == "error":
                raise ServerError(event)
            if event["type"] == kind:
                return event

    async def respond(
        self, text: str | None = None, *, role: str = "user", on_audio: AudioSink | None = None, **params: Any
    ) -> AsyncIterator[str]:
        """Append ``text`` (as ``role``) and stream the assistant's answer.

        ``on_audio`` gets the spoken answer's pcm16 as it comes (with audio
        output on, or ``modalities=["text", "audio"]``).

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
        self.current = response = Response(on_audio=on_audio)
        response.take_created(await self._expect("response.created"))
        async for delta in self._follow(response):
            yield delta

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
            text = self._apply(response, event)
            if text:
                yield text

    def _apply(self, response: Response, event: dict[str, Any]) -> str | None:
        """Take one event of ``response`` into it; returns the new text of a delta.

        A delta or audio replayed after a resume is taken only past what the
        response holds. ``response.audio.paused`` and ``.resumed`` (a
        confirmed interruption being decided) set :attr:`Response.paused` and
        call its ``on_pause`` and ``on_resume``.

        Raises:
            ServerError: an ``error`` about this response.
        """
        response.events.append(event)
        kind = event["type"]
        if kind == "response.delta" and event["end"] > response.end:
            response.text += event["text"]
            response.end = event["end"]
            return str(event["text"])
        if kind == "response.audio.delta" and event["end_ms"] > response.audio_end_ms:
            pcm = base64.b64decode(event["audio"])
            if event["start_ms"] < response.audio_end_ms:  # overlaps what a resume replayed
                pcm = pcm[ms_to_bytes(response.audio_end_ms - event["start_ms"], self.output_rate) :]
            response.audio += pcm
            response.audio_end_ms = event["end_ms"]
            response.text_end = event["text_end"]
            if response.on_audio is not None:
                response.on_audio(pcm)
        elif kind == "response.audio.paused" and not response.paused:
            response.paused = True
            response.num_pauses += 1
            if response.on_pause is not None:
                response.on_pause(event)
        elif kind == "response.audio.resumed" and response.paused:
            response.paused = False
            response.num_resumes += 1
            if response.on_resume is not None:
                response.on_resume(event)
        elif kind == "response.audio.done":
            response.audio_done = event
            response.paused = False
        elif kind == "response.done":
            response.done = event
        elif kind == "error":
            raise ServerError(event)
        return None

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
                resume = {
                    "type": "stream.resume",
                    "stream_id": response.stream_id,
                    "resume_token": response.resume_token,
                    "from": response.end,
                }
                if self.audio_output or response.audio:
                    resume["audio_from_ms"] = response.audio_end_ms
                await self.send(resume)
                await self._expect("stream.resumed")
            except (ConnectionClosed, OSError):
                if attempt == self.max_reconnects - 1:
                    raise
                continue
            self.num_resumes += 1
            return

    async def cancel(
        self, heard_chars: int | None = None, *, audio_end_ms: int | None = None
    ) -> dict[str, Any]:
        """Interrupt the current response; returns its ``response.done``.

        ``heard_chars`` (code points) or ``audio_end_ms`` (milliseconds of its
        audio the user heard) say where the conversation cuts it. Deltas still
        in flight before the ``response.done`` are added to
        ``self.current.text``. Called before ``response.created`` came (a
        :meth:`respond` stopped early), it waits for it first. A response
        already done (a voice barge-in the server cut on its own, an answer
        still playing) is re-cut: the server answers with ``response.done``
        again, which is returned.
        """
        response = self.current
        assert response is not None, "no response to cancel"
        if not response.response_id:
            response.take_created(await self._expect("response.created"))
        event: dict[str, Any] = {"type": "response.cancel", "response_id": response.response_id}
        if heard_chars is not None:
            event["heard_chars"] = heard_chars
        if audio_end_ms is not None:
            event["audio_end_ms"] = audio_end_ms
        await self.send(event)
        response.done = None  # a finished response's cancel is answered with its response.done again
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


__all__: Sequence[str] = (
    "RealtimeClient",
    "Response",
    "ServerError",
    "ws_url",
    "drop_connection",
)
