"""Bad input over a live socket: the error event or close code PROTOCOL.md names,
and the connection (where it stays open) and the server go on serving."""

from __future__ import annotations

import json
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from bargein.client.realtime_client import RealtimeClient
from tests.app.conftest import MAX_FRAME_BYTES, MAX_MODEL_LEN, LiveServer

pytestmark = pytest.mark.slow

USER_HI = [{"role": "user", "content": "Say hi."}]

BAD_FRAMES: list[tuple[str, str, str]] = [
    ("invalid json", '{"type": "ping"', "invalid_message"),
    ("json not an object", '["ping"]', "invalid_message"),
    ("unknown type", '{"type": "response.explode"}', "unknown_type"),
    (
        "wrong field type",
        json.dumps({"type": "response.create", "input": USER_HI, "max_tokens": "ten"}),
        "invalid_message",
    ),
    ("input not a list", json.dumps({"type": "response.create", "input": "hi"}), "invalid_message"),
    (
        "max_tokens 0",
        json.dumps({"type": "response.create", "input": USER_HI, "max_tokens": 0}),
        "invalid_parameter",
    ),
    (
        "temperature -1",
        json.dumps({"type": "response.create", "input": USER_HI, "temperature": -1}),
        "invalid_parameter",
    ),
    (
        "top_p 1.5",
        json.dumps({"type": "response.create", "input": USER_HI, "top_p": 1.5}),
        "invalid_parameter",
    ),
    ("empty input", json.dumps({"type": "response.create", "input": []}), "invalid_parameter"),
    (
        "max_tokens over the limit",
        json.dumps({"type": "response.create", "input": USER_HI, "max_tokens": 100_000}),
        "invalid_parameter",
    ),
    (
        "prompt longer than the context",
        json.dumps(
            {"type": "response.create", "input": [{"role": "user", "content": "word " * (2 * MAX_MODEL_LEN)}]}
        ),
        "prompt_too_long",
    ),
]


async def recv(ws: ClientConnection) -> dict[str, Any]:
    return json.loads(await ws.recv())


async def still_serving(ws: ClientConnection) -> None:
    """The same connection answers a ping and then a real response."""
    await ws.send(json.dumps({"type": "ping"}))
    assert (await recv(ws))["type"] == "pong"
    await ws.send(
        json.dumps({"type": "response.create", "input": USER_HI, "max_tokens": 3, "temperature": 0})
    )
    kinds = []
    while not kinds or kinds[-1] != "response.done":
        kinds.append((await recv(ws))["type"])
    assert kinds[0] == "response.created" and "response.delta" in kinds


async def test_bad_events_get_error_events_and_the_connection_stays_open(live_server: LiveServer) -> None:
    async with connect(live_server.ws_url, subprotocols=["bargein.v1.json"]) as ws:  # type: ignore[list-item]
        assert (await recv(ws))["type"] == "session.created"
        for name, frame, code in BAD_FRAMES:
            with_id = frame
            if frame.startswith('{"type": "response.create"'):
                with_id = json.dumps({**json.loads(frame), "event_id": f"e-{code}"})
            await ws.send(with_id)
            error = await recv(ws)
            assert (error["type"], error["code"]) == ("error", code), name
            assert isinstance(error["message"], str) and error["message"], name
            assert error["retryable"] is False, name
            if with_id is not frame:
                assert error["event_id"] == f"e-{code}", name
        await still_serving(ws)


async def test_a_second_response_while_one_is_active_is_a_conflict(live_server: LiveServer) -> None:
    async with RealtimeClient(live_server.ws_url) as client:
        await client.send(
            {
                "type": "response.create",
                "input": USER_HI,
                "max_tokens": 24,
                "temperature": 0,
                "response_id": "first",
            }
        )
        await client.send(
            {"type": "response.create", "input": USER_HI, "max_tokens": 4, "response_id": "second"}
        )
        events = []
        while not events or events[-1]["type"] != "response.done":
            events.append(await client._recv())
        errors = [e for e in events if e["type"] == "error"]
        assert [(e["code"], e["response_id"]) for e in errors] == [("conflict", "second")]
        assert events[-1]["response_id"] == "first"


async def close_code(ws: ClientConnection) -> int | None:
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await ws.recv()
    assert closed.value.rcvd is not None, "the server sent no close frame"
    return closed.value.rcvd.code


async def test_oversized_frame_closes_with_1009(live_server: LiveServer) -> None:
    # The client's own limit is lifted so the frame reaches the server.
    async with connect(live_server.ws_url, max_size=None) as ws:
        await recv(ws)
        await ws.send(json.dumps({"type": "ping", "pad": "x" * (MAX_FRAME_BYTES + 1)}))
        assert await close_code(ws) == 1009
    await server_still_answers(live_server)


async def test_invalid_utf8_text_frame_closes_with_1007(live_server: LiveServer) -> None:
    async with connect(live_server.ws_url) as ws:
        await recv(ws)
        await ws.send(b'{"type": "ping", "x": "\xff\xfe"}', text=True)
        assert await close_code(ws) == 1007
    await server_still_answers(live_server)


async def server_still_answers(live_server: LiveServer) -> None:
    async with RealtimeClient(live_server.ws_url) as client:
        assert await client.chat("Say hi.", max_tokens=3, temperature=0)
