"""A conversation's text is bounded by ``--max-conversation-bytes`` on a real
server (issue 36, p13): announced in ``session.created``, refused when added
on both protocols, and the saved session holds only what was accepted."""

from __future__ import annotations

import json
from typing import Any

import pytest
import websockets

from bargein.app.settings import ServerConfig, Settings
from bargein.session.conversation.config import SessionConfig
from tests.app.conftest import MAX_FRAME_BYTES, LiveServer, node_on_engine

pytestmark = pytest.mark.slow

BOUND = 32 * 1024  # bytes: below one frame (64 KiB), so a single frame can pass it


def settings() -> Settings:
    return Settings(
        session=SessionConfig(
            max_tokens=64, default_max_tokens=8, max_frame_bytes=MAX_FRAME_BYTES, max_conversation_bytes=BOUND
        ),
        server=ServerConfig(port=0, log_level="warning"),
    )


def item(text: str) -> str:
    return json.dumps(
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
        }
    )


async def until(ws: Any, *kinds: str) -> dict[str, Any]:
    while True:
        event = json.loads(await ws.recv())
        if event["type"] in kinds:
            return event


async def test_openai_items_past_the_bound_are_refused_and_not_saved(live_server: LiveServer) -> None:
    with node_on_engine(live_server, settings()) as node:
        url = node.ws_url + "?model=bargein"
        async with websockets.connect(url) as ws:
            created = json.loads(await ws.recv())
            bargein = created["session"]["bargein"]
            assert bargein["limits"]["max_conversation_bytes"] == BOUND
            await ws.send(item("a" * (BOUND // 2)))
            assert (await until(ws, "conversation.item.done", "error"))["type"] == "conversation.item.done"
            await ws.send(item("b" * (BOUND // 2 + 1)))  # one byte too many
            error = await until(ws, "conversation.item.done", "error")
            assert error["type"] == "error" and error["error"]["code"] == "invalid_parameter", error
            assert "max_conversation_bytes" in error["error"]["message"]
            await ws.send(item("c" * (BOUND // 2)))  # the session goes on: this one fits
            assert (await until(ws, "conversation.item.done", "error"))["type"] == "conversation.item.done"
        async with websockets.connect(url) as ws:  # the saved conversation: the accepted items only
            await ws.recv()
            resume = {"type": "bargein.resume", **{k: bargein[k] for k in ("session_id", "session_token")}}
            await ws.send(json.dumps(resume))
            resumed = await until(ws, "bargein.session.resumed", "error")
            assert resumed["type"] == "bargein.session.resumed", resumed
            assert resumed["turns"] == 2


async def test_bargeins_input_past_the_bound_is_refused(live_server: LiveServer) -> None:
    with node_on_engine(live_server, settings()) as node:
        async with websockets.connect(node.ws_url) as ws:
            created = json.loads(await ws.recv())
            assert created["limits"]["max_conversation_bytes"] == BOUND
            create = {
                "type": "response.create",
                "event_id": "big",
                "input": [{"role": "user", "content": "é" * (BOUND // 2 + 1)}],  # 2 bytes each
            }
            await ws.send(json.dumps(create, ensure_ascii=False))
            error = await until(ws, "error", "response.created")
            assert error["type"] == "error" and error["code"] == "invalid_parameter", error
            assert error["event_id"] == "big" and "max_conversation_bytes" in error["message"]
            await ws.send(json.dumps({"type": "ping"}))
            assert (await until(ws, "pong"))["type"] == "pong"
