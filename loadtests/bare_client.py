"""A bare JSON realtime client for the resume tests and the stream contract
rounds: it can drop its socket without a close frame (what a lost network
looks like to the server)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

RECV_TIMEOUT_S = 60.0


@dataclass(slots=True, kw_only=True)
class Received:
    """What one connection received of one stream."""

    deltas: list[dict[str, Any]] = field(default_factory=list)
    done: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        return "".join(d["text"] for d in self.deltas)

    @property
    def end(self) -> int | None:
        """``end`` of the last delta, or None before any."""
        return self.deltas[-1]["end"] if self.deltas else None


class Conn:
    """One WebSocket connection speaking ``bargein.v1.json``."""

    def __init__(self, ws: ClientConnection, created: dict[str, Any]) -> None:
        self.ws = ws
        self.created = created  # its session.created

    @classmethod
    async def open(cls, url: str) -> Conn:
        ws = await connect(
            url,
            subprotocols=["bargein.v1.json"],  # type: ignore[list-item]
            max_size=None,
        )
        created = json.loads(await asyncio.wait_for(ws.recv(), RECV_TIMEOUT_S))
        assert created["type"] == "session.created", created
        return cls(ws, created)

    async def send(self, **event: Any) -> None:
        await self.ws.send(json.dumps(event))

    async def recv(self) -> dict[str, Any]:
        event: dict[str, Any] = json.loads(await asyncio.wait_for(self.ws.recv(), RECV_TIMEOUT_S))
        return event

    async def expect(self, kind: str) -> dict[str, Any]:
        event = await self.recv()
        assert event["type"] == kind, event
        return event

    async def create(self, prompt: str, **params: Any) -> dict[str, Any]:
        """Send a ``response.create``; return its ``response.created``."""
        await self.send(type="response.create", input=[{"role": "user", "content": prompt}], **params)
        return await self.expect("response.created")

    async def resume(self, stream_id: str, resume_token: str, from_: int) -> dict[str, Any]:
        """Send ``stream.resume``; return its ``stream.resumed``."""
        await self.send(
            type="stream.resume", stream_id=stream_id, resume_token=resume_token, **{"from": from_}
        )
        return await self.expect("stream.resumed")

    async def read(
        self,
        received: Received,
        max_deltas: int | None = None,
        *,
        response_id: str | None = None,
        others: list[dict[str, Any]] | None = None,
    ) -> Received:
        """Read deltas into ``received`` until ``response.done`` (or ``max_deltas``).

        With ``response_id``, events of other responses go to ``others``
        instead of failing the read.
        """
        num_read = 0
        while received.done is None and (max_deltas is None or num_read < max_deltas):
            event = await self.recv()
            if response_id is not None and event.get("response_id") != response_id:
                assert others is not None, "others collects the other responses' events"
                others.append(event)
            elif event["type"] == "response.delta":
                received.deltas.append(event)
                num_read += 1
            elif event["type"] == "response.done":
                received.done = event
            else:
                raise AssertionError(f"unexpected event {event}")
        return received

    def drop(self) -> None:
        """Lose the connection: no close frame, the TCP socket just goes."""
        self.ws.transport.abort()

    async def close(self) -> None:
        await self.ws.close()


def assert_tiles(deltas: list[dict[str, Any]], start: int, end: int) -> None:
    """The deltas cover ``[start, end)`` in order: no gap, no overlap, none empty."""
    position = start
    for delta in deltas:
        assert delta["start"] == position, (delta["start"], position)
        assert delta["end"] > delta["start"], delta
        position = delta["end"]
    assert position == end, (position, end)
