"""Function calling by voice, end to end: real models, a real socket, speech by espeak-ng (issue 40).

A spoken request with a function in force (``tool_choice`` naming it, so the
grammar makes the small model call it) is answered with the call, never
read aloud; the client runs the tool and gives its result, and the answer to
it is spoken. A user who speaks while the client runs the tool leaves no
call dangling: the next prompt says the call was cancelled.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from bargein.session.conversation.tools import UNANSWERED_CALL
from loadtests.bare_client import Conn
from loadtests.speech import silence_pcm16
from tests.app.conftest import LiveServer
from tests.app.voice_helpers import RATE, send_audio, until, voice_session
from tests.speech import espeak_pcm16

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": WEATHER,
}


def turn(text: str) -> bytes:
    return silence_pcm16(500, RATE) + espeak_pcm16(text, RATE) + silence_pcm16(1200, RATE)


async def spoken_call(conn: Conn, events: list[dict[str, Any]]) -> dict[str, Any]:
    """Ask for the weather by voice; the ``response.done`` of the call."""
    await voice_session(conn, max_tokens=48)
    await conn.send(
        type="session.update",
        session={"tools": [TOOL], "tool_choice": {"type": "function", "name": "get_weather"}},
    )
    await conn.expect("session.updated")
    await send_audio(conn, turn("What is the weather in Paris?"))
    return await until(conn, "response.done", events)


async def test_a_spoken_request_calls_the_tool_and_the_result_is_answered_in_speech(
    voice_server: LiveServer,
) -> None:
    conn = await Conn.open(voice_server.ws_url)
    try:
        events: list[dict[str, Any]] = []
        done = await spoken_call(conn, events)
        (call,) = done["tool_calls"]
        jsonschema.validate(json.loads(call["arguments"]), WEATHER)
        assert next(e for e in events if e["type"] == "response.created")["tool_mode"] == "forced"
        # the call is not read aloud: its audio ends with none
        assert not [e for e in events if e["type"] == "response.audio.delta"]
        assert next(e for e in events if e["type"] == "response.audio.done")["end_ms"] == 0
        # the client ran it: the answer to its result is spoken
        await conn.send(
            type="response.create",
            response_id="answer",
            modalities=["text", "audio"],
            tool_choice="none",
            input=[{"role": "tool", "tool_call_id": call["call_id"], "content": "18 C and sunny"}],
        )
        answer: list[dict[str, Any]] = []
        await until(conn, "response.done", answer)
        assert "".join(e["text"] for e in answer if e["type"] == "response.delta")
        assert [e for e in answer if e["type"] == "response.audio.delta"]
        prompt = voice_server.tokenizer.decode(voice_server.recent_requests()[-1].prompt_token_ids)
        assert "<|im_start|>tool\n18 C and sunny<|im_end|>" in prompt
    finally:
        await conn.close()


async def test_speaking_while_the_client_runs_the_tool_leaves_no_call_dangling(
    voice_server: LiveServer,
) -> None:
    conn = await Conn.open(voice_server.ws_url)
    try:
        events: list[dict[str, Any]] = []
        await spoken_call(conn, events)
        # no result yet: the user goes on, and the spoken turn starts the next answer
        await conn.send(type="session.update", session={"tool_choice": "none"})
        await conn.expect("session.updated")
        await send_audio(conn, turn("Never mind, tell me a joke."))
        await until(conn, "response.created", events)
        prompt = voice_server.tokenizer.decode(voice_server.recent_requests()[-1].prompt_token_ids)
        call_turn = prompt.split("<|im_start|>assistant\n")[-2]
        assert '"name":"get_weather"' in call_turn
        assert f"<|im_start|>tool\n{UNANSWERED_CALL}<|im_end|>" in prompt
        assert prompt.index(UNANSWERED_CALL) < prompt.index("joke")
        await until(conn, "response.done", events)
    finally:
        await conn.close()
