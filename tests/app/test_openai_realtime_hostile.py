"""Hostile frames on the OpenAI Realtime endpoint, against the real server:
each is answered with an ``error`` event (as docs/protocol.md 11.1 promises),
nothing is logged as a crash, and the session goes on."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import websockets

from tests.app.conftest import MAX_FRAME_BYTES, LiveServer
from tests.app.log_capture import server_log

pytestmark = pytest.mark.slow

HUGE_INT = "1" + "0" * 400  # past a float's range: float() raises OverflowError

HOSTILE = [
    # deeper than the parser's recursion limit (RecursionError), within the frame limit
    pytest.param("[" * (MAX_FRAME_BYTES - 1000), "invalid_json", None, id="nested"),
    pytest.param(
        '{"type":"response.create","response":{"temperature":' + HUGE_INT + "}}",
        "invalid_value",
        "response.temperature",
        id="temperature-400-digits",
    ),
    pytest.param(
        '{"type":"response.create","response":{"temperature":1e999}}',
        "invalid_value",
        "response.temperature",
        id="temperature-infinite",
    ),
    pytest.param(
        '{"type":"session.update","session":{"audio":{"input":{"turn_detection":'
        '{"type":"server_vad","threshold":' + HUGE_INT + "}}}}}",
        "invalid_value",
        "session.audio.input.turn_detection.threshold",
        id="threshold-400-digits",
    ),
    pytest.param(
        '{"type":"session.update","session":{"audio":{"input":{"transcription":'
        + '{"prompt":' * 900
        + "1"
        + "}" * 900
        + "}}}}",
        "invalid_type",
        "session.audio.input.transcription.prompt",
        id="transcription-nested",
    ),
]


async def _error_then_alive(url: str, frame: str) -> dict[str, Any]:
    """Send ``frame`` on a fresh connection; return its ``error``, once a
    ``session.update`` after it was answered (the session is still open)."""
    async with websockets.connect(url, max_size=2**24) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(frame)
        error = json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime"}}))
        assert json.loads(await ws.recv())["type"] == "session.updated"
        return error


@pytest.mark.parametrize(("frame", "code", "param"), HOSTILE)
async def test_a_hostile_frame_is_an_error_event_not_a_crash(
    live_server: LiveServer, frame: str, code: str, param: str | None
) -> None:
    with server_log(level=logging.WARNING) as log:
        error = await _error_then_alive(live_server.ws_url + "?model=bargein", frame)
    assert error["type"] == "error", error
    assert error["error"]["code"] == code, error
    if param is not None:
        assert error["error"]["param"] == param, error
    assert log.with_traceback() == []
